"""Early stop replayed on every recorded corpus, against Optuna's pruners, with a pooled row.

    python benchmarks/early_stop.py --out benchmarks/results/early_stop.jsonl     # ~3 min
    python benchmarks/early_stop.py --method race --method optuna-median            # seconds

Corpora (benchmarks/data/, recorded by make_curves.py and make_stress_curves.py) are listed
in CORPORA with their role: "dev" ones were seen while the race rule was designed and its
settings chosen (in sample); "held-out" ones were recorded after the rule was frozen (commit
7950fb1, "Freeze the closing race rule ...", out of sample). Each corpus is replayed with its
own check interval (a tenth of its budget), checks from 20 % of the budget, and its noise from
its own repeated runs (0 where it has none).

Output: one JSON object per corpus and method, as `gitresearch bench early-stop --json`
writes them (keys in gitresearch/bench.py), plus "role"; then a pooled row per method over
the real corpora (the synthetic one left out), then a markdown table and, per rule of ours
(forecast, race), what fails the acceptance on stderr. The acceptance: on every corpus the
rule saves strictly more than Optuna's MedianPruner with no more false stops and never stops
the best run; on average at least 3 points more; pooled false-stop rate at most 5 %. Exit 0
when a rule of ours meets it.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gitresearch import bench  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
CORPORA = {  # file stem -> role
    "nanochat_cpu": "dev",
    "nanochat_cpu_heldout": "dev",  # the name is older than this rule: seen while designing it
    "nanochat_cpu_seed2_45s": "dev",
    "nanochat_climb_20s": "dev",
    "lstm_stdlib_20s": "dev",
    "mlp_markov_15s": "dev",
    "synthetic_stress": "dev-synthetic",
    "gru_markov_20s": "dev",
    "nanochat_climb_30s": "dev",
    "lstm_markov_20s": "dev",  # held out for the rule before the closing room, seen while designing it
    "mlp_stdlib_15s": "dev",  # likewise
    "nanochat_climb_25s": "dev",  # likewise
    "gru_stdlib_20s": "held-out",  # recorded after the closing race rule was frozen (7950fb1)
    "nanochat_climb_20s_b": "held-out",  # likewise
}


def replay_all(methods, corpora=None) -> list[dict]:
    corpora = corpora or CORPORA
    paths = [DATA / f"{name}.jsonl" for name in corpora if (DATA / f"{name}.jsonl").exists()]
    rows = bench.replay_corpora(paths, methods, None, 0.2, 0.05, 0.01, None)
    rows = [r for r in rows if r["corpus"] != "pooled"]
    for row in rows:
        row["role"] = corpora[row["corpus"]]
    real = [r for r in rows if r["role"] != "dev-synthetic"]
    for method in methods:
        pooled = bench.pooled([r for r in real if r["method"] == method])
        pooled["role"] = "pooled over the real corpora"
        rows.append(pooled)
    return rows


def acceptance(rows: list[dict], rule: str = "race") -> list[str]:
    """What fails the acceptance for `rule` (empty when it holds)."""
    failures, gains = [], []
    by = {(r["corpus"], r["method"]): r for r in rows}
    for corpus in dict.fromkeys(r["corpus"] for r in rows if r["corpus"] != "pooled"):
        race, median = by[(corpus, rule)], by[(corpus, "optuna-median")]
        gains.append(race["compute_saved"] - median["compute_saved"])
        if not race["compute_saved"] > median["compute_saved"]:
            failures.append(f"{corpus}: saves {race['compute_saved']:.3f}, median {median['compute_saved']:.3f}")
        if race["false_stops"] > median["false_stops"]:
            failures.append(f"{corpus}: {race['false_stops']} false stops, median {median['false_stops']}")
        if race["best_stopped"]:
            failures.append(f"{corpus}: the best run is stopped")
    if sum(gains) / len(gains) < 0.03:
        failures.append(f"mean gain over median {sum(gains) / len(gains):.3f} < 0.03")
    pooled = by[("pooled", rule)]
    if pooled["false_stop_rate"] > 0.05:
        failures.append(f"pooled false-stop rate {pooled['false_stop_rate']:.3f} > 0.05")
    return failures


def table(rows: list[dict]) -> str:
    lines = ["| corpus (role) | method | compute saved | false stops / would-beat | 95 % interval | best stopped |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        low, high = r["false_stop_ci95"]
        lines.append(f"| {r['corpus']} ({r['role']}) | {r['method']} | {r['compute_saved']:.3f} | "
                     f"{r['false_stops']} / {r['beaters']} | {low:.3f}-{high:.3f} | "
                     f"{'yes' if r['best_stopped'] else 'no'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="early stop on every recorded corpus")
    parser.add_argument("--method", action="append", choices=bench.METHODS,
                        help="methods [default: race, forecast, optuna-median, optuna-sha]")
    parser.add_argument("--out", help="also write the JSON lines here")
    args = parser.parse_args()
    methods = args.method or ["race", "forecast", "optuna-median", "optuna-sha"]
    if "race" not in methods or "optuna-median" not in methods:
        methods = list(dict.fromkeys(["race", "optuna-median", *methods]))
    rows = replay_all(methods)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    print(table(rows), file=sys.stderr)
    met = False
    for rule in (m for m in ("forecast", "race") if m in methods):
        failures = acceptance(rows, rule)
        met = met or not failures
        for failure in failures:
            print(f"{rule} FAILS: {failure}", file=sys.stderr)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
