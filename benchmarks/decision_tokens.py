#!/usr/bin/env python
"""Which reply tokens a policy LM is uncertain about: replies sampled by the rl policy's own
learner (PPOLearner.generate, then its scoring: the entropy of each reply token under the
sampling temperature) to compact prompts of a research repo's best (imitation.examples, seed
0), each token put in the class of the reply text it covers, and what [rl] token_share
would select (decision_mask, per reply). Prints JSON: per class the tokens, their share of
all reply tokens, their mean entropy (nats), and per share the fraction of selected tokens in
each class; and seconds.

Classes: new_value (the new value on a `+` line and after `->` in the Description), name
(the constant's name on a `+`/`-` line or in the Description), copied (the removed line's
value, the Description's old value and a line's trailing comment), hunk (an `@@` header), format (the rest: labels,
fence, file headers, newlines, the end of text).

    python benchmarks/decision_tokens.py REPO MODEL_DIR [--replies 40] [--temperature 0.7]
"""
import argparse
import json
import random
import re
import time
from collections import Counter

import torch

from gitresearch.config import LLMConfig, RLConfig, load
from gitresearch.gitstore import Store
from gitresearch.policies.imitation import examples
from gitresearch.policies.ppo import PPOLearner
from gitresearch.policies.ppo_terms import decision_mask
from gitresearch.policies.pretrain import best_files

CLASSES = ("new_value", "name", "copied", "hunk", "format")
ASSIGNED = re.compile(r"^([+-])(\s*)([A-Za-z_]\w*)(\s*=\s*)([^#\n]*?)(\s*#.*)?$", re.MULTILINE)
DESCRIBED = re.compile(r"(?:(?<=^Description: )|(?<=; ))(\S+) (.+?) -> ([^;\n]+)", re.MULTILINE)
HUNK = re.compile(r"^@@.*$", re.MULTILINE)


def char_classes(text: str) -> list[str]:
    """The class of each character of a reply."""
    out = ["format"] * len(text)

    def mark(start: int, end: int, name: str) -> None:
        out[start:end] = [name] * (end - start)

    for m in ASSIGNED.finditer(text):
        if text[m.start():m.start() + 3] in ("+++", "---"):
            continue
        mark(*m.span(3), "name")
        mark(*m.span(5), "new_value" if m.group(1) == "+" else "copied")
        if m.group(6):
            mark(*m.span(6), "copied")  # a trailing comment, copied from the prompt on both lines
    for m in DESCRIBED.finditer(text):
        mark(*m.span(1), "name")
        mark(*m.span(2), "copied")
        mark(*m.span(3), "new_value")
    for m in HUNK.finditer(text):
        mark(*m.span(), "hunk")
    return out


def token_classes(tokenizer, response_ids: list[int]) -> list[str]:
    """Each token's class: the most common class of the characters it decodes to (format for
    a token with no text, such as the end of text)."""
    pieces = [tokenizer.decode([t]) if t != tokenizer.eos_token_id else "" for t in response_ids]
    chars = char_classes("".join(pieces))
    out, at = [], 0
    for piece in pieces:
        span = chars[at:at + len(piece)]
        at += len(piece)
        out.append(Counter(span).most_common(1)[0][0] if span else "format")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("repo")
    parser.add_argument("model")
    parser.add_argument("--replies", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--shares", default="0.1,0.2,0.3")
    args = parser.parse_args()
    started = time.time()
    config, store = load(args.repo), Store(args.repo)
    _, files = best_files(store, config)
    learner = PPOLearner(args.model, RLConfig(), LLMConfig(temperature=args.temperature, device="cpu"))
    cases = examples(files, random.Random(0), store.make_diff, args.replies, config.policy.skip_constants,
                     metric=config.metric.name, wander=0, tries=(0,))
    shares = [float(s) for s in args.shares.split(",")]
    tokens, entropy_sum, picked = Counter(), Counter(), {s: Counter() for s in shares}
    for i, case in enumerate(cases):
        _, episode = learner.generate(case.messages, seed=i)
        with torch.no_grad():
            _, _, ents = learner.score([episode])
        classes = token_classes(learner.tokenizer, episode.response_ids)
        for name, h in zip(classes, ents[0].tolist()):
            tokens[name] += 1
            entropy_sum[name] += h
        for share in shares:
            mask = decision_mask(ents[0], share)
            picked[share].update(name for name, m in zip(classes, mask.tolist()) if m)
    total = sum(tokens.values())
    print(json.dumps({
        "replies": args.replies, "temperature": args.temperature, "tokens": total,
        "classes": {c: {"tokens": tokens[c], "share": round(tokens[c] / total, 3),
                        "mean_entropy": round(entropy_sum[c] / max(1, tokens[c]), 4)} for c in CLASSES},
        "selected": {str(s): {c: round(picked[s][c] / max(1, sum(picked[s].values())), 3) for c in CLASSES}
                     for s in shares},
        "seconds": round(time.time() - started, 1)}, indent=1))


if __name__ == "__main__":
    main()
