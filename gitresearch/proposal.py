"""From a policy's proposal to a tree: the checks every diff passes before it is committed.

Validation is code, never prompt: whatever train.py, the agenda or a model's reply says, only
the files listed in [files] editable may change, and only into parseable Python files.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field

from . import gitstore
from .config import Config
from .errors import GitresearchError
from .gitstore import Store
from .diffs import diff_sha, repair_stale_lines
from .policies.constants import find_sites, signed_log_moves
from .workers import visible_gpus
from .policies.base import Attempt, BackendError, InvalidReply, Proposal, State

REGULAR_FILE_MODES = (0o100644, 0o100755)


class InvalidProposal(GitresearchError):
    pass


def clean_text(text: str) -> str:
    """`text` made storable and sendable: characters UTF-8 cannot encode (lone surrogates from
    a JSON reply) become backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_text(diff: str) -> None:
    """A diff is text: no NUL bytes, no binary patch, valid UTF-8 (a reply decoded from JSON
    can still hold lone surrogates)."""
    if "\0" in diff:
        raise InvalidProposal("the diff contains NUL bytes; send a text diff")
    if "GIT binary patch" in diff or "\nBinary files " in f"\n{diff}":
        raise InvalidProposal("the diff is a binary patch; only text edits of the editable files are accepted")
    try:
        diff.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidProposal(f"the diff is not valid UTF-8 ({err.reason} at character {err.start})") from None


def apply_or_repair(store: Store, config: Config, base: str, diff: str) -> tuple[str, list[str], str, list[str]]:
    """(tree, changed paths, the diff applied, its repairs): `diff` as written, or, when it does
    not apply and [policy] repair_stale_lines is on, with its stale removed lines repaired
    (diffs.repair_stale_lines; a repaired diff that still fails, or one that does not parse,
    is refused); the error is always the one of the diff as written."""
    try:
        return (*store.apply_diff(base, diff), diff, [])
    except gitstore.InvalidDiff as err:
        repaired = None
        if config.policy.repair_stale_lines:
            repaired = repair_stale_lines(diff, lambda path: read_or_none(store, base, path))
        if repaired is None:
            raise InvalidProposal(str(err)) from err
        try:
            return (*store.apply_diff(base, repaired[0]), *repaired)
        except gitstore.InvalidDiff:
            raise InvalidProposal(str(err)) from err


def read_or_none(store: Store, commit: str, path: str) -> str | None:
    try:
        return store.read_file(commit, path)
    except (gitstore.GitError, UnicodeDecodeError):
        return None


def constant_values(source: str, config: Config) -> dict:
    """name -> value of the file's search space (constants.find_sites, as the runs on this
    machine see them), exponents left out; none for a file that does not parse."""
    try:
        sites = find_sites(source, config.policy.skip_constants, cuda=bool(visible_gpus()), metric=config.metric.name)
    except SyntaxError:
        return {}
    return {s.name: s.value for s in sites if s.kind == "value"}


def check_moves(config: Config, path: str, before: str, after: str) -> None:
    """[policy] max_move_factor and min_move_factor: InvalidProposal when the edit of `path`
    moves a positive constant to a positive value more than max_move_factor away (up or
    down), or moves such constants and none of them as far as min_move_factor. A model that
    jumps LR by x10 spends a whole run to learn what the fed-back error says at once; one that
    nudges LR by x1.1 spends a run on a change the keep rule almost never keeps (docs/gym.md)."""
    top, least = config.policy.max_move_factor, config.policy.min_move_factor
    if not (top or least) or not path.endswith(".py"):
        return
    old, new = constant_values(before, config), constant_values(after, config)
    moves = signed_log_moves(old, new)

    def said(name: str) -> str:
        value, moved = old[name], new[name]
        step = f"x{moved / value:.3g}" if moved > value else f"/{value / moved:.3g}"
        return f"{name} from {value!r} to {moved!r} ({step})"

    for name, move in moves.items():
        if top and abs(move) > math.log(top) + 1e-9:
            raise InvalidProposal(f"the diff moves {said(name)}; one experiment may move a constant at most "
                                  f"x{top:g} or /{top:g} ([policy] max_move_factor): take a smaller step")
    if least and moves and max(map(abs, moves.values())) < math.log(least) - 1e-9:
        name = max(moves, key=lambda n: abs(moves[n]))
        raise InvalidProposal(f"the diff moves {said(name)} and no constant further; an experiment moves at least "
                              f"one constant x{least:g} or /{least:g} ([policy] min_move_factor): "
                              "take a larger step")


