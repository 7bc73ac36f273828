#!/usr/bin/env python
"""Two arms of `gitresearch bench research`, side by side: the figures the gym's claims rest on.

An arm is one or more result files, each `FILE:POLICY` (a policy's runs in a --results file),
pooled by seed (a seed run twice is an error). Printed, and written as JSON to --json:

- per arm: the seeds, the best after the last experiment per seed, its median, mean and worst;
- `best_p`: one-sided Mann-Whitney U p that arm A's final best is lower (better) than B's;
- `anytime`: per loop, the best so far averaged over experiments 1..n (n: the shortest loop of
  both arms; the area under its best-so-far curve over n), each arm's median and mean, and the
  one-sided Mann-Whitney p that A's is lower: the figure of an arm that gets there sooner,
  where both end level;
- with --paired (`by_seed`), the loops paired by seed (the arms share their noise where the loops
  ran with common random numbers: docs/runner.md, GITRESEARCH_SEED): per seed, how many
  experiments the two loops share from the start (the same diff, status and best), A's best
  after n minus B's and A's anytime figure minus B's (n: the shortest loop of the shared
  seeds); for both gaps their mean, median, the seeds where A is ahead and the one-sided p
  that A is lower by a paired t-test and by Wilcoxon's signed-rank test, and the one-sided 95 %
  upper bound on A's mean lead;
- with --snapshots SNAP_A SNAP_B (research_snapshot.py's files for the same loops; each arm's
  loops are those of the policy of its first source; an arm whose seeds sit in several
  snapshots names them with --a-snapshot / --b-snapshot, repeatable) and seeds in both arms, the paired
  figure of learning: per window of 50 experiments, A's mean reward minus B's on the same seed (mean, median, seeds where A is ahead, Wilcoxon signed-rank p),
  and the same for valid share and keeps; and per checkpoint of the snapshots' best_at (25,
  50, 100, ... experiments), A's best so far minus B's on the same seed (below 0: A ahead),
  which needs no common reward (two arms scored under different [reward] settings compare
  here, not on their rewards). The reward of every arm falls from window to window
  because it is the gain over a best that hardens; an arm that learns pulls ahead of its
  non-learning prior (the same LM, [rl] update_every past the run) as the windows go on, so
  `gap_trend` is the slope of the mean reward gap per window (least squares, reward per window)
  and `gap_last_minus_first` its last window's mean minus its first's.

    python benchmarks/compare_arms.py --a benchmarks/results/research_gym_rl33.json:rl \\
        --b benchmarks/results/research_gym_rl33_prior.json:rl --b-name prior \\
        --snapshots benchmarks/results/research_gym_rl33_snapshot.json benchmarks/results/research_gym_rl33_prior_snapshot.json
    python benchmarks/compare_arms.py --a benchmarks/results/research_gym_rl34_prior.json:rl \\
        --a benchmarks/results/research_gym_rl34_prior_b.json:rl --b benchmarks/results/research_gym_rl33_random.json:random \\
        --b benchmarks/results/research_gym_rl33_random_b.json:random
"""
import argparse, json, statistics
from pathlib import Path
import numpy as np
from scipy import stats


def split_source(source: str) -> tuple[str, str]:
    path, _, policy = source.rpartition(":")
    if not path or not policy:
        raise SystemExit(f"{source!r}: an arm's source is FILE:POLICY (e.g. results.json:rl)")
    return path, policy


def load_runs(sources: list[str]) -> dict[int, dict]:
    """seed -> the bench's run (best so far, statuses, diffs, ... per experiment, the baseline
    first), pooled over FILE:POLICY sources."""
    found: dict[int, dict] = {}
    for source in sources:
        path, policy = split_source(source)
        runs = json.loads(Path(path).read_text())["runs"]
        if policy not in runs:
            raise SystemExit(f"{path} has no runs of {policy!r} (it has {', '.join(runs)})")
        for run in runs[policy]:
            if run["seed"] in found:
                raise SystemExit(f"seed {run['seed']} is in two sources of one arm ({source})")
            found[run["seed"]] = run
    return found


