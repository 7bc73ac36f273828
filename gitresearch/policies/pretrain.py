"""Pre-train a small policy LM by imitation, on a CPU, with no downloaded weights: a byte-level
BPE tokenizer and a small GPT-2, both trained here on imitation examples (imitation.py) in
the compact prompt, the loss on the reply's tokens only. The result loads with `--model DIR`
like any local model; the rl policy then fine-tunes it with PPO on real rewards.

    gitresearch pretrain-policy --out .gitresearch/policy-lm        # in a research repo
    gitresearch loop --policy rl --model .gitresearch/policy-lm     # needs [llm] prompt = "compact"

After training it samples replies to the loop's first prompt (best's files, made-up history)
and reports the share that parse, apply to best as the loop applies them (`git apply`, then the
stale-line repair) and change a live constant.
"""
from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from .constants import find_sites, log_moves, move_summary
from .imitation import MAX_HISTORY, WANDER_STEPS, Example, examples, move_limits
from .moves import find_moves, step_names, with_again
from .ppo import render_chat
from .prompt import MARGIN
from .reply import parse_reply
from . import InvalidReply

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class PretrainConfig:
    examples: int = 4000  # imitation pairs to train on
    vocab_size: int = 1024  # BPE tokens
    layers: int = 4
    width: int = 128  # channels of the residual stream
    heads: int = 4
    positions: int = 1024  # tokens the model reads (prompt + reply)
    steps: int = 1200  # optimiser steps
    batch_size: int = 8  # sequences per step
    lr: float = 2e-3  # AdamW peak; linear warmup over 5 % of the steps, cosine to 10 %
    seed: int = 0
    eval_samples: int = 40  # replies sampled after training to measure the valid share
    temperature: float = 0.7  # of those samples: the [llm] temperature the policy samples at
    copy_weight: float = 1.0  # loss weight of the reply tokens copied from the prompt (see copied_spans)
    init: str = ""  # a policy LM directory to go on training (its tokenizer and shape), or "" for a new one
    max_changes: int = 1  # constants a reply changes: min_changes to this many, as the random policy (which does 1-3)
    min_changes: int = 1  # the fewest constants a reply changes (more per experiment paid more in the gym: docs/gym.md)
    digits: bool = False  # one token per digit in a new tokenizer (else BPE merges digit runs: "Ġ192", "002")
    reply: str = "diff"  # the reply form to imitate: diff | moves (a Moves line; [llm] reply must match)
    momentum: float = 0.0  # share of moves examples that repeat the kept newest experiment's steps (imitation.py)
    min_factor: float = 1.0  # each taught factor at least this far from 1 (x or /); 1: log-uniform in [1/3, 3] as random
    history: int = MAX_HISTORY  # most made-up past experiments an example's prompt shows
    # tokens the loop leaves the reply ([llm] max_tokens, at most half the window): a prompt gives
    # way to window - this - 16 as the loop's does (history dropped, oldest first); 0: an
    # example that does not fit the window is drawn again, its history whole
    reply_tokens: int = 0
    hide: float = 0.0  # share of examples whose view leaves out one or two constants the history names (crash blame)
    # the loop's [policy] max_move_factor: made-up failed tries include a step past it (and a
    # constant moved twice), and a sampled reply past it counts as invalid; 0: off
    max_factor: float = 0.0


# the reply's text copied from its prompt: the old values of the Description ("NAME OLD -> NEW")
# and the diff's removed lines. A wrong copy is a diff that does not apply, and these few
# tokens are where a small model fails (it writes the baseline's value where best moved)
DESCRIBED_OLD = re.compile(r"(?:^Description: |; )\S+ (.+?) -> ", re.MULTILINE)
REMOVED_LINE = re.compile(r"^-(?!--)(.*)$", re.MULTILINE)
# a Moves line's constant names: copied from the prompt's view, and where a small model fails
# in this form (it glues name pieces it has seen: MUON_ + BETAS[0], a constant not shown)
MOVED_NAME = re.compile(r"(?:^Moves: |; )([A-Za-z_]\w*(?:\[\d+\])?)", re.MULTILINE)


