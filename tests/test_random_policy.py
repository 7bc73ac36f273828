"""The random policy: constants found through the AST, sensible mutations, no repeats."""
import math
import random
from pathlib import Path

import pytest

from gitresearch.config import Config, PolicyConfig
from gitresearch.policies import State
from gitresearch.policies.constants import find_sites, log_moves, move_summary, rewrite
from gitresearch.policies.random_search import RandomSearch, diff_sha, mutate

SOURCE = '''import os
CUDA = os.environ.get("X") == "1"
DEPTH = 12 if CUDA else 4  # layers
LR = 0.02  # learning rate, café
BETAS = (0.8, 0.95)
USE_QK_NORM = False
SEED = 1337
name = "lowercase is not a constant"
def f():
    INNER = 3
'''


def log_move(old: float, new: float) -> float:
    """ln of the factor a move applied: to the odds of a share in (0, 1), as the policy moves one."""
    return math.log(new / (1 - new) / (old / (1 - old))) if 0 < old < 1 else math.log(new / old)


class DiffMaker:
    def make_diff(self, path, old, new):
        import difflib
        return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), path, path))


def test_sites_come_from_the_ast():
    sites = {s.name: s.value for s in find_sites(SOURCE, skip=("SEED",))}
    assert sites == {"DEPTH[0]": 12, "DEPTH[1]": 4, "LR": 0.02, "BETAS[0]": 0.8, "BETAS[1]": 0.95,
                     "USE_QK_NORM": False}


def test_rewrite_keeps_everything_else():
    sites = {s.name: s for s in find_sites(SOURCE)}
    new = rewrite(SOURCE, [(sites["LR"], 0.05), (sites["DEPTH[1]"], 6), (sites["USE_QK_NORM"], True)])
    assert "DEPTH = 12 if CUDA else 6  # layers\n" in new
    assert "LR = 0.05  # learning rate, café\n" in new and "USE_QK_NORM = True\n" in new
    assert new.count("\n") == SOURCE.count("\n")


def test_mutations_stay_sensible():
    rng = random.Random(0)
    for _ in range(500):
        for share in (0.95, 0.999, 0.001):
            assert 0 < mutate(share, rng) < 1  # a share stays a share (0.999 x3 is not 1.0)
        assert mutate(1, rng) >= 1 and mutate(4, rng) != 4
        assert 0.02 / 3 - 1e-9 <= mutate(0.02, rng) <= 0.02 * 3 + 1e-9
    assert mutate(True, rng) is False and mutate(0, rng) is None


def test_move_sizes_count_the_positive_numbers_an_edit_changed():
    before = {"LR": 0.02, "DEPTH": 4, "FLAG": True, "BIAS": -1.0, "ZERO": 0, "NAME": "a", "SAME": 3, "GONE": 2}
    after = {"LR": 0.06, "DEPTH": 1, "FLAG": False, "BIAS": -3.0, "ZERO": 5, "NAME": "b", "SAME": 3}
    assert log_moves(before, after) == pytest.approx([math.log(3), math.log(4)])
    # the median, and the share beyond the factor 3 (exactly 3 is not beyond)
    assert move_summary(log_moves(before, after)) == (round((math.log(3) + math.log(4)) / 2, 3), 0.5)
    assert move_summary([]) == (None, None)
    # the random policy's mutations of a float stay within the factor 3 the figure is judged by
    rng = random.Random(1)
    assert max(m for _ in range(300) for m in log_moves({"LR": 0.02}, {"LR": mutate(0.02, rng)})) <= math.log(3) + 1e-9


def test_never_proposes_the_same_diff_twice(tmp_path):
    source = "A = 2\nB = True\n"
    policy = RandomSearch(Config(policy=PolicyConfig(seed=1)), DiffMaker())
    tried = set()
    for _ in range(8):
        state = State("x", {"train.py": source}, [], [], Config(), frozenset(tried))
        proposal = policy.propose(state)
        sha = diff_sha(proposal.diff)
        assert sha not in tried
        tried.add(sha)


TARGET = (Path(__file__).resolve().parents[1] / "target_repo" / "train.py").read_text()


def test_only_the_branch_live_on_this_machine_is_searched():
    cpu = {s.name: s.value for s in find_sites(TARGET, cuda=False)}
    gpu = {s.name: s.value for s in find_sites(TARGET, cuda=True)}
    assert (cpu["DEPTH"], cpu["WIDTH"], cpu["BATCH_SIZE"]) == (4, 128, 16)  # the CPU scale only
    assert (gpu["DEPTH"], gpu["WIDTH"], gpu["BATCH_SIZE"]) == (12, 768, 32)  # the GPU scale only
    assert set(cpu) == set(gpu) and cpu["MATRIX_LR"] == gpu["MATRIX_LR"] == 0.005
    assert cpu["ADAM_BETAS[1]"] == 0.95  # several literals in one live value keep their index