def best_curves(runs: dict[int, dict]) -> dict[int, list[float]]:
    """seed -> best so far after the baseline and after each experiment."""
    return {seed: run["best"] for seed, run in runs.items()}


def finals(curves: dict[int, list[float]]) -> dict[int, float]:
    """seed -> best after the last experiment."""
    return {seed: curve[-1] for seed, curve in curves.items()}


def final_bests(sources: list[str]) -> dict[int, float]:
    return finals(best_curves(load_runs(sources)))


def anytime_mean(curve: list[float], n: int) -> float:
    """The best so far averaged over experiments 1..n (the baseline left out)."""
    return float(np.mean(curve[1:n + 1]))


def shortest_loop(curves: list[list[float]], figure: str) -> int:
    """The experiments every loop ran (its curve holds the baseline first); `figure` names what
    needs at least one."""
    n = min(len(curve) for curve in curves) - 1
    if n < 1:
        raise SystemExit(f"{figure} needs at least one experiment after the baseline in every loop")
    return n


def anytime(curves_a: dict[int, list[float]], curves_b: dict[int, list[float]]) -> dict:
    """The best so far averaged over experiments 1..n, n the shortest loop of both arms (the
    area under the best-so-far curve over n): a policy that gets there sooner scores lower even
    where both end level. Per arm its median and mean, and the one-sided Mann-Whitney p that
    A's is lower."""
    n = shortest_loop([*curves_a.values(), *curves_b.values()], "the anytime figure")
    means = [[anytime_mean(curve, n) for curve in curves.values()] for curves in (curves_a, curves_b)]
    figures = {arm: {"median": round(statistics.median(values), 4), "mean": round(statistics.mean(values), 4)}
               for arm, values in zip("ab", means)}
    return {"experiments": n, **figures,
            "p": round(float(stats.mannwhitneyu(means[0], means[1], alternative="less").pvalue), 4)}


def same_start(run_a: dict, run_b: dict) -> int:
    """How many experiments after the baseline two loops share from the start (the same diff,
    status and best so far each): with common random numbers, an rl arm and its prior share
    every experiment before the first update."""
    keys = ("diffs", "statuses", "best")
    n = min(len(run_a["best"]), len(run_b["best"]))
    same = next((i for i in range(n) if any(run_a[k][i] != run_b[k][i] for k in keys)), n)
    return max(0, same - 1)


def paired_test(gaps: list[float]) -> dict:
    """A's figure minus B's per seed (below 0: A ahead): mean, median, seeds where A is ahead,
    the one-sided p that A is lower, by a paired t-test and by Wilcoxon's signed-rank test, and
    `lead_bound`, the one-sided 95 % upper confidence bound (t) on A's mean lead (B minus A): the
    largest gain a null result leaves open."""
    result = {"mean": round(statistics.mean(gaps), 4), "median": round(statistics.median(gaps), 4),
              "a_ahead": sum(g < 0 for g in gaps), "seeds": len(gaps)}
    if len(gaps) < 2 or not any(gaps):  # no spread or no sign: nothing to test
        return {**result, "t_p": None, "wilcoxon_p": None, "lead_bound": None}
    lead = stats.ttest_1samp([-g for g in gaps], 0.0).confidence_interval(0.90).high  # two-sided 90 %: one-sided 95 %
    return {**result, "t_p": round(float(stats.ttest_1samp(gaps, 0.0, alternative="less").pvalue), 4),
            "wilcoxon_p": round(float(stats.wilcoxon(gaps, alternative="less").pvalue), 4),
            "lead_bound": round(float(lead), 4)}


def paired_seeds(runs_a: dict[int, dict], runs_b: dict[int, dict]) -> dict:
    """The two arms loop by loop on the seeds both ran (common random numbers make the pairs
    share their noise): per seed the experiments they share from the start and A's best after
    n minus B's and A's anytime figure minus B's (n: the shortest loop of those seeds), then the
    paired tests of both."""
    seeds = sorted(set(runs_a) & set(runs_b))
    if not seeds:
        raise SystemExit("--paired: the arms share no seed")
    n = shortest_loop([runs[s]["best"] for runs in (runs_a, runs_b) for s in seeds], "--paired")
    rows = []
    for seed in seeds:
        a, b = runs_a[seed]["best"], runs_b[seed]["best"]
        rows.append({"seed": seed, "same_start": same_start(runs_a[seed], runs_b[seed]),
                     "final_gap": round(a[n] - b[n], 4),
                     "anytime_gap": round(anytime_mean(a, n) - anytime_mean(b, n), 4)})
    return {"experiments": n, "per_seed": rows, "final": paired_test([r["final_gap"] for r in rows]),
            "anytime": paired_test([r["anytime_gap"] for r in rows])}


