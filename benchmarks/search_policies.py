"""Search policies side by side on deterministic targets whose optimum is known: the best
value each reaches in N experiments, over seeds. The targets and the loop (keep on a strict
improvement) are the ones of tests/test_optuna_policy.py. target1: four constants (a learning
rate, a width, a beta, a flag), the baseline 1.2 from the optimum 0; target2 (written after
the samplers' settings were frozen on target1): five constants that matter and one that
does not, the baseline 1.55 from the optimum 0.

    python benchmarks/search_policies.py --experiments 30 --seeds 5 --target target1   # ~30 s

Output: one JSON line per policy: {"policy", "target", "experiments", "seeds", "best": [per
seed], "mean_best", "median_best"}; lower is better.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_optuna_policy import SOURCE, SOURCE_2, best_after, objective, objective_2  # noqa: E402

TARGETS = {"target1": (SOURCE, objective), "target2": (SOURCE_2, objective_2)}
POLICIES = ["random", "tpe", "gp", "cmaes", "qmc"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--target", choices=sorted(TARGETS), default="target1")
    parser.add_argument("--policy", action="append", choices=POLICIES)
    args = parser.parse_args()
    source, target = TARGETS[args.target]
    for policy in args.policy or POLICIES:
        best = [best_after(policy, seed, args.experiments, source, target) for seed in range(args.seeds)]
        print(json.dumps({"policy": policy, "target": args.target, "experiments": args.experiments,
                          "seeds": args.seeds, "best": [round(b, 4) for b in best],
                          "mean_best": round(statistics.mean(best), 4),
                          "median_best": round(statistics.median(best), 4)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
