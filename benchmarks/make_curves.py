"""Records a learning-curve corpus from the bundled target, for replaying the self-evaluation.

    python benchmarks/make_curves.py --out benchmarks/data/nanochat_cpu.jsonl             # 64 runs
    python benchmarks/make_curves.py --runs 8 --budget 20 --parallel 2 --out /tmp/c.jsonl

Each run copies target_repo/, rewrites some module-level constants of train.py (a config
sampled with a fixed seed: Muon learning rate over two orders of magnitude, embedding and
head rates, depth, width, batch size, with and without gradient clipping, and a few settings
meant to diverge), runs it for --budget training seconds and records every
GITRESEARCH_METRICS point. Runs go --parallel at a time with OMP_NUM_THREADS split between them.

Output: one JSON object per run and line, the curve-corpus format that
`gitresearch bench early-stop --curves FILE` replays:
{"id": str, "budget_s": float, "points": [[t_seconds, val_bpb], ...], "final": float | null,
 "status": "ok" | "diverged" | "crash", "config": {constant: value}}
`final` is the run's val_bpb as the frozen evaluate.py measures it on the saved model; the
points are train.py's cheap periodic estimates (on held-out train tokens since the
evaluator took over; on the first validation tokens in corpora recorded before).
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from target_eval import evaluated_val_bpb

from pysource import set_constant

TARGET = Path(__file__).resolve().parents[1] / "target_repo"


def sample_configs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    configs = [{}]  # the baseline itself
    configs += [{"MATRIX_LR": lr} for lr in (0.0005, 0.0015, 0.015, 0.05)]
    configs += [{"EMBED_LR": 30.0, "HEAD_LR": 0.5, "GRAD_CLIP": 1e9},  # meant to diverge
                {"MATRIX_LR": 0.5, "EMBED_LR": 20.0, "GRAD_CLIP": 1e9, "WARMDOWN_FRAC": 0.0},
                {"HEAD_LR": 2.0, "GRAD_CLIP": 1e9}]
    while len(configs) < n:
        config = {
            "MATRIX_LR": round(math.exp(rng.uniform(math.log(5e-4), math.log(5e-2))), 5),
            "EMBED_LR": round(math.exp(rng.uniform(math.log(0.02), math.log(2.0))), 4),
            "HEAD_LR": round(math.exp(rng.uniform(math.log(4e-4), math.log(4e-2))), 5),
            "DEPTH": rng.choice([1, 2, 3, 4, 6]),
            "WIDTH": rng.choice([64, 128, 192]),
            "BATCH_SIZE": rng.choice([4, 8, 16, 32]),
            "GRAD_CLIP": rng.choice([1.0, 0.5, 1e9]),  # 1e9: no clipping
        }
        if rng.random() < 0.08:  # occasionally push a learning rate far too high
            config["EMBED_LR"] = round(config["EMBED_LR"] * 40, 3)
            config["GRAD_CLIP"] = 1e9
        configs.append(config)
    return configs[:n]


def run_config(index: int, config: dict, budget: float, threads: int, cache: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="gitresearch-curve-") as tmp:
        work = Path(tmp) / "target"
        shutil.copytree(TARGET, work)
        train = work / "train.py"
        source = train.read_text()
        for name, value in config.items():
            source = set_constant(source, name, repr(value).replace("{}", "{{}}"))
        train.write_text(source)
        metrics = Path(tmp) / "metrics.jsonl"
        env = dict(os.environ, GITRESEARCH_BUDGET_S=str(budget), GITRESEARCH_METRICS=str(metrics),
                   NANOCHAT_CACHE_DIR=cache, OMP_NUM_THREADS=str(threads),
                   GITRESEARCH_ARTIFACTS=str(Path(tmp) / "artifacts"))
        proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=budget * 4 + 120)
        points = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        # the final value is the evaluator's (older corpora: the point marked "final")
        final = evaluated_val_bpb(work, env) if proc.returncode == 0 else None
    status = "ok" if proc.returncode == 0 and final is not None else (
        "diverged" if "diverged" in proc.stdout else "crash")
    curve = [[p["t"], p["val_bpb"]] for p in points if not p.get("final") and "val_bpb" in p]
    return {"id": f"nanochat-cpu-{index:03d}", "budget_s": budget, "points": curve,
            "final": final, "status": status, "config": config}


def main() -> int:
    parser = argparse.ArgumentParser(description="record a learning-curve corpus")
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--budget", type=float, default=40.0, help="training seconds per run")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache", default=os.environ.get("NANOCHAT_CACHE_DIR",
                        str(Path(tempfile.gettempdir()) / "gitresearch-bench-cache")))
    args = parser.parse_args()
    subprocess.run([sys.executable, "prepare.py"], cwd=TARGET, check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, NANOCHAT_CACHE_DIR=args.cache))
    configs = sample_configs(args.runs, args.seed)
    done = set()
    out = Path(args.out)
    if out.exists():  # resume an interrupted recording
        done = {json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()}
    out.parent.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 2) // args.parallel)
    todo = [(i, c) for i, c in enumerate(configs) if f"nanochat-cpu-{i:03d}" not in done]
    with ThreadPoolExecutor(args.parallel) as pool, open(out, "a") as f:
        futures = [pool.submit(run_config, i, c, args.budget, threads, args.cache) for i, c in todo]
        for future in futures:
            record = future.result()
            f.write(json.dumps(record) + "\n")
            f.flush()
            print(f"{record['id']} {record['status']:>8} final={record['final']} "
                  f"points={len(record['points'])} {record['config']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
