"""`gitresearch init`: make a directory a research repo."""
from __future__ import annotations

import shutil
import stat
from pathlib import Path

from .config import CONFIG_FILE
from .errors import GitresearchError
from .gitstore import NOTES_REF, VERIFY_REF, Store, commit_all, create_repo
from .resources import resource

TEMPLATES = ("nanochat", "gym")
HOOK_MARK = "gitresearch pre-commit hook"
DEFAULT_CONFIG = """\
# gitresearch settings; every value has a default, command-line flags override these.
schema = 1

[run]
command = ["python", "train.py"]
budget_s = 300

[files]
editable = ["train.py"]
frozen = []
"""


class InitError(GitresearchError):
    pass


def init_repo(directory: Path, template: str | None = None) -> list[str]:
    """Returns what it did, a line per step."""
    done = []
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / ".git").exists():
        create_repo(directory)
        done.append(f"initialised a git repository in {directory}")
    if template:
        source = resource(template)
        for item in source.iterdir():
            if item.name in ("__pycache__",):
                continue
            dest = directory / item.name
            if dest.exists():
                raise InitError(f"{dest} already exists; use an empty directory for --template")
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, dest)
        commit_all(directory, f"{template} baseline (gitresearch template)")
        done.append(f"copied the {template} template and committed it")
    if not (directory / "train.py").exists():
        raise InitError(f"{directory} has no train.py: gitresearch researches a train.py")
    if not (directory / CONFIG_FILE).exists():
        (directory / CONFIG_FILE).write_text(DEFAULT_CONFIG)
        done.append(f"wrote {CONFIG_FILE} (defaults; commit it with your baseline)")
    store = Store(directory)
    hook = store.git_dir / "hooks" / "pre-commit"
    if hook.exists() and HOOK_MARK not in hook.read_text(errors="replace"):
        done.append(f"left your own {hook} in place: frozen files are still checked by the runner")
    else:
        hook.parent.mkdir(exist_ok=True)
        shutil.copy2(resource("hooks") / "pre-commit", hook)
        hook.chmod(hook.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        done.append(f"installed the frozen-file hook {hook}")
    store.show_notes_in_log()
    done.append(f"plain `git log` now shows {NOTES_REF} and {VERIFY_REF}")
    if store.best() is None:
        head = store.resolve("HEAD")
        store.create_best(head)
        done.append(f"created best at {head[:12]}")
    return done
