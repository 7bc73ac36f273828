"""Confirmation before best moves: the sequential test's error rates, the pooled noise floor,
slow-run flagging, and a confirmation killed with SIGKILL resumed without loss or repeat."""
import json
import math
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gitresearch.config import ConfirmConfig, NoiseConfig, load
from gitresearch.confirm import error_rates, floor, pooled_noise, slow_run, sprt
from gitresearch.gitstore import Store
from gitresearch.history import build_state
from gitresearch.policies.prompt import render_entry
from helpers import cli, make_repo, sh

DEFAULT = ConfirmConfig()


def simulate(true_gain, delta, sigma, trials, rng, cfg=DEFAULT):
    """The production test on simulated pairs: (keep rate, mean pairs)."""
    keeps = pairs = 0
    for _ in range(trials):
        gains = []
        while (verdict := sprt(gains, delta, sigma, cfg.alpha, cfg.beta, cfg.max_pairs)).decision == "continue":
            gains.append(rng.normal(true_gain, math.sqrt(2) * sigma))
        keeps += verdict.decision == "keep"
        pairs += verdict.pairs
    return keeps / trials, pairs / trials


@pytest.mark.parametrize("gain_in_delta", [0.0, 0.5, 1.0, 2.0])
def test_sequential_test_error_rates_match_the_stated_ones(gain_in_delta):
    """At the default settings (delta = min_delta = 2 sigma), the simulated keep rate and
    mean pairs match error_rates' exact figures within 4 standard errors, and the false-keep
    rate of a change with no effect is below alpha."""
    sigma, trials = 0.01, 6000
    delta = NoiseConfig().k_sigma * sigma
    rng = np.random.default_rng(int(gain_in_delta * 10))
    stated = error_rates(gain_in_delta * delta, delta, sigma, DEFAULT.alpha, DEFAULT.beta, DEFAULT.max_pairs)
    keep, pairs = simulate(gain_in_delta * delta, delta, sigma, trials, rng)
    se = math.sqrt(stated["keep"] * (1 - stated["keep"]) / trials) + 1e-4
    assert abs(keep - stated["keep"]) < 4 * se, (keep, stated)
    assert abs(pairs - stated["expected_pairs"]) < 0.1, (pairs, stated)
    if gain_in_delta == 0:
        assert stated["keep"] <= DEFAULT.alpha and keep <= DEFAULT.alpha + 4 * se
    if gain_in_delta == 2.0:  # a clear win: nearly always kept, mostly after one pair
        assert keep > 0.99 and pairs < 1.6


def test_an_overestimated_sigma_only_lowers_false_keeps():
    """The test runs on sigma's upper bound: when true noise is lower, false keeps fall."""
    rng = np.random.default_rng(7)
    delta, true_sigma = 0.02, 0.01
    matched_rate, _ = simulate(0.0, delta, true_sigma, 4000, rng)
    # pairs drawn with the true sigma, tested with twice that sigma
    keeps = 0
    for _ in range(4000):
        gains = []
        while (v := sprt(gains, 2 * delta, 2 * true_sigma, DEFAULT.alpha, DEFAULT.beta,
                         DEFAULT.max_pairs)).decision == "continue":
            gains.append(rng.normal(0.0, math.sqrt(2) * true_sigma))
        keeps += v.decision == "keep"
    assert keeps / 4000 <= matched_rate + 0.01


def test_verdict_text_states_pairs_gain_and_bounds():
    v = sprt([0.03, 0.025], 0.02, 0.01, 0.05, 0.1, 5)
    assert v.decision == "keep" and v.pairs == 2
    assert v.text.startswith("kept after 2 pairs: gain 0.027500 ± 0.010000 (LLR ")
    assert f"≥ {math.log(0.9 / 0.05):.2f}" in v.text
    cap = sprt([0.01] * 5, 0.02, 0.01, 0.05, 0.1, 5)  # LLR 0 after five pairs: the cap
    assert cap.decision == "discard" and "undecided after the cap of 5 pairs" in cap.text


def test_pooled_noise_and_its_upper_bound():
    groups = [[1.0, 1.02, 0.98], [2.0, 2.01], [5.0]]  # the single run adds nothing
    noise = pooled_noise(groups, 0.9)
    squares = 0.0008 + 0.00005
    assert noise.dof == 3 and noise.groups == 2
    assert noise.std == pytest.approx(math.sqrt(squares / 3))
    assert noise.upper > noise.std
    assert pooled_noise([[1.0]], 0.9) is None
    # the bound covers the true sigma about `confidence` of the time
    rng = np.random.default_rng(3)
    covered = sum(pooled_noise([list(rng.normal(0, 1.0, 5))], 0.9).upper >= 1.0 for _ in range(3000))
    assert abs(covered / 3000 - 0.9) < 0.02


