"""`gitresearch bench early-stop`: replay recorded learning curves through early-stop methods
(ours, none, a cutoff, Optuna's pruners), all given the same reports at the same times. The
curve format and the figures are in docs/early-stop.md."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from . import earlystop

METHODS = ("ours", "none", "cutoff", "optuna-median", "optuna-sha")


@dataclass
class Run:
    id: str
    budget: float
    final: float | None
    times: list[float]
    values: list[float]

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
        runs.append(Run(str(rec["id"]), float(rec["budget_s"]), final,
                        [t for t, _ in pairs], [v for _, v in pairs]))
    if not runs:
        raise ValueError(f"{path}: no curves")
    return runs


def check_times(budget: float, settings: earlystop.Settings) -> list[float]:
    times, t = [], settings.min_fraction * budget
    while t < budget - 1e-9:
        times.append(t)
        t += settings.interval_s
    return times


class OptunaMethod:
    """Optuna's own pruners, fed the latest periodic metric at each check (step = check index)."""

    def __init__(self, kind: str):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        pruner = (optuna.pruners.MedianPruner() if kind == "optuna-median"
                  else optuna.pruners.SuccessiveHalvingPruner())
        self.optuna = optuna
        self.study = optuna.create_study(direction="minimize", pruner=pruner)

    def run(self, run: Run, times: list[float]) -> float | None:
        trial = self.study.ask()
        for step, t in enumerate(times):
            seen = run.seen_until(t)
            if not seen or t > run.end:
                break
            value = seen[-1]["val_bpb"]
            if not math.isfinite(value):
                break
            trial.report(value, step)
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
    calibration = earlystop.Calibration()
    optuna_method = OptunaMethod(method) if method.startswith("optuna") else None
    stops, stopped_ids, beaters, false_stops, used, covered, trusted = [], set(), 0, 0, 0.0, 0, 0
    full = sum(r.end for r in runs)
    for run in runs:
        times = check_times(run.budget, settings)
        stop_at = None
        if optuna_method is not None:
            stop_at = optuna_method.run(run, times)
        elif method in ("ours", "cutoff") and best is not None:
            monitor = earlystop.Monitor(run.budget, best, noise, calibration, settings)
            for t in times:
                if t > run.end:
                    break
                seen = run.seen_until(t)
                n_checks = len(monitor.checks)
                reason = monitor.update(seen)
                if len(monitor.checks) > n_checks:
                    check = monitor.checks[-1]
                    if check.sd is not None and check.sd < earlystop.UNTRUSTED_SD and run.final is not None:
                        trusted += 1
                        covered += check.low <= run.final <= check.high
                    if method == "cutoff" and check.mean is not None and check.sd < earlystop.UNTRUSTED_SD:
                        reason = "cutoff" if check.mean > monitor.threshold else None
                        monitor.accepted = False  # the cutoff has no accept region
                if reason:
                    stop_at = t
                    break
        would_beat = run.final is not None and best is not None and run.final < best
        beaters += would_beat
        if stop_at is not None:
            stops.append(stop_at / run.budget)
            stopped_ids.add(run.id)
            false_stops += would_beat
            used += stop_at
        else:
            used += run.end
            if run.final is not None:
                best = run.final if best is None else min(best, run.final)
                calibration.add(earlystop.FinishedRun(tuple(run.times), tuple(run.values), run.final, run.budget))
    best_run = min((r for r in runs if r.final is not None), key=lambda r: r.final)
    result = {
        "method": method, "runs": len(runs), "stopped_frac": len(stops) / len(runs),
        "budget_used_by_stopped": sum(stops) / len(stops) if stops else 0.0,
        "compute_saved": (full - used) / sum(r.budget for r in runs),
        "false_stops": false_stops, "false_stop_rate": false_stops / beaters if beaters else 0.0,
        "best_stopped": best_run.id in stopped_ids, "throughput_x": full / used if used else 1.0,
    }
    if method == "ours":
        result["coverage90"] = covered / trusted if trusted else None
        result["trusted_checks"] = trusted
    return result
