"""Early stop (docs/early-stop.md): a `Monitor` per run watches its metric points and stops it
when, at equal elapsed time, it is further behind the best run than a set share of the way to
the median run (the `race` rule, the default), or on the calibrated forecast (`forecast`).
`EarlyStop` feeds monitors from the repo."""
from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from . import losscurve, metrics
from .config import Config
from .forecast import UNTRUSTED_SD, Calibration, FinishedRun, forecast
from .gitstore import Store
from .losscurve import Watch
from .runner import PROGRESS_FILE

DIVERGE_FACTOR = 1.5  # a metric above this multiple of its first value is a divergence


@dataclass(frozen=True)
class Settings:
    rule: str = "race"  # race | forecast (measured side by side in docs/early-stop.md)
    interval_s: float = 30.0  # seconds of training between checks
    min_fraction: float = 0.2  # no stop before this share of the budget
    min_history: int = 5  # finished runs needed before any stop but a divergence
    # race: the stop line sits at anchor + c x (median - anchor) at equal elapsed time, where the
    # anchor is the best finished run's own value then and the median is over every run that
    # reached that time (finished, or stopped later)
    race_c: float = 0.7  # the line's place between the anchor (0) and the median (1)
    race_c_closing: float = 0.85  # c for a run closing on the field: its place fell since its last check
    race_safety: float = 0.0  # c is at least this x the largest c a winner of this repo needed (0: off)
    race_noise_k: float = 2.0  # the line is at least this x sqrt(2) x noise floor above the anchor
    # forecast: stop when the calibrated forecast is above best + margin (previous rule)
    beta: float = 0.05  # level of the forecast rule's stop boundary
    alpha: float = 0.01  # level of its accept boundary
    margin_k: float = 1.0  # threshold = best + margin_k x noise floor
    delta_k: float = 4.0  # indifference zone delta = delta_k x noise floor
    min_noise: float = 0.002  # floor of the noise floor (metric units)


def forecast_test(x: float, sd: float, theta: float, delta: float, settings: Settings) -> tuple[float, str]:
    """(log likelihood ratio, decision) of the forecast rule: the latest calibrated forecast
    x ~ N(mu, sd^2) weighed for H1 mu >= theta + delta against H0 mu <= theta with Wald's
    boundaries. One look's ratio, taken afresh at each check: not a sequential test, and beta
    is a level, not a bound (docs/early-stop.md)."""
    llr = delta / sd ** 2 * (x - theta - delta / 2)
    if llr >= math.log((1 - settings.alpha) / settings.beta):
        return llr, "stop"
    if llr <= math.log(settings.alpha / (1 - settings.beta)):
        return llr, "accept"
    return llr, "continue"


def check_due(t: float, done: int, budget: float, settings: Settings) -> bool:
    """Whether a point at t serves the next check after `done` checks. Checks sit on a fixed
    grid from min_fraction of the budget on; a point a little before its due time (points come
    at the run's own pace) still serves that check. The bench feeds Optuna's pruners at the
    same points."""
    due = settings.min_fraction * budget + done * settings.interval_s
    return t >= due - 0.25 * settings.interval_s


def value_at(times, values, t: float) -> float | None:
    """The value at t, linear between the points around it (None before the first point or
    after the last). Interpolating keeps runs whose points fall a little after t from being
    read at their previous, much older point."""
    if not times or t > times[-1] + 1e-9 or t < times[0] - 1e-9:
        return None
    i = bisect.bisect_right(times, t + 1e-9) - 1
    if i + 1 >= len(times) or times[i + 1] <= times[i]:
        return values[i]
    w = (t - times[i]) / (times[i + 1] - times[i])
    return values[i] + w * (values[i + 1] - values[i])


def anchor(runs, values_at_t: list[float], t: float) -> float:
    """The best finished run's value at t: what a run must end below is that run's final, so
    its curve is the yardstick (the field's lead when the best run has no value at t)."""
    top = min(runs, key=lambda r: r.final)
    value = value_at(top.times, top.values, t)
    return value if value is not None and math.isfinite(value) else min(values_at_t)


