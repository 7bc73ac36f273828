"""What the policies see of the past, read from git alone: the history window, the best
chain and diagnostics. Everything here is derived from refs and notes, so any clone of the
repo gives the same view."""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass

from .config import Config
from .confirm import Floor, floor
from .gitstore import VERIFY_REF, Experiment, GitError, Store
from .policies import State


@dataclass(frozen=True)
class Entry:
    """One experiment as the history window shows it."""
    experiment: int
    commit: str
    parent: str | None
    description: str
    status: str
    val_bpb: float | None
    delta: float | None  # against its parent's val_bpb
    comment: str  # the self-evaluation's verdict
    reason: str
    seconds: float | None  # wall seconds of the run
    peak_memory_mb: float | None
    diff: str  # truncated to diff_chars
    confirmation: str = ""  # the confirmation's verdict (pairs, gain ± se, LLR), when it had one


def truncate_diff(diff: str, limit: int) -> str:
    """Keep whole lines up to `limit` characters and say how much was cut."""
    if len(diff) <= limit:
        return diff
    kept = diff[:limit].rsplit("\n", 1)[0]
    cut = diff.count("\n") - kept.count("\n")
    return f"{kept}\n[... {cut} more diff lines not shown]"


def entry(store: Store, exp: Experiment, diff_chars: int) -> Entry:
    record = exp.record or {}
    diff = record.get("rejected_diff") if record.get("status") == "invalid" else store.diff_of(exp.commit)
    return Entry(exp.number, exp.commit, exp.parent, record.get("description") or exp.description,
                 record.get("status", "pending"), record.get("val_bpb"), record.get("delta"),
                 record.get("comment", ""), record.get("reason", ""), record.get("seconds"),
                 record.get("peak_memory_mb"), truncate_diff(diff or "", diff_chars),
                 (record.get("confirmation") or {}).get("verdict", ""))


def history_window(store: Store, experiments: list[Experiment], k: int, diff_chars: int = 1500) -> list[Entry]:
    """The last k finished experiments of any status (baseline excluded), newest first."""
    finished = [e for e in experiments if e.record is not None and e.number > 0]
    return [entry(store, exp, diff_chars) for exp in finished[:k]]


def best_chain(store: Store, experiments: list[Experiment] | None = None) -> list[dict]:
    """best's first-parent chain with its notes, oldest (the baseline) first, each with its
    gain over the previous link. Notes come from `experiments` when given (already read)."""
    known = {e.commit: e.record for e in experiments or ()}
    chain, previous = [], None
    for commit in reversed(store.best_chain()):
        record = (known[commit] if commit in known else store.read_note(commit)) or {}
        value = record.get("val_bpb")
        gain = value - previous if isinstance(value, float) and isinstance(previous, float) else None
        chain.append({"commit": commit, "experiment": record.get("experiment"),
                      "description": store.subject(commit),
                      "status": record.get("status"), "val_bpb": value, "delta": gain})
        previous = value if isinstance(value, float) else previous
    return chain


def diagnostics(experiments: list[Experiment], baseline: dict | None = None,
                level: Floor | None = None, best_record: dict | None = None) -> dict:
    """Counts and recent failure reasons over every experiment; the noise floor pooled from
    every repeat (`level`; else the baseline's own, from `baseline` or experiment 0 when
    `experiments` holds it); drift when best's newest re-run found the machine changed."""
    records = [e.record for e in experiments if e.record is not None and e.number > 0]
    counts = collections.Counter(r.get("status", "?") for r in records)
    if baseline is None:
        baseline = next((e.record for e in experiments if e.number == 0 and e.record), {})
    stopped = [r for r in records if r.get("status") == "early_stop"]
    recent_failures = [f"#{r.get('experiment')} {r.get('status')}: {r.get('reason', '')}"[:240]
                       for r in records[:32] if r.get("status") in ("crash", "timeout", "invalid")][:5]
    since_keep = next((i for i, r in enumerate(records) if r.get("status") == "keep"), len(records))
    noise = {"noise_std": baseline.get("noise_std"), "noise_n": len(baseline.get("noise_runs") or []),
             "min_delta": baseline.get("min_delta"), "min_delta_rule": baseline.get("min_delta_rule"),
             "noise_upper": None, "screen_threshold": None}
    if level is not None and level.noise is not None:
        noise = {"noise_std": level.noise.std, "noise_n": level.noise.dof + level.noise.groups,
                 "noise_upper": level.noise.upper, "min_delta": level.min_delta,
                 "min_delta_rule": level.rule, "screen_threshold": level.screen}
    remeasured = (best_record or {}).get("remeasured") or []
    drift = remeasured[-1].get("reason") if remeasured and remeasured[-1].get("drift") else None
    return {"experiments": len(records), "by_status": dict(counts.most_common()),
            "baseline_val_bpb": baseline.get("val_bpb"), **noise, "drift": drift,
            "since_last_keep": since_keep, "early_stopped": len(stopped),
            "recent_failures": recent_failures}


