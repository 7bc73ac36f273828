"""`gitresearch bisect-run`: the test command of `git bisect run`, to find which commit
brought a gain.

    base=$(git rev-parse refs/gitresearch/experiments/000000)
    git bisect start --first-parent --term-old=worse --term-new=better best "$base"
    git bisect run gitresearch bisect-run --threshold 2.01   # [--rerun] to train each commit
    git bisect reset

A commit is `better` (exit 1, the new term) when its val_bpb is at or below the threshold,
`worse` (exit 0, the old term) above it. The value is the commit's note; with --rerun the
commit is trained under the budget instead. The default threshold is halfway between the
baseline's val_bpb and best's. A commit with no value (no note, a crash, a timeout, an early
stop, an invalid proposal) exits 125, which makes git skip it; so does any error. Nothing exits
128 or above, which would abort the bisect.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from .config import Config
from .gitstore import Store

WORSE, BETTER, SKIP = 0, 1, 125


def default_threshold(store: Store) -> float | None:
    values = []
    for commit in (store.experiment_commit(0), store.best()):
        value = (store.read_note(commit) or {}).get("val_bpb") if commit else None
        if not isinstance(value, (int, float)):
            return None
        values.append(value)
    return sum(values) / 2


def measure(store: Store, config: Config, commit: str, rerun: bool) -> tuple[float | None, str]:
    """(val_bpb, how it was found) of `commit`; None when it has none."""
    if rerun:
        from .trial import run_commit

        (store.state_dir / "worktrees").mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gitresearch-bisect-") as tmp:
            result = run_commit(store, config, commit, Path(tmp))
        if result.status != "ok":
            return None, f"rerun {result.status}: {result.reason}"
        return result.metric, "rerun"
    record = store.read_note(commit)
    if record is None:
        return None, "no gitresearch note (use --rerun to train it)"
    value = record.get("val_bpb")
    if not isinstance(value, (int, float)):
        return None, f"note status {record.get('status')}: no {config.metric.name}"
    return value, f"note ({record.get('status')})"


def bisect_run(store: Store, config: Config, threshold: float | None, rerun: bool,
               rev: str = "HEAD") -> tuple[int, str]:
    """(exit code, one line saying why) for the commit under test."""
    commit = store.resolve(rev)
    if threshold is None:
        threshold = default_threshold(store)
        if threshold is None:
            return SKIP, f"no threshold: give --threshold (the baseline or best has no {config.metric.name})"
    value, source = measure(store, config, commit, rerun)
    if value is None:
        return SKIP, f"{commit[:12]}: skip, {source}"
    code = BETTER if value <= threshold else WORSE
    word = "better" if code == BETTER else "worse"
    return code, f"{commit[:12]}: {word}, {config.metric.name} {value:.6f} from {source} vs threshold {threshold:.6f}"
