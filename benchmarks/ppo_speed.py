"""PPO cost: seconds per generation and per PPO update, measured for a tiny model on this
machine's CPU, and estimated for 0.5-7B models with LoRA on one H100 from FLOPs and bytes.

    python benchmarks/ppo_speed.py              # measure the tiny model, print the estimates
    python benchmarks/ppo_speed.py --json

Measured: a tiny GPT-2 (random weights, built here from a config: no download; byte-level
BPE vocabulary of 400, --layers x --width) with LoRA rank 8 on c_attn; a prompt of
--prompt-tokens tokens, replies of --reply-tokens tokens (EOS suppressed); an update of
--episodes episodes x ppo_epochs 4, minibatch 1, as `[rl]` defaults do.

Estimated (labelled "estimate", nothing run): H100 SXM, bf16 dense 989 TFLOP/s at 40 % MFU
for prefill and training, 3.35 TB/s HBM at 60 % efficiency for decoding (batch 1 decoding
reads every weight once per token: memory-bound). N = parameters, P = prompt tokens,
R = reply tokens, L = P + R:
    generation     = 2 N P / (0.4 x 989e12)  +  R x 2 N / (0.6 x 3.35e12)   (bf16 weights)
                     + 2 scoring passes (policy and reference): 2 x 2 N L / (0.4 x 989e12)
    update         = ppo_epochs x episodes x 4 N L / (0.4 x 989e12)
(LoRA: the backward pass still carries activation gradients through the frozen weights,
~2 N L, but computes no weight gradient for them: 4 N L per sequence instead of 6 N L.)
These are roofline bounds: transformers' `generate` at batch 1 is bound by kernel launches
and Python for small models (tens of ms per token rather than the ~0.5 ms the bandwidth
allows for 0.5B), so expect its decoding to be several times slower than estimated; an
inference engine with CUDA graphs comes close to the bound.

Output: a table, or with --json one object per line: {"kind": "measured" | "estimate", ...}.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from gitresearch.config import LLMConfig, RLConfig
from gitresearch.policies.ppo import PPOLearner

H100_BF16_FLOPS, H100_HBM = 989e12, 3.35e12
MFU, BANDWIDTH_EFFICIENCY = 0.4, 0.6


def tiny_model(path: Path, layers: int, width: int) -> Path:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([Path(__file__).read_text()] * 4, trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>").save_pretrained(path)
    config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=8192,
                                     n_embd=width, n_layer=layers, n_head=max(1, width // 32),
                                     eos_token_id=0, bos_token_id=0)
    transformers.set_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def measure(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp) / "m", args.layers, args.width)
        ppo = PPOLearner(str(model), RLConfig(lora_r=8, lora_alpha=16.0),
                         LLMConfig(max_tokens=args.reply_tokens, temperature=1.0, device="cpu"))
        ppo.eos = None  # full-length replies: a fair per-token figure
        prompt = ("x = 1\n" * args.prompt_tokens)[: args.prompt_tokens * 2]
        while ppo.count_tokens(prompt) > args.prompt_tokens:
            prompt = prompt[: int(len(prompt) * 0.95)]
        messages = [{"role": "user", "content": prompt}]
        generation = []
        for i in range(args.episodes):
            started = time.perf_counter()
            _, episode = ppo.generate(messages, seed=i)
            generation.append(time.perf_counter() - started)
            ppo.add(episode, float(i % 2))
        updates = []
        for _ in range(args.updates):
            started = time.perf_counter()
            ppo.update()
            updates.append(time.perf_counter() - started)
            ppo.version = 0  # keep the same episodes fresh for the next timing
        params = sum(p.numel() for p in ppo.model.parameters())
    return {"kind": "measured", "device": "cpu", "threads": torch.get_num_threads(), "params": params,
            "prompt_tokens": len(episode.prompt_ids), "reply_tokens": len(episode.response_ids),
            "episodes_per_update": args.episodes, "ppo_epochs": 4,
            "generation_s": round(statistics.median(generation), 4),
            "update_s": round(statistics.median(updates), 4)}


def estimate(params: float, prompt: int, reply: int, episodes: int, epochs: int = 4) -> dict:
    length = prompt + reply
    compute = H100_BF16_FLOPS * MFU
    generation = (2 * params * prompt / compute + reply * 2 * params / (H100_HBM * BANDWIDTH_EFFICIENCY)
                  + 2 * 2 * params * length / compute)
    update = epochs * episodes * 4 * params * length / compute
    return {"kind": "estimate", "device": "H100 SXM (bf16, LoRA)", "params": params,
            "prompt_tokens": prompt, "reply_tokens": reply, "episodes_per_update": episodes,
            "ppo_epochs": epochs, "generation_s": round(generation, 2), "update_s": round(update, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--reply-tokens", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(args)]
    rows += [estimate(n, 8192, 1024, 6) for n in (0.5e9, 1.5e9, 7e9)]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{'kind':>9} {'device':>22} {'params':>10} {'prompt':>7} {'reply':>6} {'episodes':>8} "
          f"{'generation s':>13} {'update s':>9}")
    for r in rows:
        print(f"{r['kind']:>9} {r['device']:>22} {r['params']:>10.3g} {r['prompt_tokens']:>7} "
              f"{r['reply_tokens']:>6} {r['episodes_per_update']:>8} {r['generation_s']:>13} {r['update_s']:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
