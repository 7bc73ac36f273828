"""Search policies side by side on a deterministic target whose optimum is known: the best
value each reaches in N experiments, over seeds. The target and the loop (keep on a strict
improvement) are the ones of tests/test_optuna_policy.py: four constants (a learning rate,
a width, a beta, a flag), the baseline 1.2 from the optimum 0.

    python benchmarks/search_policies.py --experiments 30 --seeds 5        # ~1 min

Output: one JSON line per policy: {"policy", "experiments", "seeds", "best": [per seed],
"mean_best"}; lower is better.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from gitresearch.config import Config, PolicyConfig  # noqa: E402
from gitresearch.policies.optuna_search import OptunaSearch  # noqa: E402
from gitresearch.policies.random_search import RandomSearch  # noqa: E402
from test_optuna_policy import SOURCE, NotesStore  # noqa: E402


def best_after(policy: str, seed: int, experiments: int) -> float:
    store, config = NotesStore(SOURCE), Config(policy=PolicyConfig(seed=seed))
    search = (RandomSearch(config, store, cuda=False) if policy == "random"
              else OptunaSearch(config, store, sampler=policy, cuda=False))
    return min(store.run(search, config) for _ in range(experiments))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--policy", action="append", choices=["random", "tpe", "gp"])
    args = parser.parse_args()
    for policy in args.policy or ["random", "tpe", "gp"]:
        best = [best_after(policy, seed, args.experiments) for seed in range(args.seeds)]
        print(json.dumps({"policy": policy, "experiments": args.experiments, "seeds": args.seeds,
                          "best": [round(b, 4) for b in best], "mean_best": round(statistics.mean(best), 4)}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
