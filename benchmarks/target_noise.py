"""
Noise floor and sensitivity of the bundled target (target_repo/), measured on this machine.

    python benchmarks/target_noise.py                       # 5 baseline runs + 3 variants, 60 s each
    python benchmarks/target_noise.py --budget 20 --repeats 3 --out results.jsonl

Each run copies target_repo/ into a temporary folder, rewrites one module-level constant of
train.py (the variants below), and runs `python train.py` with GITRESEARCH_BUDGET_S and
GITRESEARCH_METRICS set. The data cache is prepared once first and not timed.

Output (stdout, and appended to --out when given), one JSON object per line:
- a run:     {"kind": "run", "variant", "repeat", "val_bpb", "val_bpb_step0", "ratio_to_step0",
              "steps", "training_seconds", "wall_seconds", "peak_memory_mb"}
- the noise: {"kind": "noise", "runs", "mean", "std"}            (std: sample std, ddof=1)
- a variant: {"kind": "sensitivity", "variant", "val_bpb", "delta", "delta_in_std", "over_3_std"}
Then a human-readable table on stderr. Exit status 0 when every variant moves val_bpb by more
than 3 standard deviations and every baseline run ends at most 0.6 x its step-0 val_bpb
within 100 s of wall time (the acceptance of the target issue), 1 otherwise.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from target_eval import evaluated_val_bpb

from pysource import set_constant

TARGET = Path(__file__).resolve().parents[1] / "target_repo"
VARIANTS = {  # name -> (constant, expression applied to its baseline value)
    "lr_x3": ("MATRIX_LR", "({}) * 3"),
    "lr_div3": ("MATRIX_LR", "({}) / 3"),
    "half_depth": ("DEPTH", "({}) // 2"),
}


def run_once(variant: str, repeat: int, budget: float, cache: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="gitresearch-bench-") as tmp:
        work = Path(tmp) / "target"
        shutil.copytree(TARGET, work)
        if variant != "baseline":
            name, template = VARIANTS[variant]
            train = work / "train.py"
            train.write_text(set_constant(train.read_text(), name, template))
        metrics = Path(tmp) / "metrics.jsonl"
        env = dict(os.environ, GITRESEARCH_BUDGET_S=str(budget), GITRESEARCH_METRICS=str(metrics),
                   NANOCHAT_CACHE_DIR=cache, GITRESEARCH_ARTIFACTS=str(Path(tmp) / "artifacts"))
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{variant} run {repeat}: train.py exited {proc.returncode}\n"
                               f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        summary = dict(re.findall(r"^(\w+):\s+([-\d.]+)$", proc.stdout, flags=re.M))
        points = [json.loads(line) for line in metrics.read_text().splitlines()]
        val_bpb = evaluated_val_bpb(work, env)
    if val_bpb is None:
        raise RuntimeError(f"{variant} run {repeat}: the evaluator gave no val_bpb")
    step0 = next(p["val_bpb"] for p in points if p["step"] == 0)
    return {"kind": "run", "variant": variant, "repeat": repeat, "val_bpb": val_bpb,
            "val_bpb_step0": step0, "ratio_to_step0": val_bpb / step0,
            "steps": int(summary["num_steps"]), "training_seconds": float(summary["training_seconds"]),
            "wall_seconds": round(wall, 1), "peak_memory_mb": float(summary["peak_vram_mb"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--budget", type=float, default=60.0, help="training seconds per run")
    parser.add_argument("--repeats", type=int, default=5, help="baseline runs for the noise floor")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    parser.add_argument("--cache", default=os.environ.get("NANOCHAT_CACHE_DIR",
                        str(Path(tempfile.gettempdir()) / "gitresearch-bench-cache")))
    args = parser.parse_args()
    subprocess.run([sys.executable, "prepare.py"], cwd=TARGET, check=True,
                   env=dict(os.environ, NANOCHAT_CACHE_DIR=args.cache), stdout=subprocess.DEVNULL)
    out = open(args.out, "a") if args.out else None

    def emit(record):
        line = json.dumps(record)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    base = []
    for i in range(args.repeats):
        base.append(run_once("baseline", i, args.budget, args.cache))
        emit(base[-1])
    values = [r["val_bpb"] for r in base]
    mean, std = statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0
    emit({"kind": "noise", "runs": len(values), "mean": mean, "std": std})
    ok = all(r["ratio_to_step0"] <= 0.6 and r["wall_seconds"] <= args.budget + 40 for r in base)
    rows = []
    for variant in VARIANTS:
        run = run_once(variant, 0, args.budget, args.cache)
        emit(run)
        delta = run["val_bpb"] - mean
        in_std = abs(delta) / std if std > 0 else float("inf")
        emit({"kind": "sensitivity", "variant": variant, "val_bpb": run["val_bpb"],
              "delta": delta, "delta_in_std": in_std, "over_3_std": in_std > 3})
        rows.append((variant, run["val_bpb"], delta, in_std))
        ok &= in_std > 3
    print(f"\nbaseline x{len(values)}: val_bpb {mean:.4f} +- {std:.4f} (std), "
          f"ratio to step 0 <= {max(r['ratio_to_step0'] for r in base):.3f}, "
          f"wall <= {max(r['wall_seconds'] for r in base):.0f}s", file=sys.stderr)
    for variant, bpb, delta, in_std in rows:
        print(f"{variant:>11}: val_bpb {bpb:.4f}  delta {delta:+.4f}  = {in_std:.1f} std",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
