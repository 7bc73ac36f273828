"""benchmarks/compare_arms.py: the comparisons the gym's claims are read from."""
import json

import pytest

from helpers import benchmark_module

compare_arms = benchmark_module("compare_arms")


def results_file(path, policy, bests):
    runs = [{"seed": seed, "best": [2.5, best]} for seed, best in bests.items()]
    path.write_text(json.dumps({"runs": {policy: runs}}))
    return f"{path}:{policy}"


def snapshot_file(path, loops, best_at=None):
    """loops: name -> per window (mean_reward, valid_share, keeps); best_at: name -> {experiments: best}."""
    path.write_text(json.dumps({"loops": {name: {"windows": [
        {"first": 1 + 50 * w, "last": 50 * (w + 1), "mean_reward": r, "valid_share": v, "keeps": k}
        for w, (r, v, k) in enumerate(rows)], "best_at": (best_at or {}).get(name, {})}
        for name, rows in loops.items()}}))
    return str(path)


def test_arms_pool_by_seed_and_a_seed_run_twice_is_an_error(tmp_path):
    first = results_file(tmp_path / "a.json", "rl", {0: 1.70, 1: 1.72})
    second = results_file(tmp_path / "a_b.json", "rl", {2: 1.74})
    assert compare_arms.final_bests([first, second]) == {0: 1.70, 1: 1.72, 2: 1.74}
    again = results_file(tmp_path / "a_again.json", "rl", {1: 1.9})
    with pytest.raises(SystemExit, match="seed 1"):
        compare_arms.final_bests([first, again])
    with pytest.raises(SystemExit, match="no runs of 'random'"):
        compare_arms.final_bests([f"{tmp_path / 'a.json'}:random"])
    with pytest.raises(SystemExit, match="FILE:POLICY"):
        compare_arms.final_bests([str(tmp_path / "a.json")])


def test_paired_windows_take_each_arms_own_policy_and_only_shared_seeds(tmp_path):
    # one snapshot holds two policies' loops with the same seeds: each arm must read its own
    snap = snapshot_file(tmp_path / "snap.json", {
        "rl-seed0": [(-1.0, 0.9, 2), (0.5, 1.0, 1)], "rl-seed1": [(-2.0, 0.8, 1), (1.0, 1.0, 0)],
        "random-seed0": [(0.0, 1.0, 3), (0.0, 1.0, 1)], "random-seed1": [(0.0, 1.0, 1), (-1.0, 1.0, 2)],
        "random-seed7": [(9.0, 1.0, 9), (9.0, 1.0, 9)]})
    paired = compare_arms.paired_windows(snap, "rl", snap, "random", [0, 1, 7])
    assert paired["seeds"] == [0, 1]
    first, last = paired["windows"]
    assert (first["first"], first["last"], last["first"], last["last"]) == (1, 50, 51, 100)
    assert first["mean_reward"]["mean"] == -1.5 and last["mean_reward"]["mean"] == 1.25
    assert last["mean_reward"]["a_ahead"] == 2 and first["mean_reward"]["a_ahead"] == 0
    assert first["valid_share"]["mean"] == pytest.approx(-0.15) and first["keeps"]["mean"] == -0.5
    assert paired["gap_last_minus_first"] == 2.75 and paired["gap_trend"] == pytest.approx(2.75)


def test_main_prints_and_writes_the_figures(tmp_path, monkeypatch, capsys):
    better = results_file(tmp_path / "a.json", "rl", {s: 1.70 + s / 1000 for s in range(5)})
    worse = results_file(tmp_path / "b.json", "random", {s: 1.80 + s / 1000 for s in range(5)})
    out = tmp_path / "out.json"
    monkeypatch.setattr("sys.argv", ["compare_arms.py", "--a", better, "--b", worse, "--json", str(out)])
    compare_arms.main()
    result = json.loads(out.read_text())
    # every A below every B: the one-sided p is the exact U-test's smallest for 5 against 5
    assert result["best_p"] == pytest.approx(1 / 252, abs=1e-4)
    assert result["a"]["median"] == 1.702 and result["b"]["worst"] == 1.804
    assert result["anytime"]["experiments"] == 1 and result["anytime"]["p"] == pytest.approx(1 / 252, abs=1e-4)
    assert "p = 0.004" in capsys.readouterr().out


