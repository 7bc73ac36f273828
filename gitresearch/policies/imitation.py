"""Imitation data for a small policy LM that has to learn here, with no downloaded weights:
(prompt, reply) pairs in the policies' own reply format, made from the search space.

Each example starts from the target's files moved by 0 to 12 random steps of the random policy
(so a model has to read the values off the prompt rather than remember the baseline), shows
the compact prompt (prompt.build_compact_prompt: the lines around each live constant, which
is all a constant edit's diff needs as context, and made-up past experiments of every status
the loop records), and answers with a Description line and one ```diff block that changes one
live constant (with `max_changes` > 1: `min_changes` (one) to that many, keeping the divisor
relations, as the random policy does) as the random policy would. The diff is written the way
people and models write one (`--- a/PATH`, `+++ b/PATH`, one hunk; no `diff --git` or blob ids to copy) with no
context line, as `diff -U0` writes it: the model copies one line of its prompt and edits its
value, instead of 7-line hunks of neighbouring lines that merge when constants sit close
together (measured: docs/policies.md). Every reply goes through parse_reply and `git apply`
unchanged (tests/test_imitation.py checks both on a real repo).

With `reply="moves"` the reply is one `Moves:` line instead (moves.py: `Moves: MATRIX_LR
x2.1; DEPTH +1`), stating the random policy's change as steps (moves.step_for); the example's
file after it is what the harness writes for those steps. Its made-up failed tries name a
constant the prompt does not show instead of copying a stale line.

In the moves form each made-up past experiment shows its steps as the loop's compact prompt
shows them (`... : MATRIX_LR 0.005 -> 0.0104 | Moves: MATRIX_LR x2.08`, moves.steps_of). With
`momentum` > 0 a teacher that reads the history writes that share of the replies: the newest
past experiment was kept (its steps moved best to the files shown), and the reply repeats its
steps with one word, `Moves: again` (moves.py); a newest line that is not a keep gets a random
move. Repeating a kept step until it stops paying is the one history-reading rule that beat
random search on the gym's surrogate (benchmarks/gym_headroom.py, docs/gym.md). Teachers that copied the steps
themselves taught small models the names and not the factors' digits (docs/gym.md).

With `min_factor` above 1 the teacher moves every constant at least that far (x or /, within the
random policy's x3): a small LM imitating the random policy's factors wrote narrower ones than
it was shown, and narrower moves lose to random search in the gym (docs/gym.md).

With `hide` > 0 that share of the examples leaves one or two constants out of the view, as the
loop's crash blame leaves out the constants to blame for repeated crashes, while the made-up
history may still name them; their lines leave the view, as the loop's compact prompt leaves
them out: a model taught only full views named such constants (docs/gym.md).

Some examples first show one or two failed tries fed back as the loop feeds them back on a
retry (prompt.compact_retry: the failed reply, then "Rejected: <error>"): an empty reply, a
reply with no diff, a diff whose removed line does not match the file (git's own error), a
change already tried. Without them a model that failed once reads a prompt it never saw and
mostly fails again (measured: docs/policies.md).

    from gitresearch.policies.imitation import examples
    pairs = examples(files, random.Random(0), store.make_diff, n=1000)
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

from ..config import Config, MetricConfig, PolicyConfig
from ..proposal import ALREADY_TRIED, InvalidProposal, check_moves
from .constants import Site, described, find_sites, relations, rewrite
from . import InvalidReply
from .moves import AGAIN, MOVES_PREFIX, find_moves, moved, step_for, steps_of
from .prompt import compact_prompt, compact_retry, fence, give_way, hidden_lines, history_line
from .random_search import FACTOR_RANGE, mutate_site, random_changes
from .reply import parse_reply

# at most this many random-policy steps move the files before an example: most constants
# then differ from the baseline, so the model must read each value off its prompt (with 4,
# it wrote the baseline's value from memory once the loop's keeps had moved best)
WANDER_STEPS = 12
MAX_HISTORY = 12  # past-experiment lines drawn for an example's prompt
REPLY_CONTEXT = 0  # lines of context around the reply's change (git apply --unidiff-zero)
# the loop's statuses, weighted roughly as a young policy meets them (many replies invalid)
STATUSES = ("keep", "discard", "discard", "early_stop", "early_stop", "crash", "timeout",
            "invalid", "invalid", "invalid")
UNMEASURED = ("crash", "timeout", "invalid")
FAILED_TRIES = (0, 0, 0, 0, 0, 0, 1, 1, 1, 2)  # failed tries fed back before an example's reply
FAILURES = ("empty", "no_diff", "stale", "already_tried")  # what a made-up failed try got wrong
# and, in the moves form, the loop's own commonest failures: a step past [policy] max_move_factor
# (given one), a constant moved twice
MOVES_FAILURES = FAILURES + ("too_far", "twice")


@dataclass(frozen=True)
class Example:
    prompt: str  # the user message (compact view + task)
    reply: str  # Description line + one ```diff block
    path: str  # the edited file
    before: str  # its text the prompt shows
    after: str  # its text once the reply's diff is applied
    retries: tuple[dict, ...] = ()  # failed tries fed back after the prompt (assistant, user)
    repeats: str | None = None  # the kept newest experiment's steps the reply repeats (momentum)
    kept: str | None = None  # the newest kept line's steps: what a reply's `again` repeats

    @property
    def messages(self) -> list[dict]:
        """The chat messages the reply answers."""
        return [{"role": "user", "content": self.prompt}, *self.retries]


HUNK_SECTION = re.compile(r"^(@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@).*$", re.MULTILINE)


def plain_diff(git_diff: str) -> str:
    """A libgit2 patch as people write one: from `--- a/` on (no `diff --git` or `index`
    line), hunk headers without the enclosing line git appends (nothing to copy that git
    apply does not read)."""
    start = git_diff.find("\n--- ")
    diff = git_diff[start + 1:] if not git_diff.startswith("--- ") and start >= 0 else git_diff
    return HUNK_SECTION.sub(r"\1", diff)


def reply_text(path: str, before: str, after: str, changes, make_diff: Callable[..., str]) -> str:
    diff = plain_diff(make_diff(path, before, after, context_lines=REPLY_CONTEXT))
    return f"Description: {described(changes)}\n{fence(diff, 'diff')}\n"


def moves_text(changes) -> str:
    return f"{MOVES_PREFIX} {'; '.join(step_for(site, new) for site, new in changes)}\n"


def move_limits(max_factor: float, skip: tuple[str, ...] = (), metric: str = "val_bpb") -> Config | None:
    """The config proposal.check_moves judges a step by, for the loop's [policy]
    max_move_factor (None where 0: off)."""
    if not max_factor:
        return None
    return Config(policy=PolicyConfig(max_move_factor=max_factor, skip_constants=tuple(skip)),
                  metric=MetricConfig(name=metric))


def failed_moves(kind: str, path: str, source: str, change, sites: list[Site],
                 rng: random.Random, too_far: Config | None = None) -> tuple[str, str]:
    """(reply, error) of a made-up failed try of the moves form, with parse_reply's error:
    a step naming a constant the prompt does not show (a misspelt or lower-case name), an
    empty reply, a reply with no Moves line, a change already tried, a constant moved twice;
    or, with `too_far` (a config with [policy] max_move_factor), a step past that factor with
    proposal.check_moves' error, as the loop rejects it."""
    site, new = change
    names = {s.name for s in sites}
    if kind == "too_far" and too_far is not None:
        for _ in range(8):  # a float in (0, 1) moves in odds: its value may stay within the factor
            other = rng.choice(sites)
            if isinstance(other.value, bool) or not isinstance(other.value, (int, float)) or other.value <= 0:
                continue
            factor = too_far.policy.max_move_factor * rng.uniform(1.2, 6.0)
            far = other.value * factor if rng.random() < 0.5 else other.value / factor
            far = max(1, round(far)) if isinstance(other.value, int) else float(f"{far:.3g}")
            reply = moves_text([(other, far)])
            try:
                after = rewrite(source, moved(find_moves(reply), {path: source}, {path: sites})[1])
            except InvalidReply:  # a step the harness cannot write here (it rounds to no change)
                continue
            try:
                check_moves(too_far, path, source, after)
            except InvalidProposal as err:
                return reply, str(err)
        kind = "empty"
    if kind == "twice":
        other = rng.choice(sites)
        steps = [value for value in (mutate_site(other, rng), mutate_site(other, rng)) if value is not None]
        if len(steps) == 2:
            reply = f"{MOVES_PREFIX} {step_for(other, steps[0])}; {step_for(other, steps[1])}\n"
            try:
                parse_reply(reply, {path: source}, lambda *a: "", {path: sites})
            except InvalidReply as err:
                return reply, str(err)
        kind = "empty"
    wrong = [n for n in (site.name.lower(), site.name.split("[")[0] + "S", site.name.split("_")[-1]) if n not in names]
    if kind == "stale" and wrong:
        reply = moves_text([(Site(rng.choice(wrong), site.line, site.col, site.end_col, site.value, site.kind), new)])
    elif kind == "already_tried":
        other = rng.choice(sites)
        value = mutate_site(other, rng)
        if value is not None:
            return moves_text([(other, value)]), ALREADY_TRIED.format(rng.randint(1, 300))
        reply = ""
    else:
        reply = "" if kind == "empty" else f"Description: {described([change])}\n"
    try:
        parse_reply(reply, {path: source}, lambda *a: "", {path: sites})
    except InvalidReply as err:
        return reply, str(err)
    raise AssertionError(f"a made-up failed reply parsed: {reply!r}")


