"""Diff text helpers shared by policies and the harness (a leaf module, so no import circle):
a diff's identity, and the repair of removed lines that carry a stale value."""
from __future__ import annotations

import hashlib
import re
from typing import Callable

ASSIGNMENT = re.compile(r"^\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]*)?=(?!=)")
FILE_HEADER = re.compile(r"^--- (?:a/)?(?P<path>[^\t\n]+)")


def diff_sha(diff: str) -> str:
    """Identity of a diff's content, independent of blob ids and line numbers in its headers."""
    body = [line for line in diff.splitlines() if line[:1] in "+- " and not line.startswith(("+++", "---"))]
    return hashlib.sha256("\n".join(body).encode()).hexdigest()[:16]


def assigned_name(line: str) -> str | None:
    match = ASSIGNMENT.match(line)
    return match.group("name") if match else None


def _added_names(lines: list[str]) -> list[set[str]]:
    """Per hunk, in order, the names its added lines assign."""
    hunks: list[set[str]] = []
    for line in lines:
        if line.startswith("@@"):
            hunks.append(set())
        elif hunks and line.startswith("+") and not line.startswith("+++ "):
            name = assigned_name(line[1:])
            if name:
                hunks[-1].add(name)
    return hunks


def repair_stale_lines(diff: str, read: Callable[[str], str | None]) -> tuple[str, list[str]] | None:
    """The diff with each removed assignment line that is not in its file replaced by the file's
    one assignment to the same name, and the repairs ("old -> file's line"); None when nothing
    can be repaired safely.

    Models copy a value wrong when they write the removed line (`WARMDOWN_FRAC = 0.131` for the
    file's 0.139), and then the whole diff fails to apply although its intent is plain: set that
    name to the added line's value. A removed line is repaired only when it assigns a name that
    the file assigns on exactly one line, that line is not removed elsewhere in the diff, the
    removed line itself is nowhere in the file, and its hunk adds a line assigning the same
    name (a stale removal with no such line would turn into deleting the constant, which no
    model meant: the diff stays invalid). Context lines and every other line stay as
    written, so the repaired diff still has to apply with git, and a stale context line or an
    ambiguous name still fails. `read(path)` gives the file's text, None when it is absent."""
    lines = diff.split("\n")
    added = _added_names(lines)
    path, in_hunk, hunk, repairs = None, False, -1, []
    files: dict[str, list[str] | None] = {}
    taken: set[tuple[str, int]] = set()
    for i, line in enumerate(lines):
        header = FILE_HEADER.match(line)
        if header and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            path, in_hunk = header.group("path").strip(), False
            continue
        if line.startswith("@@"):
            in_hunk, hunk = path is not None, hunk + 1
            continue
        if not in_hunk or not line.startswith("-"):
            continue
        if path not in files:
            text = read(path)
            files[path] = None if text is None else text.split("\n")
        file_lines = files[path]
        if file_lines is None:
            continue
        if line[1:] in file_lines:
            taken.add((path, file_lines.index(line[1:])))
            continue
        name = assigned_name(line[1:])
        same = [n for n, text in enumerate(file_lines) if name and assigned_name(text) == name]
        if len(same) != 1 or (path, same[0]) in taken or name not in added[hunk]:
            return None
        taken.add((path, same[0]))
        repairs.append(f"{line[1:].strip()} -> {file_lines[same[0]].strip()}")
        lines[i] = "-" + file_lines[same[0]]
    return ("\n".join(lines), repairs) if repairs else None
