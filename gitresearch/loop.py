"""The research loop: baseline, then propose -> validate -> commit -> run -> note -> keep or
discard, until a stop condition. All state is in git (refs and notes), so any stop, kill -9
included, resumes where it was: an experiment with a ref but no note is run again.
"""
from __future__ import annotations

import shutil
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from . import gitstore
from .config import Config
from .gitstore import Store
from .history import baseline_record, build_state
from .policies import PolicyError, make_policy
from .reward import novelty, reward
from .diffs import diff_sha
from .proposal import clean_text, propose_valid
from .remote import Remote
from .processes import kill_orphans
from .judge import Judge, LoopError
from .runner import SetupError, run_setup
from .sandbox import SandboxError, mode as sandbox_mode
from .earlystop import EarlyStop
from .workers import Claims, RepoLock, visible_gpus, worker_env

STOP_FILE = "STOP"  # touch <git dir>/gitresearch/STOP to stop before the next experiment


@dataclass
class LoopReport:
    ran: int = 0
    kept: int = 0
    stop_reason: str = ""


def pending(record: dict | None) -> bool:
    """An experiment still to run: no note yet, or a confirmation a kill interrupted."""
    return record is None or record.get("status") == "confirming"


# -- the loop ---------------------------------------------------------------------------------

class Loop(Judge):
    def __init__(self, root: Path, config: Config, policy: str | None = None,
                 display: Callable[[str], None] = print, on_progress: Callable | None = None,
                 worker: int = 0, env_extra: dict | None = None,
                 stop_event: threading.Event | None = None, claims: Claims | None = None,
                 remote: Remote | None = None, on_count: Callable[[int, int, str], None] | None = None):
        self.store = Store(root)
        self.on_count = on_count or (lambda done, total, what: None)  # (done, total, what) of a counted command
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
        self.said_idle = False  # "early stop cannot act" is said once per loop
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
                return self.run_workers(start)
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
            if self.config.loop.max_experiments:
                self.on_count(len(finished), self.config.loop.max_experiments, "experiments")
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

    def run_workers(self, start: float) -> LoopReport:
        """Run [loop] workers worker loops in threads (workers.py: devices, claims); their
        reports summed."""
        count = self.config.loop.workers
        gpus = visible_gpus()
        if gpus and count > len(gpus):
            self.display(f"{count} workers for {len(gpus)} GPUs: workers share GPUs round-robin")
        reports = [LoopReport() for _ in range(count)]
        errors: list[BaseException] = []

        def work(i: int) -> None:
            config = self.config
            if config.policy.seed is not None:  # the same seed would make every worker propose alike
                config = replace(config, policy=replace(config.policy, seed=config.policy.seed + i))
            worker = Loop(self.store.root, config, self.policy_name,
                          display=lambda line: self.display(f"[worker {i}] {line}"),
                          on_progress=self.on_progress, on_count=self.on_count, worker=i, env_extra=worker_env(i, count, gpus),
                          stop_event=self.stop_event, claims=self.claims, remote=self.remote)
            try:
                reports[i] = worker.work(start)
            except BaseException as err:  # re-raised in the main thread below, with the others stopped
                errors.append(err)
                self.stop_event.set()

        threads = [threading.Thread(target=work, args=(i,), name=f"gitresearch-worker-{i}") for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # the main thread stays free for SIGINT/SIGTERM
        if errors:
            raise errors[0]
        total = LoopReport(ran=sum(r.ran for r in reports), kept=sum(r.kept for r in reports))
        total.stop_reason = "; ".join(sorted({r.stop_reason for r in reports if r.stop_reason}))
        return total

    def claim_pending(self, experiments):
        """The oldest experiment without a note, or whose confirmation was interrupted, that
        this worker may run, claimed; None if there is none. With a remote, only experiments
        this clone made: another machine's may be running there."""
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
            with self.store.worktree(self.store.best(), exclude=self.config.files.editable) as work:
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
        if outcome.repairs:
            data["repaired_lines"] = outcome.repairs
        earlier = [e.diff for e in state.history]
        data["novelty"] = round(novelty(outcome.diff, earlier, self.config.reward.novelty), 6)
        return number, commit, base, description, {**data, "diff_sha": diff_sha(outcome.diff)}

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

