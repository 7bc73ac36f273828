"""PPO update memory and time at real vocabulary sizes: peak memory and seconds per update
for a 2K-token prompt and a 256-token reply at a 32K and a 152K vocabulary, measured on
this CPU with tiny random models built from configs (no download), production scoring
(the LM head on the replies' positions only, chunked log-softmax and entropy) against the
former full-vocabulary scoring (logits, log-softmax and entropy for every position); and
H100 estimates for real model sizes that include the logits.

    python benchmarks/ppo_memory.py                  # both vocabularies, both scorings (~3 min)
    python benchmarks/ppo_memory.py --json > benchmarks/results/ppo_memory.jsonl

Measured: each (vocabulary, scoring) runs in a fresh process (peak RSS is a high-water
mark); the model is GPT-2 with --layers x --width and the given vocabulary (the weights are
tiny next to the logits, which is the point); LoRA rank 8; `[rl]` defaults otherwise
(ppo_epochs 4, minibatch 1, logit_chunk 64, gradient checkpointing on); --episodes episodes
of --prompt-tokens + --reply-tokens random token ids. `peak_update_mb` is the process's peak
RSS during the update (VmHWM, reset just before it) minus its RSS before it.

Estimated (labelled "estimate", nothing run): one H100 (bf16 weights, fp32 logits as the
scoring computes them), Qwen2.5 shapes (hidden d, vocabulary V = 151,936, non-embedding
parameters N). P prompt and R reply tokens, L = P + R, S scored positions (R for reply-only,
L for full), c = logit_chunk:
    logits memory (largest live fp32 tensors while scoring one episode):
        full:       3 x S x V x 4 bytes (logits, log-softmax, softmax for the entropy) kept
                    for the backward pass, plus their gradient
        reply-only: bf16 logits R x V x 2 kept, plus 3 x c x V x 4 for the chunk being
                    computed (the chunks are recomputed in the backward pass)
    update time = ppo_epochs x episodes x (6 N L [LoRA forward + backward + the checkpoint's
                  recomputed forward] + 8 d V S [LM head forward, backward, recompute of the
                  chunks]) / (0.4 x 989e12)
Output: a table, or with --json one object per row: {"kind": "measured" | "estimate",
"vocab", "scoring", "prompt_tokens", "reply_tokens", "peak_update_mb" | "logits_gb",
"update_s", ...}.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

H100_BF16_FLOPS, MFU = 989e12, 0.4
QWEN = {"Qwen2.5-0.5B": (896, 0.36e9), "Qwen2.5-1.5B": (1536, 1.31e9), "Qwen2.5-7B": (3584, 6.53e9)}
QWEN_VOCAB = 151936


def status_mb(key: str) -> float:
    """VmRSS (now) or VmHWM (the high-water mark) of this process, in MB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key + ":")) / 1024


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS (proc(5))."""
    Path("/proc/self/clear_refs").write_text("5")


def full_scoring(ppo, episodes):
    """The former path: full-vocabulary logits at every position, then the replies' slice."""
    seqs = [e.prompt_ids + e.response_ids for e in episodes]
    ids = torch.tensor(seqs)
    out = ppo.model(input_ids=ids, output_hidden_states=True, use_cache=False)
    logp_all = torch.log_softmax(out.logits[:, :-1].float() / ppo.temperature, dim=-1)
    token = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    values = ppo.value_head(out.hidden_states[-1][:, :-1].float()).squeeze(-1)
    n = len(episodes[0].response_ids)
    return [token[0, -n:]], [values[0, -n:]], [entropy[0, -n:]]


