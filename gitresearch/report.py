"""Reading results back: log, show, status, bench tables, and the live progress line."""
from __future__ import annotations

import collections
import re

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import sandbox
from . import verify as verify_mod
from .config import Config
from .history import current_floor
from .progress import Eta
from .gitstore import GitError, Store

LOG_KEYS = ("experiment", "commit", "parent", "status", "val_bpb", "delta", "description",
            "seconds", "training_seconds", "peak_memory_mb", "reason", "comment", "policy")


def log_records(store: Store, count: int | None = None) -> list[dict]:
    """Finished experiments (baseline included), newest first."""
    rows = []
    for exp in store.experiments():
        if exp.record is None:
            continue
        row = {k: exp.record.get(k) for k in LOG_KEYS}
        row.update(experiment=exp.number, commit=exp.commit, parent=exp.parent,
                   description=exp.record.get("description") or exp.description)
        rows.append(row)
        if count is not None and len(rows) >= count:
            break
    return rows


def show_record(store: Store, rev: str) -> dict:
    if re.fullmatch(r"#\d+", rev):
        commit = store.experiment_commit(int(rev[1:]))
        if commit is None:
            raise GitError(f"no experiment {rev}")
    else:
        commit = store.resolve(rev)
    record = store.read_note(commit)
    if record is None:
        raise GitError(f"{commit[:12]} has no gitresearch note")
    return {"commit": commit, "message": store.message(commit), **record,
            "diff": store.diff_of(commit)}


def summarise(store: Store, config: Config | None = None) -> dict:
    experiments = store.experiments()
    notes = [e.record for e in experiments if e.record is not None]
    by_status = collections.Counter(n.get("status") for n in notes)
    baseline = next((n for n in notes if n.get("status") == "baseline"), None)
    known = {e.commit: e.record for e in experiments}
    chain_commits = store.best_chain()
    chain = [(known.get(c) if c in known else store.read_note(c)) or {} for c in chain_commits]
    best = chain[0] if chain else {}
    runs = [n for n in notes if n.get("status") not in ("baseline", "invalid", None)]
    starts = [n["started"] for n in runs if n.get("started")]
    ends = [n["finished"] for n in runs if n.get("finished")]
    hours = (max(ends) - min(starts)) / 3600 if starts and ends and max(ends) > min(starts) else None
    trained = ("keep", "discard", "early_stop", "confirming")  # a crash or timeout is no budget share
    shares = [min(1.0, n["training_seconds"] / n["budget_s"]) for n in runs
              if n.get("status") in trained and n.get("training_seconds") is not None and n.get("budget_s")]
    total_budget = sum(n.get("budget_s") or 0 for n in runs)
    saved = sum(max(0.0, n["budget_s"] - (n.get("training_seconds") or 0)) for n in runs
                if n.get("status") == "early_stop" and n.get("budget_s"))
    base_bpb, best_bpb = (baseline or {}).get("val_bpb"), best.get("val_bpb")
    ran = [n for n in notes if n.get("status") not in ("invalid", None)]
    sources = collections.Counter(n.get("metric_source", "self-reported") for n in ran
                                  if n.get("val_bpb") is not None)
    sandboxes = collections.Counter(n.get("sandbox", "none") for n in ran)
    evaluator = " ".join(config.metric.evaluate) if config and config.metric.evaluate else None
    base = baseline or {}
    level = current_floor(store, config or Config(), notes)
    early_stop = early_stop_state(notes, config)
    remeasured = best.get("remeasured") or []
    drift = remeasured[-1] if remeasured and remeasured[-1].get("drift") else None
    return {
        "noise_std": level.noise.std if level.noise else base.get("noise_std"),
        "noise_n": level.noise.dof + level.noise.groups if level.noise else len(base.get("noise_runs") or []),
        "noise_dof": level.noise.dof if level.noise else 0,
        "noise_upper": level.noise.upper if level.noise else None,
        "min_delta": level.min_delta, "min_delta_rule": level.rule, "screen_threshold": level.screen,
        "drift": drift, "best_remeasured": len(remeasured),
        "sandbox_host": sandbox.probe().describe(),
        "sandbox_mode": config.sandbox.mode if config else None,
        "evaluator": evaluator, "metric_sources": dict(sources), "sandboxes": dict(sandboxes),
        "experiments": len(notes) - (baseline is not None), "by_status": dict(by_status),
        "baseline_val_bpb": base_bpb, "best_val_bpb": best_bpb,
        "relative_gain": (base_bpb - best_bpb) / base_bpb if base_bpb and best_bpb else None,
        "experiments_per_hour": len(runs) / hours if hours else None,
        "mean_budget_share": sum(shares) / len(shares) if shares else None,
        "compute_saved": saved / total_budget if total_budget else 0.0, "early_stop": early_stop,
        "best_chain": [{"commit": c, "experiment": n.get("experiment"), "val_bpb": n.get("val_bpb"),
                        "status": n.get("status"), "description": store.subject(c),
                        "evidence": evidence(store, c, n)}
                       for c, n in zip(chain_commits, chain)],
    }