def copied_spans(reply: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the reply that copy its prompt."""
    return [m.span(1) for pattern in (DESCRIBED_OLD, REMOVED_LINE, MOVED_NAME) for m in pattern.finditer(reply)]


def train_tokenizer(texts: list[str], vocab_size: int, digits: bool = False):
    """A byte-level BPE tokenizer trained on `texts`. With `digits`, every digit is a token of
    its own: BPE otherwise merges digit runs as they happen to be frequent ("192" one token,
    "0.0023" as "0", ".", "002", "3"), and a value's tokens then say little about its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), byte_level]) if digits else byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)


def loop_fit(tokenizer, window: int, reply_tokens: int) -> Callable[[list[dict]], bool] | None:
    """Whether messages leave the loop's reply budget in the window, counted as the loop's
    compact prompt counts them (prompt.build_compact_prompt); None for reply_tokens 0."""
    if not reply_tokens:
        return None
    if not 0 < reply_tokens < window:
        raise ValueError(f"reply_tokens {reply_tokens} must be below the model's window of {window} positions")
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    return lambda messages: sum(count(m["content"]) for m in messages) <= window - reply_tokens - MARGIN


def encode(tokenizer, example: Example, positions: int,
           copy_weight: float = 1.0) -> tuple[list[int], list[int], list[float]] | None:
    """(input ids, labels, loss weights): the prompt's labels masked (-100), the reply's tokens
    that overlap copied_spans weighted `copy_weight`, the others 1; None if it does not fit."""
    prompt = tokenizer(render_chat(tokenizer, example.messages), add_special_tokens=False)["input_ids"]
    reply = tokenizer(example.reply, add_special_tokens=False, return_offsets_mapping=True)
    spans = copied_spans(example.reply)
    weights = [copy_weight if any(a < end and start < b for a, b in spans) else 1.0
               for start, end in reply["offset_mapping"]] + [1.0]
    ids = reply["input_ids"] + [tokenizer.eos_token_id]
    if len(prompt) + len(ids) > positions:
        return None
    return prompt + ids, [-100] * len(prompt) + ids, [0.0] * len(prompt) + weights


def reply_loss(model, batch: list[tuple[list[int], list[int], list[float]]], pad: int) -> torch.Tensor:
    """The weighted mean loss on the labelled (reply) tokens of a batch of (ids, labels,
    weights), padded on the right; with all weights 1 it is the model's own mean loss. No
    attention mask is needed: causal attention never looks forward from a real token to the
    padding (tests/test_imitation.py checks it equals the masked loss)."""
    width = max(len(ids) for ids, _, _ in batch)
    ids = torch.tensor([i + [pad] * (width - len(i)) for i, _, _ in batch])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab, _ in batch])[:, 1:]
    weights = torch.tensor([w + [0.0] * (width - len(w)) for _, _, w in batch])[:, 1:]
    logits = model(input_ids=ids).logits[:, :-1].float()
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    weights = weights * (labels != -100)
    return (losses * weights).sum() / weights.sum()


