"""The policy types: state in, proposal (diff + one-line description + policy data) out.

Every policy (random search, an LLM, the RL-tuned LM) implements `Policy`. The loop builds a
`State` from git, asks for a proposal, validates it, and when it is invalid asks again with
the failed attempts in `State.attempts` (each with the exact error), up to [policy] max_tries.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from ..config import Config
from ..errors import GitresearchError


@dataclass(frozen=True)
class Attempt:
    """A proposal that failed validation, as the policy sees it on the next try."""
    reply: str  # the raw model output (empty for policies that have none)
    diff: str
    error: str


@dataclass(frozen=True)
class State:
    best_commit: str
    files: dict[str, str]  # editable path -> its source at best
    history: list  # history.Entry of the last K finished experiments, newest first
    best_chain: list[dict]  # best's chain, oldest (the baseline) first
    config: Config
    tried_diffs: frozenset[str] = frozenset()  # diff_sha of every experiment so far
    diagnostics: dict = field(default_factory=dict)
    agenda: str = ""  # the research agenda's text
    attempts: tuple[Attempt, ...] = ()  # failed tries of this proposal, oldest first
    optimiser: str = ""  # an optimiser's suggestion and top configurations (llm --suggest)

    def retry(self, attempt: Attempt) -> "State":
        return replace(self, attempts=self.attempts + (attempt,))


@dataclass(frozen=True)
class Proposal:
    diff: str  # a unified diff against best
    description: str  # one line
    data: dict = field(default_factory=dict)  # the policy's own data, stored in the note
    reply: str = ""  # the raw model output it came from


class PolicyError(GitresearchError):
    """The policy cannot propose anything (for example: nothing left to mutate)."""


class InvalidReply(GitresearchError):
    """The policy produced output with no usable diff in it; it counts as a failed try."""

    def __init__(self, message: str, reply: str = "", data: dict | None = None):
        super().__init__(message)
        self.reply = reply
        self.data = data or {}


class BackendError(GitresearchError):
    """The model endpoint failed after its retries (HTTP status, timeout, connection)."""


class Policy(Protocol):
    name: str

    def propose(self, state: State) -> Proposal:
        """A proposal, or InvalidReply / BackendError (a failed try)."""

    def observe(self, record: dict) -> None:
        """The finished experiment's note (its status, metric, reward)."""
