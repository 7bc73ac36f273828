"""Parallel workers on one machine (`gitresearch loop --workers N`): the repo lock, experiment
claims and each worker's device; `Loop.run_workers` starts the threads (docs/loop.md).

One process, N worker threads, each with its own Store, policy and training process. With N
GPUs visible, worker i sees GPU i alone (CUDA_VISIBLE_DEVICES); on a CPU the cores are split
(OMP_NUM_THREADS). An experiment without a note is run by exactly one worker: it is claimed
by a lock file held for the whole run, which a dead worker releases with its process.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from .errors import GitresearchError


class RepoLockedError(GitresearchError):
    """Another loop (or verify) holds the repo."""


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
            raise RepoLockedError(f"another gitresearch loop holds {self.path} (pid {holder}); "
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