def pretrain(files: dict[str, str], out: Path, make_diff: Callable[[str, str, str], str],
             config: PretrainConfig = PretrainConfig(), skip: tuple[str, ...] = (), metric: str = "val_bpb",
             log: Callable[[str], None] = print) -> dict:
    """Train the tokenizer and the model on imitation examples of `files`; save both to `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, set_seed

    if config.init and config.digits:
        raise ValueError("digits makes a new tokenizer, and init goes on training a model with its own")
    started = time.monotonic()
    set_seed(config.seed)
    def draw(fits=None) -> list[Example]:
        return examples(files, random.Random(config.seed), make_diff, config.examples, skip, metric=metric,
                        max_changes=config.max_changes, reply=config.reply, momentum=config.momentum,
                        min_changes=config.min_changes, min_factor=config.min_factor, history=config.history,
                        fits=fits, hide=config.hide, max_factor=config.max_factor)

    pairs = None if config.init else draw()  # a new tokenizer is trained on them
    if config.init:  # go on training: the model's own tokenizer and window
        tokenizer = AutoTokenizer.from_pretrained(config.init)
        model = AutoModelForCausalLM.from_pretrained(config.init)
        positions = model.config.max_position_embeddings
    else:
        tokenizer = train_tokenizer([render_chat(None, e.messages) + e.reply for e in pairs], config.vocab_size,
                                    config.digits)
        positions = config.positions
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tokenizer), n_positions=positions, n_embd=config.width, n_layer=config.layers,
            # no dropout: attention dropout sends SDPA to its slow math kernel (a step took 3x as
            # long on this CPU), and a model this small fits few epochs of its data
            n_head=config.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id))
    if pairs is None or config.reply_tokens:  # prompts cut as the loop cuts them: the tokenizer counts
        pairs = draw(loop_fit(tokenizer, positions, config.reply_tokens))
    data = [seq for e in pairs if (seq := encode(tokenizer, e, positions, config.copy_weight))]
    if not data:
        raise ValueError(f"no example fits in {positions} positions")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    warmup = max(1, config.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 0.1 + 0.45 * (
        1 + math.cos(math.pi * min(1.0, s / config.steps)))))
    rng, losses, tokens = random.Random(config.seed), [], 0
    model.train()
    for step in range(config.steps):
        batch = [data[rng.randrange(len(data))] for _ in range(config.batch_size)]
        tokens += sum(len(i) for i, _, _ in batch)
        loss = reply_loss(model, batch, tokenizer.eos_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % max(1, config.steps // 10) == 0:
            log(f"step {step + 1}/{config.steps}: reply loss {sum(losses[-20:]) / len(losses[-20:]):.4f}")
    model.eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    stats = {"schema": 2, "config": asdict(config), "examples": len(data), "parameters": model.num_parameters(),
             "tokens_seen": tokens, "longest_prompt": max(labels.count(-100) for _, labels, _ in data),
             "first_loss": round(sum(losses[:20]) / len(losses[:20]), 4),
             "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
             "seconds": round(time.monotonic() - started, 1)}
    (out / "pretrain.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def valid_share(model_dir: Path, files: dict[str, str], apply: Callable[[dict[str, str], str], dict[str, str]],
                make_diff: Callable[[str, str, str], str], samples: int, temperature: float = 0.7,
                seed: int = 0, skip: tuple[str, ...] = (), metric: str = "val_bpb",
                tries: tuple[int, ...] = (0,), wander: int = 0, reply: str = "diff", momentum: float = 0.0,
                history: int = MAX_HISTORY, reply_tokens: int = 0, hide: float = 0.0,
                max_factor: float = 0.0) -> dict:
    """Sample replies to compact prompts of `files` (made-up histories, after a number of
    failed tries drawn from `tries`: (0,) is a first try; with `wander`, the files first
    moved by up to that many random steps, as the loop's keeps move best) and count those
    that parse, apply (`apply(files, diff)` -> (the new files, the stale removed lines it
    repaired), raising InvalidProposal on failure) and change at least one live constant; how
    many valid replies needed a repair, how many of the valid diffs are distinct, how many
    constants a valid reply changes on average, and how far it moves them: the median
    |ln(new / old)| over the positive numbers changed, and the share beyond the factor 3 that
    bounds the random policy's (and so the imitation data's) moves. With `momentum`, that share
    of the prompts is of imitation.py's momentum teacher: `repeat_asked` counts those whose
    teacher repeats the kept newest steps, `repeated` the replies that do, `named_kept` those
    that move at least one constant the kept steps moved (in any step or by any factor). With
    `reply_tokens`, prompts of up to `history` past experiments give way as the loop's do
    (loop_fit) and replies run to that many tokens at most; a share `hide` of the views leave
    out constants the history may name. With `max_factor` the failed tries include the loop's
    own (a step past it, a constant moved twice) and a reply moving a constant past it counts
    as `too_far`, as the loop rejects it (proposal.check_moves)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from ..proposal import InvalidProposal, check_moves

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    window = model.config.max_position_embeddings
    # prompts as the model was trained on them: an example whose prompt and reply do not fit
    # its window is drawn again (the loop's own prompt drops history to fit, docs/policies.md)
    rng, cases, drawn = random.Random(10_000 + seed), [], 0
    fits = loop_fit(tokenizer, window, reply_tokens)
    while len(cases) < samples:
        if drawn >= 20 * samples:
            raise ValueError(f"{len(cases)} of {drawn} imitation prompts fit the model's window of {window} positions")
        batch = examples(files, rng, make_diff, samples - len(cases), skip, metric=metric, wander=wander, tries=tries,
                         reply=reply, momentum=momentum, history=history, fits=fits,
                         hide=hide, max_factor=max_factor)
        drawn += len(batch)
        cases += [({**files, e.path: e.before}, e.messages, e.repeats, e.kept) for e in batch if encode(tokenizer, e, window)]
    torch.manual_seed(seed)
    counts = {"valid": 0, "repaired": 0, "no_diff": 0, "does_not_apply": 0, "does_not_parse": 0,
              "no_constant_changed": 0, "repeat_asked": 0, "repeated": 0,
              "named_kept": 0, "too_far": 0}
    limits = move_limits(max_factor, skip, metric)
    diffs, changed, moves = set(), 0, []
    for shown, prompt, repeat, kept in cases:
        ids = tokenizer(render_chat(tokenizer, prompt), add_special_tokens=False, return_tensors="pt")["input_ids"]
        # a reply runs to the end of the model's window at most (a prompt with two failed tries
        # leaves less than 384 positions; a reply that long has failed anyway)
        generation = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                      max_new_tokens=max(1, min(reply_tokens or 384, window - ids.shape[1])),
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=generation)
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        counts["repeat_asked"] += repeat is not None
        if repeat is not None:  # `again` or the kept steps written out
            steps = with_again(find_moves(text) or "", kept)
            counts["repeated"] += steps == repeat
            counts["named_kept"] += bool(step_names(steps) & step_names(repeat))
        try:
            _, diff = parse_reply(text, shown, make_diff,
                                  {p: find_sites(src, skip, metric=metric) for p, src in shown.items()}, kept)
            new, repairs = apply(shown, diff)
        except InvalidReply:
            counts["no_diff"] += 1
            continue
        except InvalidProposal:
            counts["does_not_apply"] += 1
            continue
        try:
            for path in new if limits else ():
                check_moves(limits, path, shown[path], new[path])
        except InvalidProposal:
            counts["too_far"] += 1
            continue
        before = {(p, s.name): s.value for p, src in shown.items() for s in find_sites(src, skip, metric=metric)}
        try:
            after = {(p, s.name): s.value for p, src in new.items() for s in find_sites(src, skip, metric=metric)}
        except SyntaxError:
            counts["does_not_parse"] += 1
            continue
        if before == after:
            counts["no_constant_changed"] += 1
            continue
        counts["valid"] += 1
        counts["repaired"] += bool(repairs)
        changed += sum(value != after.get(key) for key, value in before.items())
        moves += log_moves(before, after)
        diffs.add(diff)
    return {"samples": samples, **counts, "valid_share": counts["valid"] / samples, "distinct_valid": len(diffs),
            "changes_per_valid": round(changed / max(1, counts["valid"]), 3),
            **dict(zip(("median_abs_log_move", "beyond_factor_3"), move_summary(moves)))}


