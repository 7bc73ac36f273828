#!/usr/bin/env python
"""Learning over the prior, measured inside rl loops run with [rl] prior_share: every try of a
proposal drew its sampler (the frozen prior or the adapted policy) at random, so after the
first update the two samplers propose from the same states, and what their tries bring is
a randomised comparison.

The notes keep the sampler of each experiment's last try only (`policy_data.sampled_from_prior`).
The draws come from the RL policy's own stream, random.Random("prior-share-SEED"), one per try,
so this script replays them over each experiment's tries (its failed tries plus the one that
ran) and stops with an error if the replayed try that ran disagrees with its note.

    python benchmarks/sampler_split.py LOOPS_DIR [LOOPS_DIR ...] --share 0.5 [--after 50] [--json OUT]
    python benchmarks/sampler_split.py --merge OUT1.json OUT2.json [--json OUT]

LOOPS_DIR holds `bench research --workdir` repos named rl-seedN. --merge pools the loops of
earlier outputs (say two batches of seeds whose loop folders are gone) and tests over them all;
their share and after must agree and their loop names must differ. Output (stdout, and OUT as
JSON), for experiments 1..after (before the first update: both samplers are the prior, an A/A
check of the comparison) and for those after: per loop and sampler, its tries, tries that ran
(valid), keeps, crashes, the mean reward of the experiments it ran, and the best's
improvement it brought (the sum over its keeps of best before minus the keep's val_bpb) and
its refused tries by kind (move_too_large, moved_twice, no_change, unknown_constant, repeat,
unreadable, other; tries = valid + refused);
then the adapted policy minus the prior per try (keeps and improvement) per loop, with
one-sided paired tests over the loops (t and Wilcoxon; below 0.05: the adapted policy's tries
are better).
"""
import argparse
import json
import random
import re
import statistics
from pathlib import Path

from scipy import stats

from gitresearch.gitstore import Store

SAMPLERS = ("policy", "prior")
# a refused try's error (policies/moves.py, policies/reply.py, proposal.py, check_moves) by kind
REFUSALS = {"move_too_large": "may move a constant at most", "moved_twice": "moved twice",
            "no_change": "leave every value where it was", "unknown_constant": "not a constant shown",
            "repeat": "already tried", "unreadable": "cannot read the step|needs a number|no unified diff"}


def refusal(error: str) -> str:
    return next((kind for kind, pattern in REFUSALS.items() if re.search(pattern, error)), "other")


def empty() -> dict:
    return {s: {"tries": 0, "valid": 0, "keeps": 0, "crashes": 0, "rewards": [], "improvement": 0.0,
                "refusals": {}} for s in SAMPLERS}


def split(repo: Path, share: float, after: int) -> dict:
    """Each sampler's figures of one loop, over experiments 1..after ("before") and the rest
    ("after"), from one pass over its notes and one replay of its draws."""
    seed = int(re.search(r"seed(\d+)$", repo.name).group(1))
    draws = random.Random(f"prior-share-{seed}")  # the RL policy's sampler stream (policies/rl.py)
    records = sorted((e.record for e in Store(repo).experiments() if (e.record or {}).get("status")),
                     key=lambda r: r["experiment"])
    parts = {"before": empty(), "after": empty()}
    best = None
    for record in records:
        status = record["status"]
        if record["experiment"] == 0:
            best = record["val_bpb"]
            continue
        failed = len(record.get("attempts") or [])
        tries = [draws.random() < share for _ in range(failed + (status != "invalid"))]
        noted = (record.get("policy_data") or {}).get("sampled_from_prior")
        # an invalid experiment's note may carry an earlier try's data (a repeat fails after
        # the reply was read); a valid one's is that of the try that ran
        if status != "invalid" and noted is not None and tries[-1] != noted:
            raise SystemExit(f"{repo.name} #{record['experiment']}: replayed sampler {tries[-1]} != noted {noted}")
        gain = best - record["val_bpb"] if status == "keep" else 0.0
        if status == "keep":
            best = record["val_bpb"]
        out = parts["before" if record["experiment"] <= after else "after"]
        for prior in tries:
            out[SAMPLERS[prior]]["tries"] += 1
        # the note's attempts are the refused tries, in order, before the one that ran (if any)
        for prior, attempt in zip(tries, record.get("attempts") or []):
            kinds = out[SAMPLERS[prior]]["refusals"]
            kind = refusal(attempt.get("error", ""))
            kinds[kind] = kinds.get(kind, 0) + 1
        if status == "invalid":
            continue
        ran = out[SAMPLERS[tries[-1]]]
        ran["valid"] += 1
        ran["keeps"] += status == "keep"
        ran["crashes"] += status == "crash"
        ran["rewards"].append((record.get("reward") or {}).get("total", 0.0))
        ran["improvement"] += gain
    for figures in (f for out in parts.values() for f in out.values()):
        rewards = figures.pop("rewards")
        figures["mean_reward"] = round(statistics.fmean(rewards), 4) if rewards else None
        figures["improvement"] = round(figures["improvement"], 5)
    return parts


