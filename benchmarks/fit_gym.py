"""Fits the research gym's surrogate (gym_repo/surrogate.json) to the recorded runs of the
bundled target (record_gym.py), and reports its fidelity on runs held out from the fit.

    python benchmarks/fit_gym.py --data benchmarks/data/gym_nanochat_30s.jsonl \
        --out gym_repo/surrogate.json --report benchmarks/results/gym_fidelity.json   # ~1 min

The surrogate, per configuration (each constant's place in its search range, on the scale
the optuna policy searches it: log, log-odds or linear):
- two Gaussian processes (scikit-learn, Matern 5/2 with one length scale per constant plus a
  white-noise term, fitted by maximum likelihood): one for the learning curve at 11
  fractions of the budget and the final val_bpb, one for log(training steps);
- a logistic regression on the constants and their squares for the probability that the run
  diverges or crashes;
- the noise, from the repeated configurations: the final's sd, the curve's sd per fraction
  (the part shared along a run) and a point's own jitter.

Fidelity: 5-fold cross-validation over the runs that are not repeats (every run predicted by
a fit that never saw it; the repeats always stay in the fit), and "after_freeze": the model
as designed when --frozen-at runs were recorded (92: this design was chosen then, on the
cross-validation of those runs), fitted on them alone and scored on every run recorded
after. Report (JSON): Spearman rank correlation of the held-out finals, their RMSE and the
noise sd, the crash probability's calibration by bins with the Brier score against the base
rate's.
"""
import argparse
import hashlib
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

sys.path.insert(0, str(ROOT / "gym_repo"))

import train as gym  # noqa: E402  (the gym's own feature and prediction code)
from record_gym import target_space  # noqa: E402
from gitresearch.earlystop import value_at  # noqa: E402

FRACTIONS = [i / 10 for i in range(11)]
CURVE_OUTPUTS = [f"curve@{f:g}" for f in FRACTIONS] + ["final"]
WALL_PER_SIM_S = 1 / 60  # the gym's pace: a simulated 30 s run takes half a second
CRASH_BINS = [0.0, 0.1, 0.3, 0.6, 1.0]


def feature_spec() -> list[dict]:
    spec = []
    for name, dim in target_space().items():
        if hasattr(dim.dist, "choices"):
            continue
        scale = "logit" if dim.logit else ("log" if dim.dist.log else "linear")
        low, high = (math.log(dim.dist.low), math.log(dim.dist.high)) if scale == "log" else (dim.dist.low, dim.dist.high)
        spec.append({"name": name, "scale": scale, "low": low, "high": high})
    return spec


def features(spec: list[dict], config: dict) -> list[float]:
    """As gym_repo/train.py computes them (it is the same function)."""
    return gym.features({"features": spec}, config)


def curve_at(record: dict) -> list[float]:
    times = [p[0] / record["budget_s"] for p in record["points"]]
    values = [p[1] for p in record["points"]]
    return [value_at(times, values, f) if f <= times[-1] else values[-1] for f in FRACTIONS]


