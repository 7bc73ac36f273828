"""The research loop: baseline, then propose -> validate -> commit -> run -> note -> keep or
discard, until a stop condition. All state is in git (refs and notes), so any stop, kill -9
included, resumes where it was: an experiment with a ref but no note is run again.
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import gitstore
from . import verify as verify_mod
from .config import Config
from .gitstore import Store
from .history import baseline_record, build_state, current_floor
from .policies import PolicyError, make_policy
from .policies.reward import novelty, reward
from .proposal import clean_text, diff_sha, propose_valid
from .remote import Remote
from .processes import kill_orphans
from .runner import RunResult, SetupError, run_evaluation, run_setup, run_training
from .sandbox import SandboxError, mode as sandbox_mode
from .calibration import EarlyStop
from .confirm import Floor, best_reference, gain, pooled_noise, min_delta_rule, slow_run, sprt
from .workers import Claims, RepoLock, run_workers

STOP_FILE = "STOP"  # touch <git dir>/gitresearch/STOP to stop before the next experiment


class LoopError(RuntimeError):
    pass


@dataclass
class LoopReport:
    ran: int = 0
    kept: int = 0
    stop_reason: str = ""


def pending(record: dict | None) -> bool:
    """An experiment still to run: no note yet, or a confirmation a kill interrupted."""
    return record is None or record.get("status") == "confirming"


# -- running one commit -----------------------------------------------------------------------

def run_commit(store: Store, config: Config, commit: str, run_dir: Path,
               on_progress: Callable | None = None, stop_event: threading.Event | None = None,
               should_stop: Callable | None = None, env_extra: dict | None = None) -> RunResult:
    """Check `commit` out into a fresh folder, train it there, then (where the config names an
    evaluator) evaluate its artifact over a fresh checkout of the frozen files alone."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with checkout(store, commit, exclude=config.files.hidden) as work:
        compile_cache = store.state_dir / "compile-cache"
        compile_cache.mkdir(exist_ok=True)
        result = run_training(work, config, run_dir / "log.txt", run_dir / "metrics.jsonl",
                              on_progress=on_progress, stop_event=stop_event, should_stop=should_stop,
                              env_extra=env_extra, compile_cache=compile_cache)
    try:
        if result.status == "ok" and config.metric.evaluate:
            with checkout(store, commit, exclude=config.files.editable) as frozen:
                result = run_evaluation(result, frozen, config, run_dir / "evaluate.log", env_extra)
    finally:
        shutil.rmtree(run_dir / "out", ignore_errors=True)  # the artifacts: only the verdict is kept
    return result


@contextmanager
def checkout(store: Store, commit: str, exclude: tuple[str, ...] = ()):
    """A plain copy of `commit`'s files in the state dir's worktrees folder, removed after."""
    path = Path(tempfile.mkdtemp(prefix="wt-", dir=store.state_dir / "worktrees"))
    path.rmdir()
    try:
        store.checkout(commit, path, exclude)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def result_fields(result: RunResult, store: Store) -> dict:
    log = os.path.relpath(result.log_path, store.repo.path)
    fields = {"sandbox": result.sandbox, "metric_source": result.metric_source}
    if result.self_reported is not None:
        fields["self_reported"] = result.self_reported
    if result.evaluation:
        fields["evaluation"] = {"seconds": result.evaluation["seconds"],
                                "log": os.path.relpath(result.evaluation["log"], store.repo.path)}
    return {**fields, "val_bpb": result.metric, "reason": result.reason, "seconds": result.seconds,
            "training_seconds": result.training_seconds, "peak_memory_mb": result.peak_memory_mb,
            "exit_code": result.exit_code, "log": log, "log_tail": result.log_tail,
            "network_isolated": result.network_isolated, "steps": result.steps,
            "throughput": throughput(result)}


