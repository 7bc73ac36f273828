"""
nanochat-style GPT pretraining under a fixed wall-clock budget. This is the file policies edit.

    python train.py                          # budget from GITRESEARCH_BUDGET_S (default 300 s)
    GITRESEARCH_BUDGET_S=60 python train.py  # a one-minute run

Two scales, chosen at start: on a CUDA GPU, GPT-2 small (12 layers, 768 wide) in bf16 with
torch.compile; on a CPU, a small model that learns within a minute on 2 cores. Only training
steps count against the budget: start-up, compilation, the periodic estimates and saving the
model do not. Data and tokenizer come from the frozen prepare.py; training never sees the
validation split. At the end the model is saved with prepare.save_model(), and the frozen
evaluate.py, run by the harness in a sandbox of its own, measures its val_bpb.

Reports: progress lines and a final `---` summary block on stdout (autoresearch format), and
JSON lines {"t", "step", "train_loss", "val_bpb"} to $GITRESEARCH_METRICS when it is set; their
val_bpb is the learning curve's estimate on a held-out slice of the train split (dev tokens).
"""
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import prepare

CUDA = torch.cuda.is_available()

# Model
DEPTH = 12 if CUDA else 4  # transformer blocks
WIDTH = 768 if CUDA else 128  # residual stream channels
HEAD_DIM = 64  # channels per attention head
MLP_RATIO = 4  # MLP hidden channels / WIDTH
LOGIT_SOFTCAP = 15.0  # tanh cap on the output logits

# Optimisation
BATCH_SIZE = 32 if CUDA else 16  # sequences per step
MATRIX_LR = 0.005  # Muon learning rate of the block matrices (the main learning rate)
MUON_MOMENTUM = 0.95  # Muon's Nesterov momentum
EMBED_LR = 0.2  # AdamW learning rate of the token embedding
HEAD_LR = 0.004  # AdamW learning rate of the output head
ADAM_BETAS = (0.8, 0.95)  # AdamW betas
WEIGHT_DECAY = 0.0  # AdamW weight decay of embedding and head
GRAD_CLIP = 1.0  # max global gradient norm, fixed for the whole run
WARMUP_FRAC = 0.0  # share of the budget spent ramping the learning rates up
WARMDOWN_FRAC = 0.4  # share of the budget at the end spent decaying them linearly
FINAL_LR_FRAC = 0.0  # learning-rate multiplier at the end of the warmdown

# Bookkeeping
SEED = 1337  # data order and initialisation
CURVE_POINTS = 40  # periodic validation estimates over the budget (learning curve)
LOG_EVERY_S = 1.0  # seconds of training between progress lines
DIVERGE_FACTOR = 1.5  # fail when the loss exceeds this multiple of the initial loss


def norm(x):
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len, head_dim, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos()[None, None], freqs.sin()[None, None]


