#!/usr/bin/env python
"""Did PPO learn, apart from the gym getting harder? A research loop's reward is measured
against the best at proposal time, so it falls as best improves whatever the policy (random
search's own reward falls over 300 experiments: docs/gym.md). This benchmark removes that
drift: it takes a finished `gitresearch bench research --workdir` rl loop and, from the same
state (same best, same history, same prompt), runs N more experiments with each arm:

- trained: the loop's PPO adapters as they ended, frozen ([rl] update_every huge);
- reference: the same LM with fresh adapters (LoRA's B is zero: exactly the base model),
  frozen; the distribution PPO started from and its KL anchor;
- random: random search.

Each arm runs in its own copy of the loop's repo (the original is not touched), so a keep in
one arm moves only that arm's best. Per arm it reports, pooled over the loops given: the
experiments, statuses, mean reward (`reward.total` of the notes), the mean improvement term
of the valid runs, the failed (crash, invalid, timeout) count and distinct diffs; and the
trained arm against the other two (compare(): scipy's Welch t-test and Fisher's exact test).

    python benchmarks/frozen_eval.py LM OUT.json LOOP [LOOP ...] [--experiments 40] [--parallel 3] [--set S.N=V ...]

LM is the policy model the loops ran with (their --model), each LOOP an `rl-seedK` repo of a
bench workdir. Output: OUT.json with {"schema": 2, "experiments", "loops", "settings", "wall_s", "arms":
{arm: {"loops": {loop: figures, "stopped": the loop's last line}, "pooled": figures with every reward and
valid improvement}}, "trained_vs_reference", "trained_vs_random"} (compare(): reward and
valid-improvement differences with Welch t-tests, Fisher's exact test on the failed shares,
per-loop reward differences; an arm's loop that added fewer experiments says why in "stopped").
"""
import argparse, json, math, shutil, statistics, subprocess, sys, tempfile, time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scipy import stats

from gitresearch.gitstore import Store
from gitresearch.research_bench import loop_args, loop_env
from gitresearch.reward import FAILED

ARMS = ("trained", "reference", "random")
FROZEN = "rl.update_every=1000000"  # no PPO update within the evaluation


def records(repo: Path) -> list[dict]:
    return [e.record or {} for e in reversed(Store(repo).experiments()) if (e.record or {}).get("status")]


def run_arm(arm: str, loop: Path, model: str, experiments: int, workdir: Path, parallel: int,
            settings: list[str] = ()) -> tuple[list[dict], str]:
    """The notes of the `experiments` this arm added to a copy of `loop` (`settings`: --set
    items for every arm, as the loop ran with), and the loop's last output line (why it
    stopped, when it added fewer)."""
    repo = workdir / f"{loop.name}-{arm}"
    shutil.copytree(loop, repo, symlinks=True)
    if arm == "reference":
        shutil.rmtree(repo / ".git/gitresearch/rl")
    start = len(records(repo))
    policy = loop_args("random") if arm == "random" else [*loop_args("rl", ["--model", model, "--prompt", "compact"]),
                                                          "--set", FROZEN]
    seed = int(loop.name.rsplit("seed", 1)[-1]) + 1000  # not the loop's own sampling stream
    command = [sys.executable, "-m", "gitresearch", "loop", *policy, "--seed", str(seed),
               "--max-experiments", str(start - 1 + experiments),  # the baseline is not counted
               *(a for item in settings for a in ("--set", item))]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, env=loop_env(parallel))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} in {repo} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return records(repo)[start:], lines[-1] if lines else ""


def figures(recs: list[dict]) -> dict:
    rewards = [r["reward"]["total"] for r in recs if isinstance((r.get("reward") or {}).get("total"), (int, float))]
    improvements = [r["reward"]["improvement"] for r in recs
                    if r.get("status") not in FAILED and r.get("reward")]
    statuses = Counter(r["status"] for r in recs)
    return {"experiments": len(recs), "statuses": dict(statuses),
            "mean_reward": round(statistics.fmean(rewards), 3) if rewards else None,
            "mean_improvement_valid": round(statistics.fmean(improvements), 3) if improvements else None,
            "failed": sum(statuses[status] for status in FAILED),
            "distinct_diffs": len({r["diff_sha"] for r in recs if r.get("diff_sha")}),
            "rewards": rewards, "improvements": improvements}