def summary(bests: dict[int, float]) -> dict:
    values = list(bests.values())
    return {"seeds": sorted(bests), "final_best": {str(s): round(b, 4) for s, b in sorted(bests.items())},
            "median": round(statistics.median(values), 4), "mean": round(statistics.mean(values), 4),
            "worst": round(max(values), 4)}


def loops_by_seed(snapshots: str | list[str], policy: str) -> dict[int, dict]:
    """seed -> the snapshots' loop of `policy` (a snapshot of one workdir may hold several
    policies; a seed in two snapshots is an error)."""
    found: dict[int, dict] = {}
    for snapshot in [snapshots] if isinstance(snapshots, str) else snapshots:
        for name, loop in json.loads(Path(snapshot).read_text())["loops"].items():
            prefix, _, seed = name.rpartition("-seed")
            if prefix == policy:
                if int(seed) in found:
                    raise SystemExit(f"seed {seed} of {policy!r} is in two snapshots ({snapshot})")
                found[int(seed)] = loop
    return found


def paired_windows(snap_a: str | list[str], policy_a: str, snap_b: str | list[str], policy_b: str, seeds: list[int]) -> dict:
    a, b = loops_by_seed(snap_a, policy_a), loops_by_seed(snap_b, policy_b)
    seeds = [s for s in seeds if s in a and s in b]
    if not seeds:
        raise SystemExit("the snapshots share no seed with both arms")
    count = min(min(len(a[s]["windows"]), len(b[s]["windows"])) for s in seeds)
    windows = []
    for w in range(count):
        row = {"first": a[seeds[0]]["windows"][w]["first"], "last": a[seeds[0]]["windows"][w]["last"]}
        for key in ("mean_reward", "valid_share", "keeps"):
            gaps = [a[s]["windows"][w][key] - b[s]["windows"][w][key] for s in seeds]
            row[key] = {"mean": round(statistics.mean(gaps), 4), "median": round(statistics.median(gaps), 4),
                        "a_ahead": sum(g > 0 for g in gaps), "seeds": len(gaps)}
            if key == "mean_reward":
                # zero gaps carry no sign; with all gaps zero there is nothing to test
                row[key]["wilcoxon_p"] = (round(float(stats.wilcoxon(gaps).pvalue), 4)
                                          if any(gaps) else 1.0)
        windows.append(row)
    checkpoints = sorted(set.intersection(*(set(a[s].get("best_at", {})) & set(b[s].get("best_at", {}))
                                            for s in seeds)), key=int)
    best_at = []
    for point in checkpoints:
        gaps = [a[s]["best_at"][point] - b[s]["best_at"][point] for s in seeds]
        best_at.append({"experiments": int(point), "mean": round(statistics.mean(gaps), 4),
                        "median": round(statistics.median(gaps), 4), "a_ahead": sum(g < 0 for g in gaps),
                        "seeds": len(gaps)})
    gaps = [row["mean_reward"]["mean"] for row in windows]
    trend = float(np.polyfit(range(len(gaps)), gaps, 1)[0]) if len(gaps) > 1 else 0.0
    return {"seeds": seeds, "windows": windows, "best_at": best_at, "gap_trend": round(trend, 4),
            "gap_last_minus_first": round(gaps[-1] - gaps[0], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", action="append", required=True, help="FILE:POLICY of arm A (repeatable)")
    parser.add_argument("--b", action="append", required=True, help="FILE:POLICY of arm B (repeatable)")
    parser.add_argument("--a-name", default="A")
    parser.add_argument("--b-name", default="B")
    parser.add_argument("--snapshots", nargs=2, metavar=("SNAP_A", "SNAP_B"), default=[])
    parser.add_argument("--a-snapshot", action="append", default=[], help="a snapshot of arm A's loops (repeatable)")
    parser.add_argument("--b-snapshot", action="append", default=[], help="a snapshot of arm B's loops (repeatable)")
    parser.add_argument("--paired", action="store_true", help="also pair the loops by seed")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    runs_a, runs_b = load_runs(args.a), load_runs(args.b)
    curves_a, curves_b = best_curves(runs_a), best_curves(runs_b)
    best_a, best_b = finals(curves_a), finals(curves_b)
    result = {"schema": 1, "a": {"name": args.a_name, "sources": args.a, **summary(best_a)},
              "b": {"name": args.b_name, "sources": args.b, **summary(best_b)},
              "best_p": round(float(stats.mannwhitneyu(list(best_a.values()), list(best_b.values()),
                                                       alternative="less").pvalue), 4),
              "anytime": anytime(curves_a, curves_b)}
    for arm in ("a", "b"):
        r = result[arm]
        print(f"{r['name']}: {len(r['seeds'])} seeds, final best median {r['median']}, mean {r['mean']}, "
              f"worst {r['worst']}")
    print(f"{args.a_name} better than {args.b_name} (one-sided Mann-Whitney): p = {result['best_p']}")
    area = result["anytime"]
    print(f"best so far averaged over experiments 1-{area['experiments']}: {args.a_name} median {area['a']['median']}, "
          f"mean {area['a']['mean']}; {args.b_name} median {area['b']['median']}, mean {area['b']['mean']}; "
          f"{args.a_name} lower (one-sided Mann-Whitney): p = {area['p']}")
    if args.paired:
        pairs = result["by_seed"] = paired_seeds(runs_a, runs_b)
        print(f"paired by seed, {args.a_name} minus {args.b_name} (below 0: {args.a_name} ahead), "
              f"over experiments 1-{pairs['experiments']}:")
        for row in pairs["per_seed"]:
            print(f"  seed {row['seed']}: best {row['final_gap']:+.4f}, anytime {row['anytime_gap']:+.4f}, "
                  f"the same first {row['same_start']} experiments")
        for key, label in (("final", "best after the last"), ("anytime", "anytime")):
            t = pairs[key]
            print(f"  {label}: mean {t['mean']:+.4f}, median {t['median']:+.4f}, {args.a_name} ahead on "
                  f"{t['a_ahead']}/{t['seeds']}; one-sided paired t p = {t['t_p']}, Wilcoxon p = {t['wilcoxon_p']}; "
                  f"A's lead under {t['lead_bound']} (one-sided 95 %)")
    snap_a, snap_b = args.a_snapshot + args.snapshots[:1], args.b_snapshot + args.snapshots[1:]
    if bool(snap_a) != bool(snap_b):
        raise SystemExit("the paired figures need snapshots of both arms")
    if snap_a:
        paired = paired_windows(snap_a, split_source(args.a[0])[1], snap_b, split_source(args.b[0])[1],
                                sorted(set(best_a) & set(best_b)))
        result["paired"] = paired
        print(f"per window, {args.a_name} minus {args.b_name} on the same seed ({len(paired['seeds'])} seeds):")
        for row in paired["windows"]:
            r, v, k = row["mean_reward"], row["valid_share"], row["keeps"]
            print(f"  {row['first']:>3}-{row['last']:<3} reward {r['mean']:+.3f} (median {r['median']:+.3f}, "
                  f"ahead on {r['a_ahead']}/{r['seeds']}, p = {r['wilcoxon_p']})  valid {v['mean']:+.3f}  "
                  f"keeps {k['mean']:+.2f}")
        print(f"  gap trend {paired['gap_trend']:+.4f} reward per window; last minus first "
              f"{paired['gap_last_minus_first']:+.3f}")
        print(f"best so far, {args.a_name} minus {args.b_name} on the same seed (below 0: {args.a_name} ahead):")
        for row in paired["best_at"]:
            print(f"  after {row['experiments']:>3}: {row['mean']:+.4f} (median {row['median']:+.4f}, "
                  f"ahead on {row['a_ahead']}/{row['seeds']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
