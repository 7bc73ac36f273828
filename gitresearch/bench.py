"""`gitresearch bench early-stop`: replay recorded learning curves through early-stop methods
(our forecast and race rules, none, a cutoff, Optuna's pruners) at the same check times, one corpus or several with a
pooled row. The curve format and the figures are in docs/early-stop.md."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from scipy import stats

from . import earlystop, losscurve
from .confirm import pooled_noise
from .forecast import UNTRUSTED_SD, Calibration, FinishedRun

METHODS = ("forecast", "race", "none", "cutoff", "optuna-median", "optuna-sha")  # ours: forecast and race


@dataclass
class Run:
    id: str
    budget: float
    final: float | None
    times: list[float]
    values: list[float]
    config: str = ""  # the run's settings as sorted JSON: equal strings are repeats
    source: str = "metric"  # metric | train_loss (progress lines, smoothed as the loop does)

    def seen_until(self, t: float) -> list[dict]:
        return [{"t": ti, "val_bpb": v} for ti, v in zip(self.times, self.values) if ti <= t + 1e-9]

    @property
    def end(self) -> float:
        """Training seconds the run used when nothing stops it (a crash ends it early)."""
        return self.budget if self.final is not None else (self.times[-1] if self.times else 0.0)


def load_curves(path: Path) -> list[Run]:
    runs = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        pairs = [(p["t"], p.get("val_bpb")) if isinstance(p, dict) else (p[0], p[1])
                 for p in rec["points"]]
        pairs = [(float(t), float("nan") if v is None else float(v)) for t, v in pairs]
        final = rec.get("final")
        final = float(final) if isinstance(final, (int, float)) and math.isfinite(final) else None
        source = rec.get("source", "metric")
        values = [v for _, v in pairs]
        if source == "train_loss":
            values = losscurve.smoothed(values)
        runs.append(Run(str(rec["id"]), float(rec["budget_s"]), final, [t for t, _ in pairs], values,
                        json.dumps(rec.get("config"), sort_keys=True) if "config" in rec else "", source))
    if not runs:
        raise ValueError(f"{path}: no curves")
    return runs


def corpus_noise(runs: list[Run]) -> tuple[float, int] | None:
    """(sd, dof) of the final value pooled over the corpus's repeated runs (equal configs), or
    None when it holds no repeats."""
    groups: dict[str, list[float]] = {}
    for run in runs:
        if run.config and run.final is not None:
            groups.setdefault(run.config, []).append(run.final)
    noise = pooled_noise(groups.values(), confidence=0.9)  # the keep rule's pooling (docs/keep.md)
    return (noise.std, noise.dof) if noise else None


def loss_slope(runs: list[Run]) -> float:
    """Metric per unit of training loss over the corpus's finished runs (final against the last
    smoothed loss): the noise floor, in metric units, divided by it is the race line's floor in
    loss units. The loop refits the map on the runs before each one; the bench, fitting once
    on the whole corpus, is in sample for that one number."""
    pairs = [(r.values[-1], r.final) for r in runs if r.final is not None and r.values]
    fit = stats.linregress([p[0] for p in pairs], [p[1] for p in pairs])
    if not fit.slope > 0:
        raise ValueError(f"the training loss of this corpus does not track its finals (slope {fit.slope:.3g})")
    return float(fit.slope)


def rate_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact binomial) interval of a rate seen k times in n."""
    if n == 0:
        return 0.0, 1.0
    tail = (1 - level) / 2
    low = stats.beta.ppf(tail, k, n - k + 1) if k > 0 else 0.0
    high = stats.beta.ppf(1 - tail, k + 1, n - k) if k < n else 1.0
    return float(low), float(high)


class OptunaMethod:
    """Optuna's own pruners, fed the latest periodic metric at each check (step = check index)."""

    def __init__(self, kind: str):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        pruner = (optuna.pruners.MedianPruner() if kind == "optuna-median"
                  else optuna.pruners.SuccessiveHalvingPruner())
        self.optuna = optuna
        self.study = optuna.create_study(direction="minimize", pruner=pruner)

    def run(self, run: Run, settings: earlystop.Settings) -> float | None:
        """The time the run is pruned at, or None. The pruner is asked at the points where our
        monitor checks (earlystop.check_due), with the value of that point (a NaN is pruned),
        and charged from then on, as a user reporting each metric when it arrives would be."""
        trial = self.study.ask()
        step = 0
        for t, value in zip(run.times, run.values):
            if t > run.end or t >= run.budget:
                break
            if not earlystop.check_due(t, step, run.budget, settings):
                continue
            trial.report(value, step)
            step += 1
            if trial.should_prune():
                self.study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
                return t
        if run.final is None:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, run.final)
        return None


