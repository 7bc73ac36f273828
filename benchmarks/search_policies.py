"""Search policies side by side on deterministic targets whose optimum is known: the best
value each reaches in N experiments, over seeds. The targets and the loop (keep on a strict
improvement) are the ones of tests/test_optuna_policy.py. target1: four constants (a learning
rate, a width, a beta, a flag), the baseline 1.2 from the optimum 0; target2 (written after
the samplers' settings were frozen on target1): five constants that matter and one that
does not, the baseline 1.55 from the optimum 0; gym: the research gym's train.py scored by its
surrogate's noise-free final (a proxy of the gym without noise, early stop or keep rule).

    python benchmarks/search_policies.py --experiments 30 --seeds 5 --target target1   # ~30 s

Output: one JSON line per policy: {"policy", "target", "experiments", "seeds", "best": [per
seed], "mean_best", "median_best"}; lower is better.
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gitresearch.config import load  # noqa: E402
from test_optuna_policy import SOURCE, SOURCE_2, best_after, objective, objective_2  # noqa: E402

GYM = ROOT / "gym_repo"
sys.path.insert(0, str(GYM))
import train as gym  # noqa: E402  (the gym's own prediction code)
from gitresearch.policies.constants import find_sites  # noqa: E402

GYM_MODEL = json.loads((GYM / "surrogate.json").read_text())


def gym_objective(source: str) -> float:
    """The gym's noise-free final for a train.py (its surrogate's mean); a config the real
    target cannot build, or one more likely to diverge than not, never wins (inf)."""
    values = {s.name: s.value for s in find_sites(source, cuda=False)}
    if gym.hard_rules(values):
        return math.inf
    x = gym.features(GYM_MODEL, values)
    if gym.crash_probability(GYM_MODEL["crash"], x) > 0.5:
        return math.inf
    return dict(zip(GYM_MODEL["gps"][0]["outputs"], gym.gp_mean(GYM_MODEL["gps"][0], x)))["final"]


TARGETS = {"target1": (SOURCE, objective), "target2": (SOURCE_2, objective_2),
           "gym": ((GYM / "train.py").read_text(), gym_objective)}
POLICIES = ["random", "tpe", "gp", "cmaes", "qmc"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--target", choices=sorted(TARGETS), default="target1")
    parser.add_argument("--policy", action="append", choices=POLICIES)
    args = parser.parse_args()
    source, target = TARGETS[args.target]
    config = load(GYM) if args.target == "gym" else None  # its skip list and [search] table
    for policy in args.policy or POLICIES:
        best = [best_after(policy, seed, args.experiments, source, target, config) for seed in range(args.seeds)]
        print(json.dumps({"policy": policy, "target": args.target, "experiments": args.experiments,
                          "seeds": args.seeds, "best": [round(b, 4) for b in best],
                          "mean_best": round(statistics.mean(best), 4),
                          "median_best": round(statistics.median(best), 4)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