def validate(store: Store, config: Config, base: str, diff: str) -> tuple[str, str, list[str]]:
    """(tree of `base` with `diff` applied, the diff applied, its repairs), or InvalidProposal
    with the exact reason."""
    check_text(diff)
    limit = config.policy.max_diff_bytes
    if len(diff.encode()) > limit:
        raise InvalidProposal(f"the diff is {len(diff.encode())} bytes, over the limit of {limit}")
    tree, paths, diff, repairs = apply_or_repair(store, config, base, diff)
    outside = [p for p in paths if p not in config.files.editable]
    if outside:
        raise InvalidProposal(f"the diff touches {', '.join(outside)}; only "
                              f"{', '.join(config.files.editable)} may change")
    for path in paths:
        mode = store.file_mode(tree, path)
        if mode is None:
            raise InvalidProposal(f"the diff deletes {path}")
        if mode not in REGULAR_FILE_MODES:
            raise InvalidProposal(f"the diff makes {path} something other than a regular file "
                                  f"(mode {mode:o})")
        try:
            text = store.tree_file(tree, path)
        except UnicodeDecodeError as err:
            raise InvalidProposal(f"the diff leaves {path} non-UTF-8 (byte {err.start})") from None
        if "\0" in text:
            raise InvalidProposal(f"the diff leaves NUL bytes in {path}")
        if path.endswith(".py"):
            try:
                ast.parse(text, filename=path)
            except SyntaxError as err:
                raise InvalidProposal(f"{path} does not parse after the diff: line {err.lineno}: "
                                      f"{err.msg}") from err
            judged = config.policy.max_move_factor or config.policy.min_move_factor
            before = read_or_none(store, base, path) if judged else None
            if before is not None:
                check_moves(config, path, before, text)
    return tree, diff, repairs


REPLY_CHARS_KEPT = 8000  # of each failed reply, stored in the note


@dataclass
class Outcome:
    """The result of asking a policy for a valid proposal, up to [policy] max_tries times."""
    proposal: Proposal | None  # the last proposal (None when no try produced one)
    tree: str | None  # its tree when valid; None: every try failed
    diff: str = ""  # the diff applied when valid: the proposal's, or its repair
    repairs: list[str] = field(default_factory=list)  # stale removed lines repaired ("old -> new")
    attempts: list[dict] = field(default_factory=list)  # failed tries: error, reply, diff
    backend_only: bool = False  # every failed try was the endpoint's fault, not the policy's
    data: dict = field(default_factory=dict)  # the policy's data of the last try

    @property
    def reason(self) -> str:
        if not self.attempts:
            return ""
        return f"{len(self.attempts)} tries failed; last: {self.attempts[-1]['error']}"


ALREADY_TRIED = "this exact change was already tried as experiment #{}; propose something different"


def check_new(diff: str, tried: dict[str, int]) -> None:
    earlier = tried.get(diff_sha(diff))
    if earlier is not None:
        raise InvalidProposal(ALREADY_TRIED.format(earlier))


def propose_valid(store: Store, config: Config, policy, state: State, tried: dict[str, int]) -> Outcome:
    """Ask `policy` until a proposal validates, feeding each failure back as an Attempt."""
    outcome = Outcome(None, None)
    backend_failures = 0
    for _ in range(max(1, config.policy.max_tries)):
        proposal, reply = None, ""
        try:
            proposal = policy.propose(state)
            reply = proposal.reply
            check_text(proposal.diff)
            check_new(proposal.diff, tried)
            outcome.proposal, outcome.data = proposal, proposal.data
            tree, applied, repairs = validate(store, config, state.best_commit, proposal.diff)
            if repairs:  # a repair can turn a new diff into one tried before
                check_new(applied, tried)
            outcome.tree, outcome.diff, outcome.repairs = tree, applied, repairs
            break
        except BackendError as err:
            error = f"backend: {err}"
            backend_failures += 1
        except InvalidReply as err:
            error, reply = str(err), err.reply
            outcome.data = err.data
        except InvalidProposal as err:
            error = str(err)
        diff, reply = clean_text(proposal.diff if proposal else ""), clean_text(reply)
        outcome.proposal = proposal or outcome.proposal
        outcome.attempts.append({"error": error, "reply": reply[:REPLY_CHARS_KEPT],
                                 "diff": diff[:config.policy.max_diff_bytes]})
        state = state.retry(Attempt(reply, diff, error))
    outcome.backend_only = outcome.tree is None and backend_failures == len(outcome.attempts)
    return outcome
