"""Results out of git: the autoresearch `results.tsv` and the progress chart.

    gitresearch export --tsv results.tsv
    gitresearch plot -o progress.png
    gitresearch export --tensorboard runs/ && tensorboard --logdir runs/

The TensorBoard export writes one run per experiment (NNNNNN-status/: the learning curve as
`curve/METRIC` and `curve/train_loss` against the run's steps, with wall times so that
TensorBoard's "relative" axis is seconds of training; the results as `final/*` at step 0; the
description as text) and a `progress` run (`progress/METRIC` and `progress/best` against the
experiment number). Exporting again replaces what an earlier export wrote there.

results.tsv is tab-separated with autoresearch's header and columns: commit (7 characters),
val_bpb (6 decimals, 0.000000 when the run gave none), memory_gb (peak, 1 decimal), status,
description; one row per experiment, oldest first, the baseline included. Statuses are
gitresearch's own (keep, discard, crash, and also baseline, early_stop, timeout, invalid):
notebooks that count `keep` rows work unchanged.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from . import metrics
from .errors import GitresearchError
from .gitstore import Store
from .runner import PROGRESS_FILE

TSV_HEADER = ("commit", "val_bpb", "memory_gb", "status", "description")


def rows(store: Store) -> list[dict]:
    """Finished experiments, oldest first, with what the exports need."""
    out = []
    for exp in reversed(store.experiments()):
        if exp.record is None:
            continue
        record = exp.record
        out.append({"experiment": exp.number, "commit": exp.commit, "status": record.get("status", "?"),
                    "val_bpb": record.get("val_bpb"), "memory_mb": record.get("peak_memory_mb"),
                    "description": (record.get("description") or exp.description).replace("\t", " ").replace("\n", " "),
                    "forecast": ((record.get("checks") or [{}])[-1] or {}).get("mean"),
                    "min_delta": record.get("min_delta"), "record": record})
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_curve(store: Store, number: int, metric: str = "val_bpb") -> dict:
    """An experiment's learning curve as its run wrote it (<git dir>/gitresearch/runs/NNNNNN):
    the metric points (t, step, value) and the progress lines' training loss (t, loss). The
    baseline's is its first noise run's."""
    folder = store.state_dir / "runs" / f"{number:06d}"
    if not (folder / "metrics.jsonl").exists() and (folder / "noise-0").is_dir():
        folder = folder / "noise-0"

    def points(name: str) -> list[dict]:
        try:
            return metrics.parse_metric_lines((folder / name).read_text(errors="replace"))
        except OSError:
            return []
    metric_points = [{"t": p["t"], "step": p.get("step"), "value": p[metric]} for p in points("metrics.jsonl")
                     if not p.get("final") and _number(p.get(metric)) and _number(p.get("t"))]
    losses = [{"t": p["t"], "step": p.get("step"), "value": p["train_loss"]} for p in points(PROGRESS_FILE)
              if _number(p.get("train_loss")) and _number(p.get("t"))]
    return {"metric": metric_points, "train_loss": losses}


def counted(data: list[dict]) -> int:
    """Experiments as `status` counts them: the baseline is not one."""
    return sum(r["status"] != "baseline" for r in data)


def export_tsv(store: Store, path: Path) -> int:
    """Writes every row, the baseline included; returns the experiments (baseline excluded)."""
    data = rows(store)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(TSV_HEADER)
        for r in data:
            memory = (r["memory_mb"] or 0.0) / 1024
            writer.writerow([r["commit"][:7], f"{r['val_bpb'] or 0.0:.6f}", f"{memory:.1f}", r["status"],
                             r["description"]])
    return counted(data)


def plot(store: Store, path: Path, title: str = "gitresearch progress", metric: str = "val_bpb") -> int:
    """Every experiment's val_bpb in order: kept ones highlighted and labelled, discarded and
    early-stopped ones dimmed, failures marked on the axis; the running best as a step line."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    data = rows(store)
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=120)
    values = [r["val_bpb"] for r in data if isinstance(r["val_bpb"], (int, float))]
    floor = min(values) if values else 0.0
    styles = {"discard": dict(color="0.6", alpha=0.5, marker="o", s=18,
                              label="discarded (not below best by min_delta, or not confirmed)"),
              "early_stop": dict(color="tab:orange", alpha=0.35, marker="v", s=18, label="early stop"),
              "keep": dict(color="tab:green", alpha=1.0, marker="*", s=120, label="kept", zorder=3),
              "baseline": dict(color="tab:blue", alpha=1.0, marker="s", s=50, label="baseline", zorder=3)}
    for status, style in styles.items():
        # an early-stopped run has no final value: it is drawn at the forecast that stopped it
        key = "forecast" if status == "early_stop" else "val_bpb"
        points = [(i, r[key]) for i, r in enumerate(data)
                  if r["status"] == status and isinstance(r[key], (int, float))]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], **style)
    failed = [i for i, r in enumerate(data) if r["status"] in ("crash", "timeout", "invalid")]
    if failed:
        ax.scatter(failed, [floor] * len(failed), color="tab:red", marker="x", s=30,
                   label="crash / timeout / invalid", zorder=3)
    best, xs, ys, bar = None, [], [], []
    for i, r in enumerate(data):
        if r["status"] in ("baseline", "keep") and isinstance(r["val_bpb"], (int, float)):
            best = r["val_bpb"] if best is None else min(best, r["val_bpb"])
        if best is not None:
            xs.append(i)
            ys.append(best)
            bar.append(best - r["min_delta"] if isinstance(r.get("min_delta"), (int, float)) else None)
    if xs:
        ax.step(xs, ys, where="post", color="tab:green", linewidth=1.5, label="running best")
        shown = [(x, b) for x, b in zip(xs, bar) if b is not None]
        if shown:  # why a discard below the best line was not kept
            ax.step([p[0] for p in shown], [p[1] for p in shown], where="post", color="tab:green",
                    linewidth=0.8, linestyle="--", label="best - min_delta: a keep must end below")
    for i, r in enumerate(data):
        if r["status"] == "keep":
            ax.annotate(r["description"][:40], (i, r["val_bpb"]), textcoords="offset points",
                        xytext=(4, 6), fontsize=7, rotation=20)
    ax.set_xlabel("experiment")
    ax.set_ylabel(f"{metric} (lower is better)")
    ax.set_title(f"{title}: {counted(data)} experiments and the baseline")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return counted(data)


