"""
The research gym: the bundled nanochat target's constants, and the learning curve a surrogate
fitted to real runs of that target predicts for them, in a fraction of the time. This is the
file policies edit, as they would edit the real train.py.

    python train.py                          # a simulated 30 s CPU run, about half a second
    GITRESEARCH_BUDGET_S=60 python train.py  # the same curve, stretched over 60 simulated s

What it does: reads the constants below, checks the target's hard rules (WIDTH a multiple of
HEAD_DIM, an even HEAD_DIM, positive sizes: the real train.py crashes otherwise), and draws
the run from surrogate.json (frozen; fitted by benchmarks/fit_gym.py on recorded runs): it
diverges with the surrogate's crash probability, else it follows the predicted curve plus the
run-to-run noise measured on repeated real runs. Time is simulated: every point's "t" is
training seconds of the modelled run, and the gym sleeps surrogate.json's wall_per_sim_s per
simulated second, so early stopping sees a run that unfolds.

Reports as the real target does: progress lines, JSON lines {"t", "step", "val_bpb"} to
$GITRESEARCH_METRICS, and a final `---` summary block with val_bpb (self-reported: the gym
has no model to evaluate).
"""
import json
import math
import os
import random
import sys
import time
from pathlib import Path

# Model (the bundled target's CPU values)
DEPTH = 4  # transformer blocks
WIDTH = 128  # residual stream channels
HEAD_DIM = 64  # channels per attention head
MLP_RATIO = 4  # MLP hidden channels / WIDTH
LOGIT_SOFTCAP = 15.0  # tanh cap on the output logits

# Optimisation
BATCH_SIZE = 16  # sequences per step
MATRIX_LR = 0.005  # Muon learning rate of the block matrices (the main learning rate)
MUON_MOMENTUM = 0.95  # Muon's Nesterov momentum
EMBED_LR = 0.2  # AdamW learning rate of the token embedding
HEAD_LR = 0.004  # AdamW learning rate of the output head
ADAM_BETAS = (0.8, 0.95)  # AdamW betas
GRAD_CLIP = 1.0  # max global gradient norm, fixed for the whole run
WARMDOWN_FRAC = 0.4  # share of the budget at the end spent decaying the learning rates

CURVE_POINTS = 40  # learning-curve points over the budget, as the real target reports


def constants() -> dict:
    """This file's searched constants by the surrogate's names ("NAME" or "NAME[i]")."""
    values = {}
    for name, value in globals().items():
        if name.isupper() and isinstance(value, (int, float, tuple)):
            if isinstance(value, tuple):
                values.update({f"{name}[{i}]": v for i, v in enumerate(value)})
            else:
                values[name] = value
    return values


def hard_rules(values: dict) -> str | None:
    """Why the real target would crash at start, or None."""
    for name in ("DEPTH", "WIDTH", "HEAD_DIM", "MLP_RATIO", "BATCH_SIZE"):
        if not isinstance(values[name], int) or values[name] < 1:
            return f"{name} = {values[name]!r}: a size must be a positive int"
    if values["WIDTH"] % values["HEAD_DIM"] or values["HEAD_DIM"] % 2:
        return (f"RuntimeError: shape '[16, 256, {values['WIDTH'] // values['HEAD_DIM']}, {values['HEAD_DIM']}]' "
                f"is invalid for WIDTH {values['WIDTH']} (WIDTH must be a multiple of an even HEAD_DIM)")
    return None


def features(model: dict, values: dict) -> list[float]:
    """Each constant's place in the recorded range, on its search scale (0 and 1: the range's
    ends; values outside are clamped half a range beyond)."""
    out = []
    for f in model["features"]:
        v = float(values[f["name"]])
        if f["scale"] == "log":
            v = math.log(v) if v > 0 else -1e9
        elif f["scale"] == "logit":
            v = math.log(v / (1 - v)) if 0 < v < 1 else (1e9 if v >= 1 else -1e9)
        out.append(min(max((v - f["low"]) / (f["high"] - f["low"]), -0.5), 1.5))
    return out