def test_conditions_known_here_follow_names_and_if_blocks():
    source = '''import torch
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"
BATCH = 64 if ON_GPU else 8
DTYPE_BITS = 16 if (ON_GPU and not False) else 32
if not ON_GPU:
    STEPS = 10
else:
    STEPS = 1000
SCALE = 2 if torch.cuda.device_count() > 1 else 1  # not known here: both branches
'''
    cpu = {s.name: s.value for s in find_sites(source, cuda=False)}
    gpu = {s.name: s.value for s in find_sites(source, cuda=True)}
    assert cpu == {"BATCH": 8, "DTYPE_BITS": 32, "STEPS": 10, "SCALE[0]": 2, "SCALE[1]": 1}
    assert gpu == {"BATCH": 64, "DTYPE_BITS": 16, "STEPS": 1000, "SCALE[0]": 2, "SCALE[1]": 1}


def test_bookkeeping_constants_are_left_alone():
    source = '''PEAK_FLOPS = 989.5e12  # only feeds a printed MFU
LR = 0.01
EVAL_EVERY = 10
IMPORTED_ELSEWHERE = 3
def train(step, flops, opt):
    opt.lr = LR
    mfu = 100 * flops / PEAK_FLOPS
    share = mfu / 100
    if step % EVAL_EVERY == 0:
        print(f"step {step} lr {LR} mfu {share:.1f}")
'''
    names = {s.name for s in find_sites(source)}
    # LR is printed but also trains; EVAL_EVERY decides when to print (a condition, kept: the
    # analysis does not follow control flow); one never read may be imported by another module
    assert names == {"LR", "EVAL_EVERY", "IMPORTED_ELSEWHERE"}
    # the default skip list: seeds, logging cadence, peak figures, whatever reads them
    listed = "SEED = 3\nLOG_EVERY = 10\nH100_PEAK_FLOPS = 1e15\nLR = 0.1\ntrain(SEED, LOG_EVERY, H100_PEAK_FLOPS, LR)\n"
    assert {s.name for s in find_sites(listed)} == {"LR"}
    # output that names the metric is the result the harness reads: what feeds it is searched
    fake = (Path(__file__).resolve().parent / "fakes" / "curve.py").read_text()
    assert {s.name for s in find_sites(fake)} == {"LR", "DEPTH", "STEP_S"}
    assert {s.name for s in find_sites(fake, metric="other_metric")} == {"STEP_S"}


def test_the_random_policy_never_touches_a_dead_branch():
    for cuda, dead in ((False, {"DEPTH": 12, "WIDTH": 768, "BATCH_SIZE": 32}),
                       (True, {"DEPTH": 4, "WIDTH": 128, "BATCH_SIZE": 16})):
        policy = RandomSearch(Config(policy=PolicyConfig(seed=3)), DiffMaker(), cuda=cuda)
        tried = set()
        for _ in range(60):
            proposal = policy.propose(State("x", {"train.py": TARGET}, [], [], Config(), frozenset(tried)))
            tried.add(diff_sha(proposal.diff))
            for change in proposal.data["changes"]:
                assert dead.get(change["name"]) != change["old"], change
                assert change["name"] not in ("DEPTH[0]", "DEPTH[1]")  # one live literal, no index


def test_random_changes_never_leave_a_value_where_it_was():
    # 1 stepped down stays 1, an aligned 64 rounds back to 64, 0.9 x1.01 is 0.9: such a change
    # would show as `ONE 1 -> 1` (a step `-0`) in a made-up past experiment
    from gitresearch.policies.random_search import random_changes
    source = "ONE = 1\nBETA = 0.9\nWIDTH = 64\n"
    sites = find_sites(source)
    rng = random.Random(0)
    drawn = [change for _ in range(400) for change in random_changes(sites, rng, most=3, factors=(0.5, 2))]
    assert {site.name for site, _ in drawn} == {"ONE", "BETA", "WIDTH"}
    assert all(new != site.value for site, new in drawn)


def test_random_changes_with_least_one_draw_as_before_least_existed():
    """The random policy's stream is the seed's: with least 1 an empty draw (every chosen
    site rounds back) stays empty for the caller to redraw, as before `least` topped up."""
    from gitresearch.policies.random_search import mutate_site, random_changes
    sites = find_sites("ONE = 1\nBETA = 0.9\nWIDTH = 64\nLR = 0.01\n")
    for seed in range(300):
        ours, theirs = random.Random(seed), random.Random(seed)
        chosen = theirs.sample(sites, k=theirs.randint(1, 3))
        before = [(s, new) for s in chosen if (new := mutate_site(s, theirs, (0.9, 1.1))) is not None]
        assert random_changes(sites, ours, factors=(0.9, 1.1)) == before
        assert ours.random() == theirs.random()  # the same draws consumed
    # least 2: a site that rounds back (ONE and WIDTH at x0.9-1.1) gives its place to another
    two = [random_changes(sites[:2] + sites[3:] + [sites[2]], random.Random(seed), least=2) for seed in range(100)]
    assert all(len(changes) >= 2 for changes in two)