FINALS = ("val_bpb", "delta", "training_seconds", "seconds", "peak_memory_mb", "steps")  # record keys -> final/*


class ExportError(GitresearchError):
    pass


def export_tensorboard(store: Store, folder: Path, metric: str = "val_bpb") -> int:
    """Every finished experiment as a TensorBoard run under `folder`, plus a progress run;
    returns the experiments (baseline excluded)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:  # torch is there; its writer needs the tensorboard package
        raise ExportError(f"export --tensorboard needs the tensorboard package: pip install "
                          f"'gitresearch[tensorboard]' ({err})") from err
    folder.mkdir(parents=True, exist_ok=True)
    data = rows(store)
    for old in [*folder.glob("[0-9]" * 6 + "-*/events.out.tfevents.*"), *folder.glob("progress/events.out.tfevents.*")]:
        old.unlink()  # a second export replaces the first instead of doubling every curve
    progress = SummaryWriter(str(folder / "progress"))
    best = None
    for row in data:
        number, record = row["experiment"], row["record"]
        started = record.get("started") or record.get("finished") or 0.0
        with SummaryWriter(str(folder / f"{number:06d}-{row['status']}")) as writer:
            curve = run_curve(store, number, metric)
            for name, points in ((metric, curve["metric"]), ("train_loss", curve["train_loss"])):
                stepped = all(isinstance(p["step"], int) for p in points)
                for i, p in enumerate(points):
                    writer.add_scalar(f"curve/{name}", p["value"], p["step"] if stepped else i,
                                      walltime=started + p["t"])
            for key in FINALS:
                if _number(record.get(key)):
                    writer.add_scalar(f"final/{metric if key == 'val_bpb' else key}", record[key], 0, walltime=started)
            writer.add_text("description", f"#{number} {row['status']}: {row['description']}", 0, walltime=started)
        if _number(row["val_bpb"]):
            progress.add_scalar(f"progress/{metric}", row["val_bpb"], number, walltime=started)
            if row["status"] in ("baseline", "keep"):
                best = row["val_bpb"] if best is None else min(best, row["val_bpb"])
        if best is not None:
            progress.add_scalar("progress/best", best, number, walltime=started)
    progress.close()
    return counted(data)