CHANGED_CONSTANT = re.compile(r"^[-+]\s*([A-Z][A-Z0-9_]*)\s*(?::[^=]*)?=(?!=)")
CRASHES_TO_AVOID = 2  # a constant to blame for this many crashes since it last ran is left alone
BLAME_MEMORY = 50  # experiments: an older crash no longer counts, so a blamed constant is offered again
MEASURED = ("keep", "discard", "early_stop")  # statuses of a run that trained and was measured


def crashed_constants(store: Store, experiments: list[Experiment]) -> dict[str, list[int]]:
    """Module constants (UPPER_CASE assignments a diff changes) to blame for CRASHES_TO_AVOID
    crashes or timeouts since a run that changed them was last measured, among the last
    BLAME_MEMORY experiments: name -> those experiments, oldest first. Read from the diffs, so it
    holds for any policy's edits.

    A crash blames each of the k constants its diff changed 1/k: a policy that changes three
    constants at a time and crashes twice has not shown that any one of them crashes. Blaming
    all of them in full, over the whole history, left random search 0 to 3 of the gym's 14
    constants after an rl loop's crashes, and the compact prompt showed the LM 0 to 5 of 14 by
    its 300th experiment (docs/gym.md, "Crash blame"). A measured run that changed a constant
    clears its blame: its crashes came from the values tried then, not from touching it.
    Blame fades: no policy changes a constant it is told to leave alone, so no measured run
    would ever clear it, and one early pair of bad values (WIDTH = 200 beside HEAD_DIM = 64)
    took WIDTH away for the rest of the loop (docs/gym.md, "Blame that fades")."""
    shares: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)  # name -> (crash, share)
    # an experiment before the window can neither blame nor clear a crash inside it: its diff is not read
    oldest = max((exp.number for exp in experiments), default=0) - BLAME_MEMORY
    for exp in reversed(experiments):  # oldest first
        status = (exp.record or {}).get("status")
        if exp.number <= oldest or status not in ("crash", "timeout") + MEASURED:
            continue
        names = {m.group(1) for line in store.diff_of(exp.commit).splitlines()
                 if not line.startswith(("---", "+++")) and (m := CHANGED_CONSTANT.match(line))}
        for name in names:
            if status in MEASURED:
                shares.pop(name, None)
            else:
                shares[name].append((exp.number, 1 / len(names)))
    # a float sum of k shares of 1/k can fall short of 1 by an ulp
    return {name: [n for n, _ in crashes] for name, crashes in sorted(shares.items())
            if sum(share for _, share in crashes) >= CRASHES_TO_AVOID - 1e-9}


def current_floor(store: Store, config: Config, records: list[dict]) -> Floor:
    """The noise floor pooled from `records` (every note, baseline included) and the
    verification notes."""
    return floor(records, store.all_notes(VERIFY_REF).values(), config.noise, config.confirm)


def baseline_record(store: Store) -> dict:
    """Experiment 0's note (the loop's experiment list leaves the baseline out)."""
    commit = store.experiment_commit(0)
    return (store.read_note(commit) if commit else None) or {}


def read_agenda(store: Store, commit: str, path: str) -> str:
    """The agenda as committed in best (the repo is the record), else as on disk."""
    if not path:
        return ""
    try:
        return store.read_file(commit, path)
    except GitError:
        on_disk = store.root / path
        return on_disk.read_text(errors="replace") if on_disk.is_file() else ""


def build_state(store: Store, config: Config, experiments: list[Experiment]) -> tuple[State, dict[str, int]]:
    """The policies' view of the repo, and diff_sha -> experiment number of every experiment."""
    base = store.best()
    tried = {}
    for exp in reversed(experiments):  # oldest first: the first experiment of a diff wins
        sha = (exp.record or {}).get("diff_sha")
        if sha and sha not in tried and (exp.record or {}).get("status") != "invalid":
            tried[sha] = exp.number
    files = {p: store.read_file(base, p) for p in config.files.editable}
    baseline = baseline_record(store)
    level = current_floor(store, config, [baseline] + [e.record for e in experiments if e.record])
    policy = config.policy
    diagnosed = diagnostics(experiments, baseline, level, store.read_note(base))
    diagnosed["crashed_constants"] = crashed_constants(store, experiments)
    state = State(base, files, history_window(store, experiments, policy.history_k, policy.diff_chars),
                  best_chain(store, experiments), config, frozenset(tried), diagnosed,
                  read_agenda(store, base, policy.agenda))
    return state, tried
