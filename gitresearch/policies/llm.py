"""The greedy LLM policy: build the prompt from git, ask the model, turn its reply into a
diff. The loop validates the diff and, on failure, asks again with the exact error.

    gitresearch loop --policy llm --backend openai --model qwen2.5-coder-32b-instruct
    gitresearch loop --policy llm --backend local --model Qwen/Qwen2.5-Coder-1.5B-Instruct
    gitresearch loop --policy llm --suggest tpe ...     # the prompt shows TPE's next suggestion
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import GitresearchError

from . import InvalidReply, Proposal, State
from .backends import make_backend
from .prompt import SYSTEM_PROMPT, prompt_for, read_reply


def load_system_prompt(root: Path, path: str) -> str:
    return (Path(root) / path).read_text() if path else SYSTEM_PROMPT


class LLMPolicy:
    name = "llm"

    def __init__(self, config, store, backend=None):
        self.config, self.store = config, store
        self.backend = backend if backend is not None else make_backend(config.llm)
        self.system = load_system_prompt(store.root, config.policy.system_prompt)
        self.optimiser = None  # an OptunaSearch when [policy] suggest names a sampler

    def prompt(self, state: State):
        return prompt_for(state, self.backend.count_tokens, self.backend.context_tokens,
                            self.config.llm.max_tokens, self.system)

    def optimiser_view(self, state: State):
        """(text for the prompt, note data) of the sampler's next suggestion and the top
        configurations so far; (None, None) without --suggest."""
        if not self.config.policy.suggest:
            return None, None
        if self.optimiser is None:
            from .optuna_search import OptunaSearch

            self.optimiser = OptunaSearch(self.config, self.store, sampler=self.config.policy.suggest)
        params, diff, description, study, _ = self.optimiser.suggest(state)
        current = self.optimiser.values_in(state.files)
        changed = {k: v for k, v in params.items() if current.get(k) != v}
        top = "\n".join(f"- {self.config.metric.name} {value:.6f}: " + ", ".join(
            f"{k.split(':', 1)[1]}={v!r}" for k, v in p.items()) for value, p in self.optimiser.top(study))
        text = (f"Optuna's {self.config.policy.suggest} sampler, fitted on every experiment so far, "
                f"suggests: {description}\n```diff\n{diff.rstrip()}\n```\n"
                f"Top configurations so far (lowest first):\n{top or '(none yet)'}")
        return text, {"sampler": self.config.policy.suggest, "description": description, "params": changed}

    def followed(self, suggestion: dict, state: State, diff: str) -> dict:
        """Whether the model's edit sets the constants the sampler suggested changing."""
        try:
            tree, paths = self.store.apply_diff(state.best_commit, diff)
        except (GitresearchError, KeyError):  # the loop rejects it with the exact error
            return {**suggestion, "followed": None}
        files = {**state.files, **{p: self.store.tree_file(tree, p) for p in paths if p in state.files}}
        after = self.optimiser.values_in(files)
        matched = sum(after.get(k) == v for k, v in suggestion["params"].items())
        total = len(suggestion["params"])
        verdict = "yes" if matched == total else ("partly" if matched else "no")
        return {**suggestion, "followed": verdict, "matched": matched, "of": total}

    def propose(self, state: State) -> Proposal:
        view, suggestion = self.optimiser_view(state)
        if view:
            state = replace(state, optimiser=view)
        prompt = self.prompt(state)
        completion = self.backend.complete(prompt.messages)
        data = {"backend": self.config.llm.backend, "model": self.config.llm.model,
                "prompt_tokens": prompt.tokens, "history_shown": prompt.history_shown,
                "history_dropped": prompt.history_dropped, "seconds": round(completion.seconds, 3),
                "usage": completion.usage, "finish_reason": completion.finish_reason}
        if suggestion:
            data["suggestion"] = {**suggestion, "followed": None}
        try:
            description, diff = read_reply(completion.text, state, self.store.make_diff)
        except InvalidReply as err:
            raise InvalidReply(str(err), completion.text, data) from None
        if suggestion:
            data["suggestion"] = self.followed(suggestion, state, diff)
        return Proposal(diff, description, data, reply=completion.text)

    def observe(self, record: dict) -> None:
        """The greedy policy learns only through the history in its next prompt."""
