"""`gitresearch verify [REV...] [--chain] [--runs K]`: does each gain reproduce?

Each commit is re-run K times against its first parent, in pairs (commit then parent, then
parent then commit, alternating), on this machine now. A pair's gain is the commit's
improvement over the parent's run of the same pair; the verdict is `confirmed` when the 95 %
t-interval of the mean gain lies above 0, `unconfirmed` otherwise. With no REV, every step of
best's chain is verified. Each verification is appended to the commit's note in
refs/notes/gitresearch-verify (earlier ones are kept); its runs join the pooled noise floor.
"""
from __future__ import annotations

import math
import socket
import statistics
import threading
import time
from typing import Callable

from scipy import stats

from .config import Config
from .confirm import gain
from .gitstore import VERIFY_REF, Store

RunFn = Callable[[str, str], object]  # (commit, run name) -> RunResult


def interval(gains: list[float], sigma: float | None) -> tuple[float, float, float]:
    """Mean gain and its 95 % interval: Student's t over the pairs, or (one pair) the
    pooled single-run std's normal interval."""
    mean = statistics.fmean(gains)
    if len(gains) > 1:
        half = float(stats.t.ppf(0.975, len(gains) - 1)) * statistics.stdev(gains) / math.sqrt(len(gains))
    elif sigma:
        half = 1.96 * math.sqrt(2) * sigma
    else:
        half = math.inf
    return mean, mean - half, mean + half


def targets(store: Store, revs: tuple[str, ...], chain: bool) -> list[tuple[str, str]]:
    """(commit, parent) to verify: the REVs, or every step of best's chain (oldest first)."""
    commits = [store.resolve(r) for r in revs]
    if chain or not commits:
        steps = list(reversed(store.best_chain()))[1:]  # the baseline has no parent to beat
        commits += [c for c in steps if c not in commits]
    pairs = []
    for commit in commits:
        parent = store.parent_of(commit)
        if parent is None:
            raise ValueError(f"{commit[:12]} has no parent to verify it against")
        pairs.append((commit, parent))
    return pairs


def verify_one(store: Store, config: Config, commit: str, parent: str, runs: int, run: RunFn,
               sigma: float | None, stop_event: threading.Event) -> dict | None:
    """K pairs for one commit, recorded in its verification note; None when interrupted."""
    pairs, failures = [], []
    started = time.time()
    for k in range(runs):
        order = ("candidate", "parent") if k % 2 == 0 else ("parent", "candidate")
        results = {}
        for role in order:
            results[role] = run(commit if role == "candidate" else parent, f"{k}-{role}")
            if stop_event.is_set():
                return None
        if any(r.status != "ok" for r in results.values()):
            failures.append({role: f"{r.status}: {r.reason}" for role, r in results.items() if r.status != "ok"})
            continue
        pairs.append({"candidate": results["candidate"].metric, "parent": results["parent"].metric,
                      "gain": gain(results["candidate"].metric, results["parent"].metric),
                      "order": list(order),
                      "steps": {role: r.steps for role, r in results.items()}})
    entry = {"parent": parent, "runs": {"candidate": [p["candidate"] for p in pairs],
                                        "parent": [p["parent"] for p in pairs]},
             "pairs": pairs, "failures": failures, "budget_s": config.run.budget_s,
             "host": socket.gethostname(), "started": started, "finished": time.time()}
    if pairs:
        mean, low, high = interval([p["gain"] for p in pairs], sigma)
        entry.update(gain=mean, ci95=[low, high], reproduces=low > 0,
                     verdict="confirmed" if low > 0 else "unconfirmed")
    else:
        entry.update(gain=None, ci95=None, reproduces=False, verdict="unconfirmed")
    record = store.read_note(commit, VERIFY_REF) or {}
    record.setdefault("verifications", []).append(entry)
    store.write_note(commit, record, VERIFY_REF)
    return entry


def latest(store: Store, commit: str) -> dict | None:
    """The newest verification of `commit`, or None."""
    record = store.read_note(commit, VERIFY_REF) or {}
    entries = record.get("verifications") or []
    return entries[-1] if entries else None
