"""Several machines, one shared git remote (`gitresearch loop --remote NAME`): git is the
coordinator; fetch, merge the notes, reserve experiment numbers, push notes, move best by
compare-and-swap, retry network failures (docs/loop.md)."""
from __future__ import annotations

import time

from .gitstore import (BEST_REF, EXPERIMENTS_PREFIX, IDENTITY_ENV, NOTES_REF, GitError, StaleRefError, Store,
                       git)
from .notes import records_ref
PUSH_RETRIES = 8


class RemoteError(GitError):
    pass


def _rejected(err: GitError) -> bool:
    """A push the remote refused (a lease or fast-forward lost to another machine)."""
    text = str(err)
    return "[rejected]" in text or "stale info" in text or "! [remote rejected]" in text


class Remote:
    def __init__(self, store: Store, name: str, network_retries: int = 4, backoff_s: float = 2.0):
        self.store, self.name = store, name
        self.network_retries, self.backoff_s = network_retries, backoff_s
        try:
            self.url = store.remote_url(name)
        except GitError as err:
            raise RemoteError(f"no git remote named {name!r} in {store.root}") from err
        self.best_mirror = f"refs/remotes/{name}/best"
        # the readable notes and their records, each with the ref it is fetched into
        self.notes = {NOTES_REF: f"refs/notes/remotes/{name}/gitresearch",
                      records_ref(NOTES_REF): f"refs/notes/remotes/{name}/records/gitresearch"}

    def _git(self, *args: str) -> str:
        """A git command that talks to the remote, retried with backoff when it fails for
        another reason than a refused push (the network, a busy server): a research loop runs
        for days, and one failed fetch should not end it."""
        wait = self.backoff_s
        for attempt in range(self.network_retries + 1):
            try:
                return git(*args, cwd=self.store.root, env_extra=IDENTITY_ENV)
            except GitError as err:
                if _rejected(err) or attempt == self.network_retries:
                    raise
                time.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable")

    def _push(self, *args: str) -> bool:
        """True when the remote took the push; False when it rejected it (a lost race)."""
        try:
            self._git("push", "--porcelain", self.name, *args)
            return True
        except GitError as err:
            if _rejected(err):
                return False
            raise RemoteError(f"push to {self.name} ({self.url}) failed: {err}") from err

    def fetch(self) -> None:
        try:
            heads = self._git("ls-remote", self.name, BEST_REF, *self.notes)
        except GitError as err:
            raise RemoteError(f"cannot reach {self.name} ({self.url}): {err}") from err
        specs = [f"+{EXPERIMENTS_PREFIX}*:{EXPERIMENTS_PREFIX}*"]
        if BEST_REF in heads:
            specs.append(f"+{BEST_REF}:{self.best_mirror}")
        else:
            self.store.force_ref(self.best_mirror, None)
        specs += [f"+{ref}:{mirror}" for ref, mirror in self.notes.items() if ref in heads.split()]
        self._git("fetch", "--quiet", "--no-tags", self.name, *specs)

    def merge_notes(self) -> None:
        for ref, mirror in self.notes.items():
            self.store.merge_notes(mirror, ref)

    def sync(self) -> None:
        """Fetch, merge the notes, and make the remote's best the local best: by compare-and-
        swap, so that a local worker's move made meanwhile is never overwritten (it is
        fetched back from the remote on the next try instead)."""
        for _ in range(PUSH_RETRIES):
            self.fetch()
            self.merge_notes()
            remote_best = self.store.ref_target(self.best_mirror)
            local_best = self.store.best()
            if remote_best is None and local_best is not None:
                self.push_best(None, local_best)
                return
            if remote_best is None or remote_best == local_best:
                return
            try:
                self.store.set_best(local_best, remote_best, f"gitresearch: adopt {self.name}'s best")
                return
            except StaleRefError:
                continue
        raise RemoteError(f"best kept moving while adopting {self.name}'s best ({PUSH_RETRIES} tries)")

    def reserve(self, number: int, commit: str) -> bool:
        ref = f"{EXPERIMENTS_PREFIX}{number:06d}"
        if self._push("--atomic", f"--force-with-lease={ref}:", f"{commit}:{ref}"):
            return True
        self.fetch()
        return False

    def push_best(self, old: str | None, new: str) -> bool:
        lease = f"--force-with-lease={BEST_REF}:{old or ''}"
        return self._push("--atomic", lease, f"{new}:{BEST_REF}")

    def publish_notes(self) -> None:
        """Push the notes and their records; merge the remote's first when it moved meanwhile."""
        refs = [ref for ref in self.notes if self.store.ref_target(ref)]
        for _ in range(PUSH_RETRIES):
            if self._push("--atomic", *(f"{ref}:{ref}" for ref in refs)):
                return
            self.fetch()
            self.merge_notes()
        raise RemoteError(f"could not push {NOTES_REF} to {self.name} after {PUSH_RETRIES} tries")