def measure_one(args) -> dict:
    """In this process: one vocabulary, one scoring."""
    import transformers

    from gitresearch.config import LLMConfig, RLConfig
    from gitresearch.policies.ppo import Episode, PPOLearner
    sys.path.insert(0, str(Path(__file__).parent))
    from ppo_speed import tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model(Path(tmp) / "m", args.layers, args.width)
        config = transformers.GPT2Config.from_pretrained(path)
        config.vocab_size, config.n_positions = args.vocab, args.prompt_tokens + args.reply_tokens + 8
        transformers.set_seed(0)
        transformers.GPT2LMHeadModel(config).save_pretrained(path)
        ppo = PPOLearner(str(path), RLConfig(lora_r=8, lora_alpha=16.0),
                         LLMConfig(max_tokens=args.reply_tokens, temperature=1.0, device="cpu"))
    if args.scoring == "full":
        ppo.score = lambda episodes: full_scoring(ppo, episodes)
    generator = torch.Generator().manual_seed(0)
    for i in range(args.episodes):
        prompt = torch.randint(0, args.vocab, (args.prompt_tokens,), generator=generator).tolist()
        reply = torch.randint(0, args.vocab, (args.reply_tokens,), generator=generator).tolist()
        episode = Episode(prompt, reply, [0.0] * len(reply), [0.0] * len(reply), [0.0] * len(reply), 0)
        with torch.no_grad():
            logps, values, _ = ppo.score([episode])
        episode.logprobs = episode.ref_logprobs = logps[0].tolist()
        episode.values = values[0].tolist()
        ppo.add(episode, float(i % 2))
    reset_peak()
    before = status_mb("VmRSS")
    started = time.perf_counter()
    stats = ppo.update()
    seconds = time.perf_counter() - started
    peak = status_mb("VmHWM")
    return {"kind": "measured", "device": "cpu", "threads": torch.get_num_threads(), "vocab": args.vocab,
            "scoring": args.scoring, "prompt_tokens": args.prompt_tokens, "reply_tokens": args.reply_tokens,
            "episodes": args.episodes, "ppo_epochs": 4, "rss_before_mb": round(before),
            "peak_update_mb": round(peak - before),
            "update_s": round(seconds, 2), "skipped": stats.get("skipped")}


def estimate(name: str, prompt: int, reply: int, scoring: str, episodes: int = 8, epochs: int = 4,
             chunk: int = 64) -> dict:
    hidden, params = QWEN[name]
    length = prompt + reply
    scored = reply if scoring == "reply-only" else length
    if scoring == "full":
        logits = 3 * scored * QWEN_VOCAB * 4 * 2  # the three fp32 tensors and their gradient
    else:
        logits = reply * QWEN_VOCAB * 2 + 3 * chunk * QWEN_VOCAB * 4
    flops = epochs * episodes * (6 * params * length + 8 * hidden * QWEN_VOCAB * scored)
    return {"kind": "estimate", "device": "H100 SXM", "model": name, "vocab": QWEN_VOCAB, "scoring": scoring,
            "prompt_tokens": prompt, "reply_tokens": reply, "episodes": episodes, "ppo_epochs": epochs,
            "logits_gb": round(logits / 1e9, 2), "update_s": round(flops / (H100_BF16_FLOPS * MFU), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32768, 152064])
    parser.add_argument("--scoring", nargs="+", default=["reply-only", "full"], choices=["reply-only", "full"])
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--reply-tokens", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one row
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.one:
        args.vocab, args.scoring = args.vocab[0], args.scoring[0]
        print(json.dumps(measure_one(args)))
        return 0
    rows = []
    for vocab in args.vocab:
        for scoring in args.scoring:
            child = [sys.executable, __file__, "--one", "--vocab", str(vocab), "--scoring", scoring,
                     "--layers", str(args.layers), "--width", str(args.width), "--episodes", str(args.episodes),
                     "--prompt-tokens", str(args.prompt_tokens), "--reply-tokens", str(args.reply_tokens)]
            done = subprocess.run(child, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(child)} exited {done.returncode}:\n{done.stderr[-3000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name in QWEN:
        for prompt, reply in ((2048, 256), (14336, 1024)):
            rows += [estimate(name, prompt, reply, scoring) for scoring in ("reply-only", "full")]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{'kind':>9} {'model':>13} {'vocab':>7} {'scoring':>10} {'prompt':>6} {'reply':>5} "
          f"{'peak MB / logits GB':>19} {'update s':>8}")
    for r in rows:
        memory = r["peak_update_mb"] if r["kind"] == "measured" else r["logits_gb"]
        print(f"{r['kind']:>9} {r.get('model', 'tiny GPT-2'):>13} {r['vocab']:>7} {r['scoring']:>10} "
              f"{r['prompt_tokens']:>6} {r['reply_tokens']:>5} {memory:>19} {r['update_s']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
