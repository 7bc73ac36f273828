"""Early stop from what a script prints (docs/early-stop.md, "From the progress lines"): where
train.py writes no GITRESEARCH_METRICS points, its progress lines' training loss is the
curve. The loss is mapped into metric units by a line fitted on the finished runs (their
final metric against their loss at the end of training), then judged by the same rule as
metric points. `Watch` is what the runner asks: metric points when the run writes them, else
the mapped loss curve, and why early stop cannot act when it can do neither.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from scipy.stats import linregress

from . import metrics
from .forecast import Calibration, FinishedRun

SMOOTH = 5  # each loss point is the median of the last SMOOTH printed: one noisy batch is no trend
MIN_R = 0.3  # a map whose correlation is weaker than this does not judge runs
MAX_P = 0.05  # nor one whose positive slope could be chance (one-sided, linregress's t test)


def smoothed(values) -> list[float]:
    """Causal running median: the value at i depends only on the points up to i, so a live run
    and a finished one read alike."""
    out = []
    for i in range(len(values)):
        out.append(statistics.median(values[max(0, i - SMOOTH + 1):i + 1]))
    return out


def read_curve(path: Path) -> tuple[tuple, tuple]:
    """(times, smoothed losses) of a progress file the runner wrote; empty when absent."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return (), ()
    points = [p for p in metrics.parse_metric_lines(text)
              if isinstance(p.get("t"), (int, float)) and metrics.is_finite(p.get("train_loss"))]
    return curve_of(points)


def curve_of(points: list[dict]) -> tuple[tuple, tuple]:
    times = tuple(float(p["t"]) for p in points)
    return times, tuple(smoothed([float(p["train_loss"]) for p in points]))


@dataclass(frozen=True)
class LossMap:
    """metric = intercept + slope x training loss, fitted on finished runs."""
    intercept: float
    slope: float
    r: float
    runs: int

    def __call__(self, loss: float) -> float:
        return self.intercept + self.slope * loss

    def describe(self, metric: str) -> str:
        return (f"training loss mapped to {metric} = {self.intercept:.4f} + {self.slope:.4f} x loss "
                f"(r {self.r:.2f}, {self.runs} finished runs)")


def fit_map(finished: list[tuple[tuple, tuple, float]], min_runs: int) -> tuple[LossMap | None, str]:
    """The map from (times, losses, final) of finished runs, or None and why not."""
    pairs = [(losses[-1], final) for _, losses, final in finished if losses and math.isfinite(final)]
    if len(pairs) < min_runs:
        return None, f"waiting for {min_runs} finished runs with progress lines ({len(pairs)} so far)"
    x, y = [p[0] for p in pairs], [p[1] for p in pairs]
    if max(x) - min(x) < 1e-12:
        return None, "every finished run ended at the same training loss: nothing to map it by"
    fit = linregress(x, y)
    one_sided_p = fit.pvalue / 2 if fit.slope > 0 else 1.0
    if not (fit.slope > 0 and fit.rvalue >= MIN_R and one_sided_p < MAX_P):  # may change as runs finish
        return None, (f"waiting for finished runs whose training loss tracks the metric (over "
                      f"{len(pairs)} so far: slope {fit.slope:.3g}, r {fit.rvalue:.2f}, p {one_sided_p:.2g})")
    return LossMap(float(fit.intercept), float(fit.slope), float(fit.rvalue), len(pairs)), ""


def mapped_calibration(finished, loss_map: LossMap, budget: float) -> Calibration:
    return Calibration([FinishedRun(times, tuple(loss_map(v) for v in losses), final, budget)
                        for times, losses, final in finished if times])


class Watch:
    """One run's early stop. `update(points, curve)` (the runner's question) judges the metric
    points when the run writes them, else the training loss of its progress lines mapped into
    metric units (`loss_monitor`, None when there is no map yet, with `loss_why`). `source`
    says which one acted; `idle` why none could, for the note."""

    def __init__(self, metric_monitor, loss_monitor, loss_map: LossMap | None, loss_why: str):
        self.metric_monitor, self.loss_monitor = metric_monitor, loss_monitor
        self.loss_map, self.loss_why = loss_map, loss_why
        self.source: str | None = None  # metric | train_loss

    def update(self, points: list[dict], curve: list[dict] = ()) -> str | None:
        name = self.metric_monitor.metric
        if self.source != "train_loss" and any(
                isinstance(p.get(name), (int, float)) and isinstance(p.get("t"), (int, float))
                and not p.get("final") for p in points):
            self.source = "metric"
            return self.metric_monitor.update(points)
        if self.source == "metric" or not curve or self.loss_monitor is None:
            return None
        self.source = "train_loss"
        times, losses = curve_of([p for p in curve if metrics.is_finite(p.get("train_loss"))])
        mapped = [{"t": t, name: self.loss_map(v)} for t, v in zip(times, losses)]
        return self.loss_monitor.update(mapped)

    @property
    def monitor(self):
        return self.loss_monitor if self.source == "train_loss" else self.metric_monitor

    @property
    def checks(self):
        return self.monitor.checks

    @property
    def comment(self) -> str:
        comment = self.monitor.comment
        if self.source == "train_loss" and comment:
            return f"{comment} [{self.loss_map.describe(self.metric_monitor.metric)}]"
        return comment

    def idle(self, saw_progress: bool) -> tuple[str, bool]:
        """Why early stop could not act on this run ("" when it had a source), and whether
        that lasts: a run with nothing to judge it by, unlike one waiting for more history."""
        if self.source:
            return "", False
        if saw_progress:
            return f"the run wrote no {self.metric_monitor.metric} metric points; {self.loss_why}", False
        return (f"the run wrote no GITRESEARCH_METRICS points with {self.metric_monitor.metric} and "
                f"printed no `step N ... loss: X` progress lines: nothing to judge it by"), True
