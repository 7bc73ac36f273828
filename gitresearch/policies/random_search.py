"""Random search: mutate one to three of an editable file's live constants (constants.py: the
literals that can change the run on this machine) by sampled factors, keeping exponents,
shape alignments and divisor relations, and leaving alone constants to blame for two crashes
since they last ran (history.crashed_constants). Constants are found through the Python AST, so any
train.py works."""
from __future__ import annotations

import math
import random

from ..config import ConfigError
from ..diffs import diff_sha
from ..workers import visible_gpus
from . import InvalidReply, PolicyError, Proposal, State
from .constants import described, find_sites, relations, rewrite

FACTOR_RANGE = (1 / 3, 3.0)  # floats are multiplied by a log-uniform factor in this range
MAX_TRIES = 200  # attempts to find a diff never proposed before


def share_of_odds(odds: float) -> float:
    """odds / (1 + odds) to 3 significant digits, or as many more as keep it inside (0, 1):
    0.999 with its odds x3 is 0.999667, not 1.0 (a beta of 1 that the next move would
    multiply as a plain float, past 1)."""
    share = odds / (1 + odds)
    for digits in range(3, 17):
        rounded = float(f"{share:.{digits}g}")
        if 0 < rounded < 1:
            return rounded
    return min(max(share, math.nextafter(0, 1)), math.nextafter(1, 0))  # odds beyond a float's digits


def draw_factor(rng: random.Random, factors: tuple[float, float] = FACTOR_RANGE, floor: float = 1.0) -> float:
    """A multiplicative factor, log-uniform in `factors`; with `floor` above 1, at least that
    far from 1 either way: its size |ln factor| uniform in [ln floor, ln factors[1]] and its
    sign a coin (for the symmetric range the random policy draws from)."""
    if floor > 1:
        size = rng.uniform(math.log(floor), math.log(factors[1]))
        return math.exp(size if rng.random() < 0.5 else -size)
    return math.exp(rng.uniform(math.log(factors[0]), math.log(factors[1])))


def mutate(value, rng: random.Random, factors: tuple[float, float] = FACTOR_RANGE, floor: float = 1.0):
    if isinstance(value, bool):
        return not value
    if value == 0:
        return None  # a zero has no scale to sample around
    factor = draw_factor(rng, factors, floor)
    if isinstance(value, float) and 0 < value < 1:  # a momentum, beta or share stays in (0, 1)
        return share_of_odds(value / (1 - value) * factor)
    if isinstance(value, int):
        new = round(value * factor)
        if new == value:  # small ints: step by one in the sampled direction
            new = value + (1 if factor > 1 else -1)
        return max(new, 1) if value > 0 else new
    return float(f"{value * factor:.3g}")


def mutate_site(site, rng: random.Random, factors: tuple[float, float] = FACTOR_RANGE, floor: float = 1.0):
    """A new value for the site (a number by a log-uniform factor within `factors`, at least
    `floor` from 1 where that is above 1: draw_factor): an
    exponent moves by one or two steps (2**10 -> 2**11, never 2**30), a shape-like int stays
    a multiple of its alignment. None where there is none, or where the mutation rounds back
    to the value (1 stepped down, an aligned int, a float at 3 digits): a made-up past
    experiment `HEAD_DIM 64 -> 64` would teach a step of x1."""
    if site.kind == "exponent" and isinstance(site.value, int):
        new = max(0, site.value + rng.choice((-2, -1, 1, 2)))
    else:
        new = mutate(site.value, rng, factors, floor)
        if new is not None and site.align > 1:
            new = max(site.align, round(new / site.align) * site.align)
    return None if new == site.value else new