def replay(runs: list[Run], method: str, settings: earlystop.Settings, noise: float) -> dict:
    best = None
    calibration = Calibration()
    race = earlystop.Race(calibration)
    if method in ("forecast", "race", "cutoff"):
        settings = replace(settings, rule="race" if method == "race" else "forecast")
    optuna_method = OptunaMethod(method) if method.startswith("optuna") else None
    stops, stopped_ids, beaters, false_stops, used, covered, trusted = [], set(), 0, 0, 0.0, 0, 0
    full = sum(r.end for r in runs)
    for run in runs:
        stop_at = None
        if optuna_method is not None:
            stop_at = optuna_method.run(run, settings)
        elif method in ("forecast", "race", "cutoff") and best is not None:
            monitor = earlystop.Monitor(run.budget, best, noise, calibration, settings, race=race)
            # every point, as the loop feeds them: divergence is caught at once, checks when due
            for t in run.times:
                if t > run.end or t >= run.budget:
                    break
                n_checks = len(monitor.checks)
                reason = monitor.update(run.seen_until(t))
                if len(monitor.checks) > n_checks:
                    check = monitor.checks[-1]
                    if check.sd is not None and check.sd < UNTRUSTED_SD and run.final is not None:
                        trusted += 1
                        covered += check.low <= run.final <= check.high
                    if method == "cutoff" and check.mean is not None and check.sd < UNTRUSTED_SD:
                        reason = "cutoff" if check.mean > monitor.threshold else None
                        monitor.accepted = False  # the cutoff has no accept region
                if reason:
                    stop_at = t
                    break
        would_beat = run.final is not None and best is not None and run.final < best
        beaters += would_beat
        if stop_at is not None:
            if method == "race":  # the race's median counts stopped runs up to their stop
                seen = run.seen_until(stop_at)
                race.add_stopped([p["t"] for p in seen], [p["val_bpb"] for p in seen])
            stops.append(stop_at / run.budget)
            stopped_ids.add(run.id)
            false_stops += would_beat
            used += stop_at
        else:
            used += run.end
            if run.final is not None:
                best = run.final if best is None else min(best, run.final)
                calibration.add(FinishedRun(tuple(run.times), tuple(run.values), run.final, run.budget))
    best_run = min((r for r in runs if r.final is not None), key=lambda r: r.final)
    budget = sum(r.budget for r in runs)
    result = {
        "method": method, "runs": len(runs), "stopped_frac": len(stops) / len(runs),
        "budget_used_by_stopped": sum(stops) / len(stops) if stops else 0.0,
        "compute_saved": (full - used) / budget,
        "false_stops": false_stops, "beaters": beaters,
        "false_stop_rate": false_stops / beaters if beaters else 0.0,
        "false_stop_ci95": rate_interval(false_stops, beaters),
        "best_stopped": best_run.id in stopped_ids, "throughput_x": full / used if used else 1.0,
        "stopped": len(stops), "seconds_budget": budget, "seconds_full": full, "seconds_used": used,
    }
    if method == "forecast":
        result["coverage90"] = covered / trusted if trusted else None
        result["trusted_checks"] = trusted
    return result


def pooled(results: list[dict]) -> dict:
    """One method's rows of several corpora as one: compute saved over all their budget seconds,
    false stops over all runs that would have beaten the best, the best of any corpus stopped."""
    runs = sum(r["runs"] for r in results)
    budget, full, used = (sum(r[k] for r in results) for k in ("seconds_budget", "seconds_full", "seconds_used"))
    false_stops, beaters, stopped = (sum(r[k] for r in results) for k in ("false_stops", "beaters", "stopped"))
    return {
        "method": results[0]["method"], "corpus": "pooled", "runs": runs, "stopped_frac": stopped / runs,
        "budget_used_by_stopped": (sum(r["budget_used_by_stopped"] * r["stopped"] for r in results) / stopped
                                   if stopped else 0.0),
        "compute_saved": (full - used) / budget, "false_stops": false_stops, "beaters": beaters,
        "false_stop_rate": false_stops / beaters if beaters else 0.0,
        "false_stop_ci95": rate_interval(false_stops, beaters),
        "best_stopped": any(r["best_stopped"] for r in results), "throughput_x": full / used if used else 1.0,
        "stopped": stopped, "seconds_budget": budget, "seconds_full": full, "seconds_used": used,
    }


def replay_corpora(paths: list[Path], methods, interval: float | None, min_fraction: float, beta: float,
                   alpha: float, noise: float | None, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Every method on every corpus (each with its own check interval, a tenth of its budget
    unless given, and its own noise: `noise`, else the sd of its repeated runs, else 0), then one
    pooled row per method when there are several corpora."""
    rows = []
    for path in paths:
        runs = load_curves(path)
        settings = earlystop.Settings(interval_s=interval or runs[0].budget / 10, min_fraction=min_fraction,
                                      beta=beta, alpha=alpha)
        measured = corpus_noise(runs)
        corpus_sd = noise if noise is not None else (measured[0] if measured else 0.0)
        if runs[0].source == "train_loss":
            corpus_sd /= loss_slope(runs)
        for method in methods:
            row = replay(runs, method, settings, corpus_sd)
            row.update(corpus=Path(path).stem, noise=corpus_sd,
                       noise_source="given" if noise is not None else ("repeats" if measured else "none"))
            rows.append(row)
            if progress:
                progress(f"{row['corpus']} {method}: saved {row['compute_saved']:.3f}")
    if len(paths) > 1:
        rows += [pooled([r for r in rows if r["method"] == m]) for m in methods]
    return rows
