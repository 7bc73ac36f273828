"""The command line: parses and dispatches; the commands live in their own modules.

    gitresearch init --template nanochat DIR
    gitresearch loop --policy random --budget 20 --max-experiments 5
    gitresearch loop --policy llm --backend openai --model NAME [--base-url URL]
    gitresearch status | log [-n K] [--json] | show REV [--json] | run [REV]
    gitresearch verify [REV...] [--chain] [--runs K]
    gitresearch plot -o progress.png | export --tsv results.tsv | export --tensorboard DIR
    gitresearch serve [--port 8765]   # a live, read-only page over the repo
    gitresearch pretrain-policy [--out DIR]   # a small policy LM for --policy rl, trained here
    git bisect run gitresearch bisect-run [--rerun] [--threshold X]
"""
from __future__ import annotations

import json
import sys
import tempfile
import traceback
from pathlib import Path

import click
from rich.console import Console

from . import bench, bisect_run, export, report
from .config import Config, load, parse_settings
from .errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NEGATIVE, GitresearchError
from .gitstore import Store
from .init import init_repo
from .loop import Loop
from .policies import POLICIES
from .progress import Steps
from .trial import run_commit

UNWRAPPED = 4096  # columns for output to a file or pipe: rich's 80 would wrap long lines


def make_console(stderr: bool = False) -> Console:
    """A terminal gets its own width; a file or pipe gets lines that are never wrapped."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=UNWRAPPED)


console = make_console(stderr=True)


class ErrorExit(click.ClickException):
    exit_code = EXIT_ERROR


class Group(click.Group):
    """The one error handler: a GitresearchError from any command is one line on stderr and
    exit status 3 (errors.EXIT_ERROR), with no traceback; any other exception is a bug and
    keeps its traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GitresearchError as err:
            raise ErrorExit(str(err)) from err


def _load(root: Path, *settings: dict, **overrides) -> Config:
    """The repo's config: `settings` (from --set) first, then the named flags (None: not given)."""
    merged = {}
    for given in (*settings, overrides):
        merged.update({k: v for k, v in given.items() if v is not None})
    return load(root, merged)


def _repo_root() -> Path:
    return Store(Path.cwd()).root


@click.group(cls=Group)
@click.version_option(package_name="gitresearch")
def main():
    """A git-native harness for autonomous, perpetual ML research."""


@main.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--template", type=click.Choice(["nanochat", "gym"]), help="copy a bundled target first")
@click.option("--commit/--no-commit", default=None,
              help="commit gitresearch.toml before best is created (default: ask on a terminal)")
@click.option("--probe", is_flag=True, help="time one run of HEAD and set grace_s from it")
@click.option("--workflow", is_flag=True, help="also install .github/workflows/research.yml (self-hosted GPU runners)")
def init(directory: Path, template: str | None, commit: bool | None, probe: bool, workflow: bool):
    """Make DIRECTORY a research repo: write gitresearch.toml, commit it, create `best` there."""
    ask = (lambda question: click.confirm(question, default=True)) if sys.stdin.isatty() else None
    for line in init_repo(directory, template, commit=commit, probe=probe, ask=ask, workflow=workflow):
        click.echo(line)


@main.command()
@click.option("--policy", type=click.Choice(list(POLICIES)), help="[policy] name")
@click.option("--backend", type=click.Choice(["openai", "local"]), help="[llm] backend")
@click.option("--model", help="[llm] model: the endpoint's model name, or a local path / hub id")
@click.option("--base-url", help="[llm] base_url of an OpenAI-compatible endpoint")
@click.option("--prompt", type=click.Choice(["full", "compact"]), help="[llm] prompt: compact for small models")
@click.option("--budget", type=float, help="training seconds per experiment [run] budget_s")
@click.option("--max-experiments", type=int, help="stop when the repo holds this many experiments")
@click.option("--max-hours", type=float, help="stop after this many hours")
@click.option("--patience", type=int, help="stop after this many experiments without a keep")
@click.option("--early-stop/--no-early-stop", default=None, help="self-evaluation on or off")
@click.option("--seed", type=int, help="random and optuna policies' seed")
@click.option("--sampler", type=click.Choice(["tpe", "gp", "cmaes", "qmc"]), help="[policy] sampler of --policy optuna")
@click.option("--suggest", type=click.Choice(["tpe", "gp"]), help="[policy] suggest: --policy llm sees this sampler's suggestion")
@click.option("--command", "agent_command", help="[policy] agent_command: the coding agent --policy agent runs")
@click.option("--workers", type=int, help="experiments at once: one per GPU, or CPU cores split [loop] workers")
@click.option("--remote", help="a git remote shared with other machines [loop] remote")
@click.option("--no-sandbox", is_flag=True, default=None,
              help="run train.py without a sandbox, with your file access ([sandbox] mode = \"none\")")
