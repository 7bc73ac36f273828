"""The metrics protocol (docs/runner.md): summary blocks, progress lines and JSON metric lines."""
from __future__ import annotations

import json
import math
import re

PROGRESS = re.compile(r"^step\s+(\d+)\s*(?:\(\s*([\d.]+)%\))?.*?\bloss:\s*([-+\w.]+)")
SUMMARY_LINE = re.compile(r"^([A-Za-z_][\w.]*):\s+(\S+)\s*$")
TOKENS_PER_S = re.compile(r"\btok(?:ens)?/s(?:ec)?:\s*([\d,.]+)")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_progress(line: str) -> dict | None:
    """`step 00953 (100.0%) | loss: 2.91 | ... | tok/sec: 11,813 | ...` -> {"step", "percent",
    "train_loss", "tokens_per_s"} (None for what the line does not say)."""
    line = line.strip().rsplit("\r", 1)[-1]
    match = PROGRESS.match(line)
    if not match:
        return None
    step, percent, loss = match.groups()
    rate = TOKENS_PER_S.search(line)
    return {"step": int(step), "percent": _number(percent) if percent else None,
            "train_loss": _number(loss),
            "tokens_per_s": _number(rate.group(1).replace(",", "")) if rate else None}


def progress_time(parsed: dict, elapsed: float, budget: float) -> float:
    """Training seconds at a progress line: its percent of the budget where it prints one
    (autoresearch's `(42.0%)` counts training time, start-up and compilation left out), else
    the wall seconds since the process started."""
    if parsed.get("percent") is not None and 0 <= parsed["percent"] <= 1000:
        return round(parsed["percent"] / 100 * budget, 3)
    return round(elapsed, 3)


def parse_summary(text: str) -> dict:
    """The `key: value` lines after the last `---` line (numbers as floats, others as text)."""
    lines = text.replace("\r", "\n").splitlines()
    try:
        start = len(lines) - 1 - lines[::-1].index("---")
    except ValueError:
        return {}
    summary = {}
    for line in lines[start + 1:]:
        match = SUMMARY_LINE.match(line.strip())
        if match:
            key, value = match.groups()
            number = _number(value)
            summary[key] = number if number is not None else value
    return summary


def parse_metric_lines(text: str) -> list[dict]:
    """The JSON objects of a GITRESEARCH_METRICS file; broken lines (a killed writer) are skipped."""
    points = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            point = json.loads(line)
        except ValueError:
            continue
        if isinstance(point, dict):
            points.append(point)
    return points


def final_metric(name: str, summary: dict, points: list[dict]) -> float | None:
    """The run's result: the summary block's value, else the last JSON point that has it."""
    value = summary.get(name)
    if value is None:
        for point in reversed(points):
            if point.get(name) is not None:
                value = point[name]
                break
    if isinstance(value, str):
        value = _number(value)
    return float(value) if isinstance(value, (int, float)) else None


def is_finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
