"""Random search: mutate one to three numeric or boolean module-level constants of an editable
file by sampled factors. Constants are found through the Python AST, so any train.py works."""
from __future__ import annotations

import ast
import math
import random
from dataclasses import dataclass

from ..diffs import diff_sha
from . import PolicyError, Proposal, State

FACTOR_RANGE = (1 / 3, 3.0)  # floats are multiplied by a log-uniform factor in this range
MAX_TRIES = 200  # attempts to find a diff never proposed before


@dataclass(frozen=True)
class Site:
    """One literal number or bool inside a module-level assignment."""
    name: str  # the assigned name, plus an index when the value holds several literals
    line: int  # 1-based
    col: int  # UTF-8 byte offsets in the line
    end_col: int
    value: int | float | bool


def find_sites(source: str, skip: tuple[str, ...] = ()) -> list[Site]:
    sites = []
    for node in ast.parse(source).body:
        if not (isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not names or not names[0].isupper() or names[0] in skip:  # constants: UPPER_CASE
            continue
        literals = [n for n in ast.walk(node.value) if isinstance(n, ast.Constant)
                    and isinstance(n.value, (int, float)) and n.lineno == n.end_lineno]
        for i, lit in enumerate(sorted(literals, key=lambda n: (n.lineno, n.col_offset))):
            label = names[0] if len(literals) == 1 else f"{names[0]}[{i}]"
            sites.append(Site(label, lit.lineno, lit.col_offset, lit.end_col_offset, lit.value))
    return sites


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


def rewrite(source: str, changes: list[tuple[Site, object]]) -> str:
    lines = source.splitlines(keepends=True)
    for site, new in sorted(changes, key=lambda c: (c[0].line, c[0].col), reverse=True):
        raw = lines[site.line - 1].encode("utf-8")
        lines[site.line - 1] = (raw[:site.col] + repr(new).encode() + raw[site.end_col:]).decode("utf-8")
    return "".join(lines)


class RandomSearch:
    name = "random"

    def __init__(self, config, store, seed: int | None = None):
        self.store = store
        self.rng = random.Random(seed if seed is not None else config.policy.seed)
        self.skip = config.policy.skip_constants

    def propose(self, state: State) -> Proposal:
        tried = state.tried_diffs
        for _ in range(MAX_TRIES):
            path = self.rng.choice(sorted(state.files))
            source = state.files[path]
            sites = find_sites(source, self.skip)
            if not sites:
                continue
            chosen = self.rng.sample(sites, k=min(len(sites), self.rng.randint(1, 3)))
            changes = [(s, new) for s in chosen if (new := mutate(s.value, self.rng)) is not None]
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
