"""The random policy: constants found through the AST, sensible mutations, no repeats."""
import random

from gitresearch.config import Config, PolicyConfig
from gitresearch.policies import State
from gitresearch.policies.random_search import RandomSearch, diff_sha, find_sites, mutate, rewrite

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
        beta = mutate(0.95, rng)
        assert 0 < beta < 1 and beta != 0.95 or beta == 0.95  # a share stays a share
        assert mutate(1, rng) >= 1 and mutate(4, rng) != 4
        assert 0.02 / 3 - 1e-9 <= mutate(0.02, rng) <= 0.02 * 3 + 1e-9
    assert mutate(True, rng) is False and mutate(0, rng) is None


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
