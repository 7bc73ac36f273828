"""`gitresearch bench research`: which policy lowers val_bpb fastest, measured with full loops
on the research gym (docs/gym.md).

    gitresearch bench research --policies random,optuna-tpe --experiments 200 --seeds 5 -o plot.png

Each (policy, seed) is a real `gitresearch loop` (early stop and the keep rule on, as a user
runs it) in a fresh repo made with `gitresearch init --template gym`; loops run --parallel at
a time. The figures come from the notes alone:
- best so far after each experiment: the value of the kept best (the baseline's at first);
- compute: simulated training seconds, charged per run as the loop spent them (a finished
  run its training seconds, an early-stopped one up to the check that stopped it, a crash up
  to its last point, and every noise or confirmation re-run its budget);
- per policy: the median and interquartile range over seeds of best-so-far against
  experiments and against compute, the experiments needed to reach random search's final
  best (median over seeds; random's own included), and the area under the best-so-far curve
  (its mean over experiments: lower is better);
- per policy and window of WINDOW experiments after the baseline (whether a policy learns, and
  whether it collapses onto a few edits): the mean reward of the notes (`reward.total`), the
  distinct diffs proposed (by diff identity), the share of valid experiments (not invalid)
  and the keeps, each the mean over seeds; and each loop's wall seconds.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import GitresearchError
from .gitstore import Store
from .init import init_repo


class BenchError(GitresearchError):
    pass


WINDOW = 50  # experiments per window of the learning figures


MODEL_POLICIES = ("llm", "rl")  # the policies that take --model and --prompt


def loop_args(policy: str, model_args: list[str] = ()) -> list[str]:
    """`random`, `optuna-tpe` (any sampler), or any other --policy name as it is; the llm and
    rl policies get `model_args` (--model, --prompt)."""
    if policy.startswith("optuna-"):
        return ["--policy", "optuna", "--sampler", policy.split("-", 1)[1]]
    return ["--policy", policy, *(model_args if policy in MODEL_POLICIES else [])]


def loop_env(parallel: int) -> dict[str, str]:
    """The environment of one of `parallel` loops at a time: this machine's cores split among
    them (OMP/MKL threads), unless the caller set OMP_NUM_THREADS itself. Left to torch's
    default, every loop's policy LM takes every core, and three loops on two cores spent
    most of their time in the thread pools' busy-waits (measured: docs/gym.md)."""
    env = dict(os.environ, COLUMNS="120")
    if "OMP_NUM_THREADS" not in os.environ:
        threads = str(max(1, (os.cpu_count() or 1) // max(1, parallel)))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    return env


def run_one(policy: str, seed: int, experiments: int, workdir: Path, target: str = "gym",
            model_args: list[str] = (), settings: tuple[str, ...] = (),
            parallel: int = 1) -> tuple[list[dict], float]:
    """One loop (`settings`: its --set items; `parallel`: loops at a time, which share the
    cores): its experiments' notes, in order, and its wall seconds."""
    repo = workdir / f"{policy}-seed{seed}"
    list(init_repo(repo, template=target))
    command = [sys.executable, "-m", "gitresearch", "loop", *loop_args(policy, model_args), "--seed", str(seed),
               "--max-experiments", str(experiments), *(a for item in settings for a in ("--set", item))]
    started = time.monotonic()
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, env=loop_env(parallel))
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(command)} in {repo} exited {proc.returncode}:\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    return [exp.record or {} for exp in reversed(Store(repo).experiments())], wall


def compute_of(record: dict) -> float:
    """Simulated training seconds an experiment cost, re-runs included."""
    budget = float(record.get("budget_s") or 0.0)
    status = record.get("status")
    if status == "early_stop":
        checks = [c["t"] for c in record.get("checks") or [] if isinstance(c.get("t"), (int, float))]
        used = checks[-1] if checks else float(record.get("training_seconds") or budget)
    elif status == "invalid":
        used = 0.0
    else:
        used = min(float(record.get("training_seconds") or budget), budget)
    if status == "baseline":  # its noise runs are the baseline's runs
        used = 0.0
    reruns = len(record.get("noise_runs") or []) + len(record.get("noise_slow") or [])
    reruns += len(record.get("remeasured") or [])  # best re-run to watch for drift
    conf = record.get("confirmation") or {}
    reruns += 2 * (len(conf.get("pairs") or []) + len(conf.get("slow") or []))
    return used + reruns * budget


