"""The reward: each term's direction and scale, and its place in every note."""
import pytest

import itertools

from gitresearch.config import ConfigError, RewardConfig, load
from gitresearch.reward import novelty, reward

BASE = {"noise_std": 0.01, "peak_memory_mb": 1000.0}
CFG = RewardConfig()


def run(**fields):
    return {"status": "discard", "parent_val_bpb": 2.0, "val_bpb": 2.0, "budget_s": 60.0,
            "training_seconds": 60.0, "peak_memory_mb": 1000.0, "novelty": 0.0, **fields}


def test_improvement_is_in_noise_sigmas_and_clipped():
    assert reward(run(val_bpb=1.98), BASE, CFG)["improvement"] == pytest.approx(2.0)
    assert reward(run(val_bpb=2.03), BASE, CFG)["improvement"] == pytest.approx(-3.0)
    assert reward(run(val_bpb=0.5), BASE, CFG)["improvement"] == CFG.improvement_clip
    assert reward(run(val_bpb=1.98), {"noise_std": 0.0}, CFG)["improvement"] == pytest.approx(10.0)  # sigma floor 1e-3


def test_loss_weight_scales_losses_and_leaves_gains():
    best_seeking = RewardConfig(loss_weight=0.25)
    assert reward(run(val_bpb=1.98), BASE, best_seeking)["improvement"] == pytest.approx(2.0)
    assert reward(run(val_bpb=2.03), BASE, best_seeking)["improvement"] == pytest.approx(-0.75)
    assert reward(run(val_bpb=9.0), BASE, best_seeking)["improvement"] == pytest.approx(-2.5)  # clipped, then scaled
    gains_only = RewardConfig(loss_weight=0.0)
    assert reward(run(val_bpb=2.03), BASE, gains_only)["improvement"] == 0.0
    stopped = run(status="early_stop", val_bpb=None, training_seconds=15.0, checks=[{"mean": 2.2}])
    assert reward(stopped, BASE, gains_only)["total"] > reward(run(val_bpb=2.2), BASE, gains_only)["total"]


def test_efficiency_prefers_faster_lighter_and_early_stopped_losers():
    equal = reward(run(), BASE, CFG)["efficiency"]
    assert reward(run(peak_memory_mb=500.0), BASE, CFG)["efficiency"] > equal
    assert reward(run(training_seconds=30.0), BASE, CFG)["efficiency"] > equal
    stopped = run(status="early_stop", val_bpb=None, training_seconds=15.0,
                  checks=[{"mean": 2.2}])
    full_loser = run(val_bpb=2.2)
    assert reward(stopped, BASE, CFG)["improvement"] == reward(full_loser, BASE, CFG)["improvement"]
    assert reward(stopped, BASE, CFG)["total"] > reward(full_loser, BASE, CFG)["total"]


def test_penalties_and_total():
    assert reward(run(status="crash", val_bpb=None), BASE, CFG)["penalty"] == CFG.crash_penalty
    assert reward(run(status="timeout", val_bpb=None), BASE, CFG)["penalty"] == CFG.timeout_penalty
    invalid = reward({"status": "invalid", "novelty": 1.0}, BASE, CFG)
    assert invalid == {"total": -12.0, "improvement": 0.0, "efficiency": 0.0, "novelty": 0.0, "penalty": 12.0}
    assert reward({"status": "invalid", "backend_only": True}, BASE, CFG)["total"] == 0.0
    r = reward(run(val_bpb=1.99, novelty=0.5), BASE, CFG)
    assert r["total"] == pytest.approx(r["improvement"] + r["efficiency"] + r["novelty"] - r["penalty"])
    assert r["novelty"] == pytest.approx(0.05)


def test_novelty_is_one_minus_the_closest_jaccard():
    a = "--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-LR = 0.1\n+LR = 0.2\n"
    b = "--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-LR = 0.1\n+LR = 0.3\n"
    c = "--- a/t.py\n+++ b/t.py\n@@ -2 +2 @@\n-DEPTH = 4\n+DEPTH = 6\n"
    assert novelty(a, []) == 1.0
    assert novelty(a, [a]) == 0.0
    assert novelty(b, [a, c]) == pytest.approx(1 - 1 / 3)  # shares "LR = 0.1" of 3 distinct lines
    assert novelty(c, [a, b]) == 1.0


def test_constants_novelty_pays_less_for_the_constant_the_window_keeps_moving():
    lr = lambda old, new: f"--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-LR = {old}\n+LR = {new}\n"  # noqa: E731
    depth = "--- a/t.py\n+++ b/t.py\n@@ -2 +2 @@\n-DEPTH = 4\n+DEPTH = 6\n"
    both = "--- a/t.py\n+++ b/t.py\n@@ -1,2 +1,2 @@\n-LR = 0.1\n-DEPTH = 4\n+LR = 0.7\n+DEPTH: int = 8\n"
    prose = "--- a/t.py\n+++ b/t.py\n@@ -9 +9 @@\n-x = f(y)\n+x = g(y)\n"
    window = [lr(0.1, 0.2), lr(0.1, 0.3), depth, prose]  # 3 diffs move a constant; 2 of them LR
    new_lr = lr(0.1, 0.5)
    lines = novelty(new_lr, window)
    assert lines == pytest.approx(2 / 3)  # shares "LR = 0.1"; the lines form sees no narrowing
    assert novelty(new_lr, window, "constants") == pytest.approx(lines * (1 - 2 / 3))
    assert novelty(new_lr, [depth, prose], "constants") == 1.0  # the window moved DEPTH, never LR
    # two constants: the mean of their shares (LR 2/3, DEPTH 1/3); "DEPTH: int = 8" is an assignment too
    assert novelty(both, window, "constants") == pytest.approx(novelty(both, window) * (1 - (2 / 3 + 1 / 3) / 2))
    # no constant in the diff, or none in the window: the lines form's figure
    assert novelty(prose.replace("g(y)", "h(y)"), window, "constants") == novelty(prose.replace("g(y)", "h(y)"), window)
    assert novelty(new_lr, [prose], "constants") == novelty(new_lr, [prose]) == 1.0
    assert novelty(new_lr, [new_lr], "constants") == 0.0  # a repeat stays worth nothing
    assert novelty("LR == 0.1", window, "constants") == 0.0  # not a diff: no changed line