def divisors_near(n: int, target: float) -> int:
    """The divisor of n closest to target on a log scale."""
    found = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    found += [n // d for d in found]
    return min(found, key=lambda d: (abs(math.log(d / target)), d))


def keep_relations(changes: list, sites: list, relations) -> list:
    """The changes, adjusted so that every divisor relation that holds at best still holds:
    a multiple rounds to the (new) divisor, a changed divisor becomes a divisor of its
    (unchanged) multiple. Changes that end where they started are dropped."""
    value = {s.name: s.value for s in sites}
    value.update((s.name, new) for s, new in changes)
    old = {s.name: s.value for s in sites}
    changed = {s.name for s, _ in changes}
    ints = lambda *names: all(isinstance(old.get(n), int) and not isinstance(old.get(n), bool)  # noqa: E731
                              and old[n] > 0 for n in names)
    live = [(a, b) for a, b in sorted(relations) if ints(a, b) and old[a] % old[b] == 0]
    for multiple, divisor in live:
        if divisor in changed and multiple not in changed:
            value[divisor] = divisors_near(old[multiple], value[divisor])
    for multiple, divisor in live:
        if multiple in changed or divisor in changed:
            d = value[divisor]
            value[multiple] = max(d, round(value[multiple] / d) * d)
            changed.add(multiple)
    by_name = {s.name: s for s in sites}
    return [(by_name[n], value[n]) for n in sorted(changed, key=list(by_name).index) if value[n] != old[n]]


def random_changes(sites: list, rng: random.Random, relations=(), most: int = 3,
                   factors: tuple[float, float] = FACTOR_RANGE, least: int = 1, floor: float = 1.0) -> list:
    """`least` (one) to `most` of the sites, each with a mutated value (mutate_site: its factor
    at least `floor` from 1): [(site, new value)],
    keeping the divisor relations (constants.relations) that hold now; a site with no new
    value (mutate_site, as a constant at 0) is left out, and while fewer than `least` moved,
    another site takes its place (with least 1 the draws are those the random policy made
    before `least` existed); keeping a relation may still fold a move back."""
    chosen = rng.sample(sites, k=min(len(sites), rng.randint(least, most)))
    changes = [(s, new) for s in chosen if (new := mutate_site(s, rng, factors, floor)) is not None]
    if least > 1 and len(changes) < least:  # with least 1 an empty draw is the caller's to redraw
        spare = [s for s in sites if s not in chosen]
        for site in rng.sample(spare, k=len(spare)):
            if len(changes) >= least:
                break
            if (new := mutate_site(site, rng, factors, floor)) is not None:
                changes.append((site, new))
    return keep_relations(changes, sites, relations) if relations else changes


def changes_data(changes) -> list[dict]:
    """The note's record of [(site, new value)]."""
    return [{"name": site.name, "old": site.value, "new": new} for site, new in changes]


class RandomSearch:
    """With [policy] random_min_factor and random_momentum at their defaults (1 and 0) the
    plain random policy. With them set it is the teacher `pretrain-policy --min-factor
    --momentum` shows a small LM: every factor at least random_min_factor from 1, and after a
    keep (the newest finished experiment made best) with chance random_momentum the kept steps
    once more, as the moves reply `Moves: again` applies them (docs/policies.md, "The
    teacher's rules")."""
    name = "random"

    def __init__(self, config, store, seed: int | None = None, cuda: bool | None = None):
        self.store = store
        self.rng = random.Random(seed if seed is not None else config.policy.seed)
        self.floor = config.policy.random_min_factor
        if self.floor >= FACTOR_RANGE[1]:
            raise ConfigError(f"[policy] random_min_factor = {self.floor!r}: expected a factor below the random "
                              f"policy's largest, {FACTOR_RANGE[1]:g}")
        self.momentum = config.policy.random_momentum
        self.skip = config.policy.skip_constants
        self.metric = config.metric.name
        # the runner gives each run a GPU when this machine has one (workers.worker_env)
        self.cuda = bool(visible_gpus()) if cuda is None else cuda

    def sites(self, state: State, path: str) -> list:
        avoided = set(state.diagnostics.get("crashed_constants") or {})
        return [s for s in find_sites(state.files[path], self.skip, cuda=self.cuda, metric=self.metric)
                if s.name.split("[")[0] not in avoided]

    def again(self, state: State) -> Proposal | None:
        """The steps of the keep that made best, once more from best (moves.AGAIN), or None
        where there is none to repeat, they round to no change or were tried before."""
        from .moves import AGAIN, best_steps, moved  # moves builds on this module's helpers
        sites = {path: self.sites(state, path) for path in sorted(state.files)}
        kept = best_steps(state.best_chain, sites)
        if not kept:
            return None
        try:
            path, changes = moved(AGAIN, state.files, sites, kept)
        except InvalidReply:  # a kept constant now avoided, or a step rounding to nothing
            return None
        return self.untried(state, path, changes, again=kept)

    def untried(self, state: State, path: str, changes: list, **data) -> Proposal | None:
        """The proposal that makes `changes` to `path`, or None where its diff was tried before."""
        source = state.files[path]
        diff = self.store.make_diff(path, source, rewrite(source, changes))
        if diff_sha(diff) in state.tried_diffs:
            return None
        return Proposal(diff, described(changes), {**data, "changes": changes_data(changes)})

    def propose(self, state: State) -> Proposal:
        newest_kept = bool(state.history) and state.history[0].status == "keep"
        if self.momentum and newest_kept and self.rng.random() < self.momentum:
            if (proposal := self.again(state)) is not None:
                return proposal
        for _ in range(MAX_TRIES):
            path = self.rng.choice(sorted(state.files))
            source = state.files[path]
            sites = self.sites(state, path)
            if not sites:
                continue
            changes = random_changes(sites, self.rng, relations(source), floor=self.floor)
            if changes and (proposal := self.untried(state, path, changes)) is not None:
                return proposal
        raise PolicyError(f"no new mutation found in {MAX_TRIES} tries")

    def observe(self, record: dict) -> None:
        """The finished experiment's note; random search learns nothing from it."""