def trajectory(records: list[dict]) -> dict:
    """Best so far and cumulative compute after each experiment (the baseline is the first)."""
    best, spent, bests, computes = None, 0.0, [], []
    for record in records:
        spent += compute_of(record)
        if record.get("status") in ("baseline", "keep") and isinstance(record.get("val_bpb"), (int, float)):
            best = record["val_bpb"]
        bests.append(best)
        computes.append(spent)
    return {"best": bests, "compute": computes,
            "statuses": [r.get("status") for r in records],
            "rewards": [(r.get("reward") or {}).get("total") for r in records],
            "diffs": [r.get("diff_sha") for r in records]}


def windows(run: dict, size: int = WINDOW) -> list[dict]:
    """The learning figures of one loop per window of `size` experiments after the baseline."""
    n = len(run["statuses"])
    rewards, diffs = run.get("rewards") or [None] * n, run.get("diffs") or [None] * n
    out = []
    for start in range(1, n, size):
        span = range(start, min(start + size, n))
        statuses = [run["statuses"][i] for i in span if run["statuses"][i] is not None]
        if not statuses:
            break
        scored = [rewards[i] for i in span if isinstance(rewards[i], (int, float))]
        out.append({"first": start, "last": span[-1], "experiments": len(statuses),
                    "mean_reward": statistics.fmean(scored) if scored else None,
                    "distinct_diffs": len({diffs[i] for i in span if diffs[i]}),
                    "valid_share": sum(s != "invalid" for s in statuses) / len(statuses),
                    "keeps": sum(s == "keep" for s in statuses)})
    return out


def mean_windows(rs: list[dict]) -> list[dict]:
    """Each window's figures, the mean over seeds (the seeds that reached that window)."""
    per_seed = [windows(r) for r in rs]
    out = []
    for i in range(max(len(w) for w in per_seed)):
        rows = [w[i] for w in per_seed if len(w) > i]
        row = {"first": rows[0]["first"], "last": rows[0]["last"], "seeds": len(rows)}
        for key in ("mean_reward", "distinct_diffs", "valid_share", "keeps"):
            values = [r[key] for r in rows if r[key] is not None]
            row[key] = statistics.fmean(values) if values else None
        out.append(row)
    return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def best_at_compute(run: dict, compute: float) -> float:
    """A run's best so far once `compute` simulated seconds were spent."""
    value = run["best"][0]
    for best, spent in zip(run["best"], run["compute"]):
        if spent > compute:
            break
        value = best
    return value


def summarise(runs: dict[str, list[dict]], compute_points: int = 50) -> dict:
    """Per policy: median and IQR curves, experiments to reach random's final best, area."""
    n = min(len(r["best"]) for rs in runs.values() for r in rs)
    longest = max(r["compute"][n - 1] for rs in runs.values() for r in rs)
    grid = [longest * (i + 1) / compute_points for i in range(compute_points)]
    reference = None
    if "random" in runs:
        reference = statistics.median(r["best"][n - 1] for r in runs["random"])
    out = {}
    for policy, rs in runs.items():
        by_exp = [quartiles([r["best"][i] for r in rs]) for i in range(n)]
        by_compute = [quartiles([best_at_compute(r, c) for r in rs]) for c in grid]
        needed = None
        if reference is not None:
            # the median over seeds, a seed that never reached it counting as beyond the end
            needed = statistics.median(next((i + 1 for i, b in enumerate(r["best"][:n]) if b <= reference),
                                            math.inf) for r in rs)
            needed = None if math.isinf(needed) else needed
        out[policy] = {
            "seeds": len(rs), "experiments": n,
            "final_best": {"median": by_exp[-1][1], "q1": by_exp[-1][0], "q3": by_exp[-1][2]},
            "best_by_experiment": {"q1": [q[0] for q in by_exp], "median": [q[1] for q in by_exp],
                                   "q3": [q[2] for q in by_exp]},
            "compute_grid_s": grid,
            "best_by_compute": {"q1": [q[0] for q in by_compute], "median": [q[1] for q in by_compute],
                                "q3": [q[2] for q in by_compute]},
            "experiments_to_random_final": needed,
            "area_under_best": statistics.median(statistics.fmean(r["best"][:n]) for r in rs),
            "early_stopped_share": statistics.fmean(
                sum(s == "early_stop" for s in r["statuses"][:n]) / n for r in rs),
            "compute_s": statistics.median(r["compute"][n - 1] for r in rs),
            "windows": mean_windows(rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs) if all("wall_s" in r for r in rs) else None,
        }
    return {"reference_random_final": reference, "policies": out}