def test_paired_best_so_far_per_checkpoint_shared_by_every_seed(tmp_path):
    rows = [(0.0, 1.0, 1)]
    snap = snapshot_file(tmp_path / "snap.json", {"rl-seed0": rows, "rl-seed1": rows, "prior-seed0": rows,
                                                   "prior-seed1": rows},
                         best_at={"rl-seed0": {"25": 2.0, "50": 1.80, "100": 1.70},
                                  "rl-seed1": {"25": 2.1, "50": 1.90, "100": 1.75},
                                  "prior-seed0": {"25": 2.2, "50": 1.85, "100": 1.72},
                                  "prior-seed1": {"25": 2.0, "50": 1.80}})  # seed 1's prior stopped short
    paired = compare_arms.paired_windows(snap, "rl", snap, "prior", [0, 1])
    assert [row["experiments"] for row in paired["best_at"]] == [25, 50]  # 100: not in every loop
    at25, at50 = paired["best_at"]
    assert at25["mean"] == pytest.approx(-0.05) and at25["a_ahead"] == 1
    assert at50["mean"] == pytest.approx(0.025) and at50["a_ahead"] == 1 and at50["seeds"] == 2


def test_an_arms_seeds_may_sit_in_several_snapshots_but_not_twice(tmp_path):
    rows = [(1.0, 1.0, 1)]
    first = snapshot_file(tmp_path / "a.json", {"rl-seed0": rows})
    second = snapshot_file(tmp_path / "b.json", {"rl-seed1": [(3.0, 1.0, 1)], "prior-seed1": rows})
    assert sorted(compare_arms.loops_by_seed([first, second], "rl")) == [0, 1]
    prior = snapshot_file(tmp_path / "p.json", {"prior-seed0": [(0.0, 1.0, 1)]})
    paired = compare_arms.paired_windows([first, second], "rl", [prior, second], "prior", [0, 1])
    assert paired["seeds"] == [0, 1] and paired["windows"][0]["mean_reward"]["mean"] == 1.5
    with pytest.raises(SystemExit, match="seed 0 of 'rl' is in two snapshots"):
        compare_arms.loops_by_seed([first, first], "rl")


def test_anytime_scores_the_arm_that_gets_there_sooner_over_the_shortest_loop():
    # A drops to 1.7 after the first experiment, B only after the third: both end at 1.7
    sooner = {s: [2.5, 1.7 + s / 1000, 1.7 + s / 1000, 1.7 + s / 1000, 1.7] for s in range(4)}
    later = {s: [2.5, 2.0 + s / 1000, 2.0 + s / 1000, 1.7 + s / 1000, 1.7] for s in range(4)}
    area = compare_arms.anytime(sooner, later)
    assert area["experiments"] == 4
    assert area["a"]["mean"] == pytest.approx(1.7 + 0.0015 * 3 / 4, abs=1e-4)
    assert area["b"]["mean"] == pytest.approx((2.0 * 2 + 1.7 * 2) / 4 + 0.0015 * 3 / 4, abs=1e-4)
    assert area["p"] == pytest.approx(1 / 70, abs=1e-4)  # exact U-test, every A below every B, 4 against 4
    assert compare_arms.anytime(later, sooner)["p"] > 0.95
    # a loop cut short sets n for every loop: past it, B's late drop does not count
    cut = {**later, 9: [2.5, 2.0]}
    assert compare_arms.anytime(sooner, cut)["experiments"] == 1
    with pytest.raises(SystemExit, match="at least one experiment"):
        compare_arms.anytime(sooner, {0: [2.5]})