@click.option("--set", "settings", multiple=True, metavar="SECTION.NAME=VALUE",
              help="any setting of gitresearch.toml for this run, e.g. --set rl.ent_coef=0 (repeatable; "
                   "the named flags above win)")
def loop(policy, backend, model, base_url, prompt, budget, max_experiments, max_hours, patience, early_stop, seed,
         sampler, suggest, agent_command, workers, remote, no_sandbox, settings):
    """Run experiments until a stop condition; resumes from git state after any stop."""
    root = _repo_root()
    config = _load(root, parse_settings(settings), **{"run.budget_s": budget, "loop.max_experiments": max_experiments,
                            "loop.max_hours": max_hours, "loop.patience": patience,
                            "early_stop.enabled": early_stop, "policy.seed": seed,
                            "policy.sampler": sampler, "policy.agent_command": agent_command, "policy.suggest": suggest, "policy.name": policy, "llm.backend": backend, "llm.model": model, "llm.prompt": prompt,
                            "llm.base_url": base_url, "loop.workers": workers, "loop.remote": remote,
                            "sandbox.mode": "none" if no_sandbox else None})
    with report.LiveProgress(console, config.metric.name) as live:
        outcome = Loop(root, config, display=live.log, on_progress=live.update, on_count=live.count).run()
    click.echo(f"stopped: {outcome.stop_reason} ({outcome.ran} experiments, {outcome.kept} kept)")
    sys.exit(EXIT_INTERRUPTED if outcome.stop_reason == "interrupted" else 0)


@main.command("pretrain-policy")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="where the model goes [GITDIR/gitresearch/policy-lm]")
@click.option("--examples", type=click.IntRange(1), help="imitation pairs [4000]")
@click.option("--steps", type=click.IntRange(1), help="optimiser steps [1200]")
@click.option("--lr", type=click.FloatRange(0, min_open=True), help="AdamW peak learning rate [0.002]")
@click.option("--copy-weight", type=click.FloatRange(0), help="loss weight of the reply's tokens copied from the prompt [1]")
@click.option("--init", type=click.Path(exists=True, file_okay=False), help="go on training this policy LM")
@click.option("--max-changes", type=click.IntRange(1), help="constants a reply changes, --min-changes to this many [1]")
@click.option("--min-changes", type=click.IntRange(1), help="the fewest constants a reply changes [1]")
@click.option("--digits", is_flag=True, default=None, help="a tokenizer with one token per digit (new models)")
@click.option("--reply", type=click.Choice(["diff", "moves"]), help="the reply form to imitate ([llm] reply) [diff]")
@click.option("--momentum", type=click.FloatRange(0, 1), help="share of moves replies that repeat a kept newest experiment's steps [0]")
@click.option("--min-factor", type=click.FloatRange(1), help="each taught factor at least this far from 1, x or / [1]")
@click.option("--history", type=click.IntRange(0), help="most made-up past experiments a prompt shows [12]")
@click.option("--reply-tokens", type=click.IntRange(0), help="the loop's reply budget: prompts cut to fit beside it as the loop's are (0: whole) [0]")
@click.option("--hide", type=click.FloatRange(0, 1), help="share of views leaving out constants the history names, as crash blame does [0]")
@click.option("--max-move-factor", "max_factor", type=click.FloatRange(1, min_open=True),
              help="the loop's [policy] max_move_factor: failed tries then include steps past it; replies past it count invalid [off]")
