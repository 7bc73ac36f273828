#!/usr/bin/env python
"""The figures of `gitresearch bench research --workdir DIR` loops read from their notes, also
while they run or after they were cut off: per loop, the experiments so far, best so far
(final and at 25, 50, ... experiments), the status counts, the per-window figures of
research_bench.windows and the crashes per window of 50; for rl loops, every PPO update's KL, mean k3 penalty, raw advantage
std, entropy, clip fraction and share of decision tokens ([rl] token_share; with [rl] kl_target also the sampled KL and kl_coef), the
reasons of the invalid experiments, the errors of every failed try (valid experiments'
earlier tries included) and, per window of 50, the share of experiments whose first try was
valid and the number whose diff applied only after the stale-line repair ([policy]
repair_stale_lines).

    python benchmarks/research_snapshot.py DIR OUT.json
"""
import json, re, sys, time
from collections import Counter
from pathlib import Path
from gitresearch.gitstore import Store
from gitresearch.research_bench import trajectory, windows
root, out = Path(sys.argv[1]), Path(sys.argv[2])
loops = {}
for repo in sorted(root.iterdir()):
    recs = [e.record or {} for e in reversed(Store(repo).experiments())]
    recs = [r for r in recs if r.get("status")]  # an experiment still running has no status
    if not recs:  # a loop just started: not even its baseline has a result yet
        continue
    t = trajectory(recs)
    entry = {"experiments": len(recs) - 1, "best_final": t["best"][-1],
             "best_at": {n: t["best"][n] for n in (25, 50, 75, 100, 150, 200, 250, 300) if n < len(t["best"])},
             "statuses": dict(Counter(r["status"] for r in recs)),
             "windows": windows(t)}
    statuses = [r["status"] for r in recs[1:]]
    entry["crashes"] = [statuses[i:i + 50].count("crash") for i in range(0, len(statuses), 50)]
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
