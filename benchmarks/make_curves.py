"""Records a learning-curve corpus, for replaying early-stop methods.

    python benchmarks/make_curves.py --out benchmarks/data/nanochat_cpu.jsonl             # 64 runs
    python benchmarks/make_curves.py --runs 8 --budget 20 --parallel 2 --out /tmp/c.jsonl
    python benchmarks/make_curves.py --order climb --runs 72 --budget 20 --out F        # a search path
    python benchmarks/make_curves.py --target charlm --set MODEL=lstm --set DATA=stdlib \
        --order climb --runs 72 --budget 20 --out F

Targets: "nanochat" is the bundled target (its final value from the frozen evaluate.py);
"charlm" is benchmarks/charlm.py, a byte-level LSTM, GRU or MLP with Adam on the stdlib text or
a generated Markov text (its final value from its own last evaluation).

Orders: "random" samples every config up front (the first corpora). "climb" is a search path
as the loop walks it: each new run changes one or two settings of the best finished run by
one or two notches (15 % of runs: a fresh random config), so many runs beat the best so far,
which is what a false stop needs to be measured. A climb starts with --repeats runs of its
start config: repeated runs, from which the bench estimates the corpus's noise.

Each run copies target_repo/, rewrites some module-level constants of train.py (a config
sampled with a fixed seed: Muon learning rate over two orders of magnitude, embedding and
head rates, depth, width, batch size, with and without gradient clipping, and a few settings
meant to diverge), runs it for --budget training seconds and records every
GITRESEARCH_METRICS point. Runs go --parallel at a time with OMP_NUM_THREADS split between them.

Output: one JSON object per run and line, the curve-corpus format that
`gitresearch bench early-stop --curves FILE` replays:
{"id": str, "budget_s": float, "points": [[t_seconds, val_bpb], ...], "final": float | null,
 "status": "ok" | "diverged" | "crash", "config": {constant: value}, "steps": int | null}
(lines in the order the runs finished; "steps" is the training steps the run made, its
throughput, absent in the first corpora). With --curve train_loss the points are the training
loss of the progress lines, [t, loss] with t from the line's percent of the budget, and each
record has "source": "train_loss" (the bench maps them as the loop does).
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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from target_eval import evaluated_val_bpb

from pysource import set_constant

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from gitresearch import metrics as protocol  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "target_repo"
CHARLM = Path(__file__).resolve().parent / "charlm.py"

# The settings a climb changes, each an ordered list of values (a notch is one place), and
# where it starts: a deliberately untuned config, as a research repo's first train.py.
SPACES = {
    "nanochat": {
        "MATRIX_LR": [0.0005, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012, 0.02, 0.03, 0.05],
        "EMBED_LR": [0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 2.0, 8.0],
        "HEAD_LR": [0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.04],
        "DEPTH": [1, 2, 3, 4, 6],
        "WIDTH": [64, 128, 192],
        "BATCH_SIZE": [4, 8, 16, 32],
        "GRAD_CLIP": [0.5, 1.0, 1e9],
        "WARMDOWN_FRAC": [0.0, 0.2, 0.4, 0.6],
    },
    "charlm": {
        "LR": [0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.03, 0.06],
        "EMBED": [8, 16, 32, 64],
        "WIDTH": [32, 64, 128, 192, 256, 384],
        "LAYERS": [1, 2, 3],
        "CONTEXT": [8, 16, 32, 64, 128],
        "BATCH_SIZE": [4, 8, 16, 32, 64, 128],
        "ADAM_BETA2": [0.9, 0.99, 0.999],
        "DROPOUT": [0.0, 0.1, 0.25],
        "GRAD_CLIP": [0.25, 1.0, 1e9],
        "WARMDOWN_FRAC": [0.0, 0.2, 0.4, 0.6],
    },
}
STARTS = {
    "nanochat": {"MATRIX_LR": 0.001, "EMBED_LR": 0.05, "HEAD_LR": 0.001, "DEPTH": 2, "WIDTH": 64,
                 "BATCH_SIZE": 8, "GRAD_CLIP": 1.0, "WARMDOWN_FRAC": 0.0},
    "charlm": {"LR": 0.0002, "EMBED": 16, "WIDTH": 64, "LAYERS": 1, "CONTEXT": 16, "BATCH_SIZE": 8,
               "ADAM_BETA2": 0.999, "DROPOUT": 0.0, "GRAD_CLIP": 1.0, "WARMDOWN_FRAC": 0.0},
}
EXPLORE = 0.15  # share of climbing runs that start from a fresh random config


def climb_step(space: dict, best: dict, rng: random.Random) -> dict:
    """One or two settings of `best` moved by one or two notches (or a fresh random config)."""
    if rng.random() < EXPLORE:
        return {name: rng.choice(values) for name, values in space.items()}
    while True:
        config = dict(best)
        for name in rng.sample(sorted(space), rng.choice([1, 1, 2])):
            values = space[name]
            i = values.index(config[name]) + rng.choice([-2, -1, 1, 2])
            config[name] = values[min(max(i, 0), len(values) - 1)]
        if config != best:
            return config


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


def prepare(cache: str) -> None:
    """The bundled target's data cache (tokenised train and validation splits)."""
    subprocess.run([sys.executable, "prepare.py"], cwd=TARGET, check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, NANOCHAT_CACHE_DIR=cache))