def test_novelty_form_must_be_known(tmp_path):
    (tmp_path / "gitresearch.toml").write_text('[reward]\nnovelty = "tokens"\n')
    with pytest.raises(ConfigError, match=r"novelty = 'tokens': expected one of lines, constants"):
        load(tmp_path)
    (tmp_path / "gitresearch.toml").write_text('[reward]\nnovelty = "constants"\n')
    assert load(tmp_path).reward.novelty == "constants"


@pytest.mark.parametrize("loss_weight", [1.0, 0.25, 0.0])
def test_every_failure_scores_below_every_valid_run(loss_weight):
    """The order the RL policy relies on: no invalid, crashed or timed-out experiment scores
    as well as the worst valid one, whatever the extremes of each term and the loss weight."""
    CFG = RewardConfig(loss_weight=loss_weight)
    valid = [reward(run(status=status, val_bpb=value, training_seconds=seconds, peak_memory_mb=memory,
                        novelty=new, checks=[{"mean": value}]), BASE, CFG)["total"]
             for status, value, seconds, memory, new in itertools.product(
                 ("keep", "discard", "early_stop"), (0.1, 2.0, 9.0), (0.0, 60.0, 500.0),
                 (1.0, 1000.0, 1e6), (0.0, 1.0))]
    assert min(valid) == pytest.approx(CFG.valid_floor())  # the floor is reached, not only bounded
    failed = [reward(run(status=status, val_bpb=value, training_seconds=seconds, peak_memory_mb=memory,
                         novelty=new), BASE, CFG)["total"]
              for status, value, seconds, memory, new in itertools.product(
                  ("invalid", "crash", "timeout"), (None, 0.1, float("nan")), (0.0, 60.0, 500.0),
                  (1.0, 1e6), (0.0, 1.0))]
    assert max(failed) < min(valid)
    assert max(failed) == -min(CFG.invalid_penalty, CFG.crash_penalty, CFG.timeout_penalty)


def test_config_refuses_penalties_a_valid_run_can_undercut(tmp_path):
    (tmp_path / "gitresearch.toml").write_text("[reward]\ncrash_penalty = 1.0\n")
    with pytest.raises(ConfigError, match="crash_penalty = 1.0: a failed experiment must score below any valid run"):
        load(tmp_path)
    (tmp_path / "gitresearch.toml").write_text("[reward]\nimprovement_clip = 3.0\ncrash_penalty = 4.5\n")
    assert load(tmp_path).reward.crash_penalty == 4.5
    (tmp_path / "gitresearch.toml").write_text("[reward]\nloss_weight = 0.5\ncrash_penalty = 5.5\n")
    with pytest.raises(ConfigError, match="floor is -6 "):  # 1 x 0.5 x 10 + 1
        load(tmp_path)
    (tmp_path / "gitresearch.toml").write_text("[reward]\nloss_weight = 0.5\ncrash_penalty = 6.5\n")
    assert load(tmp_path).reward.valid_floor() == -6.0


@pytest.mark.parametrize("weight", [-0.5, 1.5])
def test_config_refuses_a_loss_weight_outside_zero_to_one(tmp_path, weight):
    (tmp_path / "gitresearch.toml").write_text(f"[reward]\nloss_weight = {weight}\n")
    with pytest.raises(ConfigError, match=rf"loss_weight = {weight}: expected a weight in \[0, 1\]"):
        load(tmp_path)


def test_paid_gains_keeps_pays_only_what_the_loop_kept():
    keeps = RewardConfig(loss_weight=0.0, paid_gains="keeps")
    assert reward(run(status="keep", val_bpb=1.98), BASE, keeps)["improvement"] == pytest.approx(2.0)
    assert reward(run(status="discard", val_bpb=1.98), BASE, keeps)["improvement"] == 0.0
    counted_losses = RewardConfig(loss_weight=0.5, paid_gains="keeps")
    assert reward(run(status="discard", val_bpb=2.03), BASE, counted_losses)["improvement"] == pytest.approx(-1.5)
    # a no-op near best: its runs land either side of the parent by noise alone. Paid on any gain
    # with losses free, it earns the positive half of the noise; paid on keeps, nothing.
    noise = [(-1) ** i * 0.001 * (i % 7 + 1) for i in range(40)]
    def mean_improvement(config):
        return sum(reward(run(val_bpb=2.0 + e), BASE, config)["improvement"] for e in noise) / len(noise)
    assert mean_improvement(RewardConfig(loss_weight=0.0)) > 0.1
    assert mean_improvement(keeps) == 0.0


def test_paid_gains_must_be_known(tmp_path):
    (tmp_path / "gitresearch.toml").write_text('[reward]\npaid_gains = "discards"\n')
    with pytest.raises(ConfigError, match=r"paid_gains = 'discards': expected one of all, keeps"):
        load(tmp_path)
