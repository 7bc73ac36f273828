"""The git store: experiment commits, their refs and notes, and `best`. The only module that
touches pygit2; the git CLI is used where libgit2 lacks a feature (worktrees, ref CAS).

Layout in the research repo:
- refs/heads/best                    first-parent chain: baseline, then each accepted improvement
- refs/gitresearch/experiments/NNNNNN one ref per experiment (kept or not), so gc never loses it
- refs/notes/gitresearch             one readable note per experiment (what `git log` shows)
- refs/notes/gitresearch-verify      `gitresearch verify`'s readable note per verified commit
- refs/notes/records/gitresearch*    the records of both, as JSON (notes.py)
- <git dir>/gitresearch/             logs, metrics, lock files (not shared, referenced by notes)
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pygit2

from .errors import GitresearchError
from .notes import note_text, parse_record, record_text, records_ref

BEST_REF = "refs/heads/best"
NOTES_REF = "refs/notes/gitresearch"
VERIFY_REF = "refs/notes/gitresearch-verify"  # `gitresearch verify`'s records, by commit
EXPERIMENTS_PREFIX = "refs/gitresearch/experiments/"
MAX_RESERVE_TRIES = 100  # experiment numbers tried before a refusing remote is an error
AUTHOR = ("gitresearch", "gitresearch@localhost")  # the one identity of gitresearch's commits and notes
IDENTITY_ENV = {"GIT_AUTHOR_NAME": AUTHOR[0], "GIT_AUTHOR_EMAIL": AUTHOR[1],
                "GIT_COMMITTER_NAME": AUTHOR[0], "GIT_COMMITTER_EMAIL": AUTHOR[1]}
GIT_ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "XDG_CONFIG_HOME",
                 "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL",
                 "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "GIT_ASKPASS", "SSH_ASKPASS",
                 "GIT_CONFIG_COUNT", "GITRESEARCH_PUSH_TOKEN")  # the last two: research.yml's push credentials
GIT_SAFE_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


class GitError(GitresearchError):
    """A git or libgit2 operation failed (the message names the command and its output)."""


class StaleRefError(GitError):
    """A compare-and-swap found the ref moved since it was read."""


class InvalidDiff(GitresearchError):
    """A proposed diff cannot be parsed or applied."""


def git_env(extra: dict | None = None) -> dict:
    """The environment of every git call: an allow-list (no API keys, no GIT_* that redirects
    the repo or runs a program), C locale, no prompts."""
    env = {k: v for k, v in os.environ.items()
           if k in GIT_ENV_ALLOW or k.startswith(("SSH_", "GIT_SSH", "GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))}
    env.update(LC_ALL="C", GIT_TERMINAL_PROMPT="0", **(extra or {}))
    return env


def git(*args: str, cwd: Path, check: bool = True, input: str | None = None,
        env_extra: dict | None = None) -> str:
    """Run the git CLI with hooks and the fsmonitor off (a hook planted in the repo never runs
    with the user's environment) in a clean environment; errors carry the command, exit code
    and output."""
    proc = subprocess.run(["git", *GIT_SAFE_CONFIG, *args], cwd=cwd, env=git_env(env_extra),
                          input=input, capture_output=True, text=True)
    if check and proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise GitError(f"`git {' '.join(args)}` exited {proc.returncode} in {cwd}:\n{tail}")
    return proc.stdout


def create_repo(directory: Path) -> None:
    git("init", "-q", cwd=directory)


def commit_all(directory: Path, message: str) -> None:
    """Commit every file of `directory`'s working tree as gitresearch (hooks off)."""
    git("add", "-A", cwd=directory)
    git("commit", "-q", "--no-verify", "-m", message, cwd=directory, env_extra=IDENTITY_ENV)


def commit_paths(directory: Path, paths: list[str], message: str) -> str:
    """Commit these paths alone (whatever else is staged stays out) as gitresearch; the new
    commit's id."""
    git("add", "--", *paths, cwd=directory)
    git("commit", "-q", "--no-verify", "-m", message, "--only", "--", *paths, cwd=directory,
        env_extra=IDENTITY_ENV)
    return git("rev-parse", "HEAD", cwd=directory).strip()


def uncommitted(directory: Path, path: str) -> bool:
    """Whether `path` differs from HEAD (untracked, modified, or no HEAD yet)."""
    return bool(git("status", "--porcelain", "--", path, cwd=directory).strip()) or \
        not git("ls-tree", "--name-only", "HEAD", "--", path, cwd=directory, check=False).strip()


@dataclass(frozen=True)
class Experiment:
    number: int
    commit: str
    parent: str | None
    description: str
    record: dict | None  # the note, None while the experiment has not finished


def has_context_free_hunk(diff_text: str) -> bool:
    """Whether some hunk of the diff has no context line (only - and + lines)."""
    context = None  # of the hunk being read; None between hunks
    # a hunk ends at the next hunk, the next file's headers (a removed "-- x" line is read as
    # one) or the end (the sentinel)
    for line in diff_text.splitlines() + ["@@"]:
        if line.startswith(("@@", "--- ", "+++ ", "diff --git ")):
            if context is False:
                return True
            context = False if line.startswith("@@") else None
        elif context is not None and line.startswith(" "):
            context = True
    return False


class Store:
    def __init__(self, path: Path):
        try:
            self.repo = pygit2.Repository(str(path))
        except pygit2.GitError as err:
            raise GitError(f"{path}: not a git repository ({err})") from err
        if self.repo.is_bare:
            raise GitError(f"{path}: a bare repository has no train.py to research")
        self.root = Path(self.repo.workdir)
        self.state_dir = Path(self.repo.path) / "gitresearch"
        self.state_dir.mkdir(exist_ok=True)
        # commit -> its diff: a commit never changes, and the loop reads every experiment's
        # diff again before each proposal (history.crashed_constants)
        self._diffs: dict[str, str] = {}

    # -- refs ------------------------------------------------------------------------------

    def resolve(self, rev: str) -> str:
        try:
            return str(self.repo.revparse_single(rev).peel(pygit2.Commit).id)
        except (KeyError, ValueError, pygit2.GitError) as err:
            raise GitError(f"unknown revision {rev!r}") from err

    def best(self) -> str | None:
        ref = self.repo.references.get(BEST_REF)
        return str(ref.target) if ref else None

    def create_best(self, commit: str) -> None:
        self.repo.create_reference_direct(BEST_REF, pygit2.Oid(hex=commit), False,
                                    message="gitresearch: baseline")

    def advance_best(self, old: str, new: str, message: str) -> None:
        """Fast-forward best from `old` to `new`, a child of `old`; StaleRefError if best moved."""
        parents = [str(p) for p in self.repo[new].parent_ids]
        if parents[:1] != [old]:
            raise GitError(f"{new} is not a child of {old}: not a fast-forward")
        try:
            git("update-ref", "-m", message, BEST_REF, new, old, cwd=self.root)
        except GitError:
            current = self.best()
            if current != old:
                raise StaleRefError(f"best moved to {current} since {old} was read") from None
            raise

    def set_best(self, old: str | None, new: str, message: str) -> None:
        """Point best at `new` if it is still at `old` (compare-and-swap, any commit);
        StaleRefError if best moved meanwhile."""
        try:
            git("update-ref", "-m", message, BEST_REF, new, old or "", cwd=self.root)
        except GitError:
            if self.best() != old:
                raise StaleRefError(f"best moved to {self.best()} since {old} was read") from None
            raise

    def is_ancestor(self, old: str, new: str) -> bool:
        return old == new or self.repo.descendant_of(pygit2.Oid(hex=new), pygit2.Oid(hex=old))

    def best_chain(self) -> list[str]:
        """Commits of best's first-parent chain, newest first, down to the baseline (the
        user's history before it is not part of the research)."""
        chain, commit, baseline = [], self.best(), self.experiment_commit(0)
        while commit:
            chain.append(commit)
            parents = self.repo[commit].parent_ids
            commit = str(parents[0]) if parents and chain[-1] != baseline else None
        return chain if baseline else chain[:1]

    # -- trees and diffs -------------------------------------------------------------------

    def read_file(self, commit: str, path: str) -> str:
        try:
            entry = self.repo[commit].peel(pygit2.Tree)[path]
        except KeyError as err:
            raise GitError(f"{path} does not exist in {commit[:12]}") from err
        return self.repo[entry.id].data.decode("utf-8")

    def make_diff(self, path: str, old: str, new: str, context_lines: int = 3) -> str:
        """A git-style unified diff of one file, with `context_lines` around each change."""
        # libgit2's patch points into the two buffers without copying them: they must outlive
        # reading its text (passed as temporaries, they were sometimes freed first, and the
        # text came out corrupt: tests/test_gitstore.py; pygit2 issue 754 is the same for blobs)
        old_bytes, new_bytes = old.encode(), new.encode()
        patch = pygit2.Patch.create_from(old_bytes, new_bytes, old_as_path=path,
                                         new_as_path=path, context_lines=context_lines)
        text = patch.text
        del patch, old_bytes, new_bytes
        return text

    def commit_files(self, parent: str, files: dict[str, str], message: str = "files") -> str:
        """A commit of `parent`'s tree with `files` (path -> text) written over it, on no ref
        (git gc removes it): something to apply a diff to when the files are in no commit."""
        index = pygit2.Index()
        index.read_tree(self.repo[parent].peel(pygit2.Tree))
        for path, text in files.items():
            index.add(pygit2.IndexEntry(path, self.repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB))
        signature = pygit2.Signature(*AUTHOR)
        return str(self.repo.create_commit(None, signature, signature, message, index.write_tree(self.repo),
                                           [pygit2.Oid(hex=parent)]))

    def apply_diff(self, commit: str, diff_text: str) -> tuple[str, list[str]]:
        """Apply a unified diff to `commit`'s tree: (new tree id, changed paths).

        git's own parser applies it (`git apply --cached --recount` on a private index:
        pygit2 does not expose git_apply_to_tree, and libgit2's parser rejects the plain
        `--- a/x`/`+++ b/x` diffs without a `diff --git` line that people and models write).
        --recount ignores the line counts of hunk headers, which models often get wrong; the
        context lines still have to match. A diff with a hunk that has no context line (what
        `diff -U0` writes, and the small pretrain-policy LM: one line to copy instead of
        three) is applied with --unidiff-zero: git then finds the removed lines wherever they
        are (the hunk's line number is only where the search starts) instead of refusing.
        The changed paths are read from the two trees, so a rename, a deletion or a mode
        change is seen whatever the diff's headers say."""
        if not diff_text.strip():
            raise InvalidDiff("the diff is empty")
        index = {"GIT_INDEX_FILE": str(self.state_dir / f"apply-{os.getpid()}-{threading.get_ident()}.index")}
        try:
            git("read-tree", commit, cwd=self.root, env_extra=index)
            try:
                zero = ["--unidiff-zero"] if has_context_free_hunk(diff_text) else []
                git("apply", "--cached", "--recount", "--whitespace=nowarn", *zero, "-", cwd=self.root,
                    input=diff_text if diff_text.endswith("\n") else diff_text + "\n",
                    env_extra=index)
            except GitError as err:
                detail = str(err).split("\n", 1)[-1].strip()
                if any(s in detail for s in ("No valid patches", "without header", "corrupt patch")):
                    raise InvalidDiff(f"the diff does not parse: {detail}") from err
                raise InvalidDiff(f"the diff does not apply to {commit[:12]}: {detail}") from err
            tree = git("write-tree", cwd=self.root, env_extra=index).strip()
        finally:
            Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)
        old_tree = self.repo[commit].peel(pygit2.Tree)
        changes = self.repo.diff(old_tree, self.repo[tree])
        paths = sorted({p for d in changes.deltas for p in (d.old_file.path, d.new_file.path) if p})
        if not paths:
            raise InvalidDiff("the diff changes nothing")
        return tree, paths

    def file_mode(self, tree: str, path: str) -> int | None:
        """The git file mode of `path` in `tree` (0o100644 a file, 0o120000 a link), None when absent."""
        try:
            return self.repo[tree][path].filemode
        except KeyError:
            return None

    def parent_of(self, commit: str) -> str | None:
        parents = self.repo[commit].peel(pygit2.Commit).parent_ids
        return str(parents[0]) if parents else None

    def tree_of(self, commit: str) -> str:
        return str(self.repo[commit].peel(pygit2.Commit).tree_id)

    def subject(self, commit: str) -> str:
        return self.repo[commit].message.split("\n")[0]

    def tree_file(self, tree: str, path: str) -> str:
        return self.repo[self.repo[tree][path].id].data.decode("utf-8")

    def trailer(self, commit: str, key: str) -> str | None:
        for line in reversed(self.repo[commit].message.splitlines()):
            if line.startswith(f"{key}: "):
                return line[len(key) + 2:].strip()
        return None

    def diff_of(self, commit: str) -> str:
        if commit not in self._diffs:
            c = self.repo[commit]
            self._diffs[commit] = (self.repo.diff(c.parents[0], c).patch or "") if c.parent_ids else ""
        return self._diffs[commit]

    # -- experiments -----------------------------------------------------------------------

    def create_experiment(self, parent: str, tree: str, description: str, policy: str,
                          reserve=None) -> tuple[int, str]:
        """Commit `tree` on `parent` and give it the next experiment ref: (number, commit).
        Never touches the working tree, the index or HEAD. `reserve(number, commit)` (a shared
        remote) returns False when another machine took the number first: the next is tried."""
        signature = pygit2.Signature(*AUTHOR)
        for _ in range(MAX_RESERVE_TRIES):
            number = self.last_experiment_number() + 1
            message = (f"{description.strip().splitlines()[0] if description.strip() else 'experiment'}"
                       f"\n\nGitresearch-Policy: {policy}\nGitresearch-Experiment: {number}\n"
                       f"Gitresearch-Origin: {self.origin_id()}\n")
            oid = self.repo.create_commit(None, signature, signature, message,
                                          pygit2.Oid(hex=tree), [pygit2.Oid(hex=parent)])
            ref = f"{EXPERIMENTS_PREFIX}{number:06d}"
            try:
                self.repo.create_reference_direct(ref, oid, False, message="gitresearch: experiment")
            except pygit2.AlreadyExistsError:  # a concurrent worker took the number
                continue
            if reserve is None or reserve(number, str(oid)):
                return number, str(oid)
            # another machine has the number (the refused reservation fetched its ref): ours is
            # renumbered; our ref goes only if the fetch left it ours
            current = self.repo.references.get(ref)
            if current is not None and current.target == oid:
                self.repo.references.delete(ref)
        raise GitError(f"no experiment number could be reserved in {MAX_RESERVE_TRIES} tries "
                       f"(the remote refused every push; see its error above)")

    def origin_id(self) -> str:
        """This clone's id (not shared): experiments it created carry it, so that with a shared
        remote a clone only resumes the unfinished experiments it made itself."""
        path = self.state_dir / "origin-id"
        if not path.exists():
            tmp = self.state_dir / f"origin-id.{os.getpid()}"
            tmp.write_text(uuid.uuid4().hex[:16])
            tmp.replace(path) if not path.exists() else tmp.unlink()
        return path.read_text().strip()

    def ref_target(self, ref: str) -> str | None:
        found = self.repo.references.get(ref)
        return str(found.resolve().target) if found is not None else None

    def force_ref(self, ref: str, commit: str | None) -> None:
        """Point `ref` at `commit` (None: delete it): for refs that mirror a remote's."""
        if commit is None:
            git("update-ref", "-d", ref, cwd=self.root, check=False)
        else:
            git("update-ref", ref, commit, cwd=self.root)

    def set_baseline(self, commit: str) -> None:
        """Experiment 0 is the baseline: the best tip the research started from."""
        self.repo.create_reference_direct(f"{EXPERIMENTS_PREFIX}{0:06d}", pygit2.Oid(hex=commit),
                                          False, "gitresearch: baseline")

    def last_experiment_number(self) -> int:
        numbers = [int(name[len(EXPERIMENTS_PREFIX):]) for name in self.repo.references
                   if name.startswith(EXPERIMENTS_PREFIX)]
        return max(numbers, default=0)

    def experiment_commit(self, number: int) -> str | None:
        ref = self.repo.references.get(f"{EXPERIMENTS_PREFIX}{number:06d}")
        return str(ref.target) if ref else None

    def experiments(self, last: int | None = None) -> list[Experiment]:
        """Experiments, newest first (the last `last` of them). Many notes are read in one
        pass over the notes tree: a lookup per note costs about 1 ms at 1,000 notes."""
        numbers = sorted((int(name[len(EXPERIMENTS_PREFIX):]) for name in self.repo.references
                          if name.startswith(EXPERIMENTS_PREFIX)), reverse=True)[:last]
        notes = self.all_notes() if len(numbers) > 32 else None
        return [self.experiment(n, notes) for n in numbers]

    def experiment(self, number: int, notes: dict[str, dict] | None = None) -> Experiment:
        commit = self.repo.references[f"{EXPERIMENTS_PREFIX}{number:06d}"].peel(pygit2.Commit)
        parent = str(commit.parent_ids[0]) if commit.parent_ids else None
        record = notes.get(str(commit.id)) if notes is not None else self.read_note(str(commit.id))
        return Experiment(number, str(commit.id), parent, commit.message.split("\n")[0], record)

    def all_notes(self, ref: str = NOTES_REF) -> dict[str, dict]:
        """Every record of `ref`, by the commit it annotates: the record notes, and the
        schema 1 notes (record inside the readable note) of commits that have none."""
        found = {}
        for notes_ref in (records_ref(ref), ref):
            if self.repo.references.get(notes_ref) is None:
                continue
            for note in self.repo.notes(notes_ref):
                commit = str(note.annotated_id)
                if commit not in found:
                    found[commit] = parse_record(self.repo[note.id].data.decode("utf-8", "replace"))
        return found

    # -- notes -----------------------------------------------------------------------------

    @contextmanager
    def lock(self, name: str):
        """An exclusive lock across processes (libgit2 and git both drop concurrent notes)."""
        with open(self.state_dir / f"{name}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def write_note(self, commit: str, record: dict, ref: str = NOTES_REF) -> None:
        """The record first, then the readable note: a kill between the two leaves a record
        that reads back whole."""
        signature = pygit2.Signature(*AUTHOR)
        with self.lock("notes"):
            self.repo.create_note(record_text(record), signature, signature, commit, records_ref(ref), True)
            self.repo.create_note(note_text(record), signature, signature, commit, ref, True)

    def read_note(self, commit: str, ref: str = NOTES_REF) -> dict | None:
        """The record of `commit` (a schema 1 note holds it in the readable note)."""
        for notes_ref in (records_ref(ref), ref):
            try:
                return parse_record(self.repo.lookup_note(commit, notes_ref).message)
            except KeyError:
                continue
        return None

    def state_token(self) -> str:
        """Changes whenever best, an experiment ref or a notes ref moves: what a live reader
        polls to know it must read again."""
        names = sorted(n for n in self.repo.references
                       if n.startswith(("refs/notes/", EXPERIMENTS_PREFIX)) or n == BEST_REF)
        state = "\n".join(f"{n} {self.repo.references[n].target}" for n in names)
        return hashlib.sha1(state.encode()).hexdigest()[:16]

    def note_count(self) -> int:
        if self.repo.references.get(NOTES_REF) is None:
            return 0
        return sum(1 for _ in self.repo.notes(NOTES_REF))

    # -- checkouts -------------------------------------------------------------------------

    @contextmanager
    def worktree(self, commit: str, exclude: tuple[str, ...] = ()):
        """A plain copy of `commit`'s files (less `exclude`) in the state dir's worktrees
        folder, removed after."""
        folder = self.state_dir / "worktrees"
        folder.mkdir(exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix="wt-", dir=folder))
        path.rmdir()
        try:
            self.checkout(commit, path, exclude)
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    @contextmanager
    def scratch_repo(self, commit: str):
        """A throwaway git repo outside this one holding `commit`'s files as its only commit:
        where a coding agent edits (it sees no .git of the research repo). Removed after."""
        path = Path(tempfile.mkdtemp(prefix="gitresearch-scratch-"))
        path.rmdir()
        try:
            self.checkout(commit, path)
            create_repo(path)
            commit_all(path, "best")
            # the diff is taken against this ref, so an agent that commits (aider) loses nothing
            git("update-ref", "refs/gitresearch/base", "HEAD", cwd=path)
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def scratch_diff(path: Path, exclude: tuple[str, ...] = ()) -> str:
        """Every change in a scratch repo since its first commit, committed or not (new and
        deleted files included), less the `exclude` paths, as `git diff` prints it."""
        git("add", "-A", cwd=path)
        return git("diff", "--cached", "refs/gitresearch/base", "--", ".",
                   *(f":(exclude){p}" for p in exclude), cwd=path)

    def checkout(self, commit: str, path: Path, exclude: tuple[str, ...] = ()) -> None:
        """Write `commit`'s files (less the `exclude` paths) into the new folder `path`. No
        .git link, no index, no hooks: the folder is a plain copy a sandbox can be given."""
        path.mkdir(parents=True)

        def write(tree: pygit2.Tree, folder: Path, prefix: str) -> None:
            for entry in tree:
                rel = prefix + entry.name
                if rel in exclude:
                    continue
                target = folder / entry.name
                if entry.filemode == pygit2.enums.FileMode.TREE:
                    target.mkdir()
                    write(self.repo[entry.id], target, rel + "/")
                elif entry.filemode == pygit2.enums.FileMode.LINK:
                    os.symlink(self.repo[entry.id].data, target)
                elif entry.filemode in (pygit2.enums.FileMode.BLOB, pygit2.enums.FileMode.BLOB_EXECUTABLE):
                    target.write_bytes(self.repo[entry.id].data)
                    if entry.filemode == pygit2.enums.FileMode.BLOB_EXECUTABLE:
                        target.chmod(0o755)

        write(self.repo[commit].peel(pygit2.Tree), path, "")

    # -- repo set-up and plumbing for init and remote ----------------------------------------

    @property
    def git_dir(self) -> Path:
        return Path(self.repo.path)

    def message(self, commit: str) -> str:
        return self.repo[commit].message.strip()

    def show_notes_in_log(self) -> None:
        """Plain `git log` shows the experiment and verification notes. A glob: git warns
        about a displayRef that does not exist yet (the verify notes), not about a glob that
        matches nothing."""
        git("config", "--unset-all", "notes.displayRef", cwd=self.root, check=False)
        git("config", "notes.displayRef", f"{NOTES_REF}*", cwd=self.root)

    def remote_url(self, name: str) -> str:
        return git("remote", "get-url", name, cwd=self.root).strip()

    def merge_notes(self, theirs_ref: str, ours_ref: str = NOTES_REF) -> None:
        """Merge a fetched notes ref into ours, theirs winning a conflict (each machine's
        notes annotate its own commits, so the merge is a union), under the notes lock."""
        theirs = self.ref_target(theirs_ref)
        if theirs is None:
            return
        with self.lock("notes"):
            ours = self.ref_target(ours_ref)
            if ours is None:
                self.force_ref(ours_ref, theirs)
            elif ours != theirs:
                git("notes", f"--ref={ours_ref}", "merge", "--quiet", "-s", "theirs", theirs_ref,
                    cwd=self.root, env_extra=IDENTITY_ENV)

    def prune_worktrees(self) -> None:
        """Forget git worktrees that older versions registered (they ran under .git)."""
        git("worktree", "prune", cwd=self.root, check=False)
