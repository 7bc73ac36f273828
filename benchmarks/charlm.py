"""A byte-level language model that records learning curves for the early-stop corpora (a
second and third target family beside the bundled nanochat: not part of the product).

    GITRESEARCH_BUDGET_S=20 GITRESEARCH_METRICS=/tmp/m.jsonl python benchmarks/charlm.py

The recorder (make_curves.py --target charlm) copies this file and rewrites the constants
below. It trains MODEL on DATA for GITRESEARCH_BUDGET_S seconds of training (evaluation time is
not counted), writes CURVE_POINTS points {"t", "step", "val_bpb"} to GITRESEARCH_METRICS
(val_bpb on a fixed 32 KiB validation slice) and a last point {"final": true, "val_bpb"} on a
256 KiB slice. A loss above DIVERGE_FACTOR x its first value, or not finite, prints
"diverged" and exits 1.

Data: "stdlib" is the bundled target's corpus (CPython standard library source, bytes);
"markov" is generated here from SEED_DATA: a Zipf-weighted vocabulary of invented words joined
by an order-2 word Markov chain, with punctuation and line breaks (2 MiB, same bytes on every
machine for one seed).
"""
import json
import lzma
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MODEL = "lstm"  # lstm | gru | mlp
DATA = "stdlib"  # stdlib | markov
EMBED = 32  # byte embedding channels
WIDTH = 128  # recurrent state / MLP hidden channels
LAYERS = 1  # recurrent layers / MLP hidden layers
CONTEXT = 64  # bytes per training sequence (mlp: bytes of context per prediction)
BATCH_SIZE = 32  # sequences per step
LR = 0.002  # Adam learning rate
ADAM_BETA2 = 0.999  # Adam's second-moment decay
WEIGHT_DECAY = 0.0  # AdamW weight decay
DROPOUT = 0.0  # dropout between layers
GRAD_CLIP = 1.0  # max global gradient norm (1e9: none)
WARMDOWN_FRAC = 0.3  # share of the budget at the end with a linear decay to zero
SEED = 0  # initialisation and batch order
SEED_DATA = 7  # the generated corpus
CURVE_POINTS = 30  # validation points over the budget
DIVERGE_FACTOR = 1.5  # stop when the loss exceeds this multiple of the first loss
CORPUS = Path(os.environ.get("CHARLM_CORPUS", Path(__file__).resolve().parents[1] / "target_repo" / "data" / "corpus.txt.xz"))


def markov_text(seed: int, size: int = 2 << 20) -> bytes:
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    letter_p = 1.0 / np.arange(1, len(letters) + 1) ** 0.9
    letter_p /= letter_p.sum()
    words = [bytes(rng.choice(letters, size=int(rng.integers(1, 9)), p=letter_p)) for _ in range(600)]
    zipf = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    # each (previous, current) word pair prefers a few successors: order-2 structure
    successors = rng.integers(0, len(words), size=(len(words), 8))
    out, prev, cur, total = [], 0, 1, 0
    while total < size:
        if rng.random() < 0.7:
            nxt = int(successors[(prev * 31 + cur) % len(words), rng.integers(0, 8)])
        else:
            nxt = int(rng.choice(len(words), p=zipf / zipf.sum()))
        word = words[nxt]
        sep = b".\n" if rng.random() < 0.06 else (b", " if rng.random() < 0.08 else b" ")
        out.append(word + sep)
        total += len(word) + len(sep)
        prev, cur = cur, nxt
    return b"".join(out)[:size]


def load_data() -> tuple[torch.Tensor, torch.Tensor]:
    raw = lzma.decompress(CORPUS.read_bytes()) if DATA == "stdlib" else markov_text(SEED_DATA)
    data = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()).long()
    split = int(len(data) * 0.9)
    return data[:split], data[split:]


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, EMBED)
        rnn = nn.LSTM if MODEL == "lstm" else nn.GRU
        self.rnn = rnn(EMBED, WIDTH, LAYERS, batch_first=True, dropout=DROPOUT if LAYERS > 1 else 0.0)
        self.head = nn.Linear(WIDTH, 256)

    def forward(self, x):  # (B, T) -> (B, T, 256)
        out, _ = self.rnn(self.embed(x))
        return self.head(F.dropout(out, DROPOUT, self.training))


class Window(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, EMBED)
        layers, width = [], CONTEXT * EMBED
        for _ in range(LAYERS):
            layers += [nn.Linear(width, WIDTH), nn.GELU(), nn.Dropout(DROPOUT)]
            width = WIDTH
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 256)

    def forward(self, x):  # (B, CONTEXT) -> (B, 256): the byte after the window
        return self.head(self.body(self.embed(x).flatten(1)))


def batch(data: torch.Tensor, gen: torch.Generator, n: int):
    starts = torch.randint(0, len(data) - CONTEXT - 1, (n,), generator=gen)
    chunk = torch.stack([data[s:s + CONTEXT + 1] for s in starts.tolist()])
    if MODEL == "mlp":
        return chunk[:, :-1], chunk[:, -1]
    return chunk[:, :-1], chunk[:, 1:]


def loss_of(model, x, y) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))


@torch.no_grad()
def val_bpb(model, val: torch.Tensor, n_bytes: int) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(1234)  # the same slice every time
    per_batch = 64 if MODEL != "mlp" else 2048
    targets = per_batch * (CONTEXT if MODEL != "mlp" else 1)
    total, count = 0.0, 0
    while count < n_bytes:
        x, y = batch(val, gen, per_batch)
        total += loss_of(model, x, y).item() * targets
        count += targets
    model.train()
    return total / count / math.log(2)


def main() -> int:
    budget = float(os.environ.get("GITRESEARCH_BUDGET_S", 20))
    metrics = open(os.environ["GITRESEARCH_METRICS"], "a") if os.environ.get("GITRESEARCH_METRICS") else None
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(SEED)
    train, val = load_data()
    model = Recurrent() if MODEL in ("lstm", "gru") else Window()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, ADAM_BETA2), weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(SEED)

    def emit(point: dict) -> None:
        if metrics:
            metrics.write(json.dumps(point) + "\n")
            metrics.flush()

    trained, step, first_loss, next_point = 0.0, 0, None, budget / CURVE_POINTS
    while trained < budget:
        frac = trained / budget
        decay = min(1.0, (1.0 - frac) / WARMDOWN_FRAC) if WARMDOWN_FRAC > 0 else 1.0
        for group in opt.param_groups:
            group["lr"] = LR * decay
        start = time.perf_counter()
        x, y = batch(train, gen, BATCH_SIZE)
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        trained += time.perf_counter() - start
        step += 1
        value = loss.item()
        first_loss = first_loss if first_loss is not None else value
        if not math.isfinite(value) or value > DIVERGE_FACTOR * first_loss:
            print(f"diverged at step {step}: loss {value:.4g} (first {first_loss:.4g})")
            return 1
        if trained >= next_point or trained >= budget:
            emit({"t": round(trained, 3), "step": step, "val_bpb": val_bpb(model, val, 32 << 10)})
            next_point += budget / CURVE_POINTS
    final = val_bpb(model, val, 256 << 10)
    emit({"final": True, "t": round(trained, 3), "step": step, "val_bpb": final})
    print(f"val_bpb: {final:.6f}\nsteps: {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
