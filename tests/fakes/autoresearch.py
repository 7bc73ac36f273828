"""A fake autoresearch-style train.py: progress lines redrawn with `\r` and printed with
end="" (no GITRESEARCH_METRICS points), a summary block, a `2**k` constant, an MFU-only
constant and a head dim that must be even and divide the width (else a shape crash). Its
training loss tracks its final val_bpb, which depends on the constants."""
import math
import os
import sys
import time

H100_BF16_PEAK_FLOPS = 989.5e12  # only feeds the printed MFU
TOTAL_BATCH_SIZE = 2**12  # tokens per step
HEAD_DIM = 32  # channels per attention head
WIDTH = 128  # model channels: a whole number of heads
MATRIX_LR = 0.04  # learning rate

budget = float(os.environ.get("GITRESEARCH_BUDGET_S", "1"))
if HEAD_DIM % 2 or WIDTH % HEAD_DIM:
    sys.exit(f"RuntimeError: shape mismatch: width {WIDTH} is not a whole number of even heads of {HEAD_DIM}")
final = (1.0 + 0.3 * (math.log10(MATRIX_LR) + 1.4) ** 2 + 0.05 * abs(math.log2(TOTAL_BATCH_SIZE) - 13)
         + 0.02 * abs(WIDTH - 192) / 64)
start = time.time()
mfu = 0.0
steps = 24  # progress lines over the budget (not a research constant)
for step in range(1, steps + 1):
    time.sleep(budget / steps)
    frac = step / steps
    loss = 1.1 * final + 0.05 + 2.0 * (1 - frac) ** 2
    mfu = 100 * 6e6 * TOTAL_BATCH_SIZE / (budget / steps) / H100_BF16_PEAK_FLOPS
    print(f"\rstep {step:05d} ({100 * frac:.1f}%) | loss: {loss:.6f} | tok/sec: {TOTAL_BATCH_SIZE * steps / budget:,.0f} "
          f"| mfu: {mfu:.1f}% | remaining: {budget * (1 - frac):.0f}s    ", end="", flush=True)
print()
print("---")
print(f"val_bpb:          {final:.6f}")
print(f"training_seconds: {time.time() - start:.1f}")
print(f"mfu_percent:      {mfu:.2f}")
print(f"num_steps:        {steps}")
