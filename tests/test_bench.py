"""`gitresearch bench early-stop` on a synthetic corpus with known outcomes."""
import json

import numpy as np

from helpers import cli


def synthetic_corpus(path, runs=40, budget=60.0, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(runs):
            a, b = rng.uniform(0.8, 1.5), rng.uniform(0.4, 0.7)
            c = 2.0 + (0.0 if i == 0 else rng.normal(0.12, 0.1))  # most runs lose to the baseline
            t = np.linspace(budget / 40, budget * 39 / 40, 39)
            drop = 0.03 * np.clip((t / budget - 0.6) / 0.4, 0, 1)
            v = a * t ** -b + c - drop + rng.normal(0, 0.004, t.size)
            final = a * budget ** -b + c - 0.03 + rng.normal(0, 0.003)
            status, points = "ok", [{"t": float(x), "val_bpb": float(y)} for x, y in zip(t, v)]
            if i % 13 == 7:  # a divergence: the curve ends and there is no final
                status, final, points = "diverged", None, points[:5]
            f.write(json.dumps({"id": f"s{i}", "budget_s": budget, "status": status,
                                "final": final, "points": points}) + "\n")


def test_bench_reports_every_method(tmp_path):
    corpus = tmp_path / "curves.jsonl"
    synthetic_corpus(corpus)
    out = cli("bench", "early-stop", "--curves", str(corpus), "--noise", "0.005", "--json", cwd=tmp_path).stdout
    results = {r["method"]: r for r in map(json.loads, out.splitlines())}
    assert set(results) == {"ours", "none", "cutoff", "optuna-median", "optuna-sha"}
    for r in results.values():
        for key in ("runs", "stopped_frac", "budget_used_by_stopped", "compute_saved", "false_stops",
                    "false_stop_rate", "best_stopped", "throughput_x"):
            assert key in r
        for key in ("stopped_frac", "budget_used_by_stopped", "compute_saved", "false_stop_rate"):
            assert 0.0 <= r[key] <= 1.0
        assert r["runs"] == 40
    none, ours = results["none"], results["ours"]
    assert none["stopped_frac"] == 0 and none["compute_saved"] == 0 and none["throughput_x"] == 1
    assert ours["stopped_frac"] > 0.3 and ours["compute_saved"] > 0.2 and ours["throughput_x"] > 1.2
    assert ours["best_stopped"] is False and ours["false_stop_rate"] <= 0.2
    assert 0.0 <= ours["coverage90"] <= 1.0 and ours["trusted_checks"] > 0
    table = cli("bench", "early-stop", "--curves", str(corpus), "--method", "ours", cwd=tmp_path).stdout
    assert "replayed" in table and "ours" in table


def test_corpus_format_pairs_null_final_and_nan(tmp_path):
    from gitresearch.bench import load_curves

    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"id": "a", "budget_s": 10.0, "points": [[1.0, 3.0], [2.0, 2.5]], "final": 2.0}) + "\n"
        + json.dumps({"id": "b", "budget_s": 10.0, "points": [[1.0, 3.0], [2.0, None]], "final": None}) + "\n"
        + json.dumps({"id": "c", "budget_s": 10.0, "points": [{"t": 1.0, "val_bpb": 3.1}], "final": 2.1}) + "\n")
    runs = load_curves(path)
    assert [r.id for r in runs] == ["a", "b", "c"]
    assert runs[0].times == [1.0, 2.0] and runs[0].final == 2.0 and runs[0].end == 10.0
    assert runs[1].final is None and runs[1].end == 2.0 and str(runs[1].values[1]) == "nan"
    assert runs[2].values == [3.1]