def early_stop_state(notes: list[dict], config: Config | None) -> str | None:
    """What early stop judged the newest screened run by, or why it could not act (None for
    notes older than the field)."""
    if config is not None and not config.early_stop.enabled:
        return "off ([early_stop] enabled = false, or --no-early-stop)"
    for note in notes:  # newest first
        if note.get("early_stop_idle"):
            return "cannot act: " + note["early_stop_idle"]
        source = note.get("early_stop_source")
        if source == "train_loss":
            return "on the training loss of the progress lines (no metric points)"
        if source == "metric":
            return "on the metric points"
    return None


def evidence(store: Store, commit: str, record: dict) -> str:
    """How far a step of best's chain is trusted: its newest verification, else how it was
    kept (confirmation pairs, or the single-run rule)."""
    checked = verify_mod.latest(store, commit)
    if checked:
        pairs = len(checked.get("pairs") or [])
        return f"{checked['verdict']} by verify ({pairs} pairs, gain {_fmt(checked.get('gain'), '+.6f')})"
    if record.get("status") == "baseline":
        return "baseline"
    if (record.get("confirmation") or {}).get("verdict"):
        return "confirmed: " + record["confirmation"]["verdict"]
    return "unconfirmed: kept on a single run" if record.get("status") == "keep" else "-"


def _fmt(value, spec=".6f"):
    return "-" if value is None else format(value, spec)