def loop_run(seed, best, diffs, statuses=None):
    """A bench run: best so far, diff ids and statuses per experiment, the baseline first."""
    return {"seed": seed, "best": best, "diffs": [None, *diffs],
            "statuses": ["baseline", *(statuses or ["discard"] * len(diffs))]}


def test_paired_by_seed_sees_a_gap_that_the_spread_between_seeds_hides():
    # seeds far apart (level 1.70 .. 1.90), A 0.010-0.018 lower than B on each seed
    levels = {seed: 1.70 + 0.05 * seed for seed in range(5)}
    runs_a = {s: loop_run(s, [2.5, 2.0, 2.0, level - 0.01 - 0.002 * s], ["x", "y", f"a{s}"]) for s, level in levels.items()}
    runs_b = {s: loop_run(s, [2.5, 2.0, 2.0, level], ["x", "y", f"b{s}"]) for s, level in levels.items()}
    runs_b[9] = loop_run(9, [2.5, 2.0, 1.0, 1.0], ["x", "y", "z"])  # a seed A lacks: not paired
    pairs = compare_arms.paired_seeds(runs_a, runs_b)
    assert [r["seed"] for r in pairs["per_seed"]] == [0, 1, 2, 3, 4]
    assert [r["final_gap"] for r in pairs["per_seed"]] == [-0.01, -0.012, -0.014, -0.016, -0.018]
    assert [r["same_start"] for r in pairs["per_seed"]] == [2] * 5  # x then y, then the arms part
    assert pairs["per_seed"][0]["anytime_gap"] == pytest.approx(-0.01 / 3, abs=1e-4)
    assert pairs["final"]["a_ahead"] == 5 and pairs["final"]["wilcoxon_p"] == pytest.approx(1 / 32, abs=1e-3)
    assert pairs["final"]["t_p"] < 0.001  # a steady gap: the paired t is sure of it
    # leads 0.010 .. 0.018: mean 0.014, sd 0.00316 over 5 seeds, t(0.95, 4) = 2.1318
    assert pairs["final"]["lead_bound"] == pytest.approx(0.014 + 2.1318 * 0.0031623 / 5 ** 0.5, abs=1e-4)
    finals_a = [r["best"][-1] for r in runs_a.values()]
    finals_b = [r["best"][-1] for s, r in runs_b.items() if s != 9]
    assert compare_arms.stats.mannwhitneyu(finals_a, finals_b, alternative="less").pvalue > 0.3  # unpaired: hidden
    swapped = compare_arms.paired_seeds(runs_b, runs_a)
    assert swapped["final"]["t_p"] > 0.99 and swapped["final"]["a_ahead"] == 0


def test_paired_by_seed_truncates_to_the_shortest_loop_and_reads_where_the_loops_part():
    runs_a = {0: loop_run(0, [2.5, 2.4, 2.2, 1.9], ["x", "y", "z"]), 1: loop_run(1, [2.5, 2.3, 2.3], ["x", "q"])}
    runs_b = {0: loop_run(0, [2.5, 2.4, 2.3, 2.3], ["x", "y", "w"], ["discard", "keep", "discard"]),
              1: loop_run(1, [2.5, 2.3, 2.3], ["x", "q"])}
    pairs = compare_arms.paired_seeds(runs_a, runs_b)
    assert pairs["experiments"] == 2  # seed 1 ran 2: seed 0's third experiment is not compared
    assert [r["final_gap"] for r in pairs["per_seed"]] == [-0.1, 0.0]
    assert [r["same_start"] for r in pairs["per_seed"]] == [1, 2]  # seed 0: y's status differs
    level = compare_arms.paired_seeds({1: runs_a[1]}, {1: runs_b[1]})
    assert level["final"]["t_p"] is None and level["final"]["lead_bound"] is None  # no gap: nothing to test
    assert level["final"]["a_ahead"] == 0
    with pytest.raises(SystemExit, match="share no seed"):
        compare_arms.paired_seeds({0: runs_a[0]}, {1: runs_b[1]})