def bench_research(policies: list[str], experiments: int, seeds: int, parallel: int = 2,
                   target: str = "gym", workdir: Path | None = None, progress=None,
                   model_args: list[str] = (), settings: tuple[str, ...] = (), first_seed: int = 0) -> dict:
    """Every (policy, seed) loop, seeds first_seed .. first_seed + seeds - 1 (more seeds of an
    earlier run without repeating its loops), then the summary; the raw trajectories are kept
    in "runs"."""
    # the model policies' loops first: they are the long ones (an rl loop took 6x random's
    # wall time), and one started last would run alone while the other slots sit idle
    jobs = sorted(((p, s) for s in range(first_seed, first_seed + seeds) for p in policies),
                  key=lambda job: job[0] not in MODEL_POLICIES)
    with tempfile.TemporaryDirectory(prefix="gitresearch-bench-") as tmp:
        root = Path(workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)

        def job(item):
            policy, seed = item
            records, wall = run_one(policy, seed, experiments, root, target, model_args, settings, parallel)
            result = {**trajectory(records), "wall_s": wall}
            result["ended_early"] = len(result["best"]) < experiments + 1  # the policy ran out
            while len(result["best"]) < experiments + 1:  # no more progress, no more compute
                for key in ("best", "compute"):
                    result[key].append(result[key][-1])
                for key in ("statuses", "rewards", "diffs"):
                    result[key].append(None)
            if progress:
                progress(f"{policy} seed {seed}: best {result['best'][-1]:.6f} after {len(result['best'])} experiments")
            return item, result

        with ThreadPoolExecutor(max(1, parallel)) as pool:
            done = list(pool.map(job, jobs))
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    for (policy, seed), result in done:
        runs[policy].append({"seed": seed, **result})
    return {"target": target, "experiments": experiments, "seeds": seeds, "first_seed": first_seed,
            "settings": list(settings),
            **summarise(runs), "runs": runs}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_exp, by_compute) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for policy, s in result["policies"].items():
        xs = range(1, s["experiments"] + 1)
        line, = by_exp.plot(xs, s["best_by_experiment"]["median"], label=policy)
        by_exp.fill_between(xs, s["best_by_experiment"]["q1"], s["best_by_experiment"]["q3"],
                            color=line.get_color(), alpha=0.2)
        minutes = [c / 60 for c in s["compute_grid_s"]]
        by_compute.plot(minutes, s["best_by_compute"]["median"], color=line.get_color(), label=policy)
        by_compute.fill_between(minutes, s["best_by_compute"]["q1"], s["best_by_compute"]["q3"],
                                color=line.get_color(), alpha=0.2)
    if result.get("reference_random_final") is not None:
        for ax in (by_exp, by_compute):
            ax.axhline(result["reference_random_final"], color="grey", ls=":", lw=1)
    by_exp.set(xlabel="experiments", ylabel="best val_bpb so far (median, IQR over seeds)",
               title=f"{result['target']}: {result['seeds']} seeds")
    by_compute.set(xlabel="simulated training minutes", title="against compute")
    by_exp.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(result: dict, path: Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")