def failed_try(kind: str, path: str, source: str, change, sites: list[Site], rng: random.Random,
               make_diff: Callable[..., str]) -> tuple[str, str]:
    """(reply, error) of a made-up failed try before the reply that makes `change`, with the
    error the loop would record for it: parse_reply's own for a reply without a diff, git
    apply's wording for a removed line that is not in the file."""
    site, new = change
    if kind == "stale":  # the intended change, copied from a line with another value
        wrong = mutate_site(site, rng)
        if wrong not in (None, new):
            stale = rewrite(source, [(site, wrong)])
            reply = reply_text(path, stale, rewrite(source, [change]), [(site, new)], make_diff)
            return reply, (f"the diff does not apply to {rng.getrandbits(48):012x}: error: patch failed: "
                           f"{path}:{site.line}\nerror: {path}: patch does not apply")
    if kind == "already_tried":
        other = rng.choice(sites)
        value = mutate_site(other, rng)
        if value is not None and (other, value) != change and rewrite(source, [(other, value)]) != source:
            reply = reply_text(path, source, rewrite(source, [(other, value)]), [(other, value)], make_diff)
            return reply, ALREADY_TRIED.format(rng.randint(1, 300))
    reply = "" if kind == "empty" else f"Description: {described([change])}\n"
    try:
        parse_reply(reply, {path: source}, make_diff)
    except InvalidReply as err:
        return reply, str(err)
    raise AssertionError(f"a made-up failed reply parsed: {reply!r}")


