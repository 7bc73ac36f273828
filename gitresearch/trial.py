"""Running one commit: a fresh checkout, training in it, then (where the config names an
evaluator) the frozen evaluation; and the note fields a run gives."""
from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Callable

from .config import Config
from .gitstore import Store
from .runner import RunResult, run_evaluation, run_training


def run_seed_env(store: Store, config: Config, run_dir: Path) -> dict:
    """GITRESEARCH_SEED for a loop's run when the loop has a seed ([policy] seed, `--seed`):
    a hash of that seed and the run's slot (its folder under the state's runs/: experiment 12's
    screen run, its second confirmation pair's candidate, baseline run 3). Every run of a loop
    gets its own seed, and two loops with the same seed give the same slot the same seed, so
    two policies compared on one seed meet the same run-to-run noise (common random numbers).
    A resumed run keeps its slot's seed. Without a loop seed, or outside an experiment's runs
    (`verify`'s re-runs, which must be fresh each time it is asked, bisect's, `run`'s), none
    is set and train.py draws its own."""
    runs = store.state_dir / "runs"
    if config.policy.seed is None or not run_dir.is_relative_to(runs):
        return {}
    slot = run_dir.relative_to(runs)
    if not slot.parts or not slot.parts[0].isdigit():  # not under an experiment's number
        return {}
    digest = hashlib.sha256(f"{config.policy.seed}:{slot.as_posix()}".encode()).digest()
    return {"GITRESEARCH_SEED": str(int.from_bytes(digest[:4], "big") >> 1)}  # 0 .. 2**31 - 1


def run_commit(store: Store, config: Config, commit: str, run_dir: Path,
               on_progress: Callable | None = None, stop_event: threading.Event | None = None,
               should_stop: Callable | None = None, env_extra: dict | None = None) -> RunResult:
    """Check `commit` out into a fresh folder, train it there, then (where the config names an
    evaluator) evaluate its artifact over a fresh checkout of the frozen files alone."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env_extra = {**(env_extra or {}), **run_seed_env(store, config, run_dir)}
    with store.worktree(commit, exclude=config.files.hidden) as work:
        compile_cache = store.state_dir / "compile-cache"
        compile_cache.mkdir(exist_ok=True)
        result = run_training(work, config, run_dir / "log.txt", run_dir / "metrics.jsonl",
                              on_progress=on_progress, stop_event=stop_event, should_stop=should_stop,
                              env_extra=env_extra, compile_cache=compile_cache)
    try:
        if result.status == "ok" and config.metric.evaluate:
            if on_progress:
                on_progress({"phase": "evaluating", "elapsed": config.run.budget_s, "budget": config.run.budget_s,
                             "step": result.steps, "metric": None,
                             "train_loss": result.curve[-1]["train_loss"] if result.curve else None})
            with store.worktree(commit, exclude=config.files.editable) as frozen:
                result = run_evaluation(result, frozen, config, run_dir / "evaluate.log", env_extra)
    finally:
        shutil.rmtree(run_dir / "out", ignore_errors=True)  # the artifacts: only the verdict is kept
    return result


def result_fields(result: RunResult, store: Store, metric: str = "val_bpb") -> dict:
    """A run's note fields. The metric's value is stored under `val_bpb` whatever its name
    (note schema 1; old notes stay readable), and its name under `metric`."""
    log = os.path.relpath(result.log_path, store.git_dir)
    fields = {"sandbox": result.sandbox, "metric_source": result.metric_source, "metric": metric}
    if result.self_reported is not None:
        fields["self_reported"] = result.self_reported
    if result.evaluation:
        fields["evaluation"] = {"seconds": result.evaluation["seconds"],
                                "log": os.path.relpath(result.evaluation["log"], store.git_dir)}
    return {**fields, "val_bpb": result.metric, "reason": result.reason, "seconds": result.seconds,
            "training_seconds": result.training_seconds, "peak_memory_mb": result.peak_memory_mb,
            "exit_code": result.exit_code, "log": log, "log_tail": result.log_tail,
            "network_isolated": result.network_isolated, "steps": result.steps,
            "throughput": throughput(result)}


def throughput(result: RunResult) -> dict:
    """Steps and steps per training second, and tokens per second where the script prints
    them: a run far below its peers' rate ran on a loaded or changed machine."""
    seconds = result.training_seconds
    steps = result.steps
    return {"steps": steps, "tokens_per_s": result.tokens_per_s,
            "steps_per_s": round(steps / seconds, 4) if steps and seconds else None}