class Race:
    """What the race rule knows of the past runs besides the finished ones (`history`): the
    stopped runs' curves up to their stop, and (race_safety) how far behind their field the
    repo's winners were."""

    GRID = tuple(k / 20 for k in range(2, 20))  # fractions of the budget a winner's need is taken at
    WINDOW = 0.1  # a check at fraction f uses the needs at f +- WINDOW

    def __init__(self, history: Calibration):
        self.history = history
        self.needs = dict.fromkeys(self.GRID, 0.0)  # grid fraction -> largest c a winner needed
        self.seen, self.best = 0, None  # runs taken into `needs`, and the best final among them
        self.stopped: list[tuple[tuple, tuple]] = []  # (times, values) of stopped runs, up to the stop

    def add_stopped(self, times, values) -> None:
        if times:
            self.stopped.append((tuple(times), tuple(values)))

    def reached_curves(self, t: float, interval: float) -> list[tuple[tuple, tuple]]:
        """The stopped runs that reached t: their last point at most a quarter check interval
        before it."""
        return [(ts, vs) for ts, vs in self.stopped if t <= ts[-1] + 0.25 * interval]

    def reached(self, t: float, interval: float) -> list[float]:
        """Values at t of the stopped runs that reached t. With them the median is over every
        run that got this far, not only the survivors, whose median drops as more runs are
        stopped."""
        found = (value_at(ts, vs, min(t, ts[-1])) for ts, vs in self.reached_curves(t, interval))
        return [v for v in found if v is not None and math.isfinite(v)]

    @staticmethod
    def field_at(runs, t: float) -> list[float]:
        """The finite values at t of these runs."""
        found = (value_at(r.times, r.values, t) for r in runs)
        return [v for v in found if v is not None and math.isfinite(v)]

    def winners_needs(self, settings: Settings) -> dict[float, float]:
        """At each grid fraction, the largest c = (value - anchor) / (median - anchor) that a run
        needed which then beat every run finished before it (measured against those runs).
        A run's need depends only on the runs before it: each run is taken in once."""
        runs = self.history.runs
        for i in range(self.seen, len(runs)):
            run = runs[i]
            if self.best is not None and run.final < self.best and i >= settings.min_history:
                for fraction in self.GRID:
                    own = value_at(run.times, run.values, fraction * run.budget)
                    others = self.field_at(runs[:i], fraction * run.budget)
                    if own is not None and len(others) >= settings.min_history:
                        lead, median = anchor(runs[:i], others, fraction * run.budget), statistics.median(others)
                        if median > lead:
                            self.needs[fraction] = max(self.needs[fraction], (own - lead) / (median - lead))
            self.best = run.final if self.best is None else min(self.best, run.final)
        self.seen = len(runs)
        return self.needs

    def winners_c(self, fraction: float, settings: Settings) -> float:
        """The largest c a winner needed within WINDOW of this fraction of the budget."""
        needs = self.winners_needs(settings)
        return max([c for f, c in needs.items() if abs(f - fraction) <= self.WINDOW + 1e-9] or [0.0])


@dataclass
class Check:
    t: float
    mean: float | None  # the final it points to (race: the best run's final + the distance to it)
    sd: float | None  # forecast rule: the forecast's sd and 90 % interval
    low: float | None
    high: float | None
    llr: float | None
    decision: str  # continue | stop | accept | diverged | no_fit | no_field
    value: float | None = None  # race rule: the run's value now
    lead: float | None = None  # the anchor: the best finished run's value at this time
    median: float | None = None  # the median of the runs that reached this time
    line: float | None = None  # the stop line
    c: float | None = None  # the line's place between lead (0) and median (1)
    place: float | None = None  # race: the run's own place, (value - lead) / (median - lead)
    place_before: float | None = None  # its place at its previous check, on the runs that reached now