def test_floor_pools_baseline_pairs_remeasures_and_verifications():
    records = [{"status": "baseline", "noise_runs": [1.0, 1.02]},
               {"status": "keep", "confirmation": {"pairs": [{"candidate": 0.9, "best": 1.0},
                                                             {"candidate": 0.92, "best": 1.01}]}},
               {"status": "keep", "remeasured": [{"value": 0.9}, {"value": 0.95, "outlier": True},
                                                 {"value": 0.91}]}]
    verifications = [{"verifications": [{"runs": {"candidate": [0.9, 0.93], "parent": [1.0]}}]}]
    level = floor(records, verifications, NoiseConfig(), ConfirmConfig())
    assert level.noise.dof == 5  # baseline 1, pair candidates 1, pair bests 1, remeasures 1, verify 1
    assert level.min_delta == pytest.approx(2 * level.noise.upper)
    assert level.screen == pytest.approx(level.noise.upper)
    assert "upper bound (5 dof)" in level.rule


def test_slow_runs_are_flagged_against_their_peers():
    assert slow_run(18 / 30, [29 / 30, 29 / 30], 0.8)  # the loaded baseline run
    assert not slow_run(28 / 30, [29 / 30, 30 / 30], 0.8)
    assert not slow_run(1.0, [], 0.8) and not slow_run(None, [1.0], 0.8)


def deterministic_repo(tmp_path, step_s=0.0):
    """Fake train.py without noise: with [noise] min_delta 0.1 the test's sigma is 0.05, and
    DEPTH 4 -> 6 gains exactly 0.1, whose LLR is 1.0 per pair: kept after exactly 3 pairs."""
    repo = make_repo(tmp_path / "repo", config="min_delta = 0.1\n[early_stop]\nenabled = false\n")
    source = (repo / "train.py").read_text().replace("STEP_S = 0.0", f"STEP_S = {step_s}")
    if step_s:
        (repo / "train.py").write_text(source)
        sh("git", "commit", "-qam", "slow steps", cwd=repo)
    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "0", cwd=repo)
    store = Store(repo)
    base = store.best()
    diff = store.make_diff("train.py", source, source.replace("DEPTH = 4", "DEPTH = 6"))
    number, commit = store.create_experiment(base, store.apply_diff(base, diff)[0], "depth 6", "test")
    return repo, store, number, commit


def test_kill_9_during_a_confirmation_loses_nothing_and_repeats_nothing(tmp_path):
    repo, store, number, commit = deterministic_repo(tmp_path, step_s=0.2)  # runs slow enough to kill in
    base = store.best()
    proc = subprocess.Popen([sys.executable, "-m", "gitresearch", "loop", "--max-experiments", "1"],
                            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the first pair is in the note
        note = store.read_note(commit)
        if note and len(note.get("confirmation", {}).get("pairs", [])) == 1:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(proc.communicate()[0])
    screened = store.read_note(commit)
    time.sleep(1.0)  # inside the second pair's first run
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert store.best() == base and store.read_note(commit)["status"] == "confirming"
    cli("loop", "--max-experiments", "1", cwd=repo)
    record = store.read_note(commit)
    conf = record["confirmation"]
    assert record["status"] == "keep" and store.best() == commit
    assert conf["verdict"].startswith("kept after 3 pairs: gain 0.100000")
    assert conf["pairs"][0] == screened["confirmation"]["pairs"][0]  # the recorded pair kept as it was
    assert record["screen_val_bpb"] == screened["val_bpb"]  # not screened again
    assert [p["order"] for p in conf["pairs"]] == [["candidate", "best"], ["best", "candidate"],
                                                   ["candidate", "best"]]
    assert store.best_chain() == [commit, base]  # best moved once
    runs = store.state_dir / "runs" / f"{number:06d}"
    assert sorted(p.name for p in runs.iterdir() if p.name.startswith("confirm-")) == [
        f"confirm-{i}-{role}" for i in (1, 2, 3) for role in ("best", "candidate")]
    log = json.loads(cli("show", "best", "--json", cwd=repo).stdout)
    assert log["confirmation"]["llr"] == pytest.approx(3.0)
    state, _ = build_state(store, load(repo), [e for e in store.experiments() if e.number > 0])
    assert f"confirmation: {conf['verdict']}" in render_entry(state.history[0])  # the policies see it


def test_single_run_rule_when_confirmation_is_off(tmp_path):
    repo = make_repo(tmp_path / "repo", config="min_delta = 0.01\n[confirm]\nenabled = false\n")
    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "0", cwd=repo)
    store = Store(repo)
    base = store.best()
    source = (repo / "train.py").read_text()
    diff = store.make_diff("train.py", source, source.replace("DEPTH = 4", "DEPTH = 6"))
    number, commit = store.create_experiment(base, store.apply_diff(base, diff)[0], "depth 6", "test")
    cli("loop", "--max-experiments", "1", cwd=repo)
    record = store.read_note(commit)
    assert record["status"] == "keep" and "confirmation" not in record and store.best() == commit
    assert not (store.state_dir / "runs" / f"{number:06d}" / "confirm-1-candidate").exists()