def welch(a: list[float], b: list[float]) -> dict:
    """Mean of a minus mean of b and Welch's t-test; None where either has under two values."""
    if len(a) < 2 or len(b) < 2:
        return {"difference": None, "t": None, "p": None}
    test = stats.ttest_ind(a, b, equal_var=False)
    finite = math.isfinite(test.statistic)  # not when both samples are constant (all at the clip)
    return {"difference": round(statistics.fmean(a) - statistics.fmean(b), 3),
            "t": round(float(test.statistic), 3) if finite else None,
            "p": float(f"{test.pvalue:.3g}") if finite else None}


def compare(arms: dict, a: str, b: str) -> dict:
    """Arm a against arm b, pooled: the mean-reward and valid-improvement differences with
    Welch t-tests, the failed shares with Fisher's exact test, and per loop the reward
    difference (loops both arms ran)."""
    pa, pb = arms[a]["pooled"], arms[b]["pooled"]
    fisher = stats.fisher_exact([[pa["failed"], pa["experiments"] - pa["failed"]],
                                 [pb["failed"], pb["experiments"] - pb["failed"]]])
    return {"reward": welch(pa["rewards"], pb["rewards"]), "valid_improvement": welch(pa["improvements"], pb["improvements"]),
            "failed": [pa["failed"], pb["failed"]], "experiments": [pa["experiments"], pb["experiments"]],
            "failed_fisher_p": float(f"{fisher.pvalue:.3g}"),
            "per_loop_reward_difference": {loop: round(fa["mean_reward"] - arms[b]["loops"][loop]["mean_reward"], 3)
                                           for loop, fa in arms[a]["loops"].items()
                                           if fa["mean_reward"] is not None
                                           and (arms[b]["loops"].get(loop) or {}).get("mean_reward") is not None}}


def summarise(per_loop: dict[str, dict[str, tuple[list[dict], str]]]) -> dict:
    """{arm: {loop: (records, stop line)}} -> per arm the per-loop and pooled figures; the
    comparisons of trained against reference and random."""
    arms = {}
    for arm, loops in per_loop.items():
        arms[arm] = {"loops": {}, "pooled": figures([r for recs, _ in loops.values() for r in recs])}
        for loop, (recs, stopped) in loops.items():
            arms[arm]["loops"][loop] = {k: v for k, v in figures(recs).items() if k not in ("rewards", "improvements")}
            arms[arm]["loops"][loop]["stopped"] = stopped
    out = {"arms": arms}
    for other in ("reference", "random"):
        if {"trained", other} <= set(arms):
            out[f"trained_vs_{other}"] = compare(arms, "trained", other)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model"), parser.add_argument("out"), parser.add_argument("loops", nargs="+")
    parser.add_argument("--experiments", type=int, default=40)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--set", action="append", default=[], dest="settings",
                        help="SECTION.NAME=VALUE for every arm's loop (the bench's own --set items that change proposals)")
    args = parser.parse_args()
    arms, loops = args.arms.split(","), [Path(p).resolve() for p in args.loops]
    model = str(Path(args.model).resolve())
    workdir = Path(tempfile.mkdtemp(prefix="frozen-eval-"))
    jobs = [(arm, loop) for loop in loops for arm in arms]
    started = time.monotonic()
    with ThreadPoolExecutor(args.parallel) as pool:
        done = list(pool.map(lambda job: run_arm(*job, model, args.experiments, workdir, args.parallel, args.settings), jobs))
    per_loop = {arm: {loop.name: got for (a, loop), got in zip(jobs, done) if a == arm} for arm in arms}
    result = {"schema": 2, "experiments": args.experiments, "loops": [str(p) for p in loops], "settings": args.settings,
              "wall_s": round(time.monotonic() - started), **summarise(per_loop)}
    shutil.rmtree(workdir)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for arm in arms:
        print(arm, {k: v for k, v in result["arms"][arm]["pooled"].items() if k not in ("rewards", "improvements")})
        for loop, f in result["arms"][arm]["loops"].items():
            if f["experiments"] < args.experiments:
                print(f"  {loop}: {f['experiments']} experiments, {f['stopped']}")
    for key in ("trained_vs_reference", "trained_vs_random"):
        if key in result:
            print(key, result[key])


if __name__ == "__main__":
    main()
