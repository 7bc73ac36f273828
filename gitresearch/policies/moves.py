"""The moves reply form (`[llm] reply = "moves"`): the model states each change as a step and
the harness writes the literal.

    Moves: MATRIX_LR x2.1; DEPTH +1; HEAD_LR /1.5; MUON_MOMENTUM = 0.9

A step is `xF` or `/F` (multiply or divide by F > 0), `+K` or `-K` (add: ints and exponents),
or `= V` (set a number or a bool). NAME is a constant the compact prompt shows (a live
constant, constants.find_sites; `ADAM_BETAS[1]` for one literal of a tuple). The step `again`
stands for the steps of the change that made the current best (best_steps: best's newest
keep, as its line in the prompt states them), applied once more: `Moves: again` pushes on in
the direction that last paid.

Why `again`: repeating a kept move's steps until they stop paying is the one history-reading
rule that beat random search on the gym's surrogate (docs/gym.md, "How much room is there
above random search?"). A small model taught to copy the kept steps off their history line
copied the names and not the factors' digits (benchmarks/copy_check.py); one word states the
repeat exactly, whatever the model's skill at copying numbers.

Why: a model that writes literals writes them digit by digit, so the size of its move depends on
the digits of the old value. Changing a last digit is a tiny move and adding a digit a huge one;
a factor says the size itself, whatever the old value (measured: docs/gym.md, "Moves stated as
factors").

A factor on a float in (0, 1) multiplies its odds v / (1 - v), as the random policy moves such
a value: a momentum or share stays in (0, 1) whatever the factor (`MUON_MOMENTUM x2` on 0.95
writes 0.974), and a small value moves almost by the factor itself (`MATRIX_LR x2` on 0.005
writes 0.00995). Without this a model wrote `ADAM_BETAS[1] x1.06` on 0.95, a beta above 1,
in 2 of its first 8 experiments.

The harness rounds as the random policy does: a float to 3 significant digits (a float in
(0, 1) to as many more as keep it inside: `x1e6` on 0.95 writes 0.9999999, not 1.0), an int to an
int (at least 1 if it was positive), a shape-like int to a multiple of its alignment. It also
keeps the file's divisor relations (random_search.keep_relations): a WIDTH moved off a multiple
of HEAD_DIM rounds back to one. The result is an ordinary unified diff that goes through the
same validation as any other reply. The description names the values written
("MATRIX_LR 0.005 -> 0.0104").
"""
from __future__ import annotations

import ast
import math
import re
from typing import Callable

from . import InvalidReply
from .constants import Site, described, relations, rewrite
from .random_search import keep_relations, share_of_odds

MOVES_PREFIX = "Moves:"  # what the imitation data writes; MOVES_LINE reads it in any case and spacing
MOVES_LINE = re.compile(r"^\W*moves\W*:(?P<text>.*)$", re.IGNORECASE | re.MULTILINE)
STEP = re.compile(r"^(?P<name>[A-Za-z_]\w*(?:\[\d+\])?)\s*(?P<op>[x*/+=-])\s*(?P<arg>\S+)$")
AGAIN = "again"  # the step that repeats best's newest kept steps
SMALL_INT = 16  # an int below this moves by +K/-K in the imitation data, a larger one by a factor
# one change as constants.described names it: `MATRIX_LR 0.005 -> 0.0104`
DESCRIBED_CHANGE = re.compile(r"^(?P<name>[A-Za-z_]\w*(?:\[\d+\])?) (?P<old>\S+) -> (?P<new>\S+)$")


def find_moves(text: str) -> str | None:
    """The text after the first `Moves:` line's colon, or None if the reply has none."""
    match = MOVES_LINE.search(text)
    return match.group("text").strip() if match else None


def _number(arg: str, step: str) -> float:
    try:
        value = float(arg)
    except ValueError:
        raise InvalidReply(f"the step `{step}` needs a number after its operator, not {arg!r}", step) from None
    if not math.isfinite(value):
        raise InvalidReply(f"the step `{step}` is not a finite number", step)
    return value