def test_verify_records_reproducing_and_null_gains(tmp_path):
    """`verify` re-runs each step against its parent in pairs; a real gain is confirmed, a
    change with no effect is not; both are recorded losslessly, shown by status and git log."""
    repo, store, number, commit = deterministic_repo(tmp_path)
    cli("loop", "--max-experiments", "1", cwd=repo)
    assert store.best() == commit
    source = store.read_file(commit, "train.py")
    diff = store.make_diff("train.py", source, "# a comment\n" + source)
    _, null = store.create_experiment(commit, store.apply_diff(commit, diff)[0], "a comment", "test")
    out = cli("verify", "--runs", "2", "--json", "--chain", null, cwd=repo, check=False)
    assert out.returncode == 1  # one commit did not reproduce
    rows = {r["commit"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(rows) == {commit, null}
    assert rows[commit]["verdict"] == "confirmed" and rows[commit]["gain"] == pytest.approx(0.1)
    assert rows[commit]["ci95"] == pytest.approx([0.1, 0.1])
    assert rows[null]["verdict"] == "unconfirmed" and rows[null]["gain"] == pytest.approx(0.0)
    assert [p["order"] for p in rows[commit]["pairs"]] == [["candidate", "parent"], ["parent", "candidate"]]
    cli("verify", "--runs", "2", commit, cwd=repo)  # a second verification is appended
    record = store.read_note(commit, "refs/notes/gitresearch-verify")
    assert [len(v["pairs"]) for v in record["verifications"]] == [2, 2]
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    link = next(link for link in status["best_chain"] if link["commit"] == commit)
    assert link["evidence"].startswith("confirmed by verify (2 pairs, gain +0.100000)")
    assert status["noise_dof"] >= 3  # the verification runs joined the pooled floor
    log = sh("git", "log", "-1", "best", cwd=repo).stdout
    assert "gitresearch verify | confirmed\n" in log and "gain:       +0.100000 (95% +0.100000 to" in log


def test_best_is_remeasured_and_drift_is_reported(tmp_path):
    """Every [confirm] remeasure_every experiments best is run again; a value outside its band
    is drift: status and the next screen use the fresh run."""
    repo = make_repo(tmp_path / "repo", config="min_delta = 0.1\n[confirm]\nremeasure_every = 1\n")
    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "1", "--seed", "1", cwd=repo)
    store = Store(repo)
    base = store.experiment_commit(0)
    record = store.read_note(base)
    assert [r["drift"] for r in record["remeasured"]] == [False]  # experiment 1 was not a keep
    record["val_bpb"] -= 0.5  # as if the machine had been faster when best was measured
    store.write_note(base, record)
    # experiment 2 runs, then best is re-measured (drift), then experiment 3 is screened
    # against that fresh run, then best is re-measured again
    cli("loop", "--max-experiments", "3", "--seed", "1", cwd=repo)
    record = store.read_note(base)
    assert [r["after"] for r in record["remeasured"]] == [1, 2, 3]
    assert record["remeasured"][-1]["drift"] and "band" in record["remeasured"][-1]["reason"]
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["drift"]["reason"] == record["remeasured"][-1]["reason"]
    third = store.read_note(store.experiment_commit(3))
    if "confirmation" in third:
        assert third["confirmation"]["reference_source"] == "best's newest re-run (drift)"
    else:
        assert third["status"] in ("discard", "early_stop", "crash")
        assert third["status"] != "discard" or "over best's newest re-run (drift)" in third["reason"]
