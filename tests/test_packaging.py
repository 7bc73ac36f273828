"""gitresearch as users install it: a wheel (not an editable install) carries the bundled
target, the hook and the policy data, and runs `init --template nanochat` and a loop."""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import FAKES, make_repo

ROOT = Path(__file__).resolve().parents[1]


def digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def run(*args, cwd, env):
    proc = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


def test_the_wheel_ships_its_data_and_runs(tmp_path):
    build = tmp_path / "checkout"  # the working tree's files alone: no build/ or egg-info left by others
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (build / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, build / name)
    env = dict(os.environ)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
        str(tmp_path / "dist"), str(build), cwd=tmp_path, env=env)
    wheel = next((tmp_path / "dist").glob("gitresearch-*.whl"))
    # A fresh venv, non-editable: its own site-packages holds the wheel; the heavy dependencies
    # (torch, pygit2...) come from this interpreter's site-packages through a .pth line, which
    # adds the folder to sys.path after the venv's own (an editable checkout there is not loaded).
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path, env=env)
    site = Path(run(str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                    cwd=tmp_path, env=env).strip())
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "dependencies.pth").write_text("\n".join(deps) + "\n")
    run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
        "--no-index", "-q", str(wheel), cwd=tmp_path, env=env)
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    where = run(str(venv / "bin" / "python"), "-c", "import gitresearch; print(gitresearch.__file__)",
                cwd=tmp_path, env=env)
    assert where.strip().startswith(str(site))  # the installed copy, not the checkout
    assert digest(site / "gitresearch" / "data" / "policy") == digest(ROOT / "policy")
    assert digest(site / "gitresearch" / "web") == digest(ROOT / "gitresearch" / "web")  # the serve page
    gitresearch = str(venv / "bin" / "gitresearch")  # the console script the wheel installs

    research = tmp_path / "research"
    run(gitresearch, "init", "--template", "nanochat", str(research), cwd=tmp_path, env=env)
    copied = {k: v for k, v in digest(research).items() if not k.startswith(".git/")}
    assert copied == digest(ROOT / "target_repo")
    hook = (research / ".git" / "hooks" / "pre-commit").read_text()
    shipped = (ROOT / "hooks" / "pre-commit").read_text()
    # the hook runs with the venv's interpreter (init's own), whatever python3 the PATH has
    shebang, body = hook.split("\n", 1)
    assert Path(shebang[2:]).parent == venv / "bin" and body == shipped.split("\n", 1)[1]

    fake = make_repo(tmp_path / "fake")
    run(gitresearch, "init", "--workflow", cwd=fake, env=env)
    assert (fake / ".github" / "workflows" / "research.yml").read_text() == \
        (ROOT / "gitresearch" / "templates" / "research.yml").read_text()
    run(gitresearch, "loop", "--max-experiments", "1", "--seed", "0", cwd=fake, env=env)
    log = run(gitresearch, "log", "--json", cwd=fake, env=env)
    assert len(log.splitlines()) == 2  # the baseline and one experiment
    assert (FAKES / "curve.py").read_text() in (fake / "train.py").read_text()
