"""The reward of an experiment (docs/policies.md), stored in every note whatever the policy:

    reward = improvement + efficiency + novelty - penalty
    improvement = w_improve * clip((parent val_bpb - val_bpb) / noise_std, +-improve_clip),
                  times loss_weight where it is a loss; with paid_gains = "keeps" a run the
                  loop did not keep is paid no gain (a no-op near best earns nothing from noise)
                  (one unit = one noise sigma; an early-stopped run counts its last forecast)
    efficiency  = -w_time * training_seconds / budget_s
                  - w_memory * (peak_memory_mb / baseline peak_memory_mb - 1), clipped to [-1, 1]
                  (at an equal metric a faster or lighter run scores higher, and a loser stopped
                  early costs less than one that ran its whole budget)
    novelty     = epsilon * (1 - max Jaccard(changed lines, changed lines of each earlier diff
                  in the history window)); changed lines are the diff's +/- lines, stripped;
                  with novelty = "constants" times (1 - the mean, over the UPPER_CASE
                  constants the diff assigns, of the share of the window's constant-moving
                  diffs that assign the same constant): a new value on the constant the
                  window keeps moving is paid less than one on a constant it left alone
    penalty     = invalid_penalty | crash_penalty | timeout_penalty by status, else 0
                  (an invalid experiment lost to the model endpoint carries no penalty)

A failed experiment (invalid, crash, timeout) earns no improvement, no novelty and no
efficiency gain, only its time share: its total lies in [-penalty - 1, -penalty], below the
floor of every valid run (-improvement_weight x loss_weight x improvement_clip - 1), so failing is never the
cheap way out of a bad result (config.load refuses penalties that break this order).
"""
from __future__ import annotations

import math
import re

from .config import RewardConfig

FAILED = ("invalid", "crash", "timeout")
MIN_NOISE = 1e-3  # metric units: a deterministic baseline (noise 0) still gives a finite scale


def changed_lines(diff: str) -> frozenset[str]:
    return frozenset(line[1:].strip() for line in diff.splitlines()
                     if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip())


ASSIGNED = re.compile(r"([A-Z][A-Z0-9_]*)\s*(?::[^=]*)?=(?!=)")  # NAME = ..., NAME: type = ...


def assigned(lines: frozenset[str]) -> frozenset[str]:
    """The UPPER_CASE names that changed lines assign."""
    return frozenset(m.group(1) for line in lines if (m := ASSIGNED.match(line)))


def constants_assigned(diff: str) -> frozenset[str]:
    """The UPPER_CASE names the diff's changed lines assign."""
    return assigned(changed_lines(diff))


def novelty(diff: str, earlier: list[str], form: str = "lines") -> float:
    """1 - the highest Jaccard similarity between this diff's changed lines and an earlier
    diff's; 1 when nothing earlier shares a line, 0 for a repeat. form "constants" also
    multiplies by 1 - the mean share of the earlier constant-moving diffs that assign each
    constant this diff assigns (unchanged where this diff or no earlier one assigns one)."""
    mine = changed_lines(diff)
    if not mine:
        return 0.0
    theirs = [lines for lines in map(changed_lines, earlier) if lines]
    best = max((len(mine & lines) / len(mine | lines) for lines in theirs), default=0.0)
    factor = 1.0
    if form == "constants" and (names := assigned(mine)):
        if moved := [n for n in map(assigned, theirs) if n]:
            factor = 1.0 - sum(sum(name in n for n in moved) / len(moved) for name in names) / len(names)
    return (1.0 - best) * factor


def reward(record: dict, baseline: dict, config: RewardConfig) -> dict:
    """The reward and its components for a finished experiment's note."""
    status = record.get("status")
    failed = status in FAILED
    noise = max(baseline.get("noise_std") or 0.0, MIN_NOISE)
    value = record.get("val_bpb")
    if value is None and status == "early_stop" and record.get("checks"):
        value = record["checks"][-1].get("mean")  # the forecast that stopped it
    parent = record.get("parent_val_bpb")
    improvement = 0.0
    if not failed and isinstance(value, (int, float)) and isinstance(parent, (int, float)) and math.isfinite(value):
        gain = (parent - value) / noise
        gain = max(-config.improvement_clip, min(config.improvement_clip, gain))
        if config.paid_gains == "keeps" and status != "keep":
            gain = min(gain, 0.0)
        improvement = config.improvement_weight * (gain if gain >= 0 else config.loss_weight * gain)
    efficiency = 0.0
    if status not in ("invalid", None):
        budget = record.get("budget_s") or 0.0
        used = record.get("training_seconds") or record.get("seconds") or 0.0
        if budget > 0:
            efficiency -= config.time_weight * min(used / budget, 2.0)
        base_memory, memory = baseline.get("peak_memory_mb"), record.get("peak_memory_mb")
        if base_memory and memory:
            efficiency -= config.memory_weight * (memory / base_memory - 1.0)
        efficiency = max(-1.0, min(0.0 if failed else 1.0, efficiency))
    penalty = {"invalid": config.invalid_penalty, "crash": config.crash_penalty,
               "timeout": config.timeout_penalty}.get(status, 0.0)
    if status == "invalid" and record.get("backend_only"):
        penalty = 0.0
    bonus = 0.0 if failed else config.novelty_epsilon * (record.get("novelty") or 0.0)
    total = improvement + efficiency + bonus - penalty
    return {"total": round(total, 6), "improvement": round(improvement, 6),
            "efficiency": round(efficiency, 6), "novelty": round(bonus, 6), "penalty": penalty}