def _rounded(site: Site, value: float, step: str):
    if not math.isfinite(value):
        raise InvalidReply(f"the step `{step}` takes {site.name} beyond any finite number", step)
    if isinstance(site.value, int):
        new = round(value)
        if site.align > 1:
            new = max(site.align, round(new / site.align) * site.align)
        return max(new, 1) if site.value > 0 and site.kind != "exponent" else new
    return float(f"{value:.3g}")


def new_value(site: Site, op: str, arg: str, step: str):
    """The value `op arg` gives the site, rounded as the random policy rounds."""
    if op == "=":
        try:
            value = ast.literal_eval(arg)
        except (ValueError, SyntaxError):
            raise InvalidReply(f"the step `{step}` sets a value that is not a number or bool: {arg!r}", step) from None
        if isinstance(site.value, bool) != isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = "True or False" if isinstance(site.value, bool) else "a number"
            raise InvalidReply(f"the step `{step}` sets {site.name} to {arg!r}; it takes {kind}", step)
        return value if isinstance(value, bool) else _rounded(site, value, step)
    if isinstance(site.value, bool):
        raise InvalidReply(f"{site.name} is a bool: set it with `{site.name} = True` or `= False`", step)
    number = _number(arg, step)
    if op in "x*/":
        if site.kind == "exponent":
            raise InvalidReply(f"{site.name} is an exponent: step it with +K or -K", step)
        if number <= 0:
            raise InvalidReply(f"the step `{step}` needs a factor above 0", step)
        factor = number if op in "x*" else 1 / number
        if isinstance(site.value, float) and 0 < site.value < 1:  # a share, momentum or rate: its odds move
            odds = site.value / (1 - site.value) * factor
            if not math.isfinite(odds):
                raise InvalidReply(f"the step `{step}` takes {site.name} beyond any finite number", step)
            return share_of_odds(odds)
        return _rounded(site, site.value * factor, step)
    if isinstance(site.value, int) and number != int(number):
        raise InvalidReply(f"{site.name} is an int: add a whole number, not {arg}", step)
    return _rounded(site, site.value + number if op == "+" else site.value - number, step)


def step_names(text: str) -> set[str]:
    """The constants a Moves line's readable steps name (`MATRIX_LR x2; DEPTH +1` names
    MATRIX_LR and DEPTH; a step that does not read names nothing)."""
    return {m["name"] for step in re.split(r"[;,]", text) if (m := STEP.match(step.strip()))}


def best_steps(best_chain: list[dict], sites: dict[str, list[Site]]) -> str | None:
    """The steps of the change that made the current best (State.best_chain's newest link,
    a keep), what the step `again` repeats; None at the baseline or where that change is not
    stated as values (an agent's words)."""
    if len(best_chain) < 2 or best_chain[-1].get("status") != "keep":
        return None
    return steps_of(best_chain[-1].get("description") or "", sites)


def with_again(text: str, kept: str | None) -> str:
    """The Moves line's text with each step `again` replaced by `kept` (best_steps)."""
    steps = [s.strip() for s in re.split(r"[;,]", text) if s.strip()]
    if not any(step.lower() == AGAIN for step in steps):
        return text
    if not kept:
        raise InvalidReply(f"`{AGAIN}` repeats the steps of the change that made the current best, and best has "
                           "none to repeat (it is the baseline, or its change is not stated as steps)", text)
    return "; ".join(kept if step.lower() == AGAIN else step for step in steps)


