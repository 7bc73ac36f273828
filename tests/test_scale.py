"""Scaling out: workers sharing one repo, and machines sharing a bare remote."""
import subprocess
import sys

from gitresearch.gitstore import Store
from helpers import cli, make_repo, sh, share_through_bare_remote

SLOW = "[early_stop]\nenabled = false\n"


def slow_repo(path, step_s="0.1"):
    repo = make_repo(path, config=SLOW)
    # constants apart, so that changes to two of them merge (diff context is 3 lines)
    source = (repo / "train.py").read_text().replace("STEP_S = 0.0", f"STEP_S = {step_s}")
    source = source.replace("DEPTH = 4", "#\n#\n#\n#\n#\n#\nDEPTH = 4")
    (repo / "train.py").write_text(source)
    sh("git", "commit", "-qam", "steps take time, so that runs overlap", cwd=repo)
    cli("init", cwd=repo)
    return repo


def check_invariants(store: Store) -> list[dict]:
    """Every experiment has a note; best's chain strictly improves; every improvement over
    its parent is on best's chain or was rebased onto a newer best and run again."""
    experiments = store.experiments()
    assert all(e.record is not None for e in experiments), [e.number for e in experiments if not e.record]
    assert store.note_count() == len(experiments)
    chain = [store.read_note(c)["val_bpb"] for c in reversed(store.best_chain())]
    assert all(later < earlier for earlier, later in zip(chain, chain[1:])), chain
    on_best = set(store.best_chain())
    records = {e.number: {**e.record, "commit": e.commit, "parent": e.parent} for e in experiments}
    min_delta = records[0]["min_delta"]
    for number, r in records.items():
        parent_value = r.get("parent_val_bpb")
        if number == 0 or r.get("val_bpb") is None or parent_value is None:
            continue
        if r["val_bpb"] < parent_value - min_delta and r["commit"] not in on_best:
            assert "rebased onto best" in r["reason"] or "does not apply" in r["reason"], r
            if "rebased onto best" in r["reason"]:
                rebased = int(r["reason"].rsplit("#", 1)[1].split()[0])
                assert records[rebased]["description"].startswith(f"rebase of #{number}:")
    return list(records.values())


def test_workers_share_one_repo_and_rebase_a_stale_improvement(tmp_path):
    repo = slow_repo(tmp_path / "repo")
    cli("loop", "--max-experiments", "0", cwd=repo)  # the baseline
    store = Store(repo)
    base = store.best()
    source = store.read_file(base, "train.py")
    for old, new in (("DEPTH = 4", "DEPTH = 6"), ("LR = 0.1", "LR = 0.05")):  # both improve on base
        diff = store.make_diff("train.py", source, source.replace(old, new))
        store.create_experiment(base, store.apply_diff(base, diff)[0], f"{old} -> {new}", "test")
    proc = cli("loop", "--workers", "2", "--max-experiments", "6", "--seed", "3", cwd=repo)
    out = proc.stdout + proc.stderr
    records = check_invariants(Store(repo))
    rebases = [r for r in records if r.get("description", "").startswith("rebase of #")]
    assert rebases and rebases[0]["status"] == "keep", out  # the two gains combined
    assert len([r for r in records if r["experiment"] > 0]) >= 6
    assert "[worker 1] #" in out and "[worker 0] #" in out  # both ran experiments
    assert "rebased as #" in out


def test_two_machines_share_a_bare_remote(tmp_path):
    seed = slow_repo(tmp_path / "seed", step_s="0.05")
    cli("loop", "--max-experiments", "0", cwd=seed)
    bare, machines = share_through_bare_remote(seed)
    procs = [subprocess.Popen([sys.executable, "-m", "gitresearch", "loop", "--remote", "origin",
                               "--max-experiments", "10", "--seed", str(i + 1)], cwd=m,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, m in enumerate(machines)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    check = tmp_path / "check"
    sh("git", "clone", "-q", "-b", "main", str(bare), str(check), cwd=tmp_path)
    sh("git", "fetch", "-q", "origin", "+refs/notes/*:refs/notes/*", "+refs/gitresearch/*:refs/gitresearch/*",
       "+refs/heads/best:refs/heads/best", cwd=check)
    records = check_invariants(Store(check))
    finished = [r for r in records if r["experiment"] > 0]
    assert len(finished) >= 10 and len({r["host"] for r in finished}) >= 1
    origins = {Store(check).trailer(r["commit"], "Gitresearch-Origin") for r in finished}
    assert len(origins) == 2, "both machines ran experiments"


def test_an_empty_remote_is_started_by_the_first_machine(tmp_path):
    seed = slow_repo(tmp_path / "seed", step_s="0.0")
    bare, _ = share_through_bare_remote(seed, everything=False)  # code only: no best, no notes yet
    first = cli("loop", "--remote", "origin", "--max-experiments", "1", "--seed", "1", cwd=tmp_path / "a")
    assert "baseline run 1/2" in first.stderr
    second = cli("loop", "--remote", "origin", "--max-experiments", "2", "--seed", "2", cwd=tmp_path / "b")
    assert "baseline run" not in second.stderr  # b found a's baseline and its noise floor
    check = tmp_path / "check"
    sh("git", "clone", "-q", "-b", "main", str(bare), str(check), cwd=tmp_path)
    sh("git", "fetch", "-q", "origin", "+refs/notes/*:refs/notes/*", "+refs/gitresearch/*:refs/gitresearch/*",
       "+refs/heads/best:refs/heads/best", cwd=check)
    records = check_invariants(Store(check))
    assert sorted(r["experiment"] for r in records) == [0, 1, 2]
