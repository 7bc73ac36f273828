"""The self-evaluation fed from the repo: every run that trained its whole budget (at the
current budget) adds its curve, read from <git dir>/gitresearch/runs/N/metrics.jsonl, and
its final value, read from its note, to the calibration; each new run gets a Monitor with
the best so far and the baseline's noise floor (docs/early-stop.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import metrics as M
from . import selfeval
from .config import Config
from .gitstore import Store

FINISHED = ("keep", "discard", "baseline")


class EarlyStop:
    def __init__(self, store: Store, config: Config, run_dir: Callable[[int], Path]):
        self.store, self.config, self.run_dir = store, config, run_dir
        self.calibration = selfeval.Calibration()
        self.seen: set[str] = set()  # run dirs already in the calibration

    def finished_runs(self):
        """(run dir, final) of every run that trained its whole budget at the current budget."""
        budget = self.config.run.budget_s
        for exp in self.store.experiments():
            rec = exp.record or {}
            if rec.get("status") not in FINISHED or rec.get("budget_s") != budget:
                continue
            if exp.number == 0:
                finals = rec.get("noise_runs") or []
                for i, final in zip(rec.get("noise_run_dirs") or range(len(finals)), finals):
                    yield self.run_dir(0) / f"noise-{i}", final
            elif rec.get("val_bpb") is not None:
                yield self.run_dir(exp.number), rec["val_bpb"]

    def monitor(self) -> selfeval.Monitor | None:
        """A Monitor for the next run, or None when early stop is off."""
        es = self.config.early_stop
        if not es.enabled:
            return None
        name = self.config.metric.name
        for run_dir, final in self.finished_runs():
            metrics_file = run_dir / "metrics.jsonl"
            if str(run_dir) in self.seen or not metrics_file.exists():
                continue
            points = [p for p in M.parse_metric_lines(metrics_file.read_text(errors="replace"))
                      if not p.get("final") and isinstance(p.get(name), (int, float))
                      and isinstance(p.get("t"), (int, float))]
            self.seen.add(str(run_dir))
            if points:
                self.calibration.add(selfeval.FinishedRun(
                    tuple(p["t"] for p in points), tuple(p[name] for p in points), final,
                    self.config.run.budget_s))
        baseline = self.store.read_note(self.store.experiment_commit(0)) or {}
        best = (self.store.read_note(self.store.best()) or {}).get("val_bpb")
        # A short budget still gets about ten checks: at most a tenth of the budget apart.
        interval = min(es.interval_s, self.config.run.budget_s / 10)
        settings = selfeval.Settings(interval_s=interval, min_fraction=es.min_fraction,
                                     beta=es.beta, alpha=es.alpha, margin_k=es.margin_k,
                                     delta_k=es.delta_k)
        return selfeval.Monitor(self.config.run.budget_s, best, baseline.get("noise_std") or 0.0,
                                self.calibration, settings, metric=name)
