"""Progress of long commands (loop, verify, bench early-stop, bench research): on a terminal a
rich bar with the count and an ETA; to a file or pipe a plain line each time the count moves."""
from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def clock(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class Eta:
    """The time left from the pace since the first count this process saw (a resumed loop's
    earlier experiments are not this run's pace)."""

    def __init__(self):
        self.first: tuple[float, int] | None = None

    def plain(self, what: str, done: int, total: int, note: str = "") -> str:
        now = time.monotonic()
        if self.first is None:
            self.first = (now, done)
        since, start = self.first
        line = f"{what}: {done}/{total}, {clock(now - since)} elapsed"
        if done > start and total > done:
            line += f", ETA {clock((now - since) / (done - start) * (total - done))}"
        return line + (f" ({note})" if note else "")


class Steps:
    """`with Steps(console, "corpora x methods", total) as steps: ... steps.advance(note)`."""

    def __init__(self, console: Console, what: str, total: int):
        self.console, self.what, self.total, self.done = console, what, total, 0
        self.eta = Eta()
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console) \
            if console.is_terminal else None
        self.task = None

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
            self.task = self.bar.add_task(self.what, total=self.total)
        else:
            self.eta.plain(self.what, 0, self.total)  # the clock starts now
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self.bar:
            self.bar.update(self.task, advance=1, description=f"{self.what}: {note}" if note else self.what)
        else:
            self.console.print(self.eta.plain(self.what, self.done, self.total, note), highlight=False, markup=False)