@dataclass
class Monitor:
    """Watches one run: call `update(points)` with the metric points seen so far; it returns a
    stop reason, or None. `checks` records every check; `comment` is the one-line verdict."""
    budget: float
    best: float | None  # best final so far (None: nothing to beat yet, no stop but divergence)
    noise: float  # noise floor (sd of the metric between identical runs)
    calibration: Calibration  # the finished runs at this budget, in the order they finished
    settings: Settings = field(default_factory=Settings)
    metric: str = "val_bpb"
    checks: list[Check] = field(default_factory=list)
    comment: str = ""
    accepted: bool = False
    race: Race | None = None  # shared by the monitors of one history (made here when not given)
    judged: int = 0  # points already judged

    @property
    def threshold(self) -> float | None:
        if self.best is None:
            return None
        return self.best + self.settings.margin_k * max(self.noise, self.settings.min_noise)

    def delta(self, sd: float) -> float:
        """The forecast rule's indifference zone: the alternative with the lowest stop boundary,
        sd sqrt(2 log A), and at least delta_k x the noise floor."""
        log_a = math.log((1 - self.settings.alpha) / self.settings.beta)
        floor = self.settings.delta_k * max(self.noise, self.settings.min_noise)
        return max(floor, sd * math.sqrt(2 * log_a))

    def update(self, points: list[dict]) -> str | None:
        """The stop reason after the run's points so far (all of them, each call), or None.
        Each new point is judged as if it had been read alone, in order: a run that reports
        several points between two polls is stopped at the first check that stops it."""
        series = [(float(p["t"]), float(p[self.metric])) for p in points
                  if isinstance(p.get("t"), (int, float)) and isinstance(p.get(self.metric), (int, float))]
        start, self.judged = min(self.judged, len(series)), len(series)
        for end in range(start + 1, len(series) + 1):
            if why := self._judge(series[:end]):
                return why
        return None

    def _judge(self, series: list[tuple[float, float]]) -> str | None:
        times, values = [s[0] for s in series], [s[1] for s in series]
        last_t, last_v = times[-1], values[-1]
        if not math.isfinite(last_v) or last_v > DIVERGE_FACTOR * values[0]:
            self.checks.append(Check(last_t, None, None, None, None, None, "diverged"))
            self.comment = (f"diverged at {last_t:.0f} s: {self.metric} {last_v:.4g} "
                            f"(first {values[0]:.4g})")
            return self.comment
        s = self.settings
        if self.accepted or not check_due(last_t, len(self.checks), self.budget, s) or self.threshold is None:
            return None
        if s.rule == "race":
            return self._race(last_t, last_v)
        return self._forecast(times, values, last_t)

    def _race(self, t: float, value: float) -> str | None:
        s = self.settings
        self.race = self.race or Race(self.calibration)
        runs = self.calibration.runs
        finished = Race.field_at(runs, t)
        if len(finished) < s.min_history:
            self.checks.append(Check(t, None, None, None, None, None, "no_field", value))
            return None
        reached = finished + self.race.reached(t, s.interval_s)
        lead, median = anchor(runs, finished, t), statistics.median(reached)
        place = (value - lead) / (median - lead) if median > lead else None
        field = [(r.times, r.values) for r in runs] + self.race.reached_curves(t, s.interval_s)
        before = self._place_before(field, t)
        closing = place is not None and before is not None and place < before
        c = s.race_c_closing if closing else s.race_c
        if s.race_safety:
            c = max(c, s.race_safety * self.race.winners_c(t / self.budget, s))
        line = lead + max(c * (median - lead), s.race_noise_k * math.sqrt(2) * self.noise)
        decision = "stop" if value > line else "continue"
        # what the run would end at if it kept its distance to the best run (the reward's estimate)
        top = min(runs, key=lambda r: r.final)
        self.checks.append(Check(t, top.final + value - lead, None, None, None, None, decision,
                                 value, lead, median, line, c, place, before))
        verdict = (f"{self.metric} {value:.4f} vs line {line:.4f} (best run {lead:.4f}, median "
                   f"{median:.4f} of {len(reached)} runs at {t:.0f} s, c {c:.2f}{', closing' if closing else ''})")
        self.comment = f"{'stopped' if decision == 'stop' else 'ran to the end'} at {t:.0f} s: {verdict}"
        return self.comment if decision == "stop" else None

    def _place_before(self, field: list[tuple[tuple, tuple]], t: float) -> float | None:
        """The run's place between the best run and the median at its previous check, measured
        on `field`, the runs that reached t, read at that check's time. On the same runs at both
        times a place that falls is the run gaining on the field; the median of whoever is left
        at each time would fall by itself as losers are stopped and leave the field."""
        before = next((c for c in reversed(self.checks) if c.value is not None and c.t < t), None)
        if before is None:
            return None
        top = min(self.calibration.runs, key=lambda r: r.final)
        lead = value_at(top.times, top.values, before.t)
        then = [value_at(ts, vs, before.t) for ts, vs in field]
        then = [v for v in then if v is not None and math.isfinite(v)]
        if lead is None or not then or not statistics.median(then) > lead:
            return None
        return (before.value - lead) / (statistics.median(then) - lead)

    def _forecast(self, times, values, t: float) -> str | None:
        fc = forecast(times, values, self.budget, self.calibration)
        if fc is None:
            self.checks.append(Check(t, None, None, None, None, None, "no_fit"))
            return None
        theta, delta = self.threshold, self.delta(fc.sd)
        llr, decision = forecast_test(fc.mean, fc.sd, theta, delta, self.settings)
        low, high = fc.interval90
        self.checks.append(Check(t, fc.mean, fc.sd, low, high, llr, decision))
        verdict = f"forecast {fc.mean:.4f} ± {fc.sd:.4f} vs threshold {theta:.4f}"
        if decision == "stop":
            self.comment = f"stopped at {t:.0f} s: {verdict}"
            return self.comment
        if decision == "accept":
            self.accepted = True
        self.comment = f"{'accepted' if self.accepted else 'ran to the end'} at {t:.0f} s: {verdict}"
        return None


def trusted(check: Check) -> bool:
    """A forecast check whose interval rests on enough finished runs."""
    return check.sd is not None and check.sd < UNTRUSTED_SD


