"""benchmarks/sampler_split.py: which sampler made each try of a prior_share loop, and what
each sampler's tries brought."""
import json
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from helpers import benchmark_module

sampler_split = benchmark_module("sampler_split")

ERRORS = {"moved_twice": "a constant is moved twice in one Moves line",
          "unreadable": "cannot read the step `LR[0.6`: expected NAME xF, NAME /F, NAME +K, NAME -K or NAME = V",
          "unknown_constant": "the step `LR /2` names LR, which is not a constant shown; the constants: DEPTH",
          "repeat": "this exact change was already tried as experiment #2; propose something different",
          "move_too_large": "the diff moves DEPTH from 4 to 1 (/4); one experiment may move a constant at most x3"}
# experiment -> (its refused tries by kind, its status, val_bpb); experiment 0 is the baseline
LOOP = {1: (["moved_twice"], "keep", 1.9), 2: ([], "discard", 2.1),
        3: (["unreadable", "unknown_constant"], "invalid", None), 4: (["repeat"], "keep", 1.8),
        5: (["move_too_large", "unreadable"], "crash", None), 6: ([], "keep", 1.75)}
SEED, SHARE, AFTER = 7, 0.5, 2


def loop_records(flip: int | None = None) -> list[dict]:
    """The notes a loop with LOOP's tries would write, each valid note naming the sampler of the
    try that ran as the RL policy draws it; `flip`: that experiment's note names the other."""
    draws = random.Random(f"prior-share-{SEED}")
    records = [{"experiment": 0, "status": "keep", "val_bpb": 2.0}]
    for number, (refused, status, val_bpb) in LOOP.items():
        tries = [draws.random() < SHARE for _ in range(len(refused) + (status != "invalid"))]
        record = {"experiment": number, "status": status, "val_bpb": val_bpb, "reward": {"total": -float(number)},
                  "attempts": [{"error": ERRORS[kind], "reply": "Moves: ..."} for kind in refused]}
        if status != "invalid":
            record["policy_data"] = {"sampled_from_prior": tries[-1] != (number == flip)}
        records.append(record)
    return records


def fake_store(records):
    return lambda repo: SimpleNamespace(experiments=lambda: [SimpleNamespace(record=r) for r in reversed(records)])


def expected() -> dict:
    """LOOP tallied by hand per part and sampler, the draws laid over its tries in order."""
    draws = random.Random(f"prior-share-{SEED}")
    out = {part: {s: Counter() for s in ("policy", "prior")} for part in ("before", "after")}
    best = 2.0
    for number, (refused, status, val_bpb) in LOOP.items():
        part = out["before" if number <= AFTER else "after"]
        for kind in refused:
            sampler = part["prior" if draws.random() < SHARE else "policy"]
            sampler["tries"] += 1
            sampler[kind] += 1
        if status == "invalid":
            continue
        sampler = part["prior" if draws.random() < SHARE else "policy"]
        sampler["tries"] += 1
        sampler["valid"] += 1
        sampler["keeps"] += status == "keep"
        sampler["crashes"] += status == "crash"
        if status == "keep":
            sampler["improvement"] += best - val_bpb
            best = val_bpb
    return out


def test_each_try_is_counted_for_the_sampler_its_draw_names(monkeypatch, tmp_path):
    monkeypatch.setattr(sampler_split, "Store", fake_store(loop_records()))
    parts = sampler_split.split(tmp_path / f"rl-seed{SEED}", SHARE, AFTER)
    want = expected()
    for part in ("before", "after"):
        for name in ("policy", "prior"):
            got, tally = parts[part][name], want[part][name]
            assert {k: got[k] for k in ("tries", "valid", "keeps", "crashes")} == \
                {k: tally[k] for k in ("tries", "valid", "keeps", "crashes")}
            assert got["improvement"] == pytest.approx(tally["improvement"], abs=1e-5)
            assert got["refusals"] == {kind: tally[kind] for kind in ERRORS if tally[kind]}
            assert got["tries"] == got["valid"] + sum(got["refusals"].values())
    # both samplers made tries after the split, so the replay did not give every try to one
    assert all(parts["after"][name]["tries"] for name in ("policy", "prior"))


def test_a_note_that_disagrees_with_the_replayed_draw_stops_the_count(monkeypatch, tmp_path):
    monkeypatch.setattr(sampler_split, "Store", fake_store(loop_records(flip=4)))
    with pytest.raises(SystemExit, match="#4: replayed sampler"):
        sampler_split.split(tmp_path / f"rl-seed{SEED}", SHARE, AFTER)


def output(path, loops: dict, **settings):
    """A --json output holding `loops` (name -> the after part's figures; before made equal)."""
    data = {**settings, "before": {"loops": loops}, "after": {"loops": loops}}
    path.write_text(json.dumps(data))
    return path


def figures(tries, keeps, refusals=None):
    row = {"tries": tries, "valid": tries, "keeps": keeps, "crashes": 0, "improvement": 0.01 * keeps}
    return row if refusals is None else {**row, "refusals": refusals}


def test_merge_pools_the_loops_of_outputs_that_agree(tmp_path):
    a = output(tmp_path / "a.json", {"rl-seed1": {"policy": figures(10, 2, {"unreadable": 1}),
                                                  "prior": figures(10, 1, {})}}, share=0.5)
    b = output(tmp_path / "b.json", {"rl-seed2": {"policy": figures(20, 1, {"unreadable": 2}),
                                                  "prior": figures(10, 3, {"repeat": 4})}},
               share=0.5, split_after=50)
    share, after, splits = sampler_split.merged([a, b])
    assert (share, after, sorted(splits)) == (0.5, 50, ["rl-seed1", "rl-seed2"])
    pooled = sampler_split.compare({name: parts["after"] for name, parts in splits.items()})
    assert pooled["keeps_per_try"]["per_loop"] == [0.1, -0.25]
    assert pooled["pooled"]["policy"]["refusals"] == {"unreadable": 3}
    assert pooled["pooled"]["prior"]["refusals"] == {"repeat": 4}
    # a loop counted before refusals were: no pooled refusals rather than a partial count
    old = output(tmp_path / "old.json", {"rl-seed3": {"policy": figures(5, 1), "prior": figures(5, 0)}}, share=0.5)
    _, _, splits = sampler_split.merged([b, old])
    assert "refusals" not in sampler_split.compare({n: p["after"] for n, p in splits.items()})["pooled"]["policy"]

    with pytest.raises(SystemExit, match="rl-seed1 is in an earlier output"):
        sampler_split.merged([a, a])
    other_share = output(tmp_path / "c.json", {"rl-seed4": {"policy": figures(1, 0), "prior": figures(1, 0)}}, share=0.3)
    with pytest.raises(SystemExit, match="disagree"):
        sampler_split.merged([a, other_share])
    other_split = output(tmp_path / "d.json", {"rl-seed5": {"policy": figures(1, 0), "prior": figures(1, 0)}},
                         share=0.5, split_after=40)
    with pytest.raises(SystemExit, match="disagree"):
        sampler_split.merged([a, other_split])
