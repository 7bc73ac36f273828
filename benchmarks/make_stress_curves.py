"""Synthetic stress curves for the early-stop bench: plateaus, spikes, slow starters,
non-monotone stretches and divergence, around a baseline, in the corpus format.

    python benchmarks/make_stress_curves.py --out benchmarks/data/synthetic_stress.jsonl

Deterministic (fixed seed). Each run: {"id", "budget_s", "points": [[t, val_bpb], ...],
"final", "kind"}. Curves are a power law a*t^-b + c with a warm-down drop over the last 40 %
of the budget, plus the stress of their kind; `final` is the curve's end value plus the
small gap between the periodic estimate and the final evaluation, with evaluation noise.
"""
import argparse
import json
import math

import numpy as np

BUDGET = 300.0
KINDS = ("plain", "plateau", "spikes", "slow_starter", "non_monotone", "diverge", "noisy")


def base_curve(t, a, b, c, budget=BUDGET):
    return a * t ** -b + c - 0.03 * np.clip((t / budget - 0.6) / 0.4, 0, 1)


def make_run(i, kind, rng):
    t = np.linspace(BUDGET / 40, BUDGET * 39 / 40, 39)
    a, b = rng.uniform(1.5, 3.0), rng.uniform(0.35, 0.6)
    c = 1.0 + rng.normal(0.08, 0.06)
    v = base_curve(t, a, b, c) + rng.normal(0, 0.003, t.size)
    final = float(base_curve(BUDGET, a, b, c) - 0.01 + rng.normal(0, 0.002))
    if kind == "plateau":  # stuck for a while, then learns again
        stuck = (t > 0.25 * BUDGET) & (t < 0.5 * BUDGET)
        v[stuck] = v[np.argmax(stuck)]
    elif kind == "spikes":
        for j in rng.choice(np.arange(5, 35), size=3, replace=False):
            v[j] += rng.uniform(0.2, 1.0)
    elif kind == "slow_starter":  # far behind early, among the best at the end
        c = 0.95 + rng.normal(0, 0.01)
        v = 8.0 * t ** -0.9 + c - 0.03 * np.clip((t / BUDGET - 0.6) / 0.4, 0, 1) + rng.normal(0, 0.003, t.size)
        final = float(8.0 * BUDGET ** -0.9 + c - 0.03 - 0.01)
    elif kind == "non_monotone":  # a bump in the middle
        v += 0.05 * np.exp(-((t - 0.45 * BUDGET) / (0.05 * BUDGET)) ** 2)
    elif kind == "noisy":
        v += rng.normal(0, 0.02, t.size)
    elif kind == "diverge":
        k = int(rng.integers(8, 20))
        v = np.concatenate([v[:k], [v[k - 1] * 3.0, float("nan")]])
        t = t[:k + 2]
        final = None
    points = [[round(float(x), 3), (round(float(y), 6) if math.isfinite(y) else None)] for x, y in zip(t, v)]
    return {"id": f"stress-{i:03d}-{kind}", "budget_s": BUDGET, "points": points, "final": final, "kind": kind}


def main():
    parser = argparse.ArgumentParser(description="synthetic stress curves")
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    with open(args.out, "w") as f:
        for i in range(args.runs):
            kind = "plain" if i == 0 else KINDS[int(rng.integers(len(KINDS)))]
            f.write(json.dumps(make_run(i, kind, rng)) + "\n")


if __name__ == "__main__":
    main()
