#!/usr/bin/env python
"""The figures of `gitresearch bench research --workdir DIR` loops read from their notes, also
while they run or after they were cut off: per loop, the experiments so far, best so far
(final and at 25, 50, ... experiments), the status counts, the per-window figures of
research_bench.windows, the crashes per window of 50 and the move sizes per window of 50 (over
the positive numeric constants each valid experiment changed, read with the policies' own
constant finder at the commit and its parent: the median |ln(new / old)| and the share of
moves beyond the random policy's factor 3), the failed tries per window of 50 that [policy]
max_move_factor refused (capped_tries), the constants the policies leave alone at the end
of each window of 50 (history.crashed_constants; crash_blame.py counts them by an older
checkout's rule), and per valid experiment that moved a constant its largest |ln move|, its
status and its improvement in sigmas at loss weight 1 (gitresearch.reward with [reward]
loss_weight = 1 and improvement_weight = 1, whatever the loop ran with; move_payoff.py
reads them: `largest_moves`), the experiments right after a keep and how many of them repeat
its steps (`repeats`: the same constants, each by the same step within 3 %, as moves.steps_of
states them: the momentum `pretrain-policy --momentum` teaches), per number of constants a
valid experiment moved (1, 2, 3, "4+"; `by_constants_moved`) its experiments, keeps and the
sum of the keeps' gains over their parent's metric; per window of 50 the constant the most
valid experiments moved and the share of the window's constant-moving valid experiments that
moved it (`top_constant`: how far a loop narrows onto one constant); for rl loops, every
PPO update's KL, mean k3 penalty, raw advantage std, entropy, clip fraction and share of
decision tokens ([rl] token_share; with [rl] kl_target also the sampled KL and kl_coef), the
reasons of the invalid experiments, the errors of every failed try (valid experiments' earlier tries included) and,
per window of 50, the share of experiments whose first try was valid and the number whose
diff applied only after the stale-line repair ([policy] repair_stale_lines).

    python benchmarks/research_snapshot.py DIR OUT.json
"""
import json, math, re, sys, time
from collections import Counter
from pathlib import Path
from gitresearch.gitstore import Store
from gitresearch.config import RewardConfig
from gitresearch.history import baseline_record, crashed_constants
from gitresearch.policies.constants import find_sites, log_moves, move_summary
from gitresearch.policies.moves import STEP, steps_of
from gitresearch.research_bench import trajectory, windows
from gitresearch.reward import reward
root, out = Path(sys.argv[1]), Path(sys.argv[2])


def values(store: Store, commit: str, seen: dict) -> dict:
    """The gym train.py's constant values at a commit (exponent sites left out); none when
    the edit broke its syntax. `seen` keeps them per commit: most experiments share a parent."""
    if commit not in seen:
        try:
            seen[commit] = {s.name: s.value for s in find_sites(store.read_file(commit, "train.py")) if s.kind == "value"}
        except SyntaxError:
            seen[commit] = {}
    return seen[commit]


def moves(store: Store, exp, seen: dict) -> list[float]:
    """|ln(new / old)| of each positive numeric constant the experiment's commit changed."""
    parent = store.parent_of(exp.commit)
    if not parent or (exp.record or {}).get("status") in ("invalid", None):
        return []
    return log_moves(values(store, parent, seen), values(store, exp.commit, seen))


def move_windows(store: Store, exps: list, seen: dict) -> list[dict]:
    out = []
    for i in range(0, len(exps), 50):
        ms = [m for e in exps[i:i + 50] for m in moves(store, e, seen)]
        out.append(dict(zip(("median_abs_log", "beyond_factor_3"), move_summary(ms))))
    return out


def largest_moves(store: Store, exps: list, seen: dict) -> list[list]:
    """[largest |ln move|, status, improvement in sigmas with losses counted in full] per
    valid experiment that moved a positive numeric constant."""
    baseline, full = baseline_record(store), RewardConfig(improvement_weight=1.0, loss_weight=1.0)
    out = []
    for e in exps:
        ms = moves(store, e, seen)
        if ms and e.record["status"] not in ("crash", "timeout"):
            out.append([round(max(ms), 4), e.record["status"], reward(e.record, baseline, full)["improvement"]])
    return out


def same_steps(a: str | None, b: str | None) -> bool:
    """Do two steps texts make the same moves (factors within 3 %)?"""
    if not a or not b:
        return False
    parse = lambda text: {m["name"]: (m["op"], m["arg"]) for m in map(STEP.match, text.split("; "))}  # noqa: E731
    first, second = parse(a), parse(b)
    if first.keys() != second.keys():
        return False
    for name, (op, arg) in first.items():
        other_op, other_arg = second[name]
        if op != other_op or (arg != other_arg and not (op in "x/" and abs(math.log(float(arg) / float(other_arg))) < 0.03)):
            return False
    return True


