"""Random search: mutate one to three of an editable file's live constants (constants.py: the
literals that can change the run on this machine) by sampled factors. Constants are found
through the Python AST, so any train.py works."""
from __future__ import annotations

import math
import random

from ..diffs import diff_sha
from ..workers import visible_gpus
from . import PolicyError, Proposal, State
from .constants import find_sites, rewrite

FACTOR_RANGE = (1 / 3, 3.0)  # floats are multiplied by a log-uniform factor in this range
MAX_TRIES = 200  # attempts to find a diff never proposed before


def mutate(value, rng: random.Random):
    if isinstance(value, bool):
        return not value
    if value == 0:
        return None  # a zero has no scale to sample around
    factor = math.exp(rng.uniform(math.log(FACTOR_RANGE[0]), math.log(FACTOR_RANGE[1])))
    if isinstance(value, float) and 0 < value < 1:  # a momentum, beta or share stays in (0, 1)
        odds = value / (1 - value) * factor
        return float(f"{odds / (1 + odds):.3g}")
    if isinstance(value, int):
        new = round(value * factor)
        if new == value:  # small ints: step by one in the sampled direction
            new = value + (1 if factor > 1 else -1)
        return max(new, 1) if value > 0 else new
    return float(f"{value * factor:.3g}")


def random_changes(sites: list, rng: random.Random) -> list:
    """One to three of the sites, each with a mutated value: [(site, new value)]."""
    chosen = rng.sample(sites, k=min(len(sites), rng.randint(1, 3)))
    return [(s, new) for s in chosen if (new := mutate(s.value, rng)) is not None]


class RandomSearch:
    name = "random"

    def __init__(self, config, store, seed: int | None = None, cuda: bool | None = None):
        self.store = store
        self.rng = random.Random(seed if seed is not None else config.policy.seed)
        self.skip = config.policy.skip_constants
        self.metric = config.metric.name
        # the runner gives each run a GPU when this machine has one (workers.worker_env)
        self.cuda = bool(visible_gpus()) if cuda is None else cuda

    def propose(self, state: State) -> Proposal:
        tried = state.tried_diffs
        for _ in range(MAX_TRIES):
            path = self.rng.choice(sorted(state.files))
            source = state.files[path]
            sites = find_sites(source, self.skip, cuda=self.cuda, metric=self.metric)
            if not sites:
                continue
            changes = random_changes(sites, self.rng)
            if not changes:
                continue
            diff = self.store.make_diff(path, source, rewrite(source, changes))
            sha = diff_sha(diff)
            if sha in tried:
                continue
            description = "; ".join(f"{s.name} {s.value!r} -> {new!r}" for s, new in changes)
            return Proposal(diff, description, {"changes": [
                {"name": s.name, "old": s.value, "new": new} for s, new in changes]})
        raise PolicyError(f"no new mutation found in {MAX_TRIES} tries")

    def observe(self, record: dict) -> None:
        """The finished experiment's note; random search learns nothing from it."""
