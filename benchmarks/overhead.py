"""Harness overhead per experiment: seconds spent outside the training process.

    python benchmarks/overhead.py                  # 40 experiments
    python benchmarks/overhead.py --experiments 100 --json

Makes a throw-away research repo whose train.py prints its metric at once, runs
`gitresearch loop --policy random` on it, and reads the notes back. Each note records
`finished` (wall clock, just before the note is written) and `seconds` (the training
process's wall time, spawn to exit). For consecutive experiments,
overhead = (finished_i - finished_{i-1}) - seconds_i: proposing, validating, committing,
the worktree, the frozen-file hashes, process clean-up, the note and the best move.

Output: a table on stdout, or with --json one object:
{"experiments", "median_overhead_s", "p90_overhead_s", "max_overhead_s", "median_process_s"}.
Exit status 0 when the median overhead is at most --limit (default 0.3 s), 1 otherwise.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TRAIN = '''\
LR = 0.1  # learning rate
DEPTH = 4  # layers
WIDTH = 128  # channels
import math
print("---")
print(f"val_bpb: {2 + (math.log10(LR) + 2) ** 2 + abs(DEPTH - 6) / 10 + abs(WIDTH - 200) / 1000:.6f}")
'''
CONFIG = 'schema = 1\n[run]\nbudget_s = 5\n[files]\neditable = ["train.py"]\n[noise]\nnoise_runs = 1\n'


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="harness overhead per experiment")
    parser.add_argument("--experiments", type=int, default=40)
    parser.add_argument("--limit", type=float, default=0.3, help="pass/fail bound, seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gitresearch-overhead-") as tmp:
        repo = Path(tmp)
        (repo / "train.py").write_text(TRAIN)
        (repo / "gitresearch.toml").write_text(CONFIG)
        git("init", "-q", cwd=repo)
        git("add", "-A", cwd=repo)
        git("-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "base", cwd=repo)
        gr = [sys.executable, "-m", "gitresearch"]
        subprocess.run([*gr, "init"], cwd=repo, check=True, capture_output=True)
        subprocess.run([*gr, "loop", "--max-experiments", str(args.experiments), "--seed", "0"],
                       cwd=repo, check=True, capture_output=True)
        from gitresearch.gitstore import Store

        notes = sorted((e.record for e in Store(repo).experiments() if e.record and e.number > 0),
                       key=lambda r: r["experiment"])
    overheads = [b["finished"] - a["finished"] - b["seconds"] for a, b in zip(notes, notes[1:])]
    overheads.sort()
    result = {"experiments": len(notes), "median_overhead_s": round(statistics.median(overheads), 4),
              "p90_overhead_s": round(overheads[int(0.9 * (len(overheads) - 1))], 4),
              "max_overhead_s": round(overheads[-1], 4),
              "median_process_s": round(statistics.median(n["seconds"] for n in notes), 4)}
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")
    return 0 if result["median_overhead_s"] <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
