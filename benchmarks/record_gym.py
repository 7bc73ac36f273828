"""Records the research gym's sample: runs of the bundled target with configurations drawn
from the optuna policy's search space (the live constants on this machine, the bounds of
target_repo/gitresearch.toml's [search] table and the defaults around them).

    python benchmarks/record_gym.py --runs 160 --budget 30 --out benchmarks/data/gym_nanochat_30s.jsonl

Draws (seeded; a resumed recording continues where the file ends):
- "repeat": the baseline 4 times, then two global draws 3 times each (the noise);
- "global": every constant drawn from its distribution (Optuna's RandomSampler);
- "local": the baseline with one to three constants drawn (where one-step policies walk);
global and local alternate.
Runs go --parallel at a time with OMP_NUM_THREADS split between them (2 x 1 thread here).

Output: one JSON object per run and line, the curve-corpus format of make_curves.py
({"id", "budget_s", "points": [[t, val_bpb], ...], "final", "status", "config", "steps"})
plus "draw" and "threads"; "config" holds every searched constant ("NAME" or "NAME[i]").
"""
import argparse
import json
import os
import random
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import make_curves  # noqa: E402
from gitresearch.config import load  # noqa: E402
from gitresearch.policies.constants import find_sites, rewrite  # noqa: E402
from gitresearch.policies.optuna_search import dimension_for  # noqa: E402

REPEATS = [("baseline", 4), ("global", 3), ("global", 3)]


def target_space() -> dict:
    """{site name: Dimension} of the bundled target's train.py on a CPU."""
    config = load(ROOT / "target_repo")
    source = (ROOT / "target_repo" / "train.py").read_text()
    space = {}
    for site in find_sites(source, config.policy.skip_constants, cuda=False, metric=config.metric.name):
        dim = dimension_for(site.value, config.search.get(f"train.py:{site.name}", config.search.get(site.name)))
        if dim is not None:
            space[site.name] = dim
    return space


def draws(n: int, seed: int) -> list[tuple[str, dict]]:
    """The recording's (draw, config) list, the same for every call with the same seed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = target_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    rng = random.Random(seed)
    baseline = {name: dim.baseline for name, dim in space.items()}

    def draw() -> dict:
        trial = study.ask({name: dim.dist for name, dim in space.items()})
        study.tell(trial, 0.0)
        return {name: dim.to_file(trial.params[name]) for name, dim in space.items()}

    out = []
    for kind, times in REPEATS:
        config = baseline if kind == "baseline" else draw()
        out += [("repeat", config)] * times
    while len(out) < n:
        config = draw()
        if len(out) % 2:
            config = {**baseline, **{k: config[k] for k in rng.sample(sorted(space), rng.randint(1, 3))}}
            out.append(("local", config))
        else:
            out.append(("global", config))
    return out[:n]


def editor(config: dict):
    def edit(source: str) -> str:
        sites = find_sites(source, cuda=False)
        return rewrite(source, [(s, config[s.name]) for s in sites if s.name in config and s.value != config[s.name]])
    return edit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=160)
    parser.add_argument("--budget", type=float, default=30.0, help="training seconds per run")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache", default=os.environ.get("NANOCHAT_CACHE_DIR", "/tmp/gitresearch-bench-cache"))
    args = parser.parse_args()
    args.target, args.fixed = "nanochat", {}
    make_curves.prepare(args.cache)
    out = Path(args.out)
    made = {json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()} if out.exists() else set()
    threads = max(1, (os.cpu_count() or 2) // args.parallel)
    todo = [(f"gym-{i:03d}", kind, config) for i, (kind, config) in enumerate(draws(args.runs, args.seed))
            if f"gym-{i:03d}" not in made]
    with ThreadPoolExecutor(args.parallel) as pool, open(out, "a") as f:
        running = {}
        while todo or running:
            while todo and len(running) < args.parallel:
                run_id, kind, config = todo.pop(0)
                future = pool.submit(make_curves.run_config, run_id, config, args, threads, editor(config))
                running[future] = kind
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                record = {**future.result(), "draw": running.pop(future), "threads": threads}
                f.write(json.dumps(record) + "\n")
                f.flush()
                print(f"{record['id']} {record['draw']:>7} {record['status']:>8} final={record['final']} "
                      f"steps={record['steps']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