# -- fed from the repo -------------------------------------------------------------------------

FINISHED = ("keep", "discard", "baseline")


class EarlyStop:
    def __init__(self, store: Store, config: Config, run_dir: Callable[[int], Path]):
        self.store, self.config, self.run_dir = store, config, run_dir
        self.calibration = Calibration()
        self.race = Race(self.calibration)  # winners' needs and the stopped runs' curves
        self.seen: set[str] = set()  # run dirs already taken in
        self.loss_finished: list[tuple[tuple, tuple, float]] = []  # progress-line curves and finals
        self.loss_stopped: list[tuple[tuple, tuple]] = []

    def past_runs(self):
        """(run dir, final, stopped at) of every run at the current budget, in the order they
        ran (the race needs it): the final of those that trained their whole budget, None for
        early-stopped; `stopped at`: an early-stopped run's time of the check that stopped it
        (None where its note has no checks)."""
        budget = self.config.run.budget_s
        for exp in reversed(self.store.experiments()):
            rec = exp.record or {}
            if rec.get("budget_s") != budget:
                continue
            if rec.get("status") == "early_stop":
                stops = [c.get("t") for c in rec.get("checks") or [] if c.get("decision") in ("stop", "diverged")]
                yield self.run_dir(exp.number), None, stops[0] if stops else None
            elif rec.get("status") not in FINISHED:
                continue
            elif exp.number == 0:
                finals = rec.get("noise_runs") or []
                for i, final in zip(rec.get("noise_run_dirs") or range(len(finals)), finals):
                    yield self.run_dir(0) / f"noise-{i}", final, None
            elif rec.get("val_bpb") is not None:
                yield self.run_dir(exp.number), rec["val_bpb"], None

    def monitor(self, noise: float | None = None) -> Watch | None:
        """The early stop of the next run (a Watch: metric points, else the progress lines'
        training loss), or None when early stop is off. `noise`: the repo's pooled noise floor
        (sd); the baseline's own sd when not given."""
        es = self.config.early_stop
        if not es.enabled:
            return None
        name = self.config.metric.name
        for run_dir, final, stopped_at in self.past_runs():
            metrics_file = run_dir / "metrics.jsonl"
            if str(run_dir) in self.seen or not metrics_file.exists():
                continue
            # a stopped run is known up to its stop: the points it wrote before the kill landed
            # depend on the machine's load, and would make the field differ from run to run
            points = [p for p in metrics.parse_metric_lines(metrics_file.read_text(errors="replace"))
                      if not p.get("final") and isinstance(p.get(name), (int, float))
                      and isinstance(p.get("t"), (int, float))
                      and (stopped_at is None or p["t"] <= stopped_at)]
            self.seen.add(str(run_dir))
            times, values = tuple(p["t"] for p in points), tuple(p[name] for p in points)
            if points and final is None:
                self.race.add_stopped(times, values)
            elif points:
                self.calibration.add(FinishedRun(times, values, final, self.config.run.budget_s))
            loss_times, losses = losscurve.read_curve(run_dir / PROGRESS_FILE)
            if loss_times and final is None:
                self.loss_stopped.append((loss_times, losses))
            elif loss_times:
                self.loss_finished.append((loss_times, losses, final))
        baseline = self.store.read_note(self.store.experiment_commit(0)) or {}
        best = (self.store.read_note(self.store.best()) or {}).get("val_bpb")
        # A short budget still gets about ten checks: at most a tenth of the budget apart.
        interval = min(es.interval_s, self.config.run.budget_s / 10)
        settings = replace(Settings(**{f.name: getattr(es, f.name) for f in fields(Settings)
                                       if hasattr(es, f.name)}), interval_s=interval)
        sd = noise if noise is not None else (baseline.get("noise_std") or 0.0)
        budget = self.config.run.budget_s
        on_metric = Monitor(budget, best, sd, self.calibration, settings, metric=name, race=self.race)
        # the training loss stands in only for a repo whose runs write no metric points: a run
        # whose metric file lags its output is still judged by its metric
        loss_map, why = (None, "the repo's runs write metric points") if self.calibration.runs else \
            losscurve.fit_map(self.loss_finished, settings.min_history)
        on_loss = None
        if loss_map is not None:  # rebuilt per run: the map moves
            calibration = losscurve.mapped_calibration(self.loss_finished, loss_map, budget)
            race = Race(calibration)
            for times, losses in self.loss_stopped:
                race.add_stopped(times, [loss_map(v) for v in losses])
            on_loss = Monitor(budget, best, sd, calibration, settings, metric=name, race=race)
        return Watch(on_metric, on_loss, loss_map, why)