def print_status(store: Store, console: Console, config: Config | None = None) -> dict:
    s = summarise(store, config)
    table = Table(title="gitresearch status", show_header=False)
    table.add_row("sandbox on this host", s["sandbox_host"])
    if s["sandbox_mode"] == "none":
        table.add_row("sandbox", "[red]off ([sandbox] mode = \"none\"): train.py runs with your file access[/red]")
    table.add_row("metric decided by", s["evaluator"] and f"the evaluator `{s['evaluator']}`"
                  or "[yellow]train.py itself (self-reported; no \\[metric] evaluate)[/yellow]")
    if s["metric_sources"]:
        table.add_row("  results by source", ", ".join(f"{k} {v}" for k, v in sorted(s["metric_sources"].items())))
    if s["sandboxes"].get("none"):
        table.add_row("  runs without a sandbox", str(s["sandboxes"]["none"]))
    table.add_row("experiments", str(s["experiments"]))
    for status, n in sorted(s["by_status"].items(), key=lambda item: -item[1]):
        table.add_row(f"  {status}", str(n))
    name = config.metric.name if config else "val_bpb"
    table.add_row(f"baseline {name}", _fmt(s["baseline_val_bpb"]))
    gain = f" ({100 * s['relative_gain']:.2f}% better)" if s["relative_gain"] else ""
    table.add_row(f"best {name}", _fmt(s["best_val_bpb"]) + gain)
    if s["noise_std"] is not None:
        rule = f" = {escape(s['min_delta_rule'])}" if s["min_delta_rule"] else ""
        upper = f", upper bound {_fmt(s['noise_upper'])}" if s["noise_upper"] is not None else ""
        table.add_row("noise floor", f"std {_fmt(s['noise_std'])} pooled over {s['noise_n']} repeated runs "
                                     f"({s['noise_dof']} dof){upper}; a keep must beat best by "
                                     f"{_fmt(s['min_delta'])}{rule}; a run gaining "
                                     f"{_fmt(s['screen_threshold'])} is confirmed in pairs")
    if s["drift"]:
        table.add_row("[red]drift[/red]", f"[red]best's newest re-run: {escape(s['drift']['reason'])}; "
                                          "candidates are judged against fresh runs of best[/red]")
    table.add_row("experiments per hour", _fmt(s["experiments_per_hour"], ".1f"))
    share = s["mean_budget_share"]
    table.add_row("mean budget share used", "-" if share is None else f"{100 * share:.1f}%")
    table.add_row("compute saved by early stop", f"{100 * s['compute_saved']:.1f}%")
    if s["early_stop"]:
        colour = "yellow" if not s["early_stop"].startswith("on ") else "default"
        table.add_row("  early stop", f"[{colour}]{escape(s['early_stop'])}[/{colour}]")
    console.print(table)
    chain = Table(title="best chain (newest first)")
    for col in ("#", "commit", name, "status", "evidence", "description"):
        chain.add_column(col)
    for link in s["best_chain"]:
        chain.add_row(str(link["experiment"]), link["commit"][:10], _fmt(link["val_bpb"]),
                      link["status"] or "-", escape(link["evidence"]), escape(link["description"]))
    console.print(chain)
    return s


def print_verify(done: list[dict], console: Console) -> None:
    table = Table(title="verify: does each gain reproduce?")
    for col in ("commit", "pairs", "gain", "95% interval", "verdict", "description"):
        table.add_column(col)
    for e in done:
        low, high = e["ci95"] or (None, None)
        colour = "green" if e["verdict"] == "confirmed" else "yellow"
        table.add_row(e["commit"][:10], str(len(e["pairs"])), _fmt(e["gain"], "+.6f"),
                      f"{_fmt(low, '+.6f')} to {_fmt(high, '+.6f')}", f"[{colour}]{e['verdict']}[/{colour}]",
                      escape(e["description"]))
    console.print(table)


def print_log(rows: list[dict], console: Console, metric: str = "val_bpb") -> None:
    table = Table()
    for col in ("#", "commit", "status", metric, "delta", "seconds", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["experiment"]), r["commit"][:10], r["status"] or "-", _fmt(r["val_bpb"]),
                      _fmt(r["delta"], "+.6f"), _fmt(r["seconds"], ".1f"),
                      (r["description"] or "") + (f"  [{r['reason']}]" if r.get("reason") else ""))
    console.print(table)


def format_result(data: dict, metric: str = "val_bpb") -> str:
    return (f"{data['status']}: {metric} {_fmt(data['val_bpb'])} in {data['seconds']:.1f}s"
            + (f" ({data['reason']})" if data["reason"] else ""))


def progress_text(p: dict, metric: str = "val_bpb") -> str:
    """The live line: `#3 12/30s step 40 loss 2.3412 val_bpb -`; past the budget (the script's
    own final evaluation) or in the evaluator, the clock stops at the budget: `evaluating`."""
    evaluating = p.get("phase") == "evaluating" or p["elapsed"] > p["budget"]
    clock = f"{p['budget']:.0f}/{p['budget']:.0f}s evaluating" if evaluating else \
        f"{p['elapsed']:.0f}/{p['budget']:.0f}s"
    return (f"#{p.get('experiment', '-')} {clock} step {p['step'] if p.get('step') is not None else '-'} "
            f"loss {_fmt(p.get('train_loss'), '.4f')} {metric} {_fmt(p.get('metric'), '.4f')}")


