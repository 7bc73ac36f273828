"""
Keep rules side by side on the bundled target, from the same runs: the single-run rule (one
run beats the baseline by 2 x the sample std of 3 baseline runs: gitresearch before
confirmation) and the confirmation rule (a screen run, then paired re-runs and a sequential
test, with sigma pooled from every repeat).

    python benchmarks/keep_rule.py --budget 30 --nulls 40 --power 10 --out benchmarks/results/keep_rule.jsonl

A research repo is made from target_repo/ (`gitresearch init --template nanochat`) and the
production loop runs everything: sandboxed training, the frozen evaluator, the baseline
(`[noise] noise_runs` repeats, slow ones re-run). Trials, in a seeded random order, are
committed on the baseline as experiments and run by `Loop.run_experiment` (screen, then
confirmation pairs when the screen passes); after a keep, best goes back to the baseline so
that every trial is judged against the same code. Early stop is off, so every screen run has
a final value for the single-run rule. Null trials change nothing the run reads: a comment
line, an unread constant, or a value in the CUDA branch of a conditional (this is a CPU).
Power trials multiply the Muon learning rate MATRIX_LR by 3 (a known real gain).
With --remeasure, best is re-run between trials every [confirm] remeasure_every experiments
(production `Loop.remeasure`), so that a machine that drifts is caught as the loop catches it.
An --out file that exists is resumed: its trials are not run again (the same seed gives the
same trials), and a confirmation a kill interrupted is finished from its note.

Output, one JSON object per line (stdout, and --out):
- {"kind": "baseline", "values", "steps", "old_std", "old_min_delta", "noise_std", "min_delta"}
- {"kind": "trial", "trial", "type" (null|power), "description", "experiment", "screen",
   "screen_steps", "old_keep", "status", "pairs", "slow_pairs", "extra_runs", "verdict",
   "gain" (mean pair gain), "candidate_values", "best_values", "pair_steps_per_s",
   "noise_std", "noise_upper", "noise_dof", "min_delta", "seconds"}
- {"kind": "summary", per type: trials, old keep rate, new keep rate, extra runs per
   candidate, per screened candidate and per keep; the power trials' mean pair gain and the
   screen gain over the baseline in pooled stds}
A table goes to stderr. Exit status 0 when the new rule keeps at most 5% of the nulls and at
least 90% of the power trials.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gitresearch import config as config_module
from gitresearch.loop import Loop, pending
from pysource import set_constant

NULL_KINDS = ("comment", "unread constant", "CUDA branch")
CUDA_EDITS = [("DEPTH = 12 if CUDA", "DEPTH = {} if CUDA", (10, 14, 16, 20)),
              ("WIDTH = 768 if CUDA", "WIDTH = {} if CUDA", (512, 640, 1024)),
              ("BATCH_SIZE = 32 if CUDA", "BATCH_SIZE = {} if CUDA", (24, 48, 64))]


def null_edit(source: str, i: int, rng: random.Random) -> tuple[str, str]:
    kind = NULL_KINDS[i % len(NULL_KINDS)]
    lines = source.split("\n")
    if kind == "comment":
        tops = [n for n, line in enumerate(lines) if line[:1].isupper() and " = " in line]
        at = rng.choice(tops)
        lines.insert(at, f"# null trial {i}: a comment the interpreter skips")
        return "\n".join(lines), f"null {i}: comment before line {at + 1}"
    if kind == "unread constant":
        at = next(n for n, line in enumerate(lines) if line.startswith("SEED = "))
        lines.insert(at + 1, f"SCRATCH_{i} = {rng.randint(1, 999)}  # never read")
        return "\n".join(lines), f"null {i}: unread constant SCRATCH_{i}"
    old, template, values = CUDA_EDITS[(i // len(NULL_KINDS)) % len(CUDA_EDITS)]
    new = template.format(rng.choice(values))
    assert old in source, old
    return source.replace(old, new), f"null {i}: CUDA branch {new}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--nulls", type=int, default=40)
    parser.add_argument("--power", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repo", type=Path, help="keep the research repo here (default: a temp dir)")
    parser.add_argument("--out", type=Path, help="JSON lines; an existing file is resumed (its trials are not run again)")
    parser.add_argument("--remeasure", action="store_true",
                        help="re-run best between trials every [confirm] remeasure_every experiments, as the loop does")
    args = parser.parse_args()
    out = args.out.open("a") if args.out else None

    def emit(obj):
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    root = args.repo or Path(tempfile.mkdtemp(prefix="gitresearch-keep-rule-")) / "research"
    if not (root / ".git").exists():
        subprocess.run([sys.executable, "-m", "gitresearch", "init", "--template", "nanochat", str(root)],
                       check=True, stdout=subprocess.DEVNULL)
    config = config_module.load(root, {"run.budget_s": args.budget, "early_stop.enabled": False})
    loop = Loop(root, config, policy="random", display=lambda line: print(line, file=sys.stderr, flush=True))
    store = loop.store
    if store.best() is None:
        store.create_best(store.resolve("HEAD"))
    loop.setup()
    baseline = loop.ensure_baseline()
    base = store.experiment_commit(0)
    if store.best() != base:
        store.set_best(store.best(), base, "benchmark: best back to the baseline")
    previous = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out and args.out.exists() else []
    first3 = baseline["noise_runs"][:3]
    old_std = statistics.stdev(first3)
    old_mean = statistics.fmean(first3)
    level = loop.noise_floor()
    if not previous:
        emit({"kind": "baseline", "values": baseline["noise_runs"],
              "steps": [t["steps"] for t in baseline["noise_throughput"]], "slow": baseline.get("noise_slow"),
              "old_mean": old_mean, "old_std": old_std, "old_min_delta": 2 * old_std,
              "noise_std": level.noise.std if level.noise else None, "min_delta": level.min_delta})

    rng = random.Random(args.seed)
    source = store.read_file(base, "train.py")
    trials = [("null", i) for i in range(args.nulls)] + [("power", i) for i in range(args.power)]
    rng.shuffle(trials)
    done = len([r for r in previous if r.get("kind") == "trial"])
    for n, (kind, i) in enumerate(trials, 1):
        if kind == "null":
            edited, description = null_edit(source, i, rng)  # drawn for every trial: the same edits on resume
        else:
            edited, description = set_constant(source, "MATRIX_LR", "({}) * 3"), f"power {i}: MATRIX_LR x3"
        if n <= done:
            continue
        experiments = [e for e in store.experiments() if e.number > 0]
        if args.remeasure and loop.remeasure_due(experiments):  # as the loop does between experiments
            loop.remeasure(experiments)
        started = next((e for e in experiments if e.description == description and pending(e.record)), None)
        if started:  # a trial a killed run left unfinished (a confirmation in progress)
            number, commit, record = started.number, started.commit, started.record
        else:
            tree, _ = store.apply_diff(base, store.make_diff("train.py", source, edited))
            number, commit = store.create_experiment(base, tree, description, "benchmark", lambda *a: True)
            record = None
        start = time.monotonic()
        record = loop.run_experiment(number, commit, base, description, {"policy": "benchmark"}, record)
        if store.best() != base:  # judge every trial against the same baseline
            store.set_best(store.best(), base, "benchmark: best back to the baseline")
        conf = record.get("confirmation") or {}
        pairs = conf.get("pairs") or []
        screen = record.get("screen_val_bpb", record.get("val_bpb"))
        emit({"kind": "trial", "trial": n, "type": kind, "description": description, "experiment": number,
              "screen": screen, "screen_steps": record.get("steps"),
              "old_keep": screen is not None and old_mean - screen > 2 * old_std,
              "status": record["status"], "reason": record.get("reason", ""), "pairs": len(pairs),
              "slow_pairs": len(conf.get("slow") or []),
              "extra_runs": 2 * (len(pairs) + len(conf.get("slow") or [])), "verdict": conf.get("verdict"),
              "gain": statistics.fmean(p["gain"] for p in pairs) if pairs else None,
              "candidate_values": [p["candidate"] for p in pairs], "best_values": [p["best"] for p in pairs],
              "pair_steps_per_s": [p["steps_per_s"] for p in pairs],
              "noise_std": record.get("noise_std"), "noise_upper": record.get("noise_upper"),
              "noise_dof": record.get("noise_dof"), "min_delta": record.get("min_delta"),
              "screen_threshold": record.get("screen_threshold"),
              "remeasured": args.remeasure, "seconds": round(time.monotonic() - start, 1)})
        if out:
            out.flush()

    rows = [json.loads(line) for line in (args.out.read_text().splitlines() if args.out else [])]
    return summarise([r for r in rows if r.get("kind") == "trial"][-len(trials):], emit)


def summarise(rows: list[dict], emit) -> int:
    summary = {"kind": "summary"}
    for kind in ("null", "power"):
        group = [r for r in rows if r["type"] == kind]
        if not group:
            continue
        keeps = [r for r in group if r["status"] == "keep"]
        screened = [r for r in group if r["pairs"] or r["slow_pairs"]]
        extra = sum(r["extra_runs"] for r in group)
        gains = [r["gain"] for r in group if r["gain"] is not None]
        summary[kind] = {"trials": len(group), "old_keep_rate": sum(r["old_keep"] for r in group) / len(group),
                         "new_keep_rate": len(keeps) / len(group), "screened": len(screened),
                         "extra_runs_per_candidate": extra / len(group),
                         "extra_runs_per_screened": extra / len(screened) if screened else None,
                         "mean_pair_gain": statistics.fmean(gains) if gains else None}
    kept = [r for r in rows if r["status"] == "keep"]
    summary["extra_runs_per_keep"] = sum(r["extra_runs"] for r in rows) / len(kept) if kept else None
    last = rows[-1] if rows else {}
    summary["final_noise_std"], summary["final_noise_dof"] = last.get("noise_std"), last.get("noise_dof")
    if summary.get("power", {}).get("mean_pair_gain") and last.get("noise_std"):
        summary["power"]["gain_in_std"] = summary["power"]["mean_pair_gain"] / last["noise_std"]
    emit(summary)
    print(f"{'':24}{'null':>10}{'power':>10}", file=sys.stderr)
    for key in ("trials", "old_keep_rate", "new_keep_rate", "screened", "extra_runs_per_candidate",
                "extra_runs_per_screened"):
        cells = [summary.get(k, {}).get(key) for k in ("null", "power")]
        print(f"{key:24}" + "".join(f"{c:>10.3f}" if isinstance(c, float) else f"{str(c):>10}" for c in cells),
              file=sys.stderr)
    ok = (summary.get("null", {}).get("new_keep_rate", 1) <= 0.05
          and summary.get("power", {}).get("new_keep_rate", 0) >= 0.9)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
