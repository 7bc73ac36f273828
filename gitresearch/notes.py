"""The note format. Each experiment has two notes on its commit:
- the readable note (refs/notes/gitresearch, shown by plain `git log`): a summary line, then a
  few short lines (metric, delta, noise, status reason, early stop, confirmation), every line
  at most NOTE_WIDTH columns so `git log` reads well in an 80-column terminal;
- the record (refs/notes/records/gitresearch): the whole record as one JSON object with its
  schema version (log tails, checks, attempts, replies: everything).
Schema 1 notes held both in one note (the summary line, a blank line, the JSON); readers accept
them and every schema up to NOTE_SCHEMA (README, "Git layout")."""
from __future__ import annotations

import json
import textwrap

from .errors import GitresearchError

NOTE_SCHEMA = 2
NOTE_WIDTH = 76  # git log indents a note by 4 columns: 80 in all
LABEL = 12  # the label column of the readable lines


class NoteError(GitresearchError):
    """A note that is not gitresearch's, or from a newer schema than this version reads."""


def records_ref(ref: str) -> str:
    """Where the records of the notes under `ref` live: refs/notes/gitresearch ->
    refs/notes/records/gitresearch. Outside the refs/notes/gitresearch* glob that plain
    `git log` shows, so the JSON never reaches a person's log."""
    return "refs/notes/records/" + ref.removeprefix("refs/notes/")


def record_text(record: dict) -> str:
    """The record note: one JSON object with the schema version, keys sorted."""
    return json.dumps({**record, "schema": NOTE_SCHEMA}, sort_keys=True) + "\n"


def _lines(label: str, text: str) -> list[str]:
    """`label: text` wrapped to NOTE_WIDTH with the continuation under the text."""
    first = f"{label + ':':<{LABEL}}"
    return textwrap.wrap(" ".join(text.split()), NOTE_WIDTH, initial_indent=first,
                         subsequent_indent=" " * LABEL, break_long_words=True) or [first.rstrip()]


def _num(value, spec: str = ".6f") -> str | None:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summary_line(record: dict) -> str:
    metric, name = record.get("val_bpb"), record.get("metric", "val_bpb")
    parts = [f"gitresearch #{record.get('experiment', '?')}", str(record.get("status", "?")),
             f"{name} {_num(metric) or '-'}"]
    if _num(record.get("delta")):
        parts.append(f"delta {record['delta']:+.6f}")
    if _num(record.get("seconds")):
        parts.append(f"{record['seconds']:.1f}s")
    return " | ".join(parts)


def note_text(record: dict) -> str:
    """The readable note: the summary line, then a few labelled lines."""
    if "verifications" in record:
        return verify_text(record)
    name = record.get("metric", "val_bpb")
    lines = [summary_line(record)]
    if _num(record.get("val_bpb")):
        before = _num(record.get("parent_val_bpb"))
        lines += _lines("metric", f"{name} {record['val_bpb']:.6f}" + (f" (best before: {before})" if before else ""))
    if _num(record.get("delta")):
        lines += _lines("delta", f"{record['delta']:+.6f}" + (
            f", a keep needs below -{record['min_delta']:.6f}" if _num(record.get("min_delta")) else ""))
    if _num(record.get("noise_std")):
        lines += _lines("noise", f"sd {record['noise_std']:.6f}" + (
            f" over {record['noise_dof']} dof" if record.get("noise_dof") else ""))
    if record.get("status") == "keep":  # how far `git log best` may trust this step
        verdict = (record.get("confirmation") or {}).get("verdict")
        lines += _lines("confirmed", verdict) if verdict else _lines("confirmed", "no: kept on a single run")
    if record.get("reason"):
        lines += _lines("reason", str(record["reason"]))
    if record.get("comment") and record.get("comment") != record.get("reason"):
        lines += _lines("early stop", str(record["comment"]))
    if record.get("description"):
        lines += _lines("change", str(record["description"]).splitlines()[0])
    lines += _lines("record", "gitresearch show #{} (checks, log tail, replies)".format(record.get("experiment", "?")))
    return "\n".join(lines) + "\n"


def verify_text(record: dict) -> str:
    """A verification note: the newest verdict, wrapped."""
    newest = record["verifications"][-1]
    lines = [f"gitresearch verify | {newest.get('verdict', '?')}"[:NOTE_WIDTH]]
    if _num(newest.get("gain")):
        low, high = newest["ci95"]
        lines += _lines("gain", f"{newest['gain']:+.6f} (95% {low:+.6f} to {high:+.6f}) over "
                                f"{len(newest.get('pairs') or [])} pairs")
    lines += _lines("runs", f"{len(record['verifications'])} verification(s); gitresearch show --json for all")
    return "\n".join(lines) + "\n"


def parse_record(text: str) -> dict:
    """A record note (schema 2 on), or a schema 1 note's JSON line."""
    for line in text.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("schema", 1) > NOTE_SCHEMA:
                raise NoteError(f"note schema {record['schema']} is newer than {NOTE_SCHEMA}")
            return record
    if text.startswith("gitresearch "):  # a readable note whose record was not fetched
        raise NoteError(f"the record of this note is missing (it lives in refs/notes/records/; fetch "
                        f"'+refs/notes/*:refs/notes/*'): {text.splitlines()[0][:120]!r}")
    raise NoteError(f"not a gitresearch record: {text[:200]!r}")


parse_note = parse_record  # schema 1 notes carry their record in the readable note
