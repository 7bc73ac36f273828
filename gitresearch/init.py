"""`gitresearch init`: make a directory a research repo, in three steps printed as they go:
write gitresearch.toml (every key, docs/adopting.md), commit it (asked, or --commit), create
`best` at that commit; plus the frozen-file hook, run by the interpreter that ran init."""
from __future__ import annotations

import math
import shutil
import stat
import sys
from pathlib import Path
from typing import Callable, Iterator

from .config import CONFIG_FILE, load
from .config_reference import reference_toml
from .errors import GitresearchError
from .gitstore import (NOTES_REF, VERIFY_REF, GitError, Store, commit_all, commit_paths, create_repo,
                       uncommitted)
from .resources import resource, workflow_template
from .runner import run_setup
from .trial import run_commit

TEMPLATES = ("nanochat", "gym")
HOOK_MARK = "gitresearch pre-commit hook"
WORKFLOW_FILE = ".github/workflows/research.yml"
MIN_GRACE_S = 60.0  # the default grace; a probe only ever raises it


class InitError(GitresearchError):
    pass


def init_repo(directory: Path, template: str | None = None, commit: bool | None = None,
              probe: bool = False, ask: Callable[[str], bool] | None = None,
              workflow: bool = False) -> Iterator[str]:
    """Yields what it did, a line per step, as it goes. `commit`: True commits the toml (and
    the workflow), False leaves them, None asks through `ask` (no `ask`: leaves them, and says
    how to go on). `workflow`: install the research workflow (WORKFLOW_FILE)."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / ".git").exists():
        create_repo(directory)
        yield f"initialised a git repository in {directory}"
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
        yield f"copied the {template} template and committed it"
    if not (directory / "train.py").exists():
        raise InitError(f"{directory} has no train.py: gitresearch researches a train.py")
    store = Store(directory)
    yield install_hook(store)
    store.show_notes_in_log()
    yield f"plain `git log` now shows {NOTES_REF} and {VERIFY_REF}"

    toml = directory / CONFIG_FILE
    if toml.exists():
        yield f"1. {CONFIG_FILE} is there already: kept as it is"
    else:
        toml.write_text(reference_toml())
        yield f"1. wrote {CONFIG_FILE}: every key with its default, most commented out (docs/adopting.md)"
    if probe:
        yield from probe_grace(store, toml)
    if workflow:
        yield install_workflow(directory)

    pending = [p for p in (CONFIG_FILE, *([WORKFLOW_FILE] if workflow else [])) if uncommitted(directory, p)]
    if pending:
        names = " and ".join(pending)
        if commit is None and ask is not None:
            commit = ask(f"commit {names} now, so that best and every experiment hold it?")
        if not commit:
            yield (f"2. {names} {'is' if len(pending) == 1 else 'are'} not committed: commit "
                   f"(`git add {' '.join(pending)} && git commit`), "
                   f"then run `gitresearch init` again to create best at that commit")
            return
        head = commit_paths(directory, pending, f"gitresearch: add {names}")
        yield f"2. committed {names} as {head[:12]}"
    else:
        yield f"2. {CONFIG_FILE} is committed"
    yield create_best(store)


def install_workflow(directory: Path) -> str:
    """Write the research workflow (self-hosted GPU runners) unless one is there already."""
    dest = directory / WORKFLOW_FILE
    template = workflow_template().read_text()
    if dest.exists():
        same = dest.read_text() == template
        return f"{WORKFLOW_FILE} is there already: kept as it is{'' if same else ' (it differs from this version)'}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(template)
    return (f"wrote {WORKFLOW_FILE}: register self-hosted runners labelled gpu and h100 (or edit runs-on), "
            f"push it, then dispatch it from the Actions tab (docs/fleet.md)")


def install_hook(store: Store) -> str:
    hook = store.git_dir / "hooks" / "pre-commit"
    if hook.exists() and HOOK_MARK not in hook.read_text(errors="replace"):
        return f"left your own {hook} in place: frozen files are still checked by the runner"
    hook.parent.mkdir(exist_ok=True)
    # the interpreter that runs gitresearch reads the toml: the system python3 (maybe 3.10
    # without tomli) does not matter
    body = (resource("hooks") / "pre-commit").read_text().split("\n", 1)[1]
    hook.write_text(f"#!{sys.executable}\n{body}")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return f"installed the frozen-file hook {hook} (run by {sys.executable})"


def create_best(store: Store) -> str:
    """Step 3: best at HEAD, which must hold train.py; a best left behind HEAD by an earlier
    init (before the toml was committed) moves up while no experiment has run from it."""
    try:
        head = store.resolve("HEAD")
    except GitError:
        raise InitError("the repo has no commit yet: commit train.py (your baseline), then run "
                        "`gitresearch init` again") from None
    try:
        store.read_file(head, "train.py")
    except GitError:
        raise InitError(f"HEAD {head[:12]} does not hold train.py: commit your baseline, then run "
                        f"`gitresearch init` again") from None
    best = store.best()
    if best is None:
        store.create_best(head)
        return f"3. created best at {head[:12]} (the commit that holds {CONFIG_FILE})"
    if best == head:
        return f"3. best is at {head[:12]} already"
    if store.experiment_commit(0) is None and store.is_ancestor(best, head):
        store.set_best(best, head, "gitresearch init: best moves to the committed config")
        return f"3. moved best from {best[:12]} to {head[:12]} (no experiment yet)"
    return f"3. best stays at {best[:12]}: experiments already ran from it"


def probe_grace(store: Store, toml: Path) -> Iterator[str]:
    """One timed run of HEAD (through the runner, as the loop runs it): the wall seconds past
    the budget (start-up, compilation, the script's own final evaluation) give a grace_s."""
    config = load(store.root)
    run_dir = store.state_dir / "runs" / "probe"
    yield f"probe: one run of HEAD with the {config.run.budget_s:g} s budget ..."
    if config.run.setup:
        with store.worktree(store.resolve("HEAD"), exclude=config.files.editable) as work:
            run_setup(work, config, run_dir / "setup.log")
    result = run_commit(store, config, store.resolve("HEAD"), run_dir)
    over = max(0.0, result.seconds - (result.training_seconds or config.run.budget_s))
    startup = f", first progress line after {result.first_output_s:.1f} s" if result.first_output_s else ""
    suggested = max(MIN_GRACE_S, 10 * math.ceil(2 * over / 10))
    yield (f"probe: {result.status} in {result.seconds:.1f} s wall for {config.run.budget_s:g} s of budget "
           f"({over:.1f} s past the training time{startup}); suggested grace_s = {suggested:g}")
    text = toml.read_text()
    spelled = f"grace_s = {suggested:g}  # probed by init: {over:.1f} s past the budget, x2"
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if line.lstrip("# ").startswith("grace_s =")), None)
    if at is not None and suggested > config.run.grace_s:
        lines[at] = spelled
        toml.write_text("\n".join(lines) + "\n")
        yield f"probe: set {spelled.split('  #')[0]} in {CONFIG_FILE}"