def run_config(run_id: str, config: dict, args, threads: int, edit=None) -> dict:
    """One run of `config`; `edit(source) -> source` rewrites train.py instead of setting
    each constant of `config` by name."""
    with tempfile.TemporaryDirectory(prefix="gitresearch-curve-") as tmp:
        if args.target == "nanochat":
            work = Path(tmp) / "target"
            shutil.copytree(TARGET, work)
            train = work / "train.py"
        else:
            work = Path(tmp)
            train = work / "train.py"
            shutil.copy(CHARLM, train)
        source = train.read_text()
        for name, value in ({} if edit else {**args.fixed, **config}).items():
            source = set_constant(source, name, repr(value).replace("{}", "{{}}"))
        source = edit(source) if edit else source
        train.write_text(source)
        metrics = Path(tmp) / "metrics.jsonl"
        env = dict(os.environ, GITRESEARCH_BUDGET_S=str(args.budget), GITRESEARCH_METRICS=str(metrics),
                   NANOCHAT_CACHE_DIR=args.cache, OMP_NUM_THREADS=str(threads),
                   CHARLM_CORPUS=str(TARGET / "data" / "corpus.txt.xz"),
                   GITRESEARCH_ARTIFACTS=str(Path(tmp) / "artifacts"))
        proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True,
                              text=True, timeout=args.budget * 4 + 120)
        points = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        if args.target == "nanochat":  # the evaluator's value (older corpora: the point marked "final")
            final = evaluated_val_bpb(work, env) if proc.returncode == 0 else None
        else:
            final = next((p["val_bpb"] for p in points if p.get("final")), None) if proc.returncode == 0 else None
    status = "ok" if proc.returncode == 0 and final is not None else (
        "diverged" if "diverged" in proc.stdout else "crash")
    curve = [[p["t"], p["val_bpb"]] for p in points if not p.get("final") and "val_bpb" in p]
    steps = max((p.get("step") or 0 for p in points), default=None)
    extra = {}
    if args.curve == "train_loss":  # what the runner reads off the progress lines, as printed
        lines = [protocol.parse_progress(line) for line in proc.stdout.replace("\r", "\n").splitlines()]
        lines = [p for p in lines if p and p["percent"] is not None and protocol.is_finite(p["train_loss"])]
        curve = [[protocol.progress_time(p, 0.0, args.budget), p["train_loss"]] for p in lines]
        extra = {"source": "train_loss"}
    return {"id": run_id, "budget_s": args.budget, "points": curve, "final": final, "status": status,
            "config": config, "steps": steps, **extra}


def main() -> int:
    parser = argparse.ArgumentParser(description="record a learning-curve corpus")
    parser.add_argument("--target", choices=("nanochat", "charlm"), default="nanochat")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a constant fixed for every run (charlm: MODEL=gru, DATA=markov)")
    parser.add_argument("--order", choices=("random", "climb"), default="random")
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--curve", choices=("metric", "train_loss"), default="metric",
                        help="the points: the metric points, or the progress lines' training loss")
    parser.add_argument("--budget", type=float, default=40.0, help="training seconds per run")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3,
                        help="climb: runs of the start config first (the corpus's own noise)")
    parser.add_argument("--prefix", default=None, help="run ids are PREFIX-NNN")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache", default=os.environ.get("NANOCHAT_CACHE_DIR",
                        str(Path(tempfile.gettempdir()) / "gitresearch-bench-cache")))
    args = parser.parse_args()
    args.fixed = {}
    for item in args.set:
        name, _, value = item.partition("=")
        try:
            args.fixed[name] = json.loads(value)
        except json.JSONDecodeError:
            args.fixed[name] = value
    prefix = args.prefix or ("nanochat-cpu" if args.target == "nanochat" else "charlm")
    if args.target == "nanochat":
        prepare(args.cache)
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    out.parent.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 2) // args.parallel)
    rng = random.Random(args.seed)
    if args.order == "random":
        configs = sample_configs(args.runs, args.seed)
    best = {"final": math.inf, "config": STARTS[args.target]}
    for record in done:  # resume an interrupted recording
        if record["final"] is not None and record["final"] < best["final"]:
            best = record
    made = {record["id"] for record in done}

    def propose(index: int) -> dict:
        if args.order == "random":
            return configs[index]
        if index < max(1, args.repeats):
            return dict(STARTS[args.target])
        return climb_step(SPACES[args.target], best["config"], rng)

    with ThreadPoolExecutor(args.parallel) as pool, open(out, "a") as f:
        running, index = set(), 0
        while index < args.runs or running:
            while index < args.runs and len(running) < args.parallel:
                run_id = f"{prefix}-{index:03d}"
                if run_id not in made:
                    running.add(pool.submit(run_config, run_id, propose(index), args, threads))
                index += 1
            if not running:
                break
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                record = future.result()
                if record["final"] is not None and record["final"] < best["final"]:
                    best = record
                f.write(json.dumps(record) + "\n")
                f.flush()
                print(f"{record['id']} {record['status']:>8} final={record['final']} steps={record['steps']} "
                      f"points={len(record['points'])} {record['config']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