def noise(records: list[dict]) -> dict:
    """Pooled sds of the repeated configurations: final, curve per fraction, point jitter."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        if r["draw"] == "repeat" and r["status"] == "ok":
            groups.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r)
    groups = [g for g in groups.values() if len(g) >= 2]

    def pooled(values_per_group):
        num = sum(sum((v - statistics.mean(vs)) ** 2 for v in vs) for vs in values_per_group)
        return math.sqrt(num / sum(len(vs) - 1 for vs in values_per_group))

    jitter = []
    for r in records:
        if r["status"] == "ok":
            v = [p[1] for p in r["points"]]
            jitter += [v[k] - (v[k - 1] + v[k + 1]) / 2 for k in range(2, len(v) - 1)]
    point_sd = statistics.pstdev(jitter) / math.sqrt(1.5) if jitter else 0.0
    curve_sd = [pooled([[curve_at(r)[i] for r in g] for g in groups]) for i in range(len(FRACTIONS))]
    return {"final_sd": pooled([[r["final"] for r in g] for g in groups]),
            "curve_sd": [math.sqrt(max(sd * sd - point_sd * point_sd, 0.0)) for sd in curve_sd],
            "point_sd": point_sd, "groups": [len(g) for g in groups]}


def fit_gp(x: np.ndarray, y: np.ndarray, outputs: list[str]) -> dict:
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    kernel = (ConstantKernel(1.0, (1e-3, 1e3)) * Matern(np.ones(x.shape[1]), (1e-2, 1e2), nu=2.5)
              + WhiteKernel(0.1, (1e-6, 1.0)))
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=3, random_state=0).fit(x, y)
    product = gp.kernel_.k1
    return {"outputs": outputs, "x": gp.X_train_.tolist(), "alpha": gp.alpha_.reshape(len(x), -1).tolist(),
            "amplitude": float(product.k1.constant_value),
            "length_scales": np.atleast_1d(product.k2.length_scale).tolist(),
            "y_mean": np.atleast_1d(gp._y_train_mean).tolist(), "y_std": np.atleast_1d(gp._y_train_std).tolist(),
            "white": float(gp.kernel_.k2.noise_level)}


def fit_crash(x: np.ndarray, crashed: np.ndarray) -> dict:
    from sklearn.linear_model import LogisticRegression

    quad = np.hstack([x, x * x])
    if crashed.all() or not crashed.any():  # one class: what was seen, always or never
        return {"intercept": 40.0 if crashed.all() else -40.0, "coef": [0.0] * quad.shape[1]}
    model = LogisticRegression(C=1.0, max_iter=5000).fit(quad, crashed)
    return {"intercept": float(model.intercept_[0]), "coef": model.coef_[0].tolist()}


def fit(records: list[dict], spec: list[dict]) -> dict:
    ok = [r for r in records if r["status"] == "ok" and r["points"]]
    x_ok = np.array([features(spec, r["config"]) for r in ok])
    y_curve = np.array([curve_at(r) + [r["final"]] for r in ok])
    y_steps = np.array([[math.log(max(r["steps"] or 1, 1))] for r in ok])
    x_all = np.array([features(spec, r["config"]) for r in records])
    crashed = np.array([r["status"] != "ok" for r in records])
    diverged_at = [r_t / r["budget_s"] for r in records if r["status"] == "diverged"
                   for r_t in [max((p[0] for p in r["points"]), default=0.0)]]
    return {"gps": [fit_gp(x_ok, y_curve, CURVE_OUTPUTS), fit_gp(x_ok, y_steps, ["log_steps"])],
            "crash": fit_crash(x_all, crashed),
            "diverge_fraction": [0.02, max(0.1, float(np.quantile(diverged_at, 0.9)))] if diverged_at else [0.02, 0.5]}


def predict(model: dict, config: dict) -> dict:
    x = gym.features(model, config)
    out = {}
    for gp in model["gps"]:
        out.update(zip(gp["outputs"], gym.gp_mean(gp, x)))
    out["crash"] = gym.crash_probability(model["crash"], x)
    return out


def cross_validate(records: list[dict], spec: list[dict], folds: int = 5) -> dict:
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    pool = [r for r in records if r["draw"] != "repeat"]
    order = rng.permutation(len(pool))
    held, predicted_final, actual_final, p_crash, crashed = [], [], [], [], []
    for k in range(folds):
        test = [pool[i] for i in order[k::folds]]
        test_ids = {r["id"] for r in test}
        model = {**fit([r for r in records if r["id"] not in test_ids], spec), "features": spec}
        for r in test:
            pred = predict(model, r["config"])
            p_crash.append(pred["crash"])
            crashed.append(r["status"] != "ok")
            if r["status"] == "ok":
                predicted_final.append(pred["final"])
                actual_final.append(r["final"])
                held.append(r["id"])
    residuals = np.array(predicted_final) - np.array(actual_final)
    p_crash, crashed = np.array(p_crash), np.array(crashed, dtype=float)
    bins = []
    for low, high in zip(CRASH_BINS, CRASH_BINS[1:]):
        inside = (p_crash >= low) & ((p_crash < high) if high < 1 else (p_crash <= high))
        if inside.any():
            bins.append({"bin": [low, high], "runs": int(inside.sum()), "mean_predicted": round(float(p_crash[inside].mean()), 3),
                         "observed": round(float(crashed[inside].mean()), 3)})
    base = crashed.mean()
    from scipy.stats import binomtest
    interval = binomtest(int(crashed.sum()), len(crashed)).proportion_ci(0.95, method="exact")
    return {"crash_rate_ci95": [round(interval.low, 4), round(interval.high, 4)],"folds": folds, "held_out_runs": len(pool), "held_out_finished": len(held),
            "spearman_final": round(float(spearmanr(predicted_final, actual_final).statistic), 4),
            "rmse_final": round(float(np.sqrt(np.mean(residuals ** 2))), 4),
            "median_abs_error_final": round(float(np.median(np.abs(residuals))), 4),
            "crash_rate": round(float(base), 3), "crash_bins": bins,
            "brier_crash": round(float(np.mean((p_crash - crashed) ** 2)), 4),
            "brier_base_rate": round(float(np.mean((base - crashed) ** 2)), 4)}


def after_freeze(records: list[dict], spec: list[dict], first: int) -> dict:
    """Fit on the runs gym-000 .. gym-(first-1), predict every later one: the surrogate's
    design was frozen when `first` runs were recorded, so these are out of sample."""
    from scipy.stats import spearmanr

    number = lambda r: int(r["id"].rsplit("-", 1)[1])  # noqa: E731
    model = {**fit([r for r in records if number(r) < first], spec), "features": spec}
    later = [r for r in records if number(r) >= first and r["draw"] != "repeat"]
    done = [r for r in later if r["status"] == "ok"]
    predicted = [predict(model, r["config"])["final"] for r in done]
    actual = [r["final"] for r in done]
    residuals = np.array(predicted) - np.array(actual)
    return {"fitted_on_first": first, "later_runs": len(later), "later_finished": len(done),
            "spearman_final": round(float(spearmanr(predicted, actual).statistic), 4),
            "rmse_final": round(float(np.sqrt(np.mean(residuals ** 2))), 4),
            "median_abs_error_final": round(float(np.median(np.abs(residuals))), 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "benchmarks/data/gym_nanochat_30s.jsonl"))
    parser.add_argument("--out", default=str(ROOT / "gym_repo/surrogate.json"))
    parser.add_argument("--report", default=str(ROOT / "benchmarks/results/gym_fidelity.json"))
    parser.add_argument("--frozen-at", type=int, default=92,
                        help="runs recorded when the surrogate's design was frozen (later ones: out of sample)")
    args = parser.parse_args()
    raw = Path(args.data).read_bytes()
    records = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    spec = feature_spec()
    budget = statistics.median(r["budget_s"] for r in records)
    report = {"data": Path(args.data).name, "runs": len(records), **cross_validate(records, spec),
              "after_freeze": after_freeze(records, spec, args.frozen_at)}
    model = {"schema": 1, "budget_s": budget, "fractions": FRACTIONS, "outputs": CURVE_OUTPUTS + ["log_steps"],
             "features": spec, **fit(records, spec), "noise": noise(records), "wall_per_sim_s": WALL_PER_SIM_S,
             "fitted_on": {"data": Path(args.data).name, "runs": len(records),
                           "sha256": hashlib.sha256(raw).hexdigest()}}
    report["noise_final_sd"] = round(model["noise"]["final_sd"], 4)
    report["rmse_over_noise"] = round(report["rmse_final"] / model["noise"]["final_sd"], 2)
    Path(args.out).write_text(json.dumps(model, separators=(",", ":")) + "\n")
    Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
