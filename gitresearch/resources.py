"""Files that ship with gitresearch: the bundled target, the git hook and the policy side's
data. In a wheel they are package data under gitresearch/data/ (pyproject.toml maps them
there); in a source checkout they are the repo's top-level folders."""
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SOURCE = {"nanochat": "target_repo", "gym": "gym_repo", "hooks": "hooks", "policy": "policy"}  # name -> folder in a checkout


def resource(name: str) -> Path:
    """The folder holding the shipped files called `name` (nanochat, gym, hooks, policy)."""
    packaged = PACKAGE / "data" / name
    if packaged.is_dir():
        return packaged
    checkout = PACKAGE.parent / SOURCE[name]
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"gitresearch's {name} files are missing: neither {packaged} nor {checkout}")


def web_dir() -> Path:
    """The page `gitresearch serve` sends (index.html, app.js, style.css)."""
    return PACKAGE / "web"


def workflow_template() -> Path:
    """The research workflow `gitresearch init --workflow` installs."""
    return PACKAGE / "templates" / "research.yml"