def moved(text: str, files: dict[str, str], sites: dict[str, list[Site]],
          kept: str | None = None) -> tuple[str, list[tuple[Site, object]]]:
    """(path, [(site, new value)]) that a moves reply's text (find_moves) asks for, with the
    divisor relations kept; InvalidReply says which step failed and why. All the steps change
    one file. A step `again` stands for `kept` (best_steps)."""
    steps = [s.strip() for s in re.split(r"[;,]", with_again(text, kept)) if s.strip()]
    if not steps:
        raise InvalidReply("the Moves line is empty: write steps such as `Moves: NAME x2; OTHER +1`", text)
    by_name = {site.name: (path, site) for path, found in sites.items() for site in found}
    changes: dict[str, list[tuple[Site, object]]] = {}
    for step in steps:
        match = STEP.match(step)
        if not match:
            raise InvalidReply(f"cannot read the step `{step}`: expected NAME xF, NAME /F, NAME +K, "
                               "NAME -K or NAME = V", text)
        name, op, arg = match.group("name", "op", "arg")
        if name not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise InvalidReply(f"the step `{step}` names {name}, which is not a constant shown; "
                               f"the constants: {known}", text)
        path, site = by_name[name]
        changes.setdefault(path, []).append((site, new_value(site, op, arg, step)))
    if len(changes) > 1:
        raise InvalidReply(f"the steps change {len(changes)} files; one experiment changes one file", text)
    (path, steps_of_file), = changes.items()
    if len({site.name for site, _ in steps_of_file}) < len(steps_of_file):
        raise InvalidReply("a constant is moved twice in one Moves line", text)
    final = keep_relations(steps_of_file, sites[path], relations(files[path]))
    if not final:
        raise InvalidReply("the steps leave every value where it was (after rounding): take a larger step", text)
    return path, final


def parse_moves(text: str, files: dict[str, str], sites: dict[str, list[Site]],
                make_diff: Callable[[str, str, str], str], kept: str | None = None) -> tuple[str, str]:
    """(description, diff) of a moves reply's text: the values written, and the diff."""
    path, final = moved(text, files, sites, kept)
    return described(final), make_diff(path, files[path], rewrite(files[path], final))


def step_for(site: Site, new) -> str:
    """The step that states the change of `site` to `new` (the imitation data's replies):
    `= V` for a bool or a sign change, +K/-K for an exponent or a small int, else a factor
    with 3 significant digits (of the odds for a float in (0, 1))."""
    old = site.value
    if isinstance(old, bool) or isinstance(new, bool) or old == 0 or new == 0 or (old > 0) != (new > 0):
        return f"{site.name} = {new!r}"
    if isinstance(old, int) and (site.kind == "exponent" or abs(old) < SMALL_INT):
        return f"{site.name} {'+' if new > old else '-'}{abs(new - old)}"
    if isinstance(old, float) and 0 < old < 1:  # moved in odds, as new_value reads the factor
        if not 0 < new < 1:
            return f"{site.name} = {new!r}"
        factor = (new / (1 - new)) / (old / (1 - old))
    else:
        factor = new / old
    return f"{site.name} x{factor:.3g}" if factor >= 1 else f"{site.name} /{1 / factor:.3g}"


def steps_of(description: str, sites: dict[str, list[Site]]) -> str | None:
    """The steps (`MATRIX_LR x2.08; DEPTH +1`) that state a past experiment's described change
    (`MATRIX_LR 0.005 -> 0.0104; DEPTH 4 -> 5`), each as step_for states it (a constant's kind
    read off `sites` by name), or None where the description is not a list of such changes
    (a coding agent's own words). The compact prompt shows them on each past experiment, so
    that a model can repeat a kept move by copying its steps instead of dividing two values."""
    by_name = {site.name: site for found in sites.values() for site in found}
    steps = []
    for part in description.split(";"):
        match = DESCRIBED_CHANGE.match(part.strip())
        if not match:
            return None
        try:
            old, new = ast.literal_eval(match["old"]), ast.literal_eval(match["new"])
        except (ValueError, SyntaxError):
            return None
        if not all(isinstance(v, (int, float)) for v in (old, new)):
            return None
        known = by_name.get(match["name"])
        steps.append(step_for(Site(match["name"], 0, 0, 0, old, known.kind if known else "value"), new))
    return "; ".join(steps) or None
