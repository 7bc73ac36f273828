"""Parallel workers on one machine: `gitresearch loop --workers N`.

One process, N worker threads, each with its own Store (its own libgit2 handle), policy and
training process. Training runs in child processes, so the threads only wait. Each worker
gets its own device: with N GPUs visible, worker i sees GPU i alone (CUDA_VISIBLE_DEVICES);
on a CPU, the cores are split between the N runs (OMP_NUM_THREADS). They share one repo
safely: experiment numbers are taken by creating their ref (it fails if taken), notes are
written under a file lock, best moves only by compare-and-swap, and an experiment without a
note (interrupted, or a rebase waiting for its run) is run by exactly one worker: it is
claimed by a lock file held for the whole run, which a dead worker releases with its process.
One loop process per repo (RepoLock); its workers are threads.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path


class RepoLock:
    """Keeps two loops off one repo; the error names the holder's pid."""

    def __init__(self, store):
        self.path = store.state_dir / "loop.lock"

    def __enter__(self):
        self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "unknown"
            self.handle.close()
            from .judge import LoopError

            raise LoopError(f"another gitresearch loop holds {self.path} (pid {holder}); "
                            f"stop it first") from None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"{os.getpid()}\n")
        self.handle.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


class Claims:
    """Which worker runs which experiment, with flock'ed files under <git dir>/gitresearch/claims."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir) / "claims"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.held: dict[int, object] = {}

    @contextmanager
    def proposing(self):
        """Held while creating and claiming an experiment, and while scanning for pending
        ones, so that no worker claims an experiment its creator is about to run."""
        with open(self.dir / "propose.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def claim(self, number: int) -> bool:
        handle = open(self.dir / f"{number:06d}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self.held[number] = handle
        return True

    def release(self, number: int) -> None:
        handle = self.held.pop(number, None)
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES, else what nvidia-smi lists."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        return [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def worker_env(worker: int, workers: int, gpus: list[str]) -> dict:
    if gpus:
        return {"CUDA_VISIBLE_DEVICES": gpus[worker % len(gpus)]}
    threads = max(1, (os.cpu_count() or 1) // workers)
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def run_workers(loop, start: float):
    """Run loop.config.loop.workers worker loops in threads; their reports summed."""
    from .loop import Loop, LoopReport

    count = loop.config.loop.workers
    gpus = visible_gpus()
    if gpus and count > len(gpus):
        loop.display(f"{count} workers for {len(gpus)} GPUs: workers share GPUs round-robin")
    reports = [LoopReport() for _ in range(count)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        config = loop.config
        if config.policy.seed is not None:  # the same seed would make every worker propose alike
            config = replace(config, policy=replace(config.policy, seed=config.policy.seed + i))
        worker = Loop(loop.store.root, config, loop.policy_name,
                      display=lambda line: loop.display(f"[worker {i}] {line}"),
                      on_progress=loop.on_progress, worker=i, env_extra=worker_env(i, count, gpus),
                      stop_event=loop.stop_event, claims=loop.claims, remote=loop.remote)
        try:
            reports[i] = worker.work(start)
        except BaseException as err:  # re-raised in the main thread below, with the others stopped
            errors.append(err)
            loop.stop_event.set()

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
