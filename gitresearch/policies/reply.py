"""A model's reply -> (description, unified diff).

Accepted forms, in this order:
0. a `Moves:` line (moves.py: `Moves: NAME x2; OTHER +1`): the harness writes the literals;
1. unified diffs in fenced blocks (```diff, ```patch, or any fence whose body starts like a
   diff); several such blocks are joined, as models sometimes split one change;
2. an unfenced unified diff: from the first `diff --git` or `--- ` line followed by `+++ `;
3. a whole-file replacement: a fenced Python block that parses and keeps at least half the
   lines of the editable file it replaces (the only editable file, or the one named on the
   fence line). It is turned into a diff with libgit2 and goes through the same validation.
   Accepted because small models often rewrite the file instead of diffing it; the size rule
   keeps a snippet from silently replacing the whole file.
Nothing here patches a file: applying is `git apply` (gitstore.apply_diff) alone.
"""
from __future__ import annotations

import ast
import re
from typing import Callable

from . import InvalidReply
from .constants import Site, find_sites
from .moves import find_moves, parse_moves

FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)(?:^(?P=fence)[ \t]*$|\Z)",
                   re.MULTILINE | re.DOTALL)
DIFF_START = re.compile(r"^(diff --git |--- \S.*\n\+\+\+ \S)", re.MULTILINE)
DIFF_LINE = re.compile(r"^([ +\-\\@]|diff --git |index |old mode |new mode |deleted file |new file |similarity |rename |$)")
DESCRIPTION = re.compile(r"^\W*description\W*:\s*(?P<text>.+)$", re.IGNORECASE | re.MULTILINE)
MAX_DESCRIPTION = 160  # characters
MIN_KEPT_SHARE = 0.5  # a whole-file replacement keeps at least this share of the file's lines


def describe(text: str) -> str:
    match = DESCRIPTION.search(FENCE.sub("", text))
    if match:
        line = match.group("text")
    else:
        prose = [ln.strip(" #*>-") for ln in FENCE.sub("", text).splitlines()]
        line = next((ln for ln in prose if ln), "")
    line = re.sub(r"\s+", " ", line.strip().strip("*`").strip())
    return line[:MAX_DESCRIPTION] or "LLM edit (no description given)"


def _trim_diff(text: str) -> str:
    """Cut prose that follows a diff (a model's closing remarks) at the first line that is
    not diff syntax after the first hunk."""
    lines, out, in_hunks = text.splitlines(), [], False
    for line in lines:
        if line.startswith("@@"):
            in_hunks = True
        elif in_hunks and not DIFF_LINE.match(line):
            break
        out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


def _looks_like_diff(info: str, body: str) -> bool:
    lang = info.strip().split()[0].lower() if info.strip() else ""
    return lang in ("diff", "patch", "udiff") or bool(DIFF_START.match(body))


def parse_reply(text: str, files: dict[str, str], make_diff: Callable[[str, str, str], str],
                sites: dict[str, list[Site]] | None = None, kept: str | None = None) -> tuple[str, str]:
    """(description, diff) from a reply; InvalidReply says what was missing. `sites` (path ->
    the constants a Moves line may name) defaults to every file's live constants; `kept`
    (moves.best_steps) is what a Moves line's `again` repeats."""
    if not text.strip():
        raise InvalidReply("the reply is empty", text)
    moves = find_moves(text)
    if moves is not None:
        if sites is None:
            sites = {path: find_sites(source) for path, source in files.items() if path.endswith(".py")}
        return parse_moves(moves, files, sites, make_diff, kept)
    blocks = [(m.group("info"), m.group("body")) for m in FENCE.finditer(text)]
    diffs = [_trim_diff(body) for info, body in blocks if _looks_like_diff(info, body) and body.strip()]
    if diffs:
        return describe(text), "".join(diffs)
    start = DIFF_START.search(text)
    if start:
        return describe(text[:start.start()] or text), _trim_diff(text[start.start():])
    for info, body in blocks:
        path = _replaced_file(info, body, files)
        if path:
            return describe(text), make_diff(path, files[path], body if body.endswith("\n") else body + "\n")
    raise InvalidReply("no unified diff found in the reply: expected a ```diff block with "
                       "--- a/PATH, +++ b/PATH and @@ hunks (or the whole new file in one "
                       "```python block, or a Moves: line)", text)


def _replaced_file(info: str, body: str, files: dict[str, str]) -> str | None:
    named = [p for p in files if p in info]
    lang = info.strip().split()[0].lower() if info.strip() else ""
    if lang not in ("", "python", "py", "python3") and not named:
        return None
    path = named[0] if named else (next(iter(files)) if len(files) == 1 else None)
    if path is None or not path.endswith(".py"):
        return None
    try:
        ast.parse(body)
    except SyntaxError:
        return None
    if len(body.splitlines()) < MIN_KEPT_SHARE * len(files[path].splitlines()):
        return None
    return path