def test_a_factor_floor_moves_every_constant_at_least_that_far_and_floor_one_draws_as_before():
    """draw_factor with floor 1 consumes and returns exactly the random policy's log-uniform
    draw; with floor 1.5 every factor is x1.5 to x3 or /1.5 to /3, either way about as often,
    and so is every float constant random_changes moves (to its 3 significant digits)."""
    from gitresearch.policies.random_search import FACTOR_RANGE, draw_factor, random_changes
    for seed in range(200):
        ours, theirs = random.Random(seed), random.Random(seed)
        assert draw_factor(ours) == math.exp(theirs.uniform(math.log(FACTOR_RANGE[0]), math.log(FACTOR_RANGE[1])))
        assert ours.random() == theirs.random()
    rng = random.Random(0)
    sizes = [math.log(draw_factor(rng, floor=1.5)) for _ in range(4000)]
    assert all(math.log(1.5) <= abs(s) <= math.log(3) for s in sizes)
    assert 0.45 < sum(s > 0 for s in sizes) / len(sizes) < 0.55
    plain = [abs(math.log(draw_factor(rng))) for _ in range(4000)]
    assert min(plain) < math.log(1.1)  # without the floor small moves are drawn
    sites = find_sites("LR = 0.02\nEMBED_LR = 0.3\nBETA = 0.9\nCLIP = 1.0\n")
    for seed in range(300):
        for site, new in random_changes(sites, random.Random(seed), floor=1.5):
            assert abs(log_move(site.value, new)) >= math.log(1.5) - 2e-3, (site.name, site.value, new)


def teacher(seed=0, floor=1.0, momentum=0.0):
    return RandomSearch(Config(policy=PolicyConfig(seed=seed, random_min_factor=floor, random_momentum=momentum)),
                        DiffMaker(), cuda=False)


def test_the_policy_with_a_momentum_repeats_a_keep_that_made_best_and_otherwise_draws_as_plain():
    """random_momentum 1: after a keep (the newest experiment made best) the proposal is its
    steps once more from best, as `Moves: again` writes them; after anything else, and with
    momentum 0, the proposals are the plain policy's, draw for draw."""
    from gitresearch.history import Entry
    source = "LR = 0.02\nWIDTH = 64\nCLIP = 1.0\n"
    chain = [{"status": "baseline", "description": "baseline"},
             {"status": "keep", "description": "LR 0.01 -> 0.02; CLIP 2.0 -> 1.0"}]
    kept = [Entry(2, "c" * 40, "p" * 40, chain[1]["description"], "keep", 1.5, -0.01, "", "", 1.0, None, "")]
    lost = [Entry(3, "d" * 40, "c" * 40, "WIDTH 64 -> 128", "discard", 1.6, 0.1, "", "", 1.0, None, "")] + kept

    def proposals(policy, history, n=20):
        state = State("c" * 40, {"train.py": source}, history, chain, Config())
        return [policy.propose(state) for _ in range(n)]

    for proposal in proposals(teacher(momentum=1.0), kept, 3):
        # LR is a float in (0, 1): its odds move x2.02 again (0.0396, not 0.04), CLIP /2 again
        assert proposal.description == "LR 0.02 -> 0.0396; CLIP 1.0 -> 0.5" and proposal.data["again"]
        assert "+LR = 0.0396\n" in proposal.diff and "+CLIP = 0.5\n" in proposal.diff
    plain = [p.diff for p in proposals(teacher(), [])]
    assert [p.diff for p in proposals(teacher(momentum=1.0), lost)] == plain
    assert [p.diff for p in proposals(teacher(momentum=0.0), kept)] == plain
    # half the time after a keep: about half the proposals repeat it
    repeats = sum("again" in p.data for p in proposals(teacher(seed=5, momentum=0.5), kept, 400))
    assert 150 < repeats < 250
    # the repeat tried before: a fresh draw instead
    tried = frozenset({diff_sha(proposals(teacher(momentum=1.0), kept, 1)[0].diff)})
    again = teacher(momentum=1.0).propose(State("c" * 40, {"train.py": source}, kept, chain, Config(), tried))
    assert "again" not in again.data and diff_sha(again.diff) not in tried


def test_the_policy_with_a_factor_floor_moves_every_constant_at_least_that_far():
    source = "LR = 0.02\nEMBED_LR = 0.3\nWIDTH_MULT = 40.0\nCLIP = 1.0\n"
    floored, plain = teacher(floor=1.5), teacher()
    sizes = {"floored": [], "plain": []}
    for _ in range(150):
        for name, policy in (("floored", floored), ("plain", plain)):
            for change in policy.propose(State("x", {"train.py": source}, [], [], Config())).data["changes"]:
                sizes[name].append(abs(log_move(change["old"], change["new"])))
    assert min(sizes["floored"]) >= math.log(1.5) - 2e-3
    assert min(sizes["plain"]) < math.log(1.2)  # without it small moves are drawn


def test_the_teacher_settings_out_of_range_are_refused(tmp_path):
    from gitresearch.config import ConfigError, load
    for setting in ("random_min_factor = 0.5", "random_momentum = 1.5", "random_momentum = -0.1"):
        (tmp_path / "gitresearch.toml").write_text(f"[policy]\n{setting}\n")
        with pytest.raises(ConfigError, match=setting.split(" ")[0]):
            load(tmp_path)
    with pytest.raises(ConfigError, match="random_min_factor"):
        teacher(floor=3.0)
