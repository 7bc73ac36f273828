"""Prompt build time on a repo with many experiments (issue 5: at most 0.5 s for 1,000).

    python benchmarks/prompt_speed.py                       # 1000 experiments
    python benchmarks/prompt_speed.py --experiments 200 --json

Makes a throw-away research repo from the bundled target (its real train.py, AGENDA.md and
gitresearch.toml) holding N experiments: each a real commit of a one-constant diff of
train.py with a note like the loop writes (status mix of keeps, discards, early stops,
crashes and invalids; early-stop checks; a 1,500-character log tail), `best` moved on each
keep. Then it times, from a fresh Store each time (nothing cached), what the LLM policy does
before asking the model: read the experiments from git, build the state (history window,
best chain, diagnostics, the tried-diff set, the agenda, the code) and build the prompt
within [llm] context_tokens (16,384 by default; tokens estimated as the openai backend does).

Output: a table on stdout, or with --json one object:
{"experiments", "repeats", "median_s", "max_s", "prompt_tokens", "history_shown"}.
Exit status 0 when the median is at most --limit (default 0.5 s), 1 otherwise.
"""
import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.history import build_state
from gitresearch.policies.backends import estimate_tokens
from gitresearch.policies.prompt import build_prompt
from pysource import set_constant

TARGET = Path(__file__).resolve().parents[1] / "target_repo"
STATUSES = ["discard"] * 5 + ["early_stop"] * 4 + ["keep", "crash", "invalid"]


def make_repo(root: Path, n: int, seed: int = 0) -> Store:
    shutil.copytree(TARGET, root, ignore=shutil.ignore_patterns("data"))
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@x", "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "baseline"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, env=env)
    store = Store(root)
    store.create_best(store.resolve("HEAD"))
    store.set_baseline(store.best())
    store.write_note(store.best(), {"experiment": 0, "status": "baseline", "val_bpb": 2.05,
                                    "noise_std": 0.007, "min_delta": 0.014, "seconds": 72.0})
    rng, value = random.Random(seed), 2.05
    tail = "\n".join(f"step {i:05d} (99.0%) | loss: 2.345678 | lrm: 0.10 | dt: 250ms" for i in range(25))[-1500:]
    for i in range(1, n + 1):
        best = store.best()
        source = store.read_file(best, "train.py")
        new = set_constant(source, "MATRIX_LR", f"{rng.uniform(0.001, 0.02):.5f}")
        tree, _ = store.apply_diff(best, store.make_diff("train.py", source, new))
        number, commit = store.create_experiment(best, tree, f"MATRIX_LR sweep {i}", "random")
        status = rng.choice(STATUSES)
        metric = None if status in ("crash", "invalid", "early_stop") else value + rng.uniform(0.0, 0.1)
        if status == "keep":
            metric = value = value - 0.002
        checks = [{"t": 6.0 * k, "mean": 2.1, "sd": 0.01, "low": 2.08, "high": 2.12, "llr": -1.0,
                   "decision": "continue"} for k in range(8)]
        store.write_note(commit, {"experiment": number, "status": status, "val_bpb": metric,
                                  "delta": None if metric is None else metric - 2.05,
                                  "description": f"MATRIX_LR sweep {i}", "seconds": 72.0,
                                  "peak_memory_mb": 812.0, "comment": "ran to the end at 54 s",
                                  "checks": checks, "log_tail": tail, "diff_sha": f"{i:016x}",
                                  "reason": "crashed: CUDA error" if status == "crash" else ""})
        if status == "keep":
            store.advance_best(best, commit, f"keep #{number}")
    return store


def time_prompt(root: Path) -> tuple[float, object]:
    started = time.perf_counter()
    store = Store(root)
    config = load(root)
    state, _ = build_state(store, config, store.experiments())
    prompt = build_prompt(state, estimate_tokens, config.llm.context_tokens, config.llm.max_tokens)
    return time.perf_counter() - started, prompt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--limit", type=float, default=0.5, help="seconds allowed for the median")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gitresearch-prompt-") as tmp:
        root = Path(tmp) / "repo"
        made = time.perf_counter()
        make_repo(root, args.experiments)
        made = time.perf_counter() - made
        times, prompt = [], None
        for _ in range(args.repeats):
            seconds, prompt = time_prompt(root)
            times.append(seconds)
    result = {"experiments": args.experiments, "repeats": args.repeats,
              "median_s": round(statistics.median(times), 4), "max_s": round(max(times), 4),
              "prompt_tokens": prompt.tokens, "history_shown": prompt.history_shown}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"repo with {args.experiments} experiments built in {made:.1f} s")
        for key, value in result.items():
            print(f"{key:>16}: {value}")
    return 0 if result["median_s"] <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
