"""Imitation data for a small policy LM that has to learn here, with no downloaded weights:
(prompt, reply) pairs in the policies' own reply format, made from the search space.

Each example starts from the target's files moved by a few random steps of the random policy
(so a model has to read the values off the prompt rather than remember the baseline), shows
the compact view of the editable files (the lines around each live constant, which is all a
constant edit's diff needs as context), and answers with a Description line and one
```diff block that edits one to three live constants as the random policy would. The diff is
written the way people and models write one (`--- a/PATH`, `+++ b/PATH`, hunks; no
`diff --git` or blob ids to copy). Every reply goes through parse_reply and `git apply`
unchanged (tests/test_imitation.py checks both on a real repo).

    from gitresearch.policies.imitation import examples
    pairs = examples(files, random.Random(0), store.make_diff, n=1000)
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from .constants import Site, find_sites, rewrite
from .prompt import fence
from .random_search import random_changes

CONTEXT_LINES = 3  # around each constant in the compact view: the context a unified diff needs
WANDER_STEPS = 4  # at most this many random steps move the files before an example
TASK = ("Propose the next experiment: one change to the current best. Reply with the "
        "Description line and one ```diff block.")


@dataclass(frozen=True)
class Example:
    prompt: str  # the user message (compact view + task)
    reply: str  # Description line + one ```diff block
    path: str  # the edited file
    before: str  # its text the prompt shows
    after: str  # its text once the reply's diff is applied


def compact_view(source: str, sites: list[Site], context: int = CONTEXT_LINES) -> str:
    """The file's lines within `context` of a live constant, in runs headed by their first
    line number ("# lines 12-30"); the lines between runs are left out."""
    lines = source.splitlines()
    keep = sorted({i for s in sites for i in range(s.line - 1 - context, s.line + context)
                   if 0 <= i < len(lines)})
    runs: list[list[int]] = []
    for i in keep:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return "\n".join(f"# lines {run[0] + 1}-{run[-1] + 1}\n" + "\n".join(lines[i] for i in run)
                     for run in runs)


def compact_prompt(files: dict[str, str], sites: dict[str, list[Site]]) -> str:
    """The user message of the compact prompt mode: each editable file's constants with
    their context, then the task."""
    views = [f"## {path}\n{fence(compact_view(source, sites[path]), 'python')}"
             for path, source in sorted(files.items()) if sites.get(path)]
    return "# The current best: its constants\n" + "\n\n".join(views) + f"\n\n# Your task\n{TASK}"


def plain_diff(git_diff: str) -> str:
    """A libgit2 patch without its `diff --git` and `index` lines: from `--- a/` on."""
    start = git_diff.find("\n--- ")
    return git_diff[start + 1:] if not git_diff.startswith("--- ") and start >= 0 else git_diff


def examples(files: dict[str, str], rng: random.Random, make_diff: Callable[[str, str, str], str],
             n: int, skip: tuple[str, ...] = (), cuda: bool = False, metric: str = "val_bpb",
             wander: int = WANDER_STEPS) -> list[Example]:
    """n imitation examples over `files` (path -> source of the baseline)."""
    def live(source: str) -> list[Site]:
        return find_sites(source, skip, cuda=cuda, metric=metric)

    paths = sorted(p for p, source in files.items() if live(source))
    if not paths:
        raise ValueError("no live constant in the files: nothing to imitate")
    out = []
    while len(out) < n:
        current = dict(files)
        for _ in range(rng.randint(0, wander)):
            path = rng.choice(paths)
            current[path] = rewrite(current[path], random_changes(live(current[path]), rng))
        sites = {path: live(current[path]) for path in paths}
        path = rng.choice(paths)
        changes = random_changes(sites[path], rng)
        after = rewrite(current[path], changes)
        if not changes or after == current[path]:
            continue
        description = "; ".join(f"{s.name} {s.value!r} -> {new!r}" for s, new in changes)
        diff = plain_diff(make_diff(path, current[path], after))
        reply = f"Description: {description}\n{fence(diff, 'diff')}\n"
        out.append(Example(compact_prompt(current, sites), reply, path, current[path], after))
    return out
