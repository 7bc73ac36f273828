"""The Moves reply's grammar, for sampling under it (`[rl] grammar`, docs/policies.md):

    Moves: NAME xF; NAME /F; NAME +K; NAME -K; NAME = V; again\\n

NAME is one of the constants the prompt shows, F and K plain numbers (`2`, `1.5`, `1e-05`,
`1e+03`), V a number (with a sign) or True/False; steps are joined by `; `. This is the form
the imitation data writes (moves.step_for), a subset of what moves.moved reads. The
grammar says what may be written, not whether a step is a good one: a factor past the cap or
a constant moved twice still fails validation.

Why: PPO's drift on a small LM lands in the reply's syntax (`koves:`, `WIDTH /1 Movesoves`,
constants that do not exist), and the adapted policy's refusals grow with the updates
(docs/gym.md, "rl44 on fresh seeds 32-39"). Sampling under the grammar gives every token
that would leave it probability 0, so an update can move which moves are proposed and not
whether they parse. The log-probs PPO stores and rescores are those of the masked
distribution (ppo.PPOLearner.score), so the ratio and the KL compare like with like.

The automaton reads characters; a token is allowed where all its characters are, so the
token mask at a state is the vocabulary filtered through it, kept per state.
"""
from __future__ import annotations

import torch

PREFIX = "Moves: "
AGAIN = "again"
END = ("end",)
START = ("lit", 0)
DIGITS = set("0123456789")


class MovesGrammar:
    def __init__(self, names: list[str]):
        self.names = sorted(set(names))
        self.prefixes = {name[:i] for name in self.names + [AGAIN] for i in range(len(name) + 1)}
        self.masks: dict[tuple, torch.Tensor] = {}  # state -> allowed token ids (bool), see mask()

    def step(self, state: tuple | None, char: str) -> tuple | None:
        """The state after `char`, or None where the grammar has no way on."""
        if state is None:
            return None
        kind = state[0]
        if kind == "lit":
            at = state[1]
            if char != PREFIX[at]:
                return None
            return ("name", "") if at + 1 == len(PREFIX) else ("lit", at + 1)
        if kind == "name":
            grown = state[1] + char
            if grown in self.prefixes:
                return ("after",) if grown == AGAIN else ("name", grown)
            return ("op",) if char == " " and state[1] in self.names else None
        if kind == "op":
            if char in "x/+-":
                return ("num", "start")
            return ("eq",) if char == "=" else None
        if kind == "eq":
            return ("value",) if char == " " else None
        if kind == "value":  # a signed number or a bool
            if char == "-":
                return ("num", "start")
            for word in ("True", "False"):
                if char == word[0]:
                    return ("word", word, 1)
            return self.number(("num", "start"), char)
        if kind == "word":
            word, at = state[1], state[2]
            if at == len(word):
                return self.after_step(char)
            return ("word", word, at + 1) if char == word[at] else None
        if kind == "num":
            return self.number(state, char)
        if kind == "after":
            return self.after_step(char)
        if kind == "sep":
            return ("name", "") if char == " " else None
        return None  # END takes nothing more

    @staticmethod
    def after_step(char: str) -> tuple | None:
        return ("sep",) if char == ";" else END if char == "\n" else None

    def number(self, state: tuple, char: str) -> tuple | None:
        """Digits, an optional fraction, an optional exponent (`1.5`, `1e-05`), then the step ends."""
        phase = state[1]
        if char in DIGITS:
            return ("num", {"start": "int", "dot": "frac", "e": "exp", "esign": "exp"}.get(phase, phase))
        if char == "." and phase == "int":
            return ("num", "dot")
        if char == "e" and phase in ("int", "frac"):
            return ("num", "e")
        if char in "+-" and phase == "e":
            return ("num", "esign")
        return self.after_step(char) if phase in ("int", "frac", "exp") else None

    def walk(self, text: str, state: tuple | None = START) -> tuple | None:
        for char in text:
            state = self.step(state, char)
            if state is None:
                return None
        return state

    def complete(self, state: tuple | None) -> bool:
        """Whether a reply may end here: after its newline."""
        return state == END

    def mask(self, state: tuple | None, token_texts: list[str], eos: int | None, size: int) -> torch.Tensor:
        """The tokens (of a vocabulary of `size`) allowed at `state`: those whose text the
        grammar reads on from it, and EOS where the reply is complete. Never empty: where no
        token reads on (a vocabulary without some character) or past a refused token (state
        None), only EOS."""
        key = (state, size)
        if key not in self.masks:
            allowed = torch.zeros(size, dtype=torch.bool)
            for token, text in enumerate(token_texts if state is not None else ()):
                if text and self.walk(text, state) is not None:
                    allowed[token] = True
            if eos is not None and (self.complete(state) or not allowed.any()):
                allowed[eos] = True
            self.masks[key] = allowed
        return self.masks[key]

    def after(self, token_texts: list[str], eos: int | None, tokens: list[int], state: tuple | None = START):
        """The state after `tokens` (None past EOS or a token the grammar refuses)."""
        for token in tokens:
            if state is None or token == eos or token >= len(token_texts):
                return None
            state = self.walk(token_texts[token], state)
        return state

    def rows(self, token_texts: list[str], eos: int | None, response: list[int], size: int) -> torch.Tensor:
        """(len(response) + 1, size) bool: the tokens allowed before each token of `response`
        and after its last."""
        rows, state = [], START
        for token in response:
            rows.append(self.mask(state, token_texts, eos, size))
            state = self.after(token_texts, eos, [token], state)
        rows.append(self.mask(state, token_texts, eos, size))
        return torch.stack(rows)


class GrammarMask:
    """A logits processor for transformers' `generate`: the tokens the grammar refuses after the
    reply so far get -inf, so the sample is drawn from the masked distribution that
    ppo.PPOLearner.score evaluates."""

    def __init__(self, grammar: MovesGrammar, token_texts: list[str], eos: int | None, prompt_tokens: int):
        self.grammar, self.token_texts, self.eos = grammar, token_texts, eos
        self.walked, self.state = prompt_tokens, START  # one call per sampled token: walk only the new ones

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        new = input_ids[0, self.walked:].tolist()
        self.state = self.grammar.after(self.token_texts, self.eos, new, self.state)
        self.walked += len(new)
        allowed = self.grammar.mask(self.state, self.token_texts, self.eos, scores.shape[-1]).to(scores.device)
        return scores.masked_fill(~allowed, float("-inf"))
