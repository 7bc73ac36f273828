"""The gym's real-target check: two policies' loops on the real bundled target, read from
their repos' notes the way `bench research` reads the gym's, side by side.

    # the loops (resumable: run the same command again after a kill or in a later session)
    gitresearch init --template nanochat /work/realcheck/random
    (cd /work/realcheck/random && OMP_NUM_THREADS=1 gitresearch loop --policy random --seed 0 \
        --budget 30 --max-experiments 60) &
    gitresearch init --template nanochat /work/realcheck/optuna-gp
    (cd /work/realcheck/optuna-gp && OMP_NUM_THREADS=1 gitresearch loop --policy optuna \
        --sampler gp --seed 0 --budget 30 --max-experiments 60) &
    # the figures
    python benchmarks/real_target_check.py /work/realcheck/random /work/realcheck/optuna-gp \
        --out benchmarks/results/real_target_check.json

Two loops at a time with one thread each, as the gym's runs were recorded; nothing else
running beside them (a slower run has fewer steps and a worse value). optuna-gp: GP is the
better Optuna sampler on the gym (docs/gym.md).

Run the loops with the code they started with (7ec5c90), so that the random policy of the
whole check is the one the gym's bench measured: `git worktree add /work/rc-code 7ec5c90` and
PYTHONPATH=/work/rc-code in front of each loop command. Sessions get different machines (the
2026-12-02 one ran the bundled target about 2.6 x slower than the one the loops started on:
the baseline's 19 steps against 50), so compare the two bests at the end by re-running them
side by side on one quiet machine (`gitresearch verify` in each repo, or `gitresearch run
best --json` alternately), not by the values each loop recorded.

The loops take longer than a session (the random policy's many near-null edits pass the
screen by noise and are confirmed by pairs of 30 s runs: about 4 experiments an hour at the
start), so their repos travel as git bundles (everything the loop resumes from is in git):

    # save, after stopping the loops with Ctrl-C (SIGINT)
    for p in random optuna-gp; do git -C /work/realcheck/$p bundle create \
        $PWD/benchmarks/data/realcheck/$p.bundle --all; done
    # restore, then run the loop commands above again (without the init)
    for p in random optuna-gp; do r=/work/realcheck/$p; git init -q --bare $r/.git && \
        git -C $r/.git fetch -q $PWD/benchmarks/data/realcheck/$p.bundle '+refs/*:refs/*' && \
        git -C $r/.git config core.bare false && git -C $r checkout -q -f master; done

Output: JSON {"repos": {name: {"experiments", "best_by_experiment", "compute_s", "statuses"}},
"ranking": [names, best final first]} and one line per repo on stderr.
"""
import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gitresearch.gitstore import Store  # noqa: E402
from gitresearch.research_bench import trajectory  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repos", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = {}
    for repo in args.repos:
        records = [e.record or {} for e in reversed(Store(repo).experiments())]
        run = trajectory(records)
        result[repo.name] = {"experiments": len(records) - 1, "best_by_experiment": run["best"],
                             "compute_s": run["compute"][-1], "statuses": dict(collections.Counter(run["statuses"]))}
        print(f"{repo.name}: {len(records) - 1} experiments, best {run['best'][-1]:.6f}, "
              f"{run['compute'][-1] / 60:.0f} training minutes, {result[repo.name]['statuses']}", file=sys.stderr)
    ranking = sorted(result, key=lambda name: result[name]["best_by_experiment"][-1])
    out = {"repos": result, "ranking": ranking}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"ranking": ranking}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
