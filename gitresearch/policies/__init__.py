"""Policies (docs/policies.md): random search, Optuna's samplers, a coding agent, an LLM, the RL-tuned LM; the
types are in base.py."""
from __future__ import annotations

from ..config import Config
from .base import Attempt, BackendError, InvalidReply, Policy, PolicyError, Proposal, State

__all__ = ["Attempt", "BackendError", "InvalidReply", "Policy", "PolicyError", "Proposal", "State",
           "POLICIES", "make_policy"]

POLICIES = ("random", "optuna", "agent", "llm", "rl")


def make_policy(name: str, config: Config, store) -> Policy:
    if name == "random":
        from .random_search import RandomSearch

        return RandomSearch(config, store)
    if name == "optuna":
        from .optuna_search import OptunaSearch

        return OptunaSearch(config, store)
    if name == "agent":
        from .agent import AgentPolicy

        return AgentPolicy(config, store)
    if name == "llm":
        from .llm import LLMPolicy

        return LLMPolicy(config, store)
    if name == "rl":
        from .rl import RLPolicy

        return RLPolicy(config, store)
    raise PolicyError(f"unknown policy {name!r} (available: {', '.join(POLICIES)})")
