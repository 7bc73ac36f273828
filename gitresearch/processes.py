"""Process trees and what they leave behind: draining a run's output into a capped log,
killing its whole tree (the process group, children that left it, processes tagged with its
run id), and reading the files it wrote without following links. Used by the runner, which
alone spawns training and evaluation."""
from __future__ import annotations

import hashlib
import os
import re
import signal
import stat
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import psutil

TAIL_BYTES = 64 * 1024  # output kept in memory for the summary block and the note's tail
METRICS_CAP = 16 * 2 ** 20  # bytes of a run's metrics file read at most
PROGRESS_SPLIT = re.compile(rb"[\r\n]")  # progress lines end in \n, or redraw with \r


def read_untrusted(path: Path, offset: int = 0, limit: int = METRICS_CAP) -> bytes:
    """Up to `limit` bytes from `offset` of a file a sandboxed process may have written: a
    symlink, a FIFO, a device or a missing file reads as nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        os.lseek(fd, offset, os.SEEK_SET)
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def hash_files(root: Path, patterns: tuple[str, ...]) -> dict[str, str]:
    """SHA-256 of each file matching `patterns` under `root`, never following a link."""
    hashes = {}
    for pattern in patterns:
        matches = sorted(root.glob(pattern)) or [root / pattern]
        for path in matches:
            rel = str(path.relative_to(root))
            if path.is_symlink():
                hashes[rel] = "symlink"
            elif not path.exists():
                hashes[rel] = "missing"
            else:
                data = read_untrusted(path, limit=1 << 40)
                hashes[rel] = hashlib.sha256(data).hexdigest() if path.is_file() else "not a file"
    return hashes


class OutputPump(threading.Thread):
    """Drains the child's output: the first `cap` bytes go to the log, the last TAIL_BYTES stay
    in memory, progress lines go to `on_line(line, complete)` (complete: ended by \\n or \\r;
    an unfinished one is passed too, for the live display). A flood costs memcpy, nothing more."""

    def __init__(self, stream, log_path: Path, cap: int, on_line: Callable[[str, bool], None]):
        super().__init__(daemon=True)
        self.stream, self.log, self.cap, self.on_line = stream, open(log_path, "wb"), cap, on_line
        self.written = self.dropped = 0
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.partial = b""  # the unfinished last line (print writes a line and its \n apart)

    def run(self):
        fd = self.stream.fileno()
        while chunk := os.read(fd, 1 << 16):
            room = self.cap - self.written
            if room > 0:
                self.log.write(chunk[:room])
                self.log.flush()  # so that `tail -f` on the log follows the run
                self.written += min(room, len(chunk))
            self.dropped += max(0, len(chunk) - max(room, 0))
            self.tail.append(chunk)
            self.tail_size += len(chunk)
            while self.tail_size - len(self.tail[0]) >= TAIL_BYTES:
                self.tail_size -= len(self.tail.popleft())
            recent = (self.partial + chunk)[-8192:]
            self.partial = PROGRESS_SPLIT.split(recent)[-1][-4096:]
            if progress := newest_progress_line(recent):
                self.on_line(progress.decode("utf-8", "replace"), True)
            if self.partial.lstrip().startswith(b"step"):
                # a line redrawn with `\r` and printed with end="" is complete only when the next
                # one starts: shown now, counted in the curve when it is complete
                self.on_line(self.partial.decode("utf-8", "replace"), False)

    def tail_text(self) -> str:
        return b"".join(self.tail)[-TAIL_BYTES:].decode("utf-8", "replace")

    def close(self):
        if self.dropped:
            self.log.write(f"\n[gitresearch: {self.dropped} bytes over the log cap dropped; "
                           f"the last {TAIL_BYTES} bytes follow]\n".encode())
            self.log.write(self.tail_text().encode())
        self.log.close()


def tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def newest_progress_line(chunk: bytes, look_back: int = 16) -> bytes | None:
    """The newest complete `step ...` line among the last `look_back` lines of `chunk` (a
    summary or log line printed right after it does not hide it); bounded work per chunk, so
    a flood of output costs little."""
    lines = PROGRESS_SPLIT.split(chunk)[:-1]  # the last piece is not complete yet
    for line in reversed(lines[-look_back:]):
        if line.lstrip().startswith(b"step"):
            return line
    return None


def kill_tree(group: int, seen: dict[int, psutil.Process], term_grace: float) -> None:
    """SIGTERM the process group and every process seen in the tree, then SIGKILL survivors."""
    def alive():
        return [p for p in seen.values() if _running(p)]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass
        for p in alive():  # children that left the group with setsid()
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + (term_grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and (alive() or _group_alive(group)):
            time.sleep(0.02)
        if not alive() and not _group_alive(group):
            return


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(_running(p) for p in psutil.process_iter() if _safe_pgid(p) == group)


def _safe_pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def tagged(match: Callable[[psutil.Process, str], bool]) -> dict[int, psutil.Process]:
    """Processes carrying a GITRESEARCH_RUN_ID tag that `match(process, tag)` accepts: they
    find descendants that escaped the process group (setsid, double fork) or outlived us."""
    found = {}
    for p in psutil.process_iter():
        try:
            tag = p.environ().get("GITRESEARCH_RUN_ID")
            if tag and p.pid != os.getpid() and match(p, tag):
                found[p.pid] = p
        except psutil.Error:
            continue
    return found


def kill_orphans(under: Path) -> int:
    """Kill training processes left by a harness that died (kill -9): any process tagged with
    a GITRESEARCH_RUN_ID whose working directory is under `under`. Returns how many."""
    under = str(Path(under).resolve())
    orphans = tagged(lambda p, tag: p.cwd().startswith(under))
    for p in orphans.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(orphans.values()), timeout=5)
    return len(orphans)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
