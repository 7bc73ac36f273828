"""What trusting the result costs: the sandbox per run, and the bundled target's evaluation.

    python benchmarks/sandbox_cost.py                 # 15 pairs, 10 s target run
    python benchmarks/sandbox_cost.py --pairs 30 --json

1. Sandbox: the runner's production path (`runner.run_training`) on a train.py that prints
   its metric at once, with `[sandbox] mode = "bwrap"` and `"none"` interleaved in pairs (so
   machine drift cancels). Cost = median over pairs of (sandboxed wall s - unsandboxed wall s).
2. Evaluation of the bundled target on this machine: a real run of the nanochat target through
   `loop.run_commit` (training in the sandbox, then the frozen evaluator in a fresh sandbox),
   and, on the same model, the former in-process figure: `prepare.evaluate_bpb` timed in this
   process, plus the one-off cost of `prepare.save_model` (torch.export) at the end of training.

Output: a table on stdout, or with --json one object per line:
{"kind": "sandbox", "pairs", "median_bwrap_s", "median_none_s", "median_cost_s", "p90_cost_s"}
{"kind": "evaluation", "budget_s", "steps", "val_bpb", "evaluator_s", "export_s",
 "in_process_eval_s", "sandbox"}
Exit status 0 when the sandbox's median cost is at most --limit (default 0.2 s), 1 otherwise.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gitresearch import config as config_module  # noqa: E402
from gitresearch.gitstore import Store  # noqa: E402
from gitresearch.loop import run_commit  # noqa: E402
from gitresearch.runner import run_training  # noqa: E402

INSTANT = 'print("---")\nprint("val_bpb: 1.000000")\n'


def sandbox_cost(pairs: int, workdir: Path) -> dict:
    work = workdir / "instant"
    work.mkdir()
    (work / "train.py").write_text(INSTANT)
    base = config_module.Config()
    seconds = {"bwrap": [], "none": []}
    for i in range(pairs + 1):  # the first pair warms caches and is dropped
        for mode in ("bwrap", "none") if i % 2 else ("none", "bwrap"):
            config = replace(base, sandbox=replace(base.sandbox, mode=mode))
            start = time.perf_counter()
            result = run_training(work, config, workdir / "log.txt", workdir / "metrics.jsonl")
            elapsed = time.perf_counter() - start
            if result.status != "ok" or result.sandbox != mode:
                raise SystemExit(f"instant run failed under {mode}: {result.reason}")
            if i:
                seconds[mode].append(elapsed)
    costs = sorted(b - n for b, n in zip(seconds["bwrap"], seconds["none"]))
    return {"kind": "sandbox", "pairs": pairs, "median_bwrap_s": round(statistics.median(seconds["bwrap"]), 4),
            "median_none_s": round(statistics.median(seconds["none"]), 4),
            "median_cost_s": round(statistics.median(costs), 4),
            "p90_cost_s": round(costs[int(0.9 * (len(costs) - 1))], 4)}


def evaluation_cost(budget: float, workdir: Path) -> dict:
    repo = workdir / "research"
    shutil.copytree(ROOT / "target_repo", repo)
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@x", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@x")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "target"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env)
    subprocess.run([sys.executable, str(repo / "prepare.py")], check=True, capture_output=True)
    config = config_module.load(repo, {"run.budget_s": budget})
    store = Store(repo)
    (store.state_dir / "worktrees").mkdir(exist_ok=True)
    commit = store.resolve("HEAD")
    result = run_commit(store, config, commit, workdir / "run")
    if result.status != "ok":
        raise SystemExit(f"the target run failed: {result.reason}\n{result.log_tail}")
    # The former in-process figure and the export, on a model of the same configuration.
    sys.path.insert(0, str(repo))
    os.environ["GITRESEARCH_BUDGET_S"] = "1000"
    os.environ["GITRESEARCH_ARTIFACTS"] = str(workdir / "artifacts")
    os.environ.pop("GITRESEARCH_METRICS", None)
    import prepare
    import train
    model = train.main(max_steps=2)  # includes one save_model; timed again below
    start = time.perf_counter()
    prepare.save_model(model)
    export_s = time.perf_counter() - start
    val, token_bytes = prepare.load_val()
    start = time.perf_counter()
    prepare.evaluate_bpb(model, val, token_bytes)
    in_process = time.perf_counter() - start
    return {"kind": "evaluation", "budget_s": budget, "steps": result.summary.get("num_steps"),
            "val_bpb": result.metric, "evaluator_s": result.evaluation["seconds"],
            "export_s": round(export_s, 3), "in_process_eval_s": round(in_process, 3),
            "sandbox": result.sandbox}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--budget", type=float, default=10.0, help="training seconds of the target run")
    parser.add_argument("--limit", type=float, default=0.2, help="bound on the sandbox's median cost (s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gitresearch-sandbox-bench-") as tmp:
        rows = [sandbox_cost(args.pairs, Path(tmp)), evaluation_cost(args.budget, Path(tmp))]
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
    return 0 if rows[0]["median_cost_s"] <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
