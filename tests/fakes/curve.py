"""A fake train.py: a scripted learning curve whose final value depends on its constants."""
import json
import math
import os
import time

LR = 0.1  # learning rate
DEPTH = 4  # layers
STEP_S = 0.0  # seconds per step (wall)

budget = float(os.environ.get("GITRESEARCH_BUDGET_S", "1"))
final = 2.0 + (math.log10(LR) + 2) ** 2 * 0.1 + abs(DEPTH - 6) * 0.05
metrics = open(os.environ["GITRESEARCH_METRICS"], "a")
for step in range(1, 11):
    t = budget * step / 10
    time.sleep(STEP_S)
    value = final + 2.0 * t ** -0.5 / (1 + step)
    metrics.write(json.dumps({"t": t, "step": step, "train_loss": value, "val_bpb": value}) + "\n")
    metrics.flush()
    print(f"step {step:05d} ({10 * step:.1f}%) | loss: {value:.6f}", flush=True)
print("---")
print(f"val_bpb:          {final:.6f}")
print(f"training_seconds: {budget:.1f}")
print("environment:", " ".join(sorted(os.environ)))