class LiveProgress:
    """The live lines: the run in progress (experiment, elapsed against budget, step, loss,
    metric) and, where the command has a count (loop --max-experiments, verify), the count with
    an ETA; to a file or pipe the count is a plain line each time it moves."""

    def __init__(self, console: Console, metric: str = "val_bpb"):
        self.console, self.metric = console, metric
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[left]}"), TimeRemainingColumn(),
                                 console=console, transient=True)
        self.task = self.overall = None
        self.eta, self.counted = Eta(), None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def log(self, line: str) -> None:
        self.progress.console.print(line, highlight=False, markup=False)

    def update(self, p: dict) -> None:
        text = progress_text(p, self.metric)
        if self.task is None:
            self.task = self.progress.add_task(text, total=p["budget"], left="left")
        self.progress.update(self.task, description=text, completed=min(p["elapsed"], p["budget"]),
                             total=p["budget"])

    def count(self, done: int, total: int, what: str) -> None:
        """`done` of `total` (experiments, verification runs)."""
        if (done, total) == self.counted:
            return
        self.counted = (done, total)
        line = self.eta.plain(what, done, total)
        if not self.console.is_terminal:
            self.log(line)
        elif self.overall is None:
            self.overall = self.progress.add_task(f"{what} {done}/{total}", total=total, completed=done, left="ETA")
        else:
            self.progress.update(self.overall, description=f"{what} {done}/{total}", completed=done, total=total)


def print_bench(rows: list[dict], console: Console) -> None:
    """One table per corpus (and the pooled one): methods as columns, figures as rows."""
    for corpus in dict.fromkeys(r["corpus"] for r in rows):
        results = [r for r in rows if r["corpus"] == corpus]
        noise = results[0].get("noise")
        title = f"early stop, replayed: {corpus}" + (
            f" (noise {noise:.4f} from {results[0]['noise_source']})" if noise is not None else "")
        table = Table(title=title)
        table.add_column("figure")
        for r in results:
            table.add_column(r["method"], justify="right")
        for key in ("runs", "stopped_frac", "budget_used_by_stopped", "compute_saved", "false_stops",
                    "beaters", "false_stop_rate", "false_stop_ci95", "best_stopped", "throughput_x",
                    "coverage90"):
            cells = []
            for r in results:
                value = r.get(key)
                if key == "false_stop_ci95" and value is not None:
                    cells.append(f"{value[0]:.3f}-{value[1]:.3f}")
                else:
                    cells.append(_fmt(value, ".3f") if isinstance(value, float) else str(value if key in r else "-"))
            table.add_row(key, *cells)
        console.print(table)


def print_research(result: dict, console: Console) -> None:
    """`bench research`: one row per policy."""
    table = Table(title=f"bench research on the {result['target']}: {result['experiments']} experiments x "
                        f"{result['seeds']} seeds (medians over seeds)")
    for column in ("policy", "final best", "IQR", "experiments to random's final", "area under best",
                   "early-stopped", "compute (sim. min)"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, s in result["policies"].items():
        needed = s["experiments_to_random_final"]
        table.add_row(policy, f"{s['final_best']['median']:.4f}",
                      f"{s['final_best']['q1']:.4f}-{s['final_best']['q3']:.4f}",
                      "not reached" if needed is None else f"{needed:g}", f"{s['area_under_best']:.4f}",
                      f"{s['early_stopped_share']:.0%}", f"{s['compute_s'] / 60:.0f}")
    console.print(table)
    learning = Table(title="per window of experiments (means over seeds)")
    for column in ("policy", "experiments", "mean reward", "distinct diffs", "not invalid", "keeps"):
        learning.add_column(column, justify="left" if column == "policy" else "right")
    for policy, s in result["policies"].items():
        for w in s.get("windows") or []:
            learning.add_row(policy, f"{w['first']}-{w['last']}", _fmt(w["mean_reward"], ".2f"),
                             _fmt(w["distinct_diffs"], ".1f"), _fmt(w["valid_share"], ".0%"), _fmt(w["keeps"], ".1f"))
    console.print(learning)
