"""Policies: state in, proposal (diff + one-line description + policy data) out."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config import Config


@dataclass(frozen=True)
class State:
    best_commit: str
    files: dict[str, str]  # editable path -> its source at best
    history: list[dict]  # the last K experiments, newest first (see loop.history_window)
    best_chain: list[dict]  # best's records, newest first
    config: Config
    tried_diffs: frozenset[str] = frozenset()  # diff_sha of every experiment so far


@dataclass(frozen=True)
class Proposal:
    diff: str  # a git-style unified diff against best
    description: str  # one line
    data: dict = field(default_factory=dict)  # the policy's own data, stored in the note


class PolicyError(RuntimeError):
    """The policy cannot propose anything (for example: nothing left to mutate)."""


def make_policy(name: str, config: Config, store):
    if name == "random":
        from .random_search import RandomSearch

        return RandomSearch(config, store)
    raise PolicyError(f"unknown policy {name!r} (available: random)")
