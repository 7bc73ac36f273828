"""The note format: one summary line a person reads in `git log`, a blank line, then the record
as JSON with its schema version. Readers accept every schema up to NOTE_SCHEMA (README, "Git layout")."""
from __future__ import annotations

import json

from .errors import GitresearchError

NOTE_SCHEMA = 1


class NoteError(GitresearchError):
    """A note that is not gitresearch's, or from a newer schema than this version reads."""


def note_text(record: dict) -> str:
    """A note: one line a person reads in `git log`, a blank line, then the record as JSON."""
    if "verifications" in record:
        return verify_text(record)
    metric, name = record.get("val_bpb"), record.get("metric", "val_bpb")
    shown = f"{name} {metric:.6f}" if isinstance(metric, (int, float)) else f"{name} -"
    parts = [f"gitresearch #{record.get('experiment', '?')}", record.get("status", "?"), shown]
    if isinstance(record.get("delta"), (int, float)):
        parts.append(f"delta {record['delta']:+.6f}")
    if isinstance(record.get("seconds"), (int, float)):
        parts.append(f"{record['seconds']:.1f}s")
    if record.get("status") == "keep":  # how far `git log best` may trust this step
        verdict = (record.get("confirmation") or {}).get("verdict")
        parts.append(f"confirmed: {verdict}" if verdict else "unconfirmed: kept on a single run")
    if record.get("reason"):
        parts.append(str(record["reason"]).splitlines()[0][:120])
    body = json.dumps({"schema": NOTE_SCHEMA, **record}, sort_keys=True)
    return " | ".join(parts) + "\n\n" + body + "\n"


def verify_text(record: dict) -> str:
    """A verification note: the newest verdict on one line, then every verification as JSON."""
    newest = record["verifications"][-1]
    line = f"gitresearch verify | {newest.get('verdict', '?')}"
    if isinstance(newest.get("gain"), (int, float)):
        low, high = newest["ci95"]
        line += (f" | gain {newest['gain']:+.6f} (95% {low:+.6f} to {high:+.6f}) over "
                 f"{len(newest.get('pairs') or [])} pairs")
    body = json.dumps({"schema": NOTE_SCHEMA, **record}, sort_keys=True)
    return line + "\n\n" + body + "\n"


def parse_note(text: str) -> dict:
    """The record written by note_text (any schema up to ours)."""
    for line in text.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("schema", 1) > NOTE_SCHEMA:
                raise NoteError(f"note schema {record['schema']} is newer than {NOTE_SCHEMA}")
            return record
    raise NoteError(f"not a gitresearch note: {text[:200]!r}")
