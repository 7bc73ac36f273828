"""The runner: the only module that spawns training and evaluation. One run = one process
group in a sandbox (see sandbox.py) over a fresh checkout of the commit, under a hard
wall-clock limit, with a clean environment, capped logs, a memory watch over the whole
process tree and frozen-file checks. Then, where `[metric] evaluate` names a frozen evaluator,
that command runs in a fresh sandbox over the repo's frozen files and the artifact train.py
saved, and its number is the result; train.py's own is kept as `self_reported`.

Environment allow-list: only the variables in ENV_ALLOW (and PREFIX_ALLOW prefixes) plus the
config's `run.env_allow` reach train.py, and then GITRESEARCH_BUDGET_S, GITRESEARCH_METRICS and
GITRESEARCH_ARTIFACTS are set. API keys, tokens and the like never do unless a user names them
in `run.env_allow`. Everything train.py leaves behind is read without following links
(O_NOFOLLOW, regular files only, capped), so a planted symlink or FIFO cannot make the
harness read or block on a file of the user's. Process trees, logs and those reads: processes.py.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import psutil

from . import metrics
from . import sandbox
from .config import Config
from .errors import GitresearchError
from .processes import (METRICS_CAP, TAIL_BYTES, OutputPump, hash_files, kill_tree, last_line,
                        read_untrusted, tagged, tree)

ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "TERM",
             "CUDA_VISIBLE_DEVICES", "NANOCHAT_CACHE_DIR", "XDG_CACHE_HOME", "HF_HOME",
             "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VIRTUAL_ENV",
             "CONDA_PREFIX", "LD_LIBRARY_PATH", "CUDA_HOME", "OMP_NUM_THREADS",
             "MKL_NUM_THREADS", "PYTHONHASHSEED")
PREFIX_ALLOW = ("LC_", "OPENBLAS_")
PROGRESS_FILE = "progress.jsonl"  # the curve of the progress lines, written by the harness
MAX_CURVE = 20_000  # progress-line points kept per run (a flood of step lines costs no memory)
POLL_S = 0.25  # seconds between checks of the process tree (exit is noticed at once)


@dataclass
class RunResult:
    status: str  # ok | crash | timeout | invalid | early_stop
    reason: str
    metric: float | None
    summary: dict
    points: list[dict]
    exit_code: int | None
    seconds: float  # wall seconds of the training process
    peak_memory_mb: float
    log_path: str
    log_tail: str
    network_isolated: bool
    events: list[str] = field(default_factory=list)
    sandbox: str = "none"  # bwrap | none
    metric_source: str = "self-reported"  # evaluator | self-reported
    self_reported: float | None = None  # train.py's own final number, when it printed one
    evaluation: dict = field(default_factory=dict)  # the evaluator's seconds, log and summary
    artifacts: str = ""  # the folder train.py saved its artifacts in ($GITRESEARCH_ARTIFACTS)
    tokens_per_s: float | None = None  # median of the progress lines' tok/sec, where printed
    curve: list[dict] = field(default_factory=list)  # training loss from the progress lines
    first_output_s: float | None = None  # wall seconds to the first progress line (start-up, compile)

    @property
    def steps(self) -> int | None:
        value = self.summary.get("num_steps")
        if isinstance(value, float):
            return int(value)
        steps = [p["step"] for p in self.points + self.curve if isinstance(p.get("step"), int)]
        return max(steps) if steps else None

    @property
    def training_seconds(self) -> float | None:
        value = self.summary.get("training_seconds")
        if isinstance(value, float):
            return value
        times = [p["t"] for p in self.points + self.curve if isinstance(p.get("t"), (int, float))]
        return max(times) if times else None


@functools.cache
def network_isolation_available() -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "--map-root-user", "true"],
                           capture_output=True)
    return probe.returncode == 0


def clean_env(extra_allow: tuple[str, ...], secrets: tuple[str, ...] = ()) -> dict:
    """The allow-listed environment. `secrets` names variables (the LLM API key's) that never
    pass, even when allow-listed, nor does any variable holding the same value."""
    allowed = set(ENV_ALLOW) | set(extra_allow)
    hidden = {os.environ[name] for name in secrets if os.environ.get(name)}
    return {k: v for k, v in os.environ.items()
            if (k in allowed or k.startswith(PREFIX_ALLOW)) and k not in secrets and v not in hidden}


class SetupError(GitresearchError):
    pass


def run_setup(workdir: Path, config: Config, log_path: Path) -> None:
    """Run `[run] setup` (e.g. data preparation) once, untimed, with the training environment."""
    if not config.run.setup:
        return
    command = list(config.run.setup)
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.run(command, cwd=workdir, env=clean_env(config.run.env_allow, (config.llm.api_key_env,)),
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=config.run.setup_timeout_s)
        except subprocess.TimeoutExpired:
            raise SetupError(f"setup `{' '.join(config.run.setup)}` took over "
                             f"{config.run.setup_timeout_s:g} s; log: {log_path}") from None
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise SetupError(f"setup `{' '.join(config.run.setup)}` exited {proc.returncode}; "
                         f"log: {log_path}\n{tail}")


def sandboxed(command: list[str], config: Config, workdir: Path, writable: tuple,
              read_only: tuple) -> tuple[list[str], str, bool]:
    """(argv, sandbox mode, network isolated) for running `command` in `workdir`."""
    command = list(command)
    if command and command[0] in ("python", "python3"):
        command[0] = sys.executable  # the interpreter gitresearch runs in, with its packages
    mode = sandbox.mode(config)
    if mode == "bwrap":
        paths = tuple(sandbox.expand(p) for p in read_only)
        return sandbox.wrap(command, workdir, writable, paths), mode, True
    if config.run.isolate_network and network_isolation_available():
        return ["unshare", "--net", "--map-root-user", "--", *command], mode, True
    return command, mode, False


def run_training(workdir: Path, config: Config, log_path: Path, metrics_path: Path,
                 on_progress: Callable[[dict], None] | None = None,
                 should_stop: Callable[[list[dict]], str | None] | None = None,
                 stop_event: threading.Event | None = None, env_extra: dict | None = None,
                 compile_cache: Path | None = None) -> RunResult:
    """Run the configured training command in `workdir` and classify the outcome.
    `env_extra` (a worker's CUDA_VISIBLE_DEVICES or thread count) is set on top of the clean
    environment. `compile_cache`: a folder the sandbox may write that outlives the run, for
    torch.compile's and Triton's caches (else they go to the private /tmp and every run
    compiles cold). The process writes its metrics and artifacts into a fresh `out` folder beside
    `metrics_path`; the harness copies the metrics to `metrics_path` itself.

    `should_stop(points, curve)` is asked whenever new metric points or new progress lines
    arrive (curve: the training loss the progress lines print, {"t", "step", "train_loss"},
    also saved as PROGRESS_FILE beside the metrics); a reason stops the run as `early_stop`. `stop_event` set by a signal handler stops it as `crash`, "interrupted".
    """
    run = config.run
    workdir, log_path, metrics_path = Path(workdir), Path(log_path), Path(metrics_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.unlink(missing_ok=True)
    out = metrics_path.with_name("out")  # sandbox-writable: metrics and artifacts
    shutil.rmtree(out, ignore_errors=True)
    (out / "artifacts").mkdir(parents=True)
    live_metrics = out / "metrics.jsonl"
    frozen_before = hash_files(workdir, config.files.frozen)
    writable = (workdir, out) + ((compile_cache,) if compile_cache else ())
    command, mode, isolated = sandboxed(run.command, config, workdir, writable,
                                        config.sandbox.train_read_only)
    env = clean_env(run.env_allow, (config.llm.api_key_env,))
    env.update(env_extra or {})
    run_id = uuid.uuid4().hex
    env.update(GITRESEARCH_BUDGET_S=f"{run.budget_s:g}", GITRESEARCH_METRICS=str(live_metrics),
               GITRESEARCH_ARTIFACTS=str(out / "artifacts"), PYTHONUNBUFFERED="1",
               GITRESEARCH_RUN_ID=run_id)
    if mode == "bwrap":  # the caches' usual homes (~, the host's /tmp) are not there
        caches = Path(compile_cache) if compile_cache else Path("/tmp")
        env.update(TMPDIR="/tmp", TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                   TRITON_CACHE_DIR=str(caches / "triton"))
    limit = run.budget_s + run.grace_s
    progress = {"step": None, "train_loss": None, "metric": None}
    rates: list[float] = []
    curve: list[dict] = []  # the training loss from the progress lines: {"t", "step", "train_loss"}
    first: list[float] = []  # wall seconds of the progress lines (the first is the start-up)

    def on_line(line, complete):
        parsed = metrics.parse_progress(line)
        if not parsed:
            return
        progress.update(step=parsed["step"], train_loss=parsed["train_loss"])
        if not first:
            first.append(round(time.monotonic() - start, 3))
        if not complete:
            return
        if parsed["tokens_per_s"] is not None:
            rates.append(parsed["tokens_per_s"])
        if (metrics.is_finite(parsed["train_loss"]) and len(curve) < MAX_CURVE
                and (not curve or parsed["step"] > curve[-1]["step"])):
            curve.append({"t": metrics.progress_time(parsed, time.monotonic() - start, run.budget_s),
                          "step": parsed["step"], "train_loss": parsed["train_loss"]})

    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    pump = OutputPump(proc.stdout, log_path, int(run.log_cap_mb * 2 ** 20), on_line)
    pump.start()
    root = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {proc.pid: root}
    peak_rss, points, metrics_offset, judged_curve = 0, [], 0, 0
    verdict, reason = None, ""
    while True:
        try:
            proc.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - start
        rss = 0
        for p in tree(root):
            seen.setdefault(p.pid, p)
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        peak_rss = max(peak_rss, rss)
        chunk = read_untrusted(live_metrics, metrics_offset, METRICS_CAP - metrics_offset)
        complete = chunk.rfind(b"\n") + 1
        if complete:
            metrics_offset += complete
            new = metrics.parse_metric_lines(chunk[:complete].decode("utf-8", "replace"))
            if new:
                points.extend(new)
                last = [p for p in new if p.get(config.metric.name) is not None]
                if last:
                    progress["metric"] = last[-1][config.metric.name]
                if should_stop and (why := should_stop(points, curve[:])):
                    verdict, reason = "early_stop", why
        if should_stop and not verdict and len(curve) > judged_curve:
            judged_curve = len(curve)
            if why := should_stop(points, curve[:judged_curve]):
                verdict, reason = "early_stop", why
        if run.memory_limit_mb and rss > run.memory_limit_mb * 2 ** 20:
            verdict, reason = "crash", (f"memory limit: the process tree used {rss / 2 ** 20:.0f} MB, "
                                        f"over run.memory_limit_mb = {run.memory_limit_mb:g}")
        elif elapsed > limit:
            verdict, reason = "timeout", (f"killed after {elapsed:.1f} s: over the wall-clock limit "
                                          f"of {limit:g} s (budget {run.budget_s:g} + grace {run.grace_s:g})")
        elif stop_event is not None and stop_event.is_set():
            verdict, reason = "crash", "interrupted: the harness was asked to stop"
        if on_progress:
            on_progress(dict(progress, elapsed=elapsed, budget=run.budget_s))
        if verdict:
            kill_tree(proc.pid, seen, run.term_grace_s)
            break
    exit_code = proc.wait()
    seconds = time.monotonic() - start
    for p in tree(root):
        seen.setdefault(p.pid, p)
    seen.update(tagged(lambda p, tag: tag == run_id))
    kill_tree(proc.pid, seen, run.term_grace_s)  # children left running after the main process
    pump.join(timeout=5)
    pump.close()
    tail = pump.tail_text()
    raw_metrics = read_untrusted(live_metrics)
    metrics_path.write_bytes(raw_metrics)
    metrics_path.with_name(PROGRESS_FILE).write_text("".join(json.dumps(p) + "\n" for p in curve))
    points = metrics.parse_metric_lines(raw_metrics.decode("utf-8", "replace"))
    if should_stop and verdict is None and exit_code == 0:
        # the points of the last poll (a run that reports faster than the poll, like the gym's
        # simulated clock, writes many at once before it exits) are judged as if read live
        if why := should_stop([p for p in points if not p.get("final")], curve):
            verdict, reason = "early_stop", why
    summary = metrics.parse_summary(tail)
    self_reported = metrics.final_metric(config.metric.name, summary,
                                   [p for p in points if p.get("final")])
    metric = (self_reported if config.metric.evaluate
              else metrics.final_metric(config.metric.name, summary, points))
    frozen_after = hash_files(workdir, config.files.frozen)
    changed = [name for name in frozen_after if frozen_before.get(name) != frozen_after[name]]
    if changed:
        verdict, reason = "invalid", f"frozen file(s) changed during the run: {', '.join(changed)}"
    elif verdict is None:
        if exit_code != 0:
            how = (f"killed by signal {-exit_code}" if exit_code < 0 else f"exited with code {exit_code}")
            verdict, reason = "crash", f"{how}: {last_line(tail)}"
        elif metric is None and not config.metric.evaluate:
            verdict, reason = "crash", (f"no {config.metric.name} reported (no summary block line "
                                        f"and no GITRESEARCH_METRICS point): {last_line(tail)}")
        elif metric is not None and not metrics.is_finite(metric):
            verdict, reason = "crash", f"{config.metric.name} is {metric}"
        else:
            verdict = "ok"
    return RunResult(verdict, reason, metric if verdict == "ok" else None, summary, points,
                     exit_code, round(seconds, 3), round(peak_rss / 2 ** 20, 1), str(log_path),
                     "\n".join(tail.splitlines()[-12:])[-1500:], isolated, sandbox=mode,
                     self_reported=self_reported if metrics.is_finite(self_reported) else None,
                     artifacts=str(out / "artifacts"),
                     tokens_per_s=statistics.median(rates) if rates else None, curve=curve,
                     first_output_s=first[0] if first else None)


def run_evaluation(result: RunResult, eval_dir: Path, config: Config, log_path: Path,
                   env_extra: dict | None = None) -> RunResult:
    """The evaluator's verdict on a finished training run: `[metric] evaluate` runs in
    `eval_dir` (a fresh checkout of the frozen files), in a sandbox where it may write
    nothing but a private /tmp and read the artifacts train.py saved and the evaluation data.
    Its number becomes the result; train.py's own number must agree within the tolerance."""
    if not config.metric.evaluate or result.status != "ok":
        return result
    artifacts = result.artifacts
    metric_name = config.metric.name
    command, _, _ = sandboxed(config.metric.evaluate, config, eval_dir, (),
                              (str(eval_dir), artifacts, *config.sandbox.evaluate_read_only))
    env = clean_env(config.run.env_allow, (config.llm.api_key_env,))
    env.update(env_extra or {})
    env.update(GITRESEARCH_ARTIFACTS=artifacts, PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1", TMPDIR="/tmp")
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=eval_dir, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=config.metric.evaluate_timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc.pid, {proc.pid: psutil.Process(proc.pid)}, config.run.term_grace_s)
        output, _ = proc.communicate()
    seconds = round(time.monotonic() - start, 3)
    text = output[-TAIL_BYTES:].decode("utf-8", "replace")
    log_path.write_text(text)
    summary = metrics.parse_summary(text)
    evaluated = metrics.final_metric(metric_name, summary, [])
    evaluation = {"seconds": seconds, "exit_code": proc.returncode,
                  "log": str(log_path), "summary": summary}
    fields = dict(metric_source="evaluator", evaluation=evaluation)
    if timed_out:
        return replace(result, status="timeout", metric=None, **fields,
                       reason=f"the evaluation took over {config.metric.evaluate_timeout_s:g} s")
    if proc.returncode != 0 or not metrics.is_finite(evaluated):
        return replace(result, status="invalid", metric=None, **fields,
                       reason=f"the evaluator refused the run (exit {proc.returncode}): {last_line(text)}")
    reported = result.self_reported
    if reported is not None and abs(reported - evaluated) > config.metric.tolerance:
        return replace(result, status="invalid", metric=None, **fields,
                       reason=(f"train.py reported {metric_name} {reported:.6f}, the evaluator "
                               f"measured {evaluated:.6f} (tolerance {config.metric.tolerance:g})"))
    return replace(result, metric=evaluated, **fields)
