"""A run's final metric forecast from its learning curve (a power law), calibrated on the runs
that trained their whole budget: the `forecast` early-stop rule and the intervals the checks
report (docs/early-stop.md)."""
from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit
from scipy.stats import theilslopes


WARMUP_FRACTION = 0.1  # leave out points before this share of the elapsed time
MIN_POINTS = 5  # points needed for a fit
MIN_HISTORY = 6  # finished runs needed before the forecast is trusted
UNTRUSTED_SD = 1e3  # sd used while the history is too short: no stop
Z90 = 1.6449  # two-sided 90 % normal quantile


def power_law(t, a, b, c):
    return a * np.power(t, -b) + c


@dataclass(frozen=True)
class Fit:
    a: float
    b: float
    c: float
    cov: np.ndarray

    def predict(self, t: float) -> float:
        return float(power_law(t, self.a, self.b, self.c))

    def sd(self, t: float) -> float:
        """Delta-method sd of L(t) from the parameter covariance."""
        grad = np.array([t ** -self.b, -self.a * math.log(t) * t ** -self.b, 1.0])
        var = float(grad @ self.cov @ grad)
        return math.sqrt(max(var, 0.0)) if math.isfinite(var) else float("inf")


def fit_curve(times, values) -> Fit | None:
    """Power-law fit of the points after the warm-up; None when it cannot be fitted."""
    t = np.asarray(times, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(t) & np.isfinite(y) & (t > 0)
    t, y = t[ok], y[ok]
    if len(t) == 0:
        return None
    keep = t >= WARMUP_FRACTION * t.max()
    t, y = t[keep], y[keep]
    if len(t) < MIN_POINTS:
        return None
    span = max(float(y.max() - y.min()), 1e-6)
    p0 = (span * t[0] ** 0.5, 0.5, max(float(y.min()) - 0.1 * span, 0.0))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            params, cov = curve_fit(power_law, t, y, p0=p0, bounds=([0, 1e-3, 0], [np.inf, 3, np.inf]),
                                    loss="soft_l1", f_scale=span / 20 + 1e-6, max_nfev=2000)
    except (RuntimeError, ValueError):
        return None
    return Fit(*map(float, params), cov=np.nan_to_num(cov, nan=np.inf))


@dataclass(frozen=True)
class Forecast:
    mean: float
    sd: float  # scale of how far below `mean` the final may land (what a false stop needs)
    fit: Fit | None
    kind: str = "extrapolate"  # which calibrated forecast was chosen
    upper: float | None = None  # how far above `mean` the 90 % interval reaches
    lower: float | None = None  # how far below `mean` it reaches

    @property
    def interval90(self) -> tuple[float, float]:
        low = self.lower if self.lower is not None else Z90 * self.sd
        high = self.upper if self.upper is not None else Z90 * self.sd
        return self.mean - low, self.mean + high


@dataclass(frozen=True)
class FinishedRun:
    """A run that trained its whole budget: its curve and its final metric."""
    times: tuple[float, ...]
    values: tuple[float, ...]
    final: float
    budget: float


def raw_forecasts(times, values, budget) -> tuple[dict[str, float], float, Fit | None] | None:
    """The two raw forecasts of L(budget) from one fit: `extrapolate` (the fitted curve at the
    budget) and `anchor` (the fitted curve now, a smoothed current value), with the fit's sd
    at the budget. When no power law fits yet (a plateau, too few points after the warm-up),
    both are the median of the last three values and the fit's sd is infinite, so only the
    anchored candidates can be chosen."""
    fit = fit_curve(times, values)
    if fit is None:
        recent = [v for v in values[-3:] if math.isfinite(v)]
        if len(values) < MIN_POINTS or len(recent) < 3:
            return None
        level = statistics.median(recent)
        return {"extrapolate": level, "anchor": level}, float("inf"), None
    return {"extrapolate": fit.predict(budget), "anchor": fit.predict(max(times))}, fit.sd(budget), fit


class Calibration:
    """Residuals (final - raw forecast) of finished runs, by fraction of the budget."""

    def __init__(self, runs: list[FinishedRun] = ()):
        self.runs = list(runs)
        self.cache: dict[tuple[int, int], dict[str, float] | None] = {}
        self.models: dict[tuple, tuple] = {}  # (fraction key, runs, option) -> _calibrate()

    def model(self, fraction: float, option: str, pairs: list[tuple[float, float]]):
        key = (round(fraction * 40), len(self.runs), option)
        if key not in self.models:
            self.models[key] = _calibrate(pairs)
        return self.models[key]

    def add(self, run: FinishedRun) -> None:
        self.runs.append(run)

    def residuals(self, fraction: float) -> dict[str, list[tuple[float, float]]]:
        """(raw forecast, final) pairs of the finished runs, per kind of raw forecast."""
        key_f = round(fraction * 40)  # share the refits of checks at about the same fraction
        out = {"extrapolate": [], "anchor": []}
        for i, run in enumerate(self.runs):
            key = (i, key_f)
            if key not in self.cache:
                cut = fraction * run.budget
                pts = [(t, v) for t, v in zip(run.times, run.values) if t <= cut]
                got = raw_forecasts([p[0] for p in pts], [p[1] for p in pts], run.budget) if pts else None
                ok = got and all(math.isfinite(v) for v in got[0].values())
                self.cache[key] = dict(got[0]) if ok else None
            if self.cache[key] is not None:
                for k, v in self.cache[key].items():
                    out[k].append((v, run.final))
        return out


def _conformal(values: list[float], level: float = 0.95, widen_small: bool = False) -> float:
    """Split-conformal one-sided bound: the ceil((n + 1) x level)-th smallest of `values`
    (exchangeable runs stay under it with probability >= level; one odd run moves it by one
    order statistic, not by its size). With too few runs for that order statistic, the
    largest value; `widen_small` then also takes a normal prediction bound from the sample
    spread when it is wider (used for the reported interval)."""
    ordered = sorted(values)
    n = len(ordered)
    rank = math.ceil((n + 1) * level)
    if rank <= n:
        return max(ordered[rank - 1], 0.0)
    if not widen_small or n < 2:
        return max(ordered[-1], 0.0)
    mean, sd = statistics.fmean(ordered), statistics.stdev(ordered)
    z = statistics.NormalDist().inv_cdf(level)
    return max(ordered[-1], mean + z * sd * math.sqrt(1 + 1 / n), 0.0)


def _conformal_sd(residuals: list[float], center: float = 0.0) -> float:
    """How far below the prediction a final can land (residual = final - prediction), as the
    sd of a normal with the same one-sided 95 % bound. Only this side makes false stops: a run
    that ends worse than predicted is never wrongly stopped."""
    return _conformal([center - r for r in residuals]) / Z90


INTERVAL_LEVEL = 0.95  # each side of the reported 90 % interval (normalized conformal)
BLEND_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # weights of `extrapolate` against `anchor`
MIN_REGRESSION = 6  # finished runs needed to fit a slope, not only a shift


def _line(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of final ~ intercept + slope x raw: Theil-Sen, robust to odd runs;
    a shift only (slope 1) while the history is short."""
    raws = [r for r, _ in pairs]
    if len(pairs) >= MIN_REGRESSION and max(raws) - min(raws) > 1e-9:
        slope = min(max(float(theilslopes([f for _, f in pairs], raws)[0]), 0.0), 2.0)
    else:
        slope = 1.0
    return statistics.median(f - slope * r for r, f in pairs), slope


def _calibrate(pairs: list[tuple[float, float]]):
    """The calibration line and its leave-one-out residuals (final - prediction of a line
    fitted without that run): out-of-sample errors, so the spread is honest for a new run."""
    intercept, slope = _line(pairs)
    loo = []
    for j, (raw, final) in enumerate(pairs):
        a, b = _line(pairs[:j] + pairs[j + 1:])
        loo.append(final - (a + b * raw))
    return (lambda x: intercept + slope * x), loo


def forecast(times, values, budget: float, calibration: Calibration) -> Forecast | None:
    """The calibrated forecast: for each blend w x extrapolate + (1 - w) x anchor (w in
    BLEND_WEIGHTS), regress the finals of finished runs on their blended raw forecasts at this
    fraction of the budget; use the blend whose residuals are tightest (split-conformal)."""
    raw = raw_forecasts(times, values, budget)
    if raw is None:
        return None
    means, fit_sd, fit = raw
    history = calibration.residuals(max(times) / budget)
    if len(history["anchor"]) < MIN_HISTORY:
        return Forecast(means["extrapolate"], UNTRUSTED_SD, fit)
    fit_sd = fit_sd if math.isfinite(fit_sd) else UNTRUSTED_SD
    options = []
    # relative: the gap to the best finished run at the same time predicts the gap at the end
    # (what both runs share, the warm-down drop and the estimate-vs-final gap, cancels)
    anchor_ref, final_ref = min(history["anchor"], key=lambda pair: pair[1])
    fraction = max(times) / budget
    pairs = [(a - anchor_ref, final - final_ref) for a, final in history["anchor"]]
    predict, res = calibration.model(fraction, "relative", pairs)
    x = means["anchor"] - anchor_ref
    options.append((max(_conformal_sd(res), 1e-4), final_ref + predict(x), "relative",
                    *_normalized_interval(pairs, res, x, 0.0)))
    for w in BLEND_WEIGHTS:
        pairs = [(w * e + (1 - w) * a, final) for (e, final), (a, _) in
                 zip(history["extrapolate"], history["anchor"])]
        predict, res = calibration.model(fraction, f"w={w:g}", pairs)
        x = w * means["extrapolate"] + (1 - w) * means["anchor"]
        # a run fitted worse than typical widens its own interval, in proportion to w
        spread = max(_conformal_sd(res), w * fit_sd, 1e-4)
        upper, lower = _normalized_interval(pairs, res, x, min(pairs, key=lambda pair: pair[1])[0])
        options.append((spread, predict(x), f"w={w:g}", max(upper, Z90 * w * fit_sd),
                        max(lower, Z90 * w * fit_sd)))
    sd, mean, kind, upper, lower = min(options, key=lambda option: option[0])
    return Forecast(mean, sd, fit, kind, upper, lower)


def _normalized_interval(pairs, residuals, x: float, x_ref: float) -> tuple[float, float]:
    """(upper, lower) reach of the reported 90 % interval: normalized split-conformal. Each
    residual is divided by the run's distance from the best run's raw forecast (plus the
    median distance), so a run far from the best, where the calibration line is least
    supported (finished runs are mostly near the best: the losers were stopped), gets a wider
    interval and one near the best a tighter one."""
    distances = [abs(raw - x_ref) for raw, _ in pairs]
    base = max(statistics.median(distances), 1e-6)
    scores = [r / (d + base) for r, d in zip(residuals, distances)]
    scale = abs(x - x_ref) + base
    return (_conformal(scores, INTERVAL_LEVEL, True) * scale,
            _conformal([-v for v in scores], INTERVAL_LEVEL, True) * scale)
