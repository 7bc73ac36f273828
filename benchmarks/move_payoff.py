#!/usr/bin/env python
"""What a move's size pays, by policy, from research_snapshot.py's `largest_moves`: per bucket
of the largest |ln move| of a valid experiment, the runs, the keeps and the mean improvement
term (in sigmas) at each loss weight ([reward] loss_weight: a loss counts that share of its
sigmas; 1 is the symmetric reward, 0 counts only gains).

    python benchmarks/move_payoff.py SNAPSHOT.json [SNAPSHOT.json ...] [--loss-weights 1,0.25,0.1,0]

Output: one line per policy and bucket, `policy bucket runs keeps mean@w ...`; loops are
pooled by the prefix of their name (`rl-seed0` -> rl).
"""
import argparse, json, statistics
from collections import defaultdict

EDGES = (0.1, 0.3, 0.6, 1.11)  # |ln move|: x1.1, x1.35, x1.8, the random policy's x3 and its rounding


def bucket(move: float) -> str:
    low = 0.0
    for edge in EDGES:
        if move < edge:
            return f"{low:g}-{edge:g}"
        low = edge
    return f">{EDGES[-1]:g}"


def payoff(snapshots: list[dict], weights: list[float]) -> dict:
    """(policy, bucket) -> {"runs", "keeps", "mean": {weight: mean improvement}}."""
    gains = defaultdict(list)
    keeps = defaultdict(int)
    for snap in snapshots:
        for name, loop in snap["loops"].items():
            for move, status, gain in loop.get("largest_moves", []):
                key = (name.split("-")[0], bucket(move))
                gains[key].append(gain)
                keeps[key] += status == "keep"
    return {key: {"runs": len(g), "keeps": keeps[key],
                  "mean": {w: statistics.mean(x if x >= 0 else w * x for x in g) for w in weights}}
            for key, g in sorted(gains.items())}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("snapshots", nargs="+")
    parser.add_argument("--loss-weights", default="1,0.25,0.1,0")
    args = parser.parse_args()
    weights = [float(w) for w in args.loss_weights.split(",")]
    table = payoff([json.load(open(p)) for p in args.snapshots], weights)
    for (policy, size), row in table.items():
        means = " ".join(f"{row['mean'][w]:+.2f}@{w:g}" for w in weights)
        print(f"{policy:7s} {size:9s} {row['runs']:5d} {row['keeps']:4d} {means}")