@click.option("--seed", type=int, default=0, show_default=True)
def pretrain_policy(out, examples, steps, lr, copy_weight, init, max_changes, min_changes, digits, reply, momentum,
                    min_factor, history, reply_tokens, hide, max_factor, seed):
    """Train a small policy LM by imitation of this repo's constant edits (CPU, no download)."""
    from dataclasses import replace

    from .policies.pretrain import PretrainConfig, pretrain_repo

    root = _repo_root()
    store = Store(root)
    given = {"examples": examples, "steps": steps, "lr": lr, "copy_weight": copy_weight, "init": init,
             "max_changes": max_changes, "min_changes": min_changes, "digits": digits, "reply": reply, "momentum": momentum,
             "min_factor": min_factor, "history": history, "reply_tokens": reply_tokens,
             "hide": hide, "max_factor": max_factor}
    settings = replace(PretrainConfig(), seed=seed, **{k: v for k, v in given.items() if v is not None})
    out = out or store.state_dir / "policy-lm"
    stats = pretrain_repo(store, _load(root), out, settings, log=click.echo)
    sampled = stats["sampled"]
    click.echo(f"saved to {out}: {stats['parameters']:,} parameters, reply loss {stats['first_loss']} -> "
               f"{stats['final_loss']} in {stats['seconds']:.0f} s; {sampled['valid']}/{sampled['samples']} sampled "
               f"replies valid ({sampled['distinct_valid']} distinct)")
    form = "" if settings.reply == "diff" else f', reply = "{settings.reply}"'
    form += f", max_tokens = {settings.reply_tokens}" if settings.reply_tokens else ""
    click.echo(f"use it: gitresearch loop --policy rl --model {out}  (with [llm] prompt = \"compact\"{form})")


@main.command()
@click.argument("rev", default="best")
@click.option("--budget", type=float, help="training seconds [run] budget_s")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--no-sandbox", is_flag=True, default=None, help="run without a sandbox")
def run(rev, budget, as_json, no_sandbox):
    """Run one commit under the budget and print its result; writes nothing to git."""
    root = _repo_root()
    config = _load(root, **{"run.budget_s": budget, "sandbox.mode": "none" if no_sandbox else None})
    store = Store(root)
    commit = store.resolve(rev)
    (store.state_dir / "worktrees").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gitresearch-run-") as tmp, report.LiveProgress(console, config.metric.name) as live:
        result = run_commit(store, config, commit, Path(tmp), on_progress=live.update)
    data = {"commit": commit, "status": result.status, "val_bpb": result.metric,
            "metric_source": result.metric_source, "self_reported": result.self_reported,
            "sandbox": result.sandbox,
            "reason": result.reason, "seconds": result.seconds,
            "training_seconds": result.training_seconds, "peak_memory_mb": result.peak_memory_mb,
            "log_tail": result.log_tail}
    click.echo(json.dumps(data) if as_json else report.format_result(data, config.metric.name))
    sys.exit(0 if result.status == "ok" else EXIT_NEGATIVE)


@main.command()
@click.argument("revs", nargs=-1)
@click.option("--chain", is_flag=True, help="also every step of best's chain (the default without REV)")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True, help="pairs per commit")
@click.option("--budget", type=float, help="training seconds [run] budget_s")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per verified commit")
@click.option("--no-sandbox", is_flag=True, default=None, help="run without a sandbox")
def verify(revs, chain, runs, budget, as_json, no_sandbox):
    """Re-run commits (default: each step of best's chain) against their parents, K pairs
    each, and record whether each gain reproduces (refs/notes/gitresearch-verify)."""
    root = _repo_root()
    config = _load(root, **{"run.budget_s": budget, "sandbox.mode": "none" if no_sandbox else None})
    with report.LiveProgress(console, config.metric.name) as live:
        done = Loop(root, config, display=live.log, on_progress=live.update, on_count=live.count).verify(revs, chain, runs)
    if as_json:
        for entry in done:
            click.echo(json.dumps(entry))
    else:
        report.print_verify(done, make_console())
    sys.exit(0 if done and all(e["verdict"] == "confirmed" for e in done) else EXIT_NEGATIVE)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="the summary as one JSON object")