def per_try(figures: dict, key: str) -> float:
    return figures[key] / figures["tries"] if figures["tries"] else 0.0


def compare(loops: dict) -> dict:
    """The adapted policy minus the prior, per try, per loop; one-sided paired tests over loops;
    and each sampler's counts summed over the loops."""
    out = {"pooled": {name: {key: round(sum(s[name][key] for s in loops.values()), 5)
                             for key in ("tries", "valid", "keeps", "crashes", "improvement")} for name in SAMPLERS}}
    # outputs written before refusals were counted have none: pooled only where every loop has them
    for name in (SAMPLERS if all("refusals" in s[n] for s in loops.values() for n in SAMPLERS) else ()):
        kinds = [s[name]["refusals"] for s in loops.values()]
        out["pooled"][name]["refusals"] = {kind: sum(k.get(kind, 0) for k in kinds)
                                           for kind in sorted({kind for k in kinds for kind in k})}
    for key in ("keeps", "improvement", "valid"):
        diffs = [per_try(s["policy"], key) - per_try(s["prior"], key) for s in loops.values()]
        row = {"per_loop": [round(d, 5) for d in diffs], "mean": round(statistics.fmean(diffs), 5)}
        if len(diffs) > 1 and any(diffs):
            row["t_p"] = round(float(stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue), 4)
            row["wilcoxon_p"] = round(float(stats.wilcoxon(diffs, alternative="greater").pvalue), 4)
        out[f"{key}_per_try"] = row
    return out


def merged(outputs: list) -> tuple:
    """The share, the after and each loop's parts of earlier outputs, checked to agree."""
    splits, settings = {}, set()
    for path in outputs:
        earlier = json.loads(path.read_text())
        # outputs written before "split_after" was stored lost it to the part's key; all of them
        # split at the default, 50
        settings.add((earlier["share"], earlier.get("split_after", 50)))
        for name in earlier["after"]["loops"]:
            if name in splits:
                raise SystemExit(f"{path}: loop {name} is in an earlier output too")
            splits[name] = {part: earlier[part]["loops"][name] for part in ("before", "after")}
    if len(settings) != 1:
        raise SystemExit(f"the outputs disagree on (share, split_after): {sorted(settings)}")
    return (*settings.pop(), splits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("loops", type=Path, nargs="*")
    parser.add_argument("--share", type=float, help="the loops' [rl] prior_share")
    parser.add_argument("--after", type=int, default=50, help="experiments before the first update")
    parser.add_argument("--merge", type=Path, nargs="+", help="earlier --json outputs to pool")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if bool(args.merge) == bool(args.loops):
        parser.error("give either loop folders or --merge")
    if args.merge:
        if args.share is not None:
            parser.error("--merge takes the share from the outputs it pools")
        args.share, args.after, splits = merged(args.merge)
    elif args.share is None:
        parser.error("--share is required with loop folders")
    else:
        repos = [repo for loops in args.loops for repo in sorted(loops.iterdir()) if repo.name.startswith("rl-")]
        if len({repo.name for repo in repos}) < len(repos):
            parser.error("two loop folders hold a loop of the same name (the same seed twice)")
        splits = {repo.name: split(repo, args.share, args.after) for repo in repos}
    # "before" and "after" name the parts, so the split point is stored as "split_after"
    result = {"share": args.share, "split_after": args.after}
    # before the first update the adapters are zero and both samplers are the prior: an A/A check
    for part, span in {"before": f"1..{args.after}", "after": f"{args.after + 1}..end"}.items():
        loops = {name: parts[part] for name, parts in splits.items()}
        result[part] = {"loops": loops, "policy_minus_prior": compare(loops)}
        print(f"experiments {span}")
        for name, figures in loops.items():
            print(" ", name, figures)
        print(json.dumps(result[part]["policy_minus_prior"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