def throughput(result: RunResult) -> dict:
    """Steps and steps per training second, and tokens per second where the script prints
    them: a run far below its peers' rate ran on a loaded or changed machine."""
    seconds = result.training_seconds
    steps = result.steps
    return {"steps": steps, "tokens_per_s": result.tokens_per_s,
            "steps_per_s": round(steps / seconds, 4) if steps and seconds else None}


# -- the loop ---------------------------------------------------------------------------------

class Loop:
    def __init__(self, root: Path, config: Config, policy: str | None = None,
                 display: Callable[[str], None] = print, on_progress: Callable | None = None,
                 worker: int = 0, env_extra: dict | None = None,
                 stop_event: threading.Event | None = None, claims: Claims | None = None,
                 remote: Remote | None = None):
        self.store = Store(root)
        self.config = config
        self.policy_name = policy or config.policy.name
        self.display = display
        self.on_progress = on_progress
        self.worker, self.env_extra = worker, env_extra
        self.stop_event = stop_event or threading.Event()
        self.claims = claims or Claims(self.store.state_dir)
        self.remote = remote
        if remote is None and config.loop.remote:
            self.remote = Remote(self.store, config.loop.remote)
        self.early_stop = EarlyStop(self.store, config, self.run_dir)
        self.backend_failures = 0  # experiments lost to the policy's endpoint, in a row
        (self.store.state_dir / "worktrees").mkdir(exist_ok=True)

    def run_dir(self, number: int) -> Path:
        return self.store.state_dir / "runs" / f"{number:06d}"

    def _handle_signal(self, signum, frame):
        self.display(f"received {signal.Signals(signum).name}: stopping the run, state is in git")
        self.stop_event.set()

    @contextmanager
    def holding_repo(self):
        """The repo's loop lock, with SIGINT/SIGTERM stopping the run in progress."""
        with RepoLock(self.store):
            handlers = {sig: signal.signal(sig, self._handle_signal)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)

    def run(self) -> LoopReport:
        with self.holding_repo():
            return self._run()

    def verify(self, revs: tuple[str, ...] = (), chain: bool = False, runs: int = 3) -> list[dict]:
        """`gitresearch verify`: each commit (default: best's chain) re-run `runs` times in
        pairs with its parent; the verification records, newest last."""
        with self.holding_repo():
            try:
                sandbox_mode(self.config)
            except SandboxError as err:
                raise LoopError(str(err)) from err
            self.setup()
            sigma = self.noise_floor().sigma
            done = []
            for commit, parent in verify_mod.targets(self.store, revs, chain):
                self.display(f"verifying {commit[:12]} {self.store.subject(commit)} against {parent[:12]}")

                def run(rev, name, commit=commit):
                    folder = self.store.state_dir / "runs" / "verify" / f"{commit[:12]}-{name}"
                    return run_commit(self.store, self.config, rev, folder, self._progress(0),
                                      self.stop_event, env_extra=self.env_extra)
                entry = verify_mod.verify_one(self.store, self.config, commit, parent, runs, run, sigma,
                                              self.stop_event)
                if entry is None:
                    break
                done.append({"commit": commit, "description": self.store.subject(commit), **entry})
                self.display(f"{commit[:12]}: {entry['verdict']}")
            return done

    def _run(self) -> LoopReport:
        start = time.monotonic()
        if self.config.loop.workers > 1 and self.policy_name == "rl":
            raise LoopError("the rl policy learns in one process: use --workers 1")
        try:
            sandbox_mode(self.config)  # refuse before anything runs when there is no sandbox
        except SandboxError as err:
            raise LoopError(str(err)) from err
        policy = make_policy(self.policy_name, self.config, self.store)  # fails fast on bad settings
        self.clean_leftovers()
        if self.remote:
            self.remote.sync()
        if self.store.best() is None:
            self.store.create_best(self.store.resolve("HEAD"))
            if self.remote:
                self.remote.sync()
        self.setup()
        baseline = self.ensure_baseline()
        if baseline is None:
            return LoopReport(stop_reason="interrupted")
        self.reconcile()
        try:
            if self.config.loop.workers > 1:
                return run_workers(self, start)
            return self.work(start, policy)
        finally:
            (self.store.state_dir / STOP_FILE).unlink(missing_ok=True)

    def work(self, start: float, policy=None) -> LoopReport:
        """Propose and run experiments until a stop condition (one worker)."""
        policy = policy or make_policy(self.policy_name, self.config, self.store)
        report = LoopReport()
        while True:
            if self.remote:
                self.remote.sync()
            experiments = [e for e in self.store.experiments() if e.number > 0]
            finished = [e for e in experiments if e.record]
            reason = self.stop_reason(finished, start)
            if reason:
                report.stop_reason = reason
                return report
            if self.remeasure_due(experiments) and self.remeasure(experiments) is None:
                report.stop_reason = "interrupted"
                return report
            exp = self.claim_pending(experiments)  # before the count: a pending one is never left
            if exp is not None:  # interrupted before its note, or a rebase: run it, never duplicate it
                number, commit, parent, description = exp.number, exp.commit, exp.parent, exp.description
                made_by = self.store.trailer(commit, "Gitresearch-Policy")
                proposal_data = {"policy": made_by, "diff_sha": diff_sha(self.store.diff_of(commit)),
                                 "rebase" if made_by == "rebase" else "rerun": True}
            else:
                limit = self.config.loop.max_experiments
                if limit is not None and len(experiments) >= limit:  # the rest are being run
                    report.stop_reason = f"reached {limit} experiments"
                    return report
                try:
                    number, commit, parent, description, proposal_data = self.propose(policy, experiments)
                except PolicyError as err:
                    report.stop_reason = f"policy: {err}"
                    return report
                if commit is None:  # invalid: already recorded
                    report.ran += 1
                    policy.observe(self.store.read_note(self.store.experiment_commit(number)))
                    if self.backend_failures >= self.config.llm.max_backend_failures:
                        report.stop_reason = (f"policy backend failed for {self.backend_failures} "
                                              f"experiments in a row; see #{number}")
                        return report
                    continue
            resumed = exp.record if exp is not None else None  # a confirmation in progress
            try:
                record = self.run_experiment(number, commit, parent, description, proposal_data, resumed)
            finally:
                self.claims.release(number)
            if record is None:
                report.stop_reason = "interrupted"
                return report
            report.ran += 1
            report.kept += record["status"] == "keep"
            policy.observe(record)

    def claim_pending(self, experiments):
        """The oldest experiment without a note, or whose confirmation was interrupted, that
        this worker may run, claimed; None if there is none. With a remote, only experiments this clone made: another machine's may
        be running there."""
        origin = self.store.origin_id()
        with self.claims.proposing():
            for exp in reversed(experiments):  # oldest first
                if not pending(exp.record):
                    continue
                if self.remote and self.store.trailer(exp.commit, "Gitresearch-Origin") != origin:
                    continue
                if self.claims.claim(exp.number):
                    record = self.store.read_note(exp.commit)
                    if pending(record):
                        return gitstore.Experiment(exp.number, exp.commit, exp.parent, exp.description, record)
                    self.claims.release(exp.number)  # finished meanwhile
        return None

    def setup(self) -> None:
        """The config's setup command, once per loop, in a worktree of best, untimed."""
        if not self.config.run.setup:
            return
        self.display(f"setup: {' '.join(self.config.run.setup)}")
        try:
            with checkout(self.store, self.store.best(), exclude=self.config.files.editable) as work:
                run_setup(work, self.config, self.store.state_dir / "runs" / "setup.log")
        except SetupError as err:
            raise LoopError(str(err)) from err

    def clean_leftovers(self) -> None:
        """Training processes and worktrees left by a loop that was killed (we hold the lock)."""
        worktrees = self.store.state_dir / "worktrees"
        if kill_orphans(worktrees):
            self.display("killed training processes left by an earlier, killed loop")
        for stale in worktrees.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        self.store.prune_worktrees()

    def stop_reason(self, finished, start) -> str:
        limits = self.config.loop
        if self.stop_event.is_set():
            return "interrupted"
        stop_file = self.store.state_dir / STOP_FILE
        if stop_file.exists():  # removed when every worker has stopped
            return f"stop file {stop_file}"
        if limits.max_hours is not None and time.monotonic() - start > limits.max_hours * 3600:
            return f"reached {limits.max_hours:g} hours"
        if limits.patience:
            since = 0
            for exp in finished:  # newest first
                if exp.record.get("status") == "keep":
                    break
                since += 1
            if since >= limits.patience:
                return f"converged: no improvement in {since} experiments"
        return ""

    # -- baseline and noise floor --------------------------------------------------------------

    def ensure_baseline(self) -> dict | None:
        """The baseline's record; runs it (noise_runs times) when best's root has no note."""
        root = self.store.experiment_commit(0)
        if root is None:
            root = self.store.best()
            self.store.set_baseline(root)
            if self.remote and not self.remote.reserve(0, root):  # another machine set it first
                self.remote.sync()
                root = self.store.experiment_commit(0)
        record = self.store.read_note(root)
        if record is not None:
            return record
        noise = self.config.noise
        runs, slow, kept_dirs = [], [], []
        while len(runs) < max(1, noise.noise_runs):
            index = len(runs) + len(slow)
            self.display(f"baseline run {len(runs) + 1}/{max(1, noise.noise_runs)}")
            result = run_commit(self.store, self.config, root, self.run_dir(0) / f"noise-{index}",
                                self._progress(0), self.stop_event)
            if self.stop_event.is_set():
                return None
            if result.status != "ok":
                raise LoopError(f"the baseline failed ({result.status}): {result.reason}\n"
                                f"log: {result.log_path}\n{result.log_tail}")
            runs.append(result)
            kept_dirs.append(index)
            if len(runs) == max(1, noise.noise_runs) and len(slow) < noise.max_outlier_reruns:
                rates = [throughput(r)["steps_per_s"] for r in runs]
                slowest = min(range(len(runs)), key=lambda i: rates[i] or 0)
                others = rates[:slowest] + rates[slowest + 1:]
                if slow_run(rates[slowest], others, noise.outlier_share):
                    # the machine was loaded: that run measures the load, not the noise
                    slow.append({"value": runs[slowest].metric, "run": kept_dirs.pop(slowest),
                                 **throughput(runs.pop(slowest))})
                    self.display(f"baseline run at {rates[slowest]:.3f} steps/s is below "
                                 f"{noise.outlier_share:g} x its peers': running it again")
        values = [r.metric for r in runs]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        min_delta, rule = min_delta_rule(pooled_noise([values], noise.confidence), noise.k_sigma,
                                         noise.min_delta, noise.min_delta_floor)
        results = runs
        record = {"experiment": 0, "status": "baseline", "policy": "baseline",
                  **result_fields(results[-1], self.store),
                  "val_bpb": statistics.mean(values), "noise_runs": values, "noise_std": std,
                  "noise_throughput": [throughput(r) for r in results], "noise_slow": slow,
                  "noise_run_dirs": kept_dirs,
                  "min_delta": min_delta, "min_delta_rule": rule, "budget_s": self.config.run.budget_s,
                  "host": socket.gethostname(), "finished": time.time()}
        self.store.write_note(root, record)
        if self.remote:
            self.remote.publish_notes()
        self.display(f"baseline: val_bpb {record['val_bpb']:.6f} (std {std:.6f} over "
                     f"{len(values)} runs), min_delta {min_delta:.6f}")
        return record

    def reconcile(self) -> None:
        """A keep whose note was written but whose best move was lost (killed in between):
        best moves to it when it is still best's child; otherwise (another machine moved best
        first) it becomes a discard and its change is rebased, never dropped."""
        best, on_best = self.store.best(), set(self.store.best_chain())
        for exp in reversed(self.store.experiments()):  # oldest first
            if not (exp.record and exp.record.get("status") == "keep") or exp.commit in on_best:
                continue
            if exp.parent == best and self.advance(best, exp.commit, f"gitresearch: keep #{exp.number} (resumed)"):
                best = exp.commit
                continue
            record = dict(exp.record, status="discard", reason="best moved before its keep was published")
            record["reason"] += "; " + self.rebase(exp.number, exp.commit, exp.description)
            self.store.write_note(exp.commit, record)
            if self.remote:
                self.remote.publish_notes()
            best = self.store.best()

    # -- one experiment ------------------------------------------------------------------------

    def propose(self, policy, experiments):
        """A validated proposal committed as the next experiment: (number, commit, parent,
        description, note data); commit None when every try failed (recorded as `invalid`,
        with every try's reply and error in the note)."""
        state, tried = build_state(self.store, self.config, experiments)
        base = state.best_commit
        outcome = propose_valid(self.store, self.config, policy, state, tried)
        proposal = outcome.proposal
        description = clean_text(proposal.description) if proposal else f"{policy.name}: no proposal"
        data = {"policy": policy.name, "policy_data": outcome.data,
                "attempts": outcome.attempts}
        if outcome.tree is None:
            # Recorded as an experiment whose tree is best's own, with the rejected diff kept.
            self.backend_failures = self.backend_failures + 1 if outcome.backend_only else 0
            with self.claims.proposing():  # no worker may take it for a pending run
                number, commit = self.store.create_experiment(base, self.store.tree_of(base),
                                                              description, policy.name, self.reserve)
                record = {"experiment": number, "status": "invalid", "reason": outcome.reason,
                          "description": description, "backend_only": outcome.backend_only,
                          "rejected_diff": outcome.attempts[-1]["diff"], "finished": time.time(), **data}
                record["reward"] = reward(record, self.baseline_record(), self.config.reward)
                self.store.write_note(commit, record)
            if self.remote:
                self.remote.publish_notes()
            self.display(f"#{number} invalid: {outcome.reason}")
            return number, None, base, description, data
        self.backend_failures = 0
        with self.claims.proposing():
            number, commit = self.store.create_experiment(base, outcome.tree, description, policy.name,
                                                          self.reserve)
            self.claims.claim(number)
        data["novelty"] = round(novelty(proposal.diff, [e.diff for e in state.history]), 6)
        return number, commit, base, description, {**data, "diff_sha": diff_sha(proposal.diff)}

    def reserve(self, number: int, commit: str) -> bool:
        return self.remote.reserve(number, commit) if self.remote else True

    def advance(self, old: str, new: str, message: str) -> bool:
        """Move best old -> new by compare-and-swap, here and on the remote; False when
        another worker or machine moved it first."""
        try:
            self.store.advance_best(old, new, message)
        except gitstore.StaleRefError:
            return False
        if self.remote and not self.remote.push_best(old, new):
            self.remote.sync()  # the remote's best wins; ours goes back to it
            return False
        return True

    def rebase(self, number: int, commit: str, description: str) -> str:
        """Put `commit`'s change on the current best as a new experiment, left for the next
        free worker to run; what happened, for the note's reason."""
        best = self.store.best()
        try:
            tree, _ = self.store.apply_diff(best, self.store.diff_of(commit))
        except gitstore.InvalidDiff as err:
            return f"it beat its parent, but its diff does not apply to the new best {best[:12]}: {err}"
        with self.claims.proposing():
            new_number, _ = self.store.create_experiment(best, tree, f"rebase of #{number}: {description}",
                                                         "rebase", self.reserve)
        self.display(f"#{number} beat its parent after best moved: rebased as #{new_number}")
        return f"it beat its parent: rebased onto best {best[:12]} as #{new_number}"

    def baseline_record(self) -> dict:
        return baseline_record(self.store)

    def _progress(self, number):
        if self.on_progress is None:
            return None
        return lambda p: self.on_progress(dict(p, experiment=number))

    # -- one experiment: screen, confirm, conclude ----------------------------------------------

    def noise_floor(self) -> Floor:
        return current_floor(self.store, self.config, [e.record for e in self.store.experiments() if e.record])

    # -- best re-measured ----------------------------------------------------------------------

    def remeasure_due(self, experiments) -> bool:
        cfg = self.config.confirm
        record = self.store.read_note(self.store.best()) or {}
        if not record or self.worker != 0:  # one worker re-measures for all
            return False
        runs = record.get("remeasured") or []
        newest = experiments[0].number if experiments else 0
        since = newest - max([record.get("experiment") or 0] + [r.get("after", 0) for r in runs])
        last = max([record.get("finished") or 0] + [r.get("finished", 0) for r in runs])
        return bool((cfg.remeasure_every and since >= cfg.remeasure_every)
                    or (cfg.remeasure_hours and time.time() - last >= cfg.remeasure_hours * 3600))

    def remeasure(self, experiments) -> dict | None:
        """Re-run best once; a value outside its band or a throughput change marks drift,
        which `status` and the prompts report and which makes the screen compare candidates
        with this fresh run. The run is appended to best's note."""
        cfg = self.config.confirm
        best = self.store.best()
        record = self.store.read_note(best) or {}
        runs = record.setdefault("remeasured", [])
        number = record.get("experiment") or 0
        self.display(f"re-measuring best (#{number})")
        result = run_commit(self.store, self.config, best, self.run_dir(number) / f"remeasure-{len(runs)}",
                            self._progress(number), self.stop_event, env_extra=self.env_extra)
        if self.stop_event.is_set():
            return None
        after = experiments[0].number if experiments else 0
        entry = {"value": result.metric, "status": result.status, "after": after, "finished": time.time(),
                 **throughput(result)}
        if result.status != "ok":
            entry.update(outlier=True, drift=False, reason=f"re-run ended {result.status}: {result.reason}")
        else:
            level = self.noise_floor()
            band = cfg.drift_sigma * math.sqrt(2) * level.sigma
            rates = self.best_rates(record)
            rate = entry["steps_per_s"]
            change = rate / statistics.median(rates) - 1 if rate and rates else 0.0
            reasons = []
            if abs(result.metric - record["val_bpb"]) > band:
                reasons.append(f"value {result.metric:.6f} is {result.metric - record['val_bpb']:+.6f} from "
                               f"best's {record['val_bpb']:.6f} (band ±{band:.6f})")
            if abs(change) > cfg.drift_throughput:
                reasons.append(f"steps/s {change:+.0%} from best's runs")
            entry.update(drift=bool(reasons), reason="; ".join(reasons) or "within its band",
                         outlier=slow_run(rate, rates, self.config.noise.outlier_share))
        runs.append(entry)
        self.store.write_note(best, record)
        if self.remote:
            self.remote.publish_notes()
        self.display(f"best re-measured: {entry['reason']}" + (" (DRIFT)" if entry["drift"] else ""))
        return entry

    def run_experiment(self, number, commit, parent, description, data, record=None) -> dict | None:
        """Screen run, then (when it passes the screen) confirmation pairs, then the verdict;
        `record`: a note left in `confirming` by an interrupted loop, resumed where it was.
        None when interrupted (what was measured is in the note)."""
        if record is None:
            record = self.screen(number, commit, parent, description, data)
            if record is None:
                return None
        if record["status"] == "confirming":
            record = self.confirm(number, commit, parent, record)
            if record is None:
                return None
        return self.conclude(number, commit, parent, description, record)

    def screen(self, number, commit, parent, description, data) -> dict | None:
        self.display(f"#{number} {description}")
        started = time.time()
        monitor = self.early_stop.monitor()
        result = run_commit(self.store, self.config, commit, self.run_dir(number),
                            self._progress(number), self.stop_event,
                            should_stop=monitor.update if monitor else None, env_extra=self.env_extra)
        if self.stop_event.is_set() and result.status != "ok":
            return None  # no note: the next loop runs it again
        parent_record = self.store.read_note(parent) or {}
        best = self.store.best()
        best_record = self.store.read_note(best) or {}
        level = self.noise_floor()
        record = {"experiment": number, "description": description, "started": started,
                  "finished": time.time(), "budget_s": self.config.run.budget_s,
                  "host": socket.gethostname(), "parent_val_bpb": parent_record.get("val_bpb"),
                  **level.fields(), **data, **result_fields(result, self.store)}
        if result.metric is not None and parent_record.get("val_bpb") is not None:
            record["delta"] = result.metric - parent_record["val_bpb"]
        if monitor is not None:
            record["comment"] = monitor.comment
            record["checks"] = [{k: (round(v, 6) if isinstance(v, float) else v)
                                 for k, v in vars(c).items()} for c in monitor.checks]
        reference, source = best_reference(best_record)
        if result.status != "ok":
            record["status"] = result.status
        elif parent != best or reference is None:
            record["status"] = "discard"
            record["reason"] = "best moved since it was proposed"
            parent_value = parent_record.get("val_bpb")
            if parent_value is not None and gain(result.metric, parent_value) >= level.screen:
                record["rebase"] = True  # it passed the screen against its parent: run it again on best
        elif not self.config.confirm.enabled:  # the single-run rule
            won = gain(result.metric, reference) > level.min_delta
            record["status"] = "keep" if won else "discard"
            if not won:
                record["reason"] = f"not better than {source} by more than min_delta {level.min_delta:.6f}"
        elif gain(result.metric, reference) >= level.screen:
            cfg = self.config.confirm
            record["status"] = "confirming"
            record["confirmation"] = {"reference": reference, "reference_source": source,
                                      "screen_gain": gain(result.metric, reference),
                                      "delta": level.min_delta, "sigma": level.sigma,
                                      "alpha": cfg.alpha, "beta": cfg.beta, "max_pairs": cfg.max_pairs,
                                      "pairs": [], "slow": []}
            self.store.write_note(commit, record)  # a kill from here on resumes the pairs
        else:
            record["status"] = "discard"
            record["reason"] = (f"screen: gain {gain(result.metric, reference):+.6f} over "
                                f"{source} below {level.screen:.6f} ({self.config.confirm.screen_sigma:g} "
                                f"x noise std {level.sigma:.6f})")
        return record

    def confirm(self, number, commit, parent, record) -> dict | None:
        """Pairs of fresh runs (candidate, best; order alternating) until the sequential test
        decides. Each pair is in the note before the next starts: a kill loses at most the
        pair that was running, and never repeats a recorded one."""
        conf = record["confirmation"]
        parent_record = self.store.read_note(parent) or {}
        while True:
            verdict = sprt([p["gain"] for p in conf["pairs"]], conf["delta"], conf["sigma"],
                           conf["alpha"], conf["beta"], conf["max_pairs"])
            conf.update(verdict=verdict.text, llr=round(verdict.llr, 4))
            if verdict.decision != "continue":
                break
            index = len(conf["pairs"]) + len(conf["slow"]) + 1
            order = ("candidate", "best") if len(conf["pairs"]) % 2 == 0 else ("best", "candidate")
            self.display(f"#{number} confirming: pair {len(conf['pairs']) + 1} ({verdict.text})")
            runs = {}
            for role in order:
                result = run_commit(self.store, self.config, commit if role == "candidate" else parent,
                                    self.run_dir(number) / f"confirm-{index}-{role}",
                                    self._progress(number), self.stop_event, env_extra=self.env_extra)
                if self.stop_event.is_set():
                    return None
                if result.status != "ok":
                    who = "the candidate" if role == "candidate" else "best"
                    record.update(status="discard", reason=f"confirmation: {who}'s re-run {index} "
                                  f"ended {result.status}: {result.reason}")
                    return record
                runs[role] = result
            pair = {"candidate": runs["candidate"].metric, "best": runs["best"].metric,
                    "gain": gain(runs["candidate"].metric, runs["best"].metric),
                    "order": list(order), "finished": time.time(),
                    "steps_per_s": {role: throughput(r)["steps_per_s"] for role, r in runs.items()}}
            peers = {"candidate": [record.get("throughput", {}).get("steps_per_s")]
                     + [p["steps_per_s"]["candidate"] for p in conf["pairs"]],
                     "best": self.best_rates(parent_record) + [p["steps_per_s"]["best"] for p in conf["pairs"]]}
            slow = [role for role in order if slow_run(pair["steps_per_s"][role], peers[role],
                                                       self.config.noise.outlier_share)]
            if slow and len(conf["slow"]) < self.config.noise.max_outlier_reruns:
                conf["slow"].append(dict(pair, slow=slow))  # a loaded machine: run the pair again
                self.display(f"#{number} pair {index}: {', '.join(slow)} ran slow; running it again")
            else:
                conf["pairs"].append(pair)
            self.store.write_note(commit, record)
        values = [p["candidate"] for p in conf["pairs"]]
        record["screen_val_bpb"] = record["val_bpb"]
        if values:  # the screen run was selected for looking good: the fresh runs are the value
            record["val_bpb"] = statistics.fmean(values)
            if record.get("parent_val_bpb") is not None:
                record["delta"] = record["val_bpb"] - record["parent_val_bpb"]
        record["status"] = verdict.decision
        if verdict.decision == "discard":
            record["reason"] = f"confirmation: {verdict.text}"
        return record

    @staticmethod
    def best_rates(record: dict) -> list:
        """Steps per second of runs of a best commit already on record (its peers)."""
        rates = [t.get("steps_per_s") for t in record.get("noise_throughput") or []]
        rates.append((record.get("throughput") or {}).get("steps_per_s"))
        rates += [r.get("steps_per_s") for r in record.get("remeasured") or []]
        return [r for r in rates if r]

    def conclude(self, number, commit, parent, description, record) -> dict:
        """Write the verdict, move best on a keep, rebase a gain that best's move overtook."""
        baseline = self.baseline_record()
        best = self.store.best()
        record["reward"] = reward(record, baseline, self.config.reward)
        rebase = record.pop("rebase", False)
        self.store.write_note(commit, record)
        if record["status"] == "keep":
            verdict = (record.get("confirmation") or {}).get("verdict", "")
            message = f"gitresearch: keep #{number} val_bpb {record['val_bpb']:.6f}: {description}"
            if best != parent or not self.advance(best, commit, message + (f"\n\n{verdict}" if verdict else "")):
                record.update(status="discard", reason="best moved while it ran")
                record["reward"] = reward(record, baseline, self.config.reward)
                rebase = True
        if rebase and record["status"] == "discard" and parent != self.store.best():
            # an improvement found against an older best: rebased and run again, never dropped
            record["reason"] += "; " + self.rebase(number, commit, description)
            self.store.write_note(commit, record)
        elif record["status"] == "discard" and record["reason"] == "best moved while it ran":
            self.store.write_note(commit, record)
        if self.remote:
            self.remote.publish_notes()
        value = record.get("val_bpb")
        shown = f"{value:.6f}" if value is not None else "-"
        verdict = (record.get("confirmation") or {}).get("verdict") if record["status"] == "keep" else ""
        self.display(f"#{number} {record['status']}: val_bpb {shown} "
                     f"{verdict or record.get('reason', '')}".rstrip())
        return record
