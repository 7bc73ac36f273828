"""What trusting the result costs: the sandbox per run, and the bundled target's evaluation.

    python benchmarks/sandbox_cost.py                 # 15 pairs, 10 s target run
    python benchmarks/sandbox_cost.py --pairs 30 --json

1. Sandbox: the runner's production path (`runner.run_training`) on a train.py that prints
   its metric at once, interleaved in rounds (so machine drift cancels): `bwrap` (the sandbox),
   `none` (`--no-sandbox`: still a network namespace by `unshare`, the former default) and
   `bare` (no namespace at all). Cost = median over rounds of (bwrap s - other s).
2. Evaluation of the bundled target on this machine: a real run of the nanochat target through
   `trial.run_commit` (training in the sandbox, then the frozen evaluator in a fresh sandbox),
   and, on the same model, the former in-process figure: `prepare.evaluate_bpb` timed in this
   process, plus the one-off cost of `prepare.save_model` (torch.export) at the end of training.

Output: a table on stdout, or with --json one object per line:
{"kind": "sandbox", "pairs", "median_bwrap_s", "median_none_s", "median_bare_s",
 "median_cost_vs_none_s", "p90_cost_vs_none_s", "median_cost_vs_bare_s", "p90_cost_vs_bare_s"}
{"kind": "evaluation", "budget_s", "steps", "val_bpb", "evaluator_s", "export_s",
 "in_process_eval_s", "sandbox"}
Exit status 0 when the sandbox's median cost over a bare process is at most --limit
(default 0.2 s), 1 otherwise.
"""
import argparse
import contextlib
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
from gitresearch.trial import run_commit  # noqa: E402
from gitresearch.runner import run_training  # noqa: E402

INSTANT = 'print("---")\nprint("val_bpb: 1.000000")\n'


def sandbox_cost(pairs: int, workdir: Path) -> dict:
    work = workdir / "instant"
    work.mkdir()
    (work / "train.py").write_text(INSTANT)
    base = config_module.Config()
    configs = {"bwrap": base, "none": replace(base, sandbox=replace(base.sandbox, mode="none")),
               "bare": replace(base, sandbox=replace(base.sandbox, mode="none"),
                               run=replace(base.run, isolate_network=False))}
    seconds = {name: [] for name in configs}
    for i in range(pairs + 1):  # the first round warms caches and is dropped
        for name in list(configs)[i % 3:] + list(configs)[:i % 3]:
            start = time.perf_counter()
            result = run_training(work, configs[name], workdir / "log.txt", workdir / "metrics.jsonl")
            elapsed = time.perf_counter() - start
            if result.status != "ok":
                raise SystemExit(f"instant run failed under {name}: {result.reason}")
            if i:
                seconds[name].append(elapsed)
    row = {"kind": "sandbox", "pairs": pairs}
    for name in configs:
        row[f"median_{name}_s"] = round(statistics.median(seconds[name]), 4)
    for other in ("none", "bare"):
        costs = sorted(b - n for b, n in zip(seconds["bwrap"], seconds[other]))
        row[f"median_cost_vs_{other}_s"] = round(statistics.median(costs), 4)
        row[f"p90_cost_vs_{other}_s"] = round(costs[int(0.9 * (len(costs) - 1))], 4)
    return row


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
    with contextlib.redirect_stdout(sys.stderr):
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
    return 0 if rows[0]["median_cost_vs_bare_s"] <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
