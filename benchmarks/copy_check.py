#!/usr/bin/env python
"""Whether a moves-form policy LM copies a kept experiment's steps, or only their names:
teacher-forced log-probabilities of the momentum teacher's repeats (imitation.examples with
momentum 1: the kept newest steps written out, as that teacher wrote them up to 311531f; it
now answers `again`) against those of fresh moves (momentum 0, random steps), token by token. A model that copies puts the
repeat's digits near log-prob 0; one that draws fresh factors scores them as it scores a
fresh move's digits.

Prints JSON: per arm (`repeat`, `fresh`) the examples scored and, per token class (`name`:
a token with a capital letter or underscore and no digit; `digit`: a token with a digit),
the tokens and their mean log-probability (nats); and seconds.

    python benchmarks/copy_check.py REPO MODEL_DIR [--examples 40] [--seed 11]
"""
import argparse
import json
import random
import re
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.policies.imitation import examples
from gitresearch.policies.moves import MOVES_PREFIX
from gitresearch.policies.ppo import render_chat
from gitresearch.policies.pretrain import best_files


def token_class(piece: str) -> str | None:
    if re.search(r"[0-9]", piece):
        return "digit"
    return "name" if re.search(r"[A-Z_]", piece) else None


def score(model, tokenizer, pairs, window: int) -> dict:
    """Per class, the tokens of the replies and their mean teacher-forced log-probability."""
    logprobs: dict[str, list[float]] = {"name": [], "digit": []}
    scored = 0
    for messages, reply in pairs:
        prompt = render_chat(tokenizer, messages)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        encoded = tokenizer(prompt + reply, add_special_tokens=False, return_offsets_mapping=True)
        ids = encoded["input_ids"]
        if len(ids) > window or ids[:len(prompt_ids)] != prompt_ids:  # too long, or a token spans the seam
            continue
        with torch.no_grad():
            logp = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
        text = prompt + reply
        for i in range(len(prompt_ids), len(ids)):
            start, end = encoded["offset_mapping"][i]
            if kind := token_class(text[start:end]):
                logprobs[kind].append(logp[i - 1, ids[i]].item())
        scored += 1
    return {"examples": scored, **{kind: {"tokens": len(values), "mean_logprob": round(sum(values) / max(1, len(values)), 4)}
                                   for kind, values in logprobs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo")
    parser.add_argument("model")
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    started = time.time()
    store, config = Store(args.repo), load(args.repo)
    _, files = best_files(store, config)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    out = {}
    for arm, momentum in (("repeat", 1.0), ("fresh", 0.0)):
        drawn = examples(files, random.Random(args.seed), store.make_diff, args.examples, config.policy.skip_constants,
                         metric=config.metric.name, max_changes=3, reply="moves", momentum=momentum, tries=(0,))
        # the repeat arm scores the kept steps written out (the teacher now answers `again`)
        pairs = [(e.messages, f"{MOVES_PREFIX} {e.repeats}\n" if arm == "repeat" else e.reply)
                 for e in drawn if (e.repeats is not None) == (arm == "repeat")]
        out[arm] = score(model, tokenizer, pairs, model.config.max_position_embeddings)
    print(json.dumps({**out, "model": args.model, "seconds": round(time.time() - started, 1)}, indent=1))


if __name__ == "__main__":
    main()