def examples(files: dict[str, str], rng: random.Random, make_diff: Callable[..., str],
             n: int, skip: tuple[str, ...] = (), cuda: bool = False, metric: str = "val_bpb",
             wander: int = WANDER_STEPS, tries: tuple[int, ...] = FAILED_TRIES,
             max_changes: int = 1, reply: str = "diff", momentum: float = 0.0,
             min_changes: int = 1, min_factor: float = 1.0, history: int = MAX_HISTORY,
             fits: Callable[[list[dict]], bool] | None = None, hide: float = 0.0,
             max_factor: float = 0.0) -> list[Example]:
    """n imitation examples over `files` (path -> source of the baseline), each after a number
    of failed tries drawn from `tries`, each reply changing `min_changes` to `max_changes`
    constants (fewer only where a mutation rounds back to its value), in
    the `reply` form (diff or moves); in the moves form a share `momentum` of them repeat the
    kept newest past experiment's steps; with `min_factor` above 1 every factor the reply (and
    the keep it repeats) moves a constant by is at least that far from 1 (random_search.draw_factor).
    Each prompt draws up to `history` made-up past experiments; with `fits` (the messages ->
    whether they leave the loop's reply budget) the prompt gives way as the loop's compact prompt
    does (prompt.give_way): oldest history lines first, then the fed-back tries; an
    example whose repeated keep would be cut is drawn again. In a share `hide` of the examples
    the view leaves out one or two constants (never the repeated keep's), as the loop's crash
    blame does, while the made-up history may still name them: the reply never does. With
    `max_factor` (the loop's [policy] max_move_factor) the moves form's failed tries include
    the loop's commonest failures: a step past that factor, with the loop's error, and a
    constant moved twice (without them a model answered such an error with an empty reply)."""
    too_far = move_limits(max_factor, skip, metric)
    kinds = MOVES_FAILURES if too_far and reply == "moves" else FAILURES
    if not 1 <= min_changes <= max_changes:
        raise ValueError(f"min_changes {min_changes} must be 1 to max_changes {max_changes}")
    if not 1 <= min_factor < FACTOR_RANGE[1]:
        raise ValueError(f"min_factor {min_factor} must be 1 or more and below the largest factor {FACTOR_RANGE[1]:g}")
    seen: dict[str, list[Site]] = {}

    def live(source: str) -> list[Site]:  # parsing dominates making examples: once per text
        if source not in seen:
            seen[source] = find_sites(source, skip, cuda=cuda, metric=metric)
        return seen[source]

    paths = sorted(p for p, source in files.items() if live(source))
    if not paths:
        raise ValueError("no live constant in the files: nothing to imitate")
    out = []
    while len(out) < n:
        current = dict(files)
        for _ in range(rng.randint(0, wander)):
            path = rng.choice(paths)
            current[path] = rewrite(current[path], random_changes(live(current[path]), rng))
        # momentum: the newest past experiment was kept, its steps moved best to `current`,
        # and the reply repeats them (in the moves form; below)
        repeat = reply == "moves" and momentum > 0 and rng.random() < momentum
        kept = None
        if repeat:
            path = rng.choice(paths)
            kept = random_changes(live(current[path]), rng, relations(current[path]), most=max_changes,
                                  least=min_changes, floor=min_factor)
            if not kept:
                continue
            current[path] = rewrite(current[path], kept)
        sites = named = {path: live(current[path]) for path in paths}
        hidden = {}
        if hide and rng.random() < hide:  # as crash blame does: the view leaves out constants
            where = rng.choice(paths)  # (by name, as ADAM_BETAS) that the history may name
            base = lambda site: site.name.split("[")[0]  # noqa: E731
            names = sorted({base(site) for site in sites[where]})
            free = sorted(set(names) - {base(site) for site, _ in kept or ()})
            gone = set(rng.sample(free, min(rng.randint(1, 2), len(names) - 1, len(free))))
            sites = {**sites, where: [site for site in sites[where] if base(site) not in gone]}
            hidden = {where: hidden_lines(named[where], sites[where])}

        def told(changes) -> tuple[str, str | None]:  # a past experiment's description and steps
            description = described(changes)
            return description, steps_of(description, sites) if reply == "moves" else None

        # made-up past experiments: the model learns to read past them, not to trust them
        past, number, kept_steps = [], rng.randint(1, 300), None
        if repeat:  # the newest one: the keep whose steps the reply repeats
            description, kept_steps = told(kept)
            past.append(history_line(number, "keep", round(rng.uniform(1.5, 4.0), 6),
                                        round(rng.uniform(-0.05, -0.001), 6), description, kept_steps))
        for k in range(len(past), rng.randint(len(past), history)):
            # with a momentum teacher a kept newest experiment always means "repeat it"
            status = rng.choice(STATUSES[1:] if not past and momentum else STATUSES)
            value = None if status in UNMEASURED else round(rng.uniform(1.5, 4.0), 6)
            delta = None if value is None else round(rng.uniform(-0.05, 0.5), 6)
            changes = random_changes(named[rng.choice(paths)], rng)
            if not changes:  # its one mutation rounded back to the value: no change to show
                continue
            description, steps = told(changes)
            if status == "keep" and kept_steps is None:
                kept_steps = steps
            past.append(history_line(number - k, status, value, delta, description, steps))
        text = repeats = None
        if repeat:  # `again`: the kept steps once more, as the harness applies them to `current`
            text = f"{MOVES_PREFIX} {AGAIN}\n"
            try:
                changes = moved(AGAIN, current, sites, kept_steps)[1]
            except InvalidReply:  # they round to no change here: the example shows a fresh move
                text = None
            else:
                repeats = kept_steps
        if text is None:
            path = rng.choice(paths)
            if max_changes > 1:
                changes = random_changes(sites[path], rng, relations(current[path]), most=max_changes,
                                         least=min_changes, floor=min_factor)
            else:  # the stream of the one-change examples the measured LMs were trained on
                site = rng.choice(sites[path])
                changes = [(site, new)] if (new := mutate_site(site, rng, floor=min_factor)) is not None else []
            if not changes:
                continue
        if reply == "moves":
            text = text or moves_text(changes)
            try:  # the file as the harness writes it for these steps (its rounding, relations)
                after = rewrite(current[path], moved(find_moves(text), current, sites, kept_steps)[1])
            except InvalidReply:
                continue
            failed = lambda kind: failed_moves(kind, path, current[path], changes[0], sites[path], rng, too_far)  # noqa: E731
        else:
            after = rewrite(current[path], changes)
            text = reply_text(path, current[path], after, changes, make_diff)
            failed = lambda kind: failed_try(kind, path, current[path], changes[0], sites[path], rng, make_diff)  # noqa: E731
        if after == current[path]:
            continue
        retries = [m for _ in range(rng.choice(tries)) for m in compact_retry(*failed(rng.choice(kinds)), reply)]
        if fits:  # the prompt gives way as the loop's does
            fitted = give_way(past, retries, lambda shown, tries: fits(
                [{"role": "user", "content": compact_prompt(current, sites, shown, metric, reply, hidden)}, *tries]))
            if fitted is None:  # as the loop, which stops: the constants' view is never cut
                raise ValueError("the compact prompt's view of the constants alone overflows the reply budget")
            past, retries = fitted
            if repeat and not past:
                continue  # the keep the reply repeats is no longer shown
        out.append(Example(compact_prompt(current, sites, past, metric, reply, hidden), text, path, current[path],
                           after, tuple(retries), repeats, kept_steps))
    return out