def status(as_json):
    """Experiments by status, baseline vs best, experiments per hour, budget share, compute
    saved by early stop, and the best chain."""
    root = _repo_root()
    store, config = Store(root), _load(root)
    if as_json:
        click.echo(json.dumps(report.summarise(store, config)))
    else:
        report.print_status(store, make_console(), config)


@main.command()
@click.option("-n", "count", type=int, default=None, help="the newest N experiments")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per experiment")
def log(count, as_json):
    """The experiment history, newest first."""
    root = _repo_root()
    rows = report.log_records(Store(root), count)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
    else:
        report.print_log(rows, make_console(), _load(root).metric.name)


@main.command()
@click.argument("rev")
@click.option("--json", "as_json", is_flag=True)
def show(rev, as_json):
    """One experiment's full record (REV: a commit, a ref, or #N for experiment N)."""
    store = Store(_repo_root())
    record = report.show_record(store, rev)
    click.echo(json.dumps(record, indent=None if as_json else 2, sort_keys=True))


@main.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (another than loopback lets other machines read the repo)")
def serve(port, host):
    """A live, read-only web page over the repo's experiments (docs/serve.md)."""
    from .serve import serve as run_server

    run_server(_repo_root(), host, port, echo=click.echo)


@main.command()
@click.option("-o", "--output", default="progress.png", show_default=True, type=click.Path(dir_okay=False, path_type=Path))
def plot(output):
    """Chart every experiment's metric and the running best (PNG, headless)."""
    root = _repo_root()
    count = export.plot(Store(root), output, metric=_load(root).metric.name)
    click.echo(f"wrote {output} ({count} experiments and the baseline)")


@main.command("export")
@click.option("--tsv", "tsv", type=click.Path(dir_okay=False, path_type=Path),
              help="write autoresearch's results.tsv format here")
@click.option("--tensorboard", "tensorboard", type=click.Path(file_okay=False, path_type=Path),
              help="write every experiment as a TensorBoard run under this folder")
def export_cmd(tsv, tensorboard):
    """Export the experiments: autoresearch's results.tsv (commit, val_bpb, memory_gb, status,
    description) and/or TensorBoard runs (`tensorboard --logdir DIR`)."""
    if not (tsv or tensorboard):
        raise click.UsageError("give --tsv FILE and/or --tensorboard DIR")
    root = _repo_root()
    if tsv:
        count = export.export_tsv(Store(root), tsv)
        click.echo(f"wrote {tsv} ({count} experiments and the baseline)")
    if tensorboard:
        count = export.export_tensorboard(Store(root), tensorboard, _load(root).metric.name)
        click.echo(f"wrote {tensorboard} ({count} experiments and the baseline, a run each, and a progress run): "
                   f"tensorboard --logdir {tensorboard}")


@main.command("bisect-run")
@click.option("--rerun", is_flag=True, help="train the commit under the budget instead of reading its note")
@click.option("--threshold", type=float, help="val_bpb at or below which a commit is `better` "
                                              "[default: halfway between baseline and best]")
@click.option("--budget", type=float, help="training seconds for --rerun [run] budget_s")
def bisect_run_cmd(rerun, threshold, budget):
    """The test of `git bisect run`: exit 0 worse, 1 better, 125 skip (never 128 or above)."""
    try:
        root = _repo_root()
        code, why = bisect_run.bisect_run(Store(root), _load(root, **{"run.budget_s": budget}), threshold, rerun)
    except Exception as err:  # noqa: BLE001 - an uncaught error would exit 1 (`better`): skip instead, loudly
        traceback.print_exc()
        code, why = bisect_run.SKIP, f"skip: {type(err).__name__}: {err}"
    click.echo(why)
    sys.exit(code)


