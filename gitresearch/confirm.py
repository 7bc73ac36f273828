"""Deciding whether a candidate is a real gain before best moves (docs/keep.md): the paired
sequential probability ratio test and its exact error rates, the noise floor pooled from
every repeated measurement at an upper confidence bound, and slow-run flagging."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from scipy import stats


def gain(value: float, reference: float) -> float:
    """How much better `value` is than `reference` (positive: better; the metric is minimised)."""
    return reference - value


# -- the noise floor ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Noise:
    std: float  # pooled sample std of one run's metric
    dof: int  # degrees of freedom: sum over groups of (runs - 1)
    upper: float  # one-sided upper confidence bound on the std at `confidence`
    confidence: float
    groups: int  # sets of repeated runs of one commit that contributed

    def describe(self) -> str:
        return (f"std {self.std:.6f} pooled over {self.groups} groups ({self.dof} dof), "
                f"{self.confidence:.0%} upper bound {self.upper:.6f}")


def pooled_noise(groups: Iterable[list[float]], confidence: float) -> Noise | None:
    """Pooled std of repeated runs of the same commit, and its chi-square upper bound; None
    without two runs of one commit."""
    squares, dof, count = 0.0, 0, 0
    for values in groups:
        values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        if len(values) < 2:
            continue
        mean = statistics.fmean(values)
        squares += sum((v - mean) ** 2 for v in values)
        dof += len(values) - 1
        count += 1
    if dof == 0:
        return None
    std = math.sqrt(squares / dof)
    upper = math.sqrt(squares / stats.chi2.ppf(1 - confidence, dof))
    return Noise(std, dof, upper, confidence, count)


def measurement_groups(records: Iterable[dict], verifications: Iterable[dict] = ()) -> list[list[float]]:
    """Every set of repeated, non-outlier runs of one commit that notes hold: the baseline's
    repeats, each confirmation's candidate runs and its best runs (one group per
    confirmation, so that slow drift between confirmations does not count as noise),
    re-runs of best, and verification runs."""
    groups: list[list[float]] = []
    for record in records:
        if record.get("status") == "baseline":
            groups.append(list(record.get("noise_runs") or []))
        confirmation = record.get("confirmation") or {}
        pairs = confirmation.get("pairs") or []
        groups.append([p["candidate"] for p in pairs])
        groups.append([p["best"] for p in pairs])
        remeasured = record.get("remeasured") or []
        groups.append([r["value"] for r in remeasured if not (r.get("outlier") or r.get("drift"))])
    for note in verifications:
        for verification in note.get("verifications") or []:
            groups += [list(runs) for runs in (verification.get("runs") or {}).values()]
    return groups


def min_delta_rule(noise: Noise | None, k_sigma: float, fixed: float | None,
                   floor: float) -> tuple[float, str]:
    """The smallest gain worth keeping and the rule that set it."""
    if fixed is not None:
        return fixed, "[noise] min_delta"
    if noise is not None and k_sigma * noise.upper >= floor:
        return k_sigma * noise.upper, (f"{k_sigma:g} x noise std's {noise.confidence:.0%} upper "
                                       f"bound ({noise.dof} dof)")
    return floor, "[noise] min_delta_floor"


# -- throughput outliers -----------------------------------------------------------------------

def slow_run(steps_per_s: float | None, peers: Iterable[float | None], share: float) -> bool:
    """A run whose training throughput is below `share` x the median of its peers' (runs of
    the same commit): the machine was loaded, so its metric measures the load."""
    rates = [p for p in peers if p]
    if not steps_per_s or not rates:
        return False
    return steps_per_s < share * statistics.median(rates)


# -- the sequential test -----------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    decision: str  # keep | discard | continue
    pairs: int
    llr: float
    upper: float  # A: keep at or above
    lower: float  # B: discard at or below
    gain: float | None  # mean gain of the pairs
    gain_se: float | None  # its standard error (sigma_d / sqrt(pairs))
    text: str


def bounds(alpha: float, beta: float) -> tuple[float, float]:
    return math.log((1 - beta) / alpha), math.log(beta / (1 - alpha))


def sprt(gains: list[float], delta: float, sigma: float, alpha: float, beta: float,
         max_pairs: int) -> Verdict:
    """The test's state after the pair gains `gains` (each: candidate's gain over best's run
    of the same pair), for single-run std `sigma`."""
    upper, lower = bounds(alpha, beta)
    n = len(gains)
    sigma_d = math.sqrt(2) * sigma
    if delta <= 0 or sigma_d <= 0:
        raise ValueError(f"the test needs a positive min_delta and sigma (got {delta}, {sigma})")
    llr = sum(delta * (g - delta / 2) for g in gains) / sigma_d ** 2
    mean = statistics.fmean(gains) if gains else None
    se = sigma_d / math.sqrt(n) if n else None
    shown = f"gain {mean:.6f} ± {se:.6f}" if n else "no pairs"
    if n and llr >= upper:
        return Verdict("keep", n, llr, upper, lower, mean, se,
                       f"kept after {n} pair{'s' * (n > 1)}: {shown} (LLR {llr:.2f} ≥ {upper:.2f})")
    if n and llr <= lower:
        return Verdict("discard", n, llr, upper, lower, mean, se,
                       f"discarded after {n} pair{'s' * (n > 1)}: {shown} (LLR {llr:.2f} ≤ {lower:.2f})")
    if n >= max_pairs:
        return Verdict("discard", n, llr, upper, lower, mean, se,
                       f"discarded: undecided after the cap of {max_pairs} pairs: {shown} "
                       f"(LLR {llr:.2f} between {lower:.2f} and {upper:.2f})")
    return Verdict("continue", n, llr, upper, lower, mean, se,
                   f"after {n} pairs: {shown} (LLR {llr:.2f}; keep at {upper:.2f}, discard at {lower:.2f})")


def error_rates(true_gain: float, delta: float, sigma: float, alpha: float, beta: float,
                max_pairs: int, grid: int = 4001) -> dict:
    """The truncated test's exact behaviour for pairs whose gain is N(true_gain, 2 sigma^2):
    the probability of a keep and the expected number of pairs. The LLR is a Gaussian random
    walk; its density inside (B, A) is carried pair by pair on a grid."""
    upper, lower = bounds(alpha, beta)
    var_d = 2 * sigma ** 2
    step_mean = delta * (true_gain - delta / 2) / var_d
    step_sd = delta * math.sqrt(var_d) / var_d
    xs = np.linspace(lower, upper, grid)
    dx = xs[1] - xs[0]
    weights = np.full(grid, dx)
    weights[[0, -1]] = dx / 2  # trapezoid rule
    keep = stats.norm.sf((upper - step_mean) / step_sd)  # after the first pair, from LLR 0
    alive = stats.norm.pdf(xs, step_mean, step_sd)
    expected_pairs, p_alive = 1.0, float(alive @ weights)
    kernel = stats.norm.pdf(xs[None, :] - xs[:, None], step_mean, step_sd)  # from row to column
    cross_up = stats.norm.sf((upper - xs - step_mean) / step_sd)
    for _ in range(max_pairs - 1):
        expected_pairs += p_alive
        keep += float((alive * cross_up) @ weights)
        alive = (alive * weights) @ kernel
        p_alive = float(alive @ weights)
    return {"keep": float(keep), "expected_pairs": float(expected_pairs)}


# -- the repo's current floor ------------------------------------------------------------------

@dataclass(frozen=True)
class Floor:
    noise: Noise | None
    min_delta: float  # the smallest gain worth keeping (the SPRT's delta)
    rule: str  # how min_delta was set
    screen: float  # a single run must gain this much over best to be confirmed
    sigma: float  # the std the test uses (the upper bound; min_delta / k_sigma without one)

    def fields(self) -> dict:
        noise = self.noise
        return {"min_delta": self.min_delta, "min_delta_rule": self.rule, "screen_threshold": self.screen,
                "noise_std": noise.std if noise else None, "noise_upper": noise.upper if noise else None,
                "noise_dof": noise.dof if noise else 0}


def floor(records: Iterable[dict], verifications: Iterable[dict], noise_config, confirm_config) -> Floor:
    """The noise floor pooled from every repeated measurement in the notes, and the
    thresholds it sets."""
    noise = pooled_noise(measurement_groups(records, verifications), noise_config.confidence)
    min_delta, rule = min_delta_rule(noise, noise_config.k_sigma, noise_config.min_delta,
                                     noise_config.min_delta_floor)
    sigma = noise.upper if noise and noise.upper > 0 else min_delta / max(noise_config.k_sigma, 1e-12)
    return Floor(noise, min_delta, rule, confirm_config.screen_sigma * sigma, sigma)


def best_reference(record: dict) -> tuple[float | None, str]:
    """The value a candidate's screen run is compared with: best's own value, or its newest
    re-run when that re-run found the machine changed (drift)."""
    remeasured = [r for r in record.get("remeasured") or [] if not r.get("outlier")]
    if remeasured and remeasured[-1].get("drift"):
        return remeasured[-1]["value"], "best's newest re-run (drift)"
    return record.get("val_bpb"), "best's value"