def apply_rotary(x, cos, sin):
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    t = x.size(-2)
    cos, sin = cos[..., :t, :].to(x.dtype), sin[..., :t, :].to(x.dtype)
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, width, head_dim):
        super().__init__()
        self.n_head, self.head_dim = width // head_dim, head_dim
        self.c_q = nn.Linear(width, width, bias=False)
        self.c_k = nn.Linear(width, width, bias=False)
        self.c_v = nn.Linear(width, width, bias=False)
        self.c_proj = nn.Linear(width, width, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        q, k, v = (lin(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
                   for lin in (self.c_q, self.c_k, self.c_v))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, width, ratio):
        super().__init__()
        self.c_fc = nn.Linear(width, ratio * width, bias=False)
        self.c_proj = nn.Linear(ratio * width, width, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, width, head_dim, mlp_ratio):
        super().__init__()
        self.attn = Attention(width, head_dim)
        self.mlp = MLP(width, mlp_ratio)

    def forward(self, x, cos, sin):
        x = x + self.attn(norm(x), cos, sin)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len, depth=DEPTH, width=WIDTH, head_dim=HEAD_DIM,
                 mlp_ratio=MLP_RATIO):
        super().__init__()
        width = max(head_dim, round(width / head_dim) * head_dim)  # a whole number of heads
        self.wte = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList(Block(width, head_dim, mlp_ratio) for _ in range(depth))
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        cos, sin = rotary_tables(seq_len, head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self):
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(lin.weight, -3 ** 0.5 / lin.in_features ** 0.5,
                                 3 ** 0.5 / lin.in_features ** 0.5)
            nn.init.zeros_(block.attn.c_proj.weight)  # each block starts as the identity
            nn.init.zeros_(block.mlp.c_proj.weight)

    def forward(self, idx, targets=None):
        x = norm(self.wte(idx))
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        logits = self.lm_head(norm(x)).float()
        logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def newton_schulz(grad, steps=5):
    """Approximately orthogonalise a matrix (the quintic iteration of Muon)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = grad.bfloat16() if CUDA else grad.float()
    tall = grad.size(-2) > grad.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(grad.dtype)


class Muon(torch.optim.Optimizer):
    """SGD with Nesterov momentum whose 2-D updates are orthogonalised (Keller Jordan's Muon)."""

    def __init__(self, params, lr, momentum):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = newton_schulz(p.grad.lerp(buf, group["momentum"]))
                scale = max(1.0, p.size(-2) / p.size(-1)) ** 0.5
                p.add_(update, alpha=-group["lr"] * scale)


def build_optimizers(model):
    matrices = [p for p in model.blocks.parameters() if p.ndim == 2]
    adam = torch.optim.AdamW([dict(params=[model.wte.weight], lr=EMBED_LR),
                              dict(params=[model.lm_head.weight], lr=HEAD_LR)],
                             betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY, eps=1e-10)
    muon = Muon(matrices, lr=MATRIX_LR, momentum=MUON_MOMENTUM)
    optimizers = [adam, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers


def lr_multiplier(progress):
    if progress < WARMUP_FRAC:
        return (progress + 1e-3) / WARMUP_FRAC
    if progress > 1 - WARMDOWN_FRAC:
        return FINAL_LR_FRAC + (1 - FINAL_LR_FRAC) * (1 - progress) / WARMDOWN_FRAC
    return 1.0


def peak_memory_mb():
    if CUDA:
        return torch.cuda.max_memory_allocated() / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main(max_steps=None):
    """Train until the budget is spent (or `max_steps`, for tests), save the model and return it."""
    wall_start = time.time()
    torch.manual_seed(SEED)
    device = "cuda" if CUDA else "cpu"
    spec, budget = prepare.spec(), prepare.budget_seconds()
    train_tokens, dev_tokens, token_bytes = prepare.load_train()
    model = GPT(spec.vocab_size, spec.seq_len).to(device)
    model.init_weights()
    optimizers = build_optimizers(model)
    step_model = torch.compile(model) if CUDA else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=CUDA)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"device: {device} | params: {num_params / 1e6:.2f}M | depth {DEPTH} width {WIDTH} "
          f"| batch {BATCH_SIZE}x{spec.seq_len} | budget {budget:.0f}s", flush=True)

    metrics_path = os.environ.get("GITRESEARCH_METRICS")
    metrics = open(metrics_path, "a") if metrics_path else None

    def report(**fields):
        if metrics:
            metrics.write(json.dumps(fields) + "\n")
            metrics.flush()

    def estimate_bpb(max_tokens=spec.quick_eval_tokens):
        with autocast:
            return prepare.evaluate_bpb(model, dev_tokens, token_bytes, spec.seq_len,
                                        max_tokens, batch_size=8, device=device)

    batch_gen = torch.Generator().manual_seed(SEED)

    def next_batch():
        starts = torch.randint(len(train_tokens) - spec.seq_len - 1, (BATCH_SIZE,),
                               generator=batch_gen)
        rows = torch.stack([train_tokens[s: s + spec.seq_len + 1] for s in starts.tolist()])
        return rows[:, :-1].to(device), rows[:, 1:].to(device)

    report(t=0.0, step=0, val_bpb=estimate_bpb())
    train_seconds, step, first_loss, loss_value = 0.0, 0, None, float("nan")
    next_log, next_curve = LOG_EVERY_S, budget / CURVE_POINTS
    while train_seconds < budget and (max_steps is None or step < max_steps):
        t0 = time.perf_counter()
        x, y = next_batch()
        with autocast:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        multiplier = lr_multiplier(train_seconds / budget)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * multiplier
            opt.step()
        model.zero_grad(set_to_none=True)
        loss_value = loss.item()  # also synchronises CUDA, so the step time is honest
        dt = time.perf_counter() - t0
        step += 1
        if not (CUDA and step == 1):  # the first CUDA step is mostly compilation
            train_seconds += dt
        first_loss = first_loss or loss_value
        if not math.isfinite(loss_value) or loss_value > DIVERGE_FACTOR * first_loss:
            print(f"FAIL: training diverged at step {step}: loss {loss_value:.4f} "
                  f"(initial {first_loss:.4f})", flush=True)
            report(t=round(train_seconds, 3), step=step, train_loss=loss_value, diverged=True)
            sys.exit(1)
        if train_seconds >= next_log or train_seconds >= budget:
            next_log += LOG_EVERY_S
            tok_per_s = BATCH_SIZE * spec.seq_len / dt
            print(f"step {step:05d} ({min(100.0, 100 * train_seconds / budget):.1f}%) | "
                  f"loss: {loss_value:.6f} | lrm: {multiplier:.2f} | dt: {dt * 1000:.0f}ms | "
                  f"tok/sec: {tok_per_s:,.0f} | remaining: {max(0.0, budget - train_seconds):.0f}s",
                  flush=True)
        if train_seconds >= next_curve and train_seconds < budget:
            next_curve += budget / CURVE_POINTS
            report(t=round(train_seconds, 3), step=step, train_loss=loss_value,
                   val_bpb=estimate_bpb())

    dev_bpb = estimate_bpb()
    report(t=round(train_seconds, 3), step=step, train_loss=loss_value, val_bpb=dev_bpb)
    prepare.save_model(model)
    print("---")
    print(f"dev_bpb:          {dev_bpb:.6f}")
    print(f"training_seconds: {train_seconds:.1f}")
    print(f"total_seconds:    {time.time() - wall_start:.1f}")
    print(f"peak_vram_mb:     {peak_memory_mb():.1f}")
    print(f"num_steps:        {step}")
    print(f"num_params_M:     {num_params / 1e6:.2f}")
    print(f"depth:            {DEPTH}")
    return model


if __name__ == "__main__":
    main()