@main.group("bench")
def bench_group():
    """Benchmarks of the harness's parts."""


@bench_group.command("early-stop")
@click.option("--curves", "curves", required=True, multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="recorded curves, one JSON object per line (benchmarks/make_curves.py); repeat for "
                   "several corpora and a pooled row")
@click.option("--interval", type=float, help="seconds of training between checks [default: budget / 10]")
@click.option("--min-fraction", type=float, default=0.2, show_default=True)
@click.option("--beta", type=float, default=0.05, show_default=True, help="false-stop level")
@click.option("--alpha", type=float, default=0.01, show_default=True, help="missed-stop level")
@click.option("--noise", type=float, default=None,
              help="noise floor (sd of the final metric between identical runs) [default: from the "
                   "corpus's repeated runs, else 0]")
@click.option("--method", "methods", multiple=True, type=click.Choice(bench.METHODS),
              help="methods to replay [default: all]")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per method and corpus")
def bench_early_stop(curves, interval, min_fraction, beta, alpha, noise, methods, as_json):
    """Replay recorded learning curves through the early stop and its rivals."""
    methods = methods or bench.METHODS
    with Steps(console, "replays (corpus x method)", len(curves) * len(methods)) as steps:
        rows = bench.replay_corpora(list(curves), methods, interval, min_fraction, beta, alpha, noise,
                                    progress=steps.advance)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
    else:
        report.print_bench(rows, make_console())


@bench_group.command("research")
@click.option("--target", type=click.Choice(["gym"]), default="gym", show_default=True,
              help="the template each loop starts from")
@click.option("--policies", default="random,optuna-tpe", show_default=True,
              help="comma-separated: random, optuna-tpe|gp|cmaes|qmc, or another --policy name")
@click.option("--experiments", type=int, default=200, show_default=True, help="per loop, the baseline included")
@click.option("--seeds", type=int, default=5, show_default=True)
@click.option("--first-seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="seeds first-seed .. first-seed + seeds - 1: more seeds of an earlier run")
@click.option("--parallel", type=int, default=2, show_default=True, help="loops at a time")
@click.option("--model", help="--model of the llm and rl policies' loops (a local path for rl)")
@click.option("--prompt", type=click.Choice(["full", "compact"]), help="--prompt of the llm and rl policies' loops")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="keep the loops' repos here (default: a temporary directory, removed)")
@click.option("--set", "settings", multiple=True, metavar="SECTION.NAME=VALUE",
              help="passed to every loop (loop --set), e.g. an ablation: --set rl.ent_coef=0 (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="the whole result as JSON on stdout")
@click.option("--results", type=click.Path(dir_okay=False, path_type=Path), help="write the result as JSON here")
@click.option("-o", "output", type=click.Path(dir_okay=False, path_type=Path), help="plot (PNG) here")
def bench_research_cmd(target, policies, experiments, seeds, first_seed, parallel, model, prompt, workdir, settings, as_json,
                       results, output):
    """Full loops per policy and seed on the research gym: best so far against experiments and
    compute, experiments to reach random search's final best, area under the curve."""
    from . import research_bench

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if model and Path(model).exists():  # a local model: each loop runs in its own repo, not here
        model = str(Path(model).resolve())
    extra = [*(["--model", model] if model else []), *(["--prompt", prompt] if prompt else [])]
    parse_settings(settings)  # a typo or a wrong type fails here, not in every loop
    with Steps(console, "loops (policy x seed)", len(names) * seeds) as steps:
        result = research_bench.bench_research(names, experiments, seeds, parallel, target, workdir,
                                               progress=steps.advance, model_args=extra, settings=settings,
                                               first_seed=first_seed)
    if results:
        research_bench.write_json(result, results)
    if output:
        research_bench.plot(result, output)
    if as_json:
        click.echo(json.dumps(result))
    else:
        report.print_research(result, make_console())


if __name__ == "__main__":
    main()