def by_constants_moved(store: Store, exps: list, seen: dict) -> dict:
    """{n constants moved: {experiments, keeps, gain}} over the valid experiments: gain is the
    sum of the keeps' improvements over their parent (parent_<metric> - <metric>)."""
    out = {}
    for e in exps:
        if e.record["status"] in ("invalid", None) or not store.parent_of(e.commit):
            continue
        n = len(moved_names(store, e, seen))
        row = out.setdefault(str(n) if n < 4 else "4+", {"experiments": 0, "keeps": 0, "gain": 0.0})
        row["experiments"] += 1
        if e.record["status"] == "keep":
            metric = e.record["metric"]
            row["keeps"] += 1
            row["gain"] = round(row["gain"] + e.record[f"parent_{metric}"] - e.record[metric], 6)
    return dict(sorted(out.items()))


def moved_names(store: Store, exp, seen: dict) -> set[str]:
    """The constants a valid experiment's commit changed (none for an invalid one)."""
    if (exp.record or {}).get("status") in ("invalid", None) or not (parent := store.parent_of(exp.commit)):
        return set()
    old, new = values(store, parent, seen), values(store, exp.commit, seen)
    return {name for name, value in old.items() if name in new and new[name] != value}


def top_constant(store: Store, exps: list, seen: dict) -> list[dict]:
    """Per window of 50: the most-moved constant and its share of the window's valid
    experiments that moved a constant (of tied constants, the one moved first)."""
    out = []
    for i in range(0, len(exps), 50):
        moved = [n for n in (moved_names(store, e, seen) for e in exps[i:i + 50]) if n]
        counts = Counter(name for names in moved for name in sorted(names))
        name, count = counts.most_common(1)[0] if counts else (None, 0)
        out.append({"name": name, "share": round(count / len(moved), 3) if moved else None})
    return out


def repeats(store: Store, exps: list) -> dict:
    """Of the experiments right after a keep, those that repeat its steps."""
    sites = {"train.py": find_sites(store.read_file(exps[0].commit, "train.py"))}  # the kinds, by name
    after = [(kept, nxt) for kept, nxt in zip(exps, exps[1:]) if kept.record["status"] == "keep"]
    return {"after_keep": len(after),
            "repeated": sum(same_steps(steps_of(k.record.get("description") or "", sites),
                                       steps_of(n.record.get("description") or "", sites)) for k, n in after)}


loops = {}
for repo in sorted(root.iterdir()):
    store = Store(repo)
    exps = [e for e in reversed(store.experiments()) if (e.record or {}).get("status")]  # running: none yet
    recs = [e.record for e in exps]
    if not recs:  # a loop just started: not even its baseline has a result yet
        continue
    t = trajectory(recs)
    entry = {"experiments": len(recs) - 1, "best_final": t["best"][-1],
             "best_at": {n: t["best"][n] for n in (25, 50, 75, 100, 150, 200, 250, 300) if n < len(t["best"])},
             "statuses": dict(Counter(r["status"] for r in recs)),
             "windows": windows(t)}
    statuses = [r["status"] for r in recs[1:]]
    entry["crashes"] = [statuses[i:i + 50].count("crash") for i in range(0, len(statuses), 50)]
    seen = {}  # commit -> its constants, read once for both
    entry["moves"] = move_windows(store, exps[1:], seen)
    entry["largest_moves"] = largest_moves(store, exps[1:], seen)
    entry["repeats"] = repeats(store, exps)
    entry["by_constants_moved"] = by_constants_moved(store, exps[1:], seen)
    entry["top_constant"] = top_constant(store, exps[1:], seen)
    capped = [sum("max_move_factor" in a["error"] for a in r.get("attempts") or []) for r in recs[1:]]
    entry["capped_tries"] = [sum(capped[i:i + 50]) for i in range(0, len(capped), 50)]  # refused by the cap
    entry["avoided"] = [len(crashed_constants(store, exps[i:0:-1])) for i in range(50, len(exps), 50)]
    if repo.name.startswith("rl-"):
        log = repo / ".git/gitresearch/rl/updates.jsonl"  # absent until the first update
        ups = [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []
        entry["updates"] = [{k: u[k] for k in ("experiment", "episodes", "mean_reward", "kl", "entropy", "clip_frac",
                                               "sampled_kl", "kl_coef", "adv_std", "kl_penalty", "decision_tokens") if k in u} for u in ups]
        entry["invalid_reasons"] = dict(Counter((r.get("reason") or "").split("last: ")[-1][:40]
                                                for r in recs if r["status"] == "invalid"))
        entry["failed_try_errors"] = dict(Counter(re.sub(r"[0-9a-f]{12}|#\d+", "N", a["error"])[:40]
                                                  for r in recs[1:] for a in r.get("attempts") or []))
        first = [not r.get("attempts") for r in recs[1:]]
        entry["first_try_valid"] = [round(sum(first[i:i + 50]) / len(first[i:i + 50]), 3)
                                    for i in range(0, len(first), 50)]
        repaired = [bool(r.get("repaired_lines")) for r in recs[1:]]
        entry["repaired"] = [sum(repaired[i:i + 50]) for i in range(0, len(repaired), 50)]
    loops[repo.name] = entry
json.dump({"schema": 1, "snapshot_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loops": loops},
          open(out, "w"), indent=1)
print({k: (v["experiments"], round(v["best_final"], 4)) for k, v in loops.items()})
