"""The greedy LLM policy: build the prompt from git, ask the model, turn its reply into a
diff. The loop validates the diff and, on failure, asks again with the exact error.

    gitresearch loop --policy llm --backend openai --model qwen2.5-coder-32b-instruct
    gitresearch loop --policy llm --backend local --model Qwen/Qwen2.5-Coder-1.5B-Instruct
"""
from __future__ import annotations

from pathlib import Path

from . import InvalidReply, Proposal, State
from .backends import make_backend
from .prompt import SYSTEM_PROMPT, build_prompt
from .reply import parse_reply


def load_system_prompt(root: Path, path: str) -> str:
    return (Path(root) / path).read_text() if path else SYSTEM_PROMPT


class LLMPolicy:
    name = "llm"

    def __init__(self, config, store, backend=None):
        self.config, self.store = config, store
        self.backend = backend if backend is not None else make_backend(config.llm)
        self.system = load_system_prompt(store.root, config.policy.system_prompt)

    def prompt(self, state: State):
        return build_prompt(state, self.backend.count_tokens, self.backend.context_tokens,
                            self.config.llm.max_tokens, self.system)

    def propose(self, state: State) -> Proposal:
        prompt = self.prompt(state)
        completion = self.backend.complete(prompt.messages)
        data = {"backend": self.config.llm.backend, "model": self.config.llm.model,
                "prompt_tokens": prompt.tokens, "history_shown": prompt.history_shown,
                "history_dropped": prompt.history_dropped, "seconds": round(completion.seconds, 3),
                "usage": completion.usage, "finish_reason": completion.finish_reason}
        try:
            description, diff = parse_reply(completion.text, state.files, self.store.make_diff)
        except InvalidReply as err:
            raise InvalidReply(str(err), completion.text, data) from None
        return Proposal(diff, description, data, reply=completion.text)

    def observe(self, record: dict) -> None:
        """The greedy policy learns only through the history in its next prompt."""