def gp_mean(gp: dict, x: list[float]) -> list[float]:
    """The GP's posterior mean (Matern 5/2 kernel with one length scale per feature)."""
    outputs = [0.0] * len(gp["y_mean"])
    for row, alpha in zip(gp["x"], gp["alpha"]):
        d = math.sqrt(sum(((a - b) / s) ** 2 for a, b, s in zip(x, row, gp["length_scales"])))
        k = gp["amplitude"] * (1 + math.sqrt(5) * d + 5 / 3 * d * d) * math.exp(-math.sqrt(5) * d)
        for i, a in enumerate(alpha):
            outputs[i] += k * a
    return [o * s + m for o, s, m in zip(outputs, gp["y_std"], gp["y_mean"])]


def crash_probability(logit: dict, x: list[float]) -> float:
    z = logit["intercept"] + sum(w * v for w, v in zip(logit["coef"], x + [v * v for v in x]))
    return 1 / (1 + math.exp(-min(max(z, -40.0), 40.0)))


def main() -> int:
    model = json.loads((Path(__file__).resolve().parent / "surrogate.json").read_text())
    budget = float(os.environ.get("GITRESEARCH_BUDGET_S", model["budget_s"]))
    values = constants()
    # read through `values`, not by name: a constant read only in a print is bookkeeping to
    # the policies' search space (constants.py), and DEPTH and WIDTH must be searched
    print(f"gym: the bundled target's curve for depth {values['DEPTH']} width {values['WIDTH']} | "
          f"budget {budget:.0f}s (simulated)", flush=True)
    if why := hard_rules(values):
        print(f"Traceback (most recent call last):\n  ...\n{why}", flush=True)
        return 1
    x = features(model, values)
    predicted = {}
    for gp in model["gps"]:
        predicted.update(zip(gp["outputs"], gp_mean(gp, x)))
    fractions = model["fractions"]
    curve = [predicted[f"curve@{f:g}"] for f in fractions]
    # fresh noise every run, as a real run's; a loop with --seed gives each run its own seed,
    # the same for the same run in another loop with that seed (common random numbers)
    seed = os.environ.get("GITRESEARCH_SEED")
    rng = random.Random(int(seed) if seed else None)
    z = rng.gauss(0, 1)  # one draw per run: a lucky run is lower along its whole curve
    noise = model["noise"]
    steps = max(1, round(math.exp(predicted["log_steps"])))
    diverge_at = budget * rng.uniform(*model["diverge_fraction"]) if rng.random() < crash_probability(
        model["crash"], x) else None
    metrics_path = os.environ.get("GITRESEARCH_METRICS")
    sink = open(metrics_path, "a") if metrics_path else None
    pace = model["wall_per_sim_s"]
    value = curve[0]
    for k in range(CURVE_POINTS + 1):
        t = budget * k / CURVE_POINTS
        if diverge_at is not None and t >= diverge_at:
            step = round(steps * diverge_at / budget)
            print(f"FAIL: training diverged at step {step}: loss {2 * curve[0]:.4f} (initial {curve[0]:.4f})",
                  flush=True)
            if sink:
                sink.write(json.dumps({"t": round(diverge_at, 3), "step": step, "diverged": True}) + "\n")
            return 1
        time.sleep(pace * budget / CURVE_POINTS if k else 0.0)
        f = k / CURVE_POINTS
        i = min(int(f * (len(fractions) - 1)), len(fractions) - 2)
        w = (f - fractions[i]) / (fractions[i + 1] - fractions[i])
        sd = noise["curve_sd"][i] * (1 - w) + noise["curve_sd"][i + 1] * w
        value = curve[i] * (1 - w) + curve[i + 1] * w + z * sd + rng.gauss(0, noise["point_sd"])
        step = round(steps * f)
        if sink:
            sink.write(json.dumps({"t": round(t, 3), "step": step, "val_bpb": round(value, 6)}) + "\n")
            sink.flush()
        if k and k % 4 == 0:
            print(f"step {step:05d} ({100 * f:.1f}%) | val_bpb: {value:.6f}", flush=True)
    final = predicted["final"] + z * noise["final_sd"]
    print("---")
    print(f"val_bpb:          {final:.6f}")
    print(f"training_seconds: {budget:.1f}")
    print(f"num_steps:        {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
