"""policies/grammar.py: the Moves reply's grammar that [rl] grammar samples under."""
import random

import pytest

from gitresearch.policies.constants import Site
from gitresearch.policies.grammar import END, START, MovesGrammar
from gitresearch.policies.moves import STEP, find_moves, step_for

NAMES = ["MATRIX_LR", "DEPTH", "ADAM_BETAS[1]", "MUON_MOMENTUM", "USE_BIAS", "LR_EXP", "WIDTH", "SHIFT"]
SITES = [Site("MATRIX_LR", 1, 0, 1, 0.005), Site("DEPTH", 2, 0, 1, 4), Site("ADAM_BETAS[1]", 3, 0, 1, 0.95),
         Site("MUON_MOMENTUM", 4, 0, 1, 0.95), Site("USE_BIAS", 5, 0, 1, True),
         Site("LR_EXP", 6, 0, 1, -3, kind="exponent"), Site("WIDTH", 7, 0, 1, 512, align=64),
         Site("SHIFT", 8, 0, 1, 2.5)]


def new_values(site: Site, rng: random.Random):
    if isinstance(site.value, bool):
        return not site.value
    if isinstance(site.value, int):
        return rng.choice([site.value + rng.randint(1, 5), site.value * rng.randint(2, 40), -site.value, 1])
    if 0 < site.value < 1:
        return rng.choice([rng.uniform(0.001, 0.999), 1.5, 1e-7])
    return site.value * rng.choice([rng.uniform(0.001, 1000), -1.0, 1e-9, 12345.0])


def test_the_grammar_reads_every_reply_the_imitation_data_writes():
    # the prior learned step_for's form: sampling under the grammar must leave all of it open
    grammar, rng = MovesGrammar(NAMES), random.Random(0)
    for _ in range(500):
        changes = [(site, new_values(site, rng)) for site in rng.sample(SITES, rng.randint(1, 4))]
        reply = f"Moves: {'; '.join(step_for(site, new) for site, new in changes)}\n"
        assert grammar.complete(grammar.walk(reply)), reply
    assert grammar.complete(grammar.walk("Moves: again\n"))
    assert grammar.complete(grammar.walk("Moves: DEPTH +1; again\n"))


@pytest.mark.parametrize("reply", [
    "koves: MUON_MOMENTUM x2.19\n",  # replies the adapted policy wrote in the gym (docs/gym.md)
    "Moves: GRAD_CLIP /2.402; WIDTH /1 Movesoves: ADAM_BETAS[1] /2.58\n",
    "Moves: LR /1.65; DEPTH +7\n",  # a constant not shown
    "Moves: ADAM_BETAS[1] /2.25; MATRIX_LR[0.63\n",
    "Moves: BATCH_SIZE fixed for -8\n",
    "Moves: DEPTH x2.\n", "Moves: DEPTH x2; \n", "Moves: DEPTH x-2\n", "Moves: DEPTH\n",
    "Moves: USE_BIAS = Tru\n", "Moves: DEPTH +1\nmore", "Moves:DEPTH +1\n", "Moves: again x2\n",
])
def test_the_grammar_refuses_what_the_parser_would_refuse_or_never_saw(reply):
    grammar = MovesGrammar(NAMES)
    assert not grammar.complete(grammar.walk(reply))


def test_every_reply_the_grammar_completes_reads_as_steps_on_the_constants_shown():
    # a random walk through the automaton, one allowed character at a time
    grammar, rng = MovesGrammar(NAMES), random.Random(1)
    alphabet = sorted(set("".join(NAMES) + "Moves:again 0123456789.e+-x/=;\nTrueFals"))
    finished = 0
    for _ in range(300):
        text, state = "", START
        while state != END and len(text) < 200:
            options = [c for c in alphabet if grammar.step(state, c) is not None]
            # lean towards ending a step so that most walks finish
            char = "\n" if "\n" in options and rng.random() < 0.3 else rng.choice(options)
            text, state = text + char, grammar.step(state, char)
        if state != END:
            continue
        finished += 1
        steps = [s.strip() for s in find_moves(text).split(";")]
        for step in steps:
            match = STEP.match(step)
            assert step == "again" or (match and match["name"] in NAMES), (text, step)
    assert finished > 200


def test_a_token_is_allowed_where_all_its_characters_are():
    grammar = MovesGrammar(["LR", "DEPTH"])
    texts = ["<|endoftext|>", "Mo", "ves", ": ", "Moves: ", "LR", " x", "2", "\n", "LRX", "M"]
    state = grammar.walk("Moves: LR")
    allowed = grammar.mask(state, texts, eos=0, size=len(texts) + 2)
    assert allowed.nonzero().flatten().tolist() == [6]  # " x" only; no EOS mid-reply, nothing past the vocab
    assert grammar.mask(START, texts, 0, len(texts)).nonzero().flatten().tolist() == [1, 4, 10]
    assert grammar.mask(END, texts, 0, len(texts)).nonzero().flatten().tolist() == [0]  # EOS after the newline
    # a refused token leaves only EOS, so a reply that left the grammar ends there
    assert grammar.after(texts, 0, [4, 9]) is None
    assert grammar.mask(None, texts, 0, len(texts)).nonzero().flatten().tolist() == [0]
    rows = grammar.rows(texts, 0, [4, 5, 6, 7, 8, 0], len(texts))
    assert rows.shape == (7, len(texts)) and rows[5].nonzero().flatten().tolist() == [0]