def pretrain_repo(store, config, out: Path, settings: PretrainConfig = PretrainConfig(),
                  log: Callable[[str], None] = print) -> dict:
    """Pre-train on best's editable files of a research repo and measure the valid share of
    replies to its compact prompt; the figures also go to OUT/pretrain.json."""
    _, files = best_files(store, config)
    stats = pretrain(files, out, store.make_diff, settings, config.policy.skip_constants,
                     config.metric.name, log)
    stats.update(check_repo(store, config, out, settings))
    (Path(out) / "pretrain.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def best_files(store, config) -> tuple[str, dict[str, str]]:
    """Best's commit (HEAD before a first keep) and its editable files: what the loop's first
    prompt shows."""
    best = store.best() or store.resolve("HEAD")
    return best, {path: store.read_file(best, path) for path in config.files.editable}


def check_repo(store, config, model_dir: Path, settings: PretrainConfig = PretrainConfig()) -> dict:
    """The valid shares of a policy LM's replies to a research repo's compact prompt: first
    tries, after failed tries, and on a moved best (valid_share), applied as the loop applies
    them (proposal.apply_or_repair)."""
    from ..proposal import apply_or_repair

    best, files = best_files(store, config)

    def apply(shown: dict[str, str], diff: str) -> tuple[dict[str, str], list[str]]:
        base = best if shown == files else store.commit_files(best, shown)
        tree, _, _, repairs = apply_or_repair(store, config, base, diff)
        return {path: store.tree_file(tree, path) for path in files}, repairs

    common = (model_dir, files, apply, store.make_diff, settings.eval_samples, settings.temperature,
              settings.seed, config.policy.skip_constants, config.metric.name)
    form = {"reply": settings.reply, "history": settings.history, "reply_tokens": settings.reply_tokens,
            "hide": settings.hide, "max_factor": settings.max_factor}
    return {"sampled": valid_share(*common, **form),
            # the prompt of a retry: the loop's 2nd and 3rd tries show the failed ones with their errors
            "sampled_after_failure": valid_share(*common, tries=(1, 2), **form),
            # best after the loop's keeps have moved it: values the model cannot have memorised
            "sampled_moved": valid_share(*common, wander=WANDER_STEPS, **form),
            # the newest past experiment kept, to a model taught momentum: does it repeat the steps?
            **({"sampled_after_keep": valid_share(*common, momentum=1.0, **form)} if settings.momentum else {})}
