"""The loop end to end on fake train.py scripts: records, best chain, user state, resume
after kill -9, lock, hostile scripts, validation."""
import json
import signal
import subprocess
import sys
import time

import pytest

from gitresearch.config import load
from gitresearch.errors import EXIT_ERROR
from gitresearch.gitstore import Store
from gitresearch.proposal import InvalidProposal, validate
from helpers import FAKES, cli, make_repo, sh


def records(repo):
    out = cli("log", "--json", cwd=repo).stdout
    return [json.loads(line) for line in out.splitlines()]


def check_invariants(repo, expected_records):
    rows = records(repo)
    assert len(rows) == expected_records
    numbers = [r["experiment"] for r in rows]
    assert sorted(numbers) == list(range(expected_records))  # no loss, no duplicate
    store = Store(repo)
    assert store.note_count() == len(rows)
    chain = store.best_chain()
    values = [store.read_note(c)["val_bpb"] for c in chain]
    assert all(newer < older for newer, older in zip(values, values[1:]))  # strictly decreasing
    on_best = set(chain)
    assert all(r["parent"] in on_best for r in rows if r["experiment"] > 0)
    for key in ("commit", "parent", "status", "val_bpb", "description", "seconds"):
        assert all(key in r for r in rows)
    return rows


def user_state(repo):
    return (sh("git", "rev-parse", "HEAD", cwd=repo).stdout, sh("git", "symbolic-ref", "HEAD", cwd=repo).stdout,
            sh("git", "status", "--porcelain", cwd=repo).stdout, sh("git", "ls-files", "-s", cwd=repo).stdout,
            (repo / "notes.md").read_text(), (repo / "train.py").read_text())


def test_short_loop(tmp_path):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    before = user_state(repo)
    cli("loop", "--policy", "random", "--max-experiments", "5", "--seed", "3", cwd=repo)
    rows = check_invariants(repo, 6)
    assert rows[-1]["status"] == "baseline"
    # the fake writes its whole curve at once: early stop judges it as if it came live
    assert {r["status"] for r in rows[:-1]} <= {"keep", "discard", "early_stop"}
    assert user_state(repo) == before
    assert "val_bpb" in sh("git", "log", "best", cwd=repo).stdout  # plain git log shows notes
    status = cli("status", cwd=repo).stdout
    assert "baseline val_bpb" in status and "best chain" in status
    shown = json.loads(cli("show", "#1", "--json", cwd=repo).stdout)
    assert shown["experiment"] == 1 and shown["diff"].startswith("diff --git a/train.py")
    assert not list((Store(repo).state_dir / "worktrees").iterdir())
    assert "gitresearch-" not in sh("git", "worktree", "list", cwd=repo).stdout.split("\n", 1)[-1]


def slow_repo(tmp_path):
    repo = make_repo(tmp_path / "repo")
    source = (repo / "train.py").read_text().replace("STEP_S = 0.0", "STEP_S = 0.15")
    (repo / "train.py").write_text(source)
    sh("git", "commit", "-qam", "slow steps", cwd=repo)
    cli("init", cwd=repo)
    return repo


def start_loop(repo, count):
    return subprocess.Popen([sys.executable, "-m", "gitresearch", "loop", "--max-experiments",
                             str(count), "--seed", "5"], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_resume_after_kill_9_at_several_points(tmp_path):
    repo = slow_repo(tmp_path)
    runs = Store(repo).state_dir / "runs"
    before = user_state(repo)
    kill_points = [  # (what we wait for, extra delay)
        (lambda: (runs / "000000" / "noise-0" / "log.txt").exists(), 0.5),  # inside the baseline
        (lambda: (runs / "000001" / "log.txt").exists(), 0.6),  # inside experiment 1
        (lambda: Store(repo).experiment_commit(2) is not None, 0.0),  # right after a commit
        (lambda: (runs / "000003" / "log.txt").exists(), 1.2),  # late in experiment 3
    ]
    for ready, delay in kill_points:
        proc = start_loop(repo, 5)
        wait_for(lambda: ready() or proc.poll() is not None)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc = start_loop(repo, 5)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    check_invariants(repo, 6)
    assert user_state(repo) == before


def test_sigterm_stops_cleanly_and_resumes(tmp_path):
    repo = slow_repo(tmp_path)
    proc = start_loop(repo, 3)
    wait_for(lambda: (Store(repo).state_dir / "runs" / "000001" / "log.txt").exists())
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "stopped: interrupted" in out
    assert Store(repo).read_note(Store(repo).experiment_commit(1)) is None  # rerun, not lost
    cli("loop", "--max-experiments", "3", cwd=repo)
    check_invariants(repo, 4)


def test_second_loop_is_refused_with_the_holders_pid(tmp_path):
    repo = slow_repo(tmp_path)
    proc = start_loop(repo, 50)
    try:
        wait_for(lambda: (Store(repo).state_dir / "runs").exists())
        second = cli("loop", "--max-experiments", "50", cwd=repo, check=False)
        assert second.returncode == EXIT_ERROR
        assert "another gitresearch loop holds" in second.stderr and f"pid {proc.pid}" in second.stderr
    finally:
        proc.kill()
        proc.wait()


def test_stop_file_and_patience(tmp_path):
    repo = make_repo(tmp_path / "repo", config="[loop]\npatience = 2\n")
    (repo / "train.py").write_text((repo / "train.py").read_text().replace("LR = 0.1", "LR = 0.01"))
    sh("git", "commit", "-qam", "optimal lr", cwd=repo)  # (log10(LR) + 2)^2 = 0: hard to beat
    cli("init", cwd=repo)
    out = cli("loop", "--max-experiments", "40", "--seed", "1", cwd=repo).stdout
    assert "converged: no improvement in 2 experiments" in out
    (Store(repo).state_dir / "STOP").touch()
    out = cli("loop", "--max-experiments", "40", cwd=repo).stdout
    assert "stopped: stop file" in out


def test_hostile_scripts_in_the_loop(tmp_path):
    repo = make_repo(tmp_path / "repo", config="")
    config = (repo / "gitresearch.toml").read_text().replace("grace_s = 20", "grace_s = 1\nterm_grace_s = 0.3")
    (repo / "gitresearch.toml").write_text(config)
    sh("git", "commit", "-qam", "short grace", cwd=repo)
    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "0", cwd=repo)  # the baseline only
    store = Store(repo)
    base = store.best()
    hostile = {"hang.py": "timeout", "child.py": "keep", "flood.py": "crash", "nometric.py": "crash",
               "nan.py": "crash", "exit1.py": "crash", "tamper.py": "invalid", "socket_open.py": "crash"}
    for name in hostile:  # experiments committed but not run yet: the loop runs them first
        diff = store.make_diff("train.py", store.read_file(base, "train.py"), (FAKES / name).read_text())
        tree, _ = store.apply_diff(base, diff)
        store.create_experiment(base, tree, f"hostile {name}", "test")
    cli("loop", "--max-experiments", str(len(hostile)), cwd=repo, timeout=300)
    rows = {r["description"]: r for r in records(repo)}
    for name, status in hostile.items():
        row = rows[f"hostile {name}"]
        assert row["status"] == status, (name, row)
        if status != "keep":
            assert row["reason"], name
    assert rows["hostile tamper.py"]["reason"] == "frozen file(s) changed during the run: frozen.txt"


def test_validation_refuses_bad_proposals(tmp_path):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    store = Store(repo)
    config = load(repo)
    base = store.best()
    train = store.read_file(base, "train.py")
    cases = {
        "only train.py may change": store.make_diff("frozen.txt", "frozen\n", "thawed\n"),
        "does not parse after the diff": store.make_diff("train.py", train, train.replace("LR = 0.1", "LR = = 0.1")),
        "does not parse": "--- a/train.py\n+++ b/train.py\n@@ garbage @@\n",
        "touches gitresearch.toml; only train.py": store.make_diff("gitresearch.toml", store.read_file(base, "gitresearch.toml"),
                                                    "[files]\neditable = ['train.py', 'frozen.txt']\n"),
        "deletes train.py": "--- a/train.py\n+++ /dev/null\n@@ -1,%d +0,0 @@\n%s" % (
            len(train.splitlines()), "".join(f"-{line}\n" for line in train.splitlines())),
        "is empty": "",
        "over the limit": "x" * 70000,
    }
    for reason, diff in cases.items():
        with pytest.raises(InvalidProposal, match=reason):
            validate(store, config, base, diff)


def test_hook_refuses_frozen_changes(tmp_path):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    (repo / "frozen.txt").write_text("thawed\n")
    sh("git", "add", "frozen.txt", cwd=repo)
    refused = sh("git", "commit", "-qm", "thaw", cwd=repo, check=False)
    assert refused.returncode == 1 and "frozen file(s): frozen.txt" in refused.stderr
    assert sh("git", "commit", "-qm", "thaw", "--no-verify", cwd=repo, check=False).returncode == 0
    (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# tweak\n")
    sh("git", "add", "train.py", cwd=repo)
    assert sh("git", "commit", "-qm", "editable", cwd=repo, check=False).returncode == 0


@pytest.mark.parametrize("rule", ["forecast", "race"])
def test_early_stop_in_the_loop(tmp_path, rule):
    repo = make_repo(tmp_path / "repo", config=(
        f"[early_stop]\nrule = \"{rule}\"\ninterval_s = 0.1\nmin_fraction = 0.3\n"))
    source = (repo / "train.py").read_text().replace("STEP_S = 0.0", "STEP_S = 0.12")
    (repo / "train.py").write_text(source)
    sh("git", "commit", "-qam", "slow steps", cwd=repo)
    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "0", cwd=repo)  # the baseline: two full runs
    store = Store(repo)
    base = store.best()
    variants = {"lr 0.05": ("LR = 0.1", "LR = 0.05"), "depth 5": ("DEPTH = 4", "DEPTH = 5"),
                "lr 0.09": ("LR = 0.1", "LR = 0.09"), "lr 0.11": ("LR = 0.1", "LR = 0.11"),
                "depth 1": ("DEPTH = 4", "DEPTH = 1"), "depth 0": ("DEPTH = 4", "DEPTH = 0")}
    for description, (old, new) in variants.items():
        diff = store.make_diff("train.py", source, source.replace(old, new))
        store.create_experiment(base, store.apply_diff(base, diff)[0], description, "test")
    cli("loop", "--max-experiments", "6", cwd=repo)  # 2 noise runs + 4 full runs calibrate
    rows = {r["description"]: r for r in records(repo)}
    assert rows["lr 0.05"]["status"] == "keep" and rows["depth 5"]["status"] in ("keep", "discard")
    for loser in ("depth 1", "depth 0"):  # finals 0.25 and 0.3 above the baseline's
        assert rows[loser]["status"] == "early_stop", rows[loser]
        assert rows[loser]["comment"].startswith("stopped at")
        assert ("vs line" if rule == "race" else "vs threshold") in rows[loser]["comment"]
        assert rows[loser]["val_bpb"] is None and rows[loser]["training_seconds"] < 1.0
        check = store.read_note(rows[loser]["commit"])["checks"][-1]
        assert check["decision"] == "stop"
        if rule == "race":
            assert check["value"] > check["line"] >= check["lead"]
        else:
            assert check["llr"] > 0
    # the next monitor knows every finished run's curve and every stopped run's, up to its stop
    from gitresearch.earlystop import EarlyStop

    stopped = [r for r in records(repo) if r["status"] == "early_stop"]
    stops = []
    for record in stopped:  # points written after the stop, before the kill landed (a loaded machine)
        stop = next(c["t"] for c in store.read_note(record["commit"])["checks"] if c["decision"] == "stop")
        stops.append(stop)
        with open(store.state_dir / "runs" / f"{record['experiment']:06d}" / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"t": stop + 0.01, "step": 999, "val_bpb": 9.0}) + "\n")
    early_stop = EarlyStop(store, load(repo), lambda n: store.state_dir / "runs" / f"{n:06d}")
    early_stop.monitor()
    finished = [r for r in records(repo) if r["status"] in ("keep", "discard")]
    assert len(early_stop.race.stopped) == len(stopped) >= 2
    assert len(early_stop.calibration.runs) == len(finished) + 2  # + the baseline's two runs
    # each stopped run's curve is cut at the check that stopped it, whatever came after
    assert sorted(ts[-1] for ts, _ in early_stop.race.stopped) == sorted(stops)
    assert all(stop < 1.0 for stop in stops)  # before the 1 s budget
    from gitresearch.history import history_window

    window = {w.description: w for w in history_window(store, store.experiments(), 32)}
    assert window["depth 1"].comment.startswith("stopped at")
    assert "compute saved by early stop" in cli("status", cwd=repo).stdout
    out = cli("loop", "--max-experiments", "8", "--no-early-stop", "--seed", "2", cwd=repo).stdout
    newest = records(repo)[:2]
    assert all(r["status"] != "early_stop" for r in newest), out


def test_run_one_commit_writes_nothing(tmp_path):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    refs = sh("git", "for-each-ref", cwd=repo).stdout
    out = cli("run", "HEAD", "--json", cwd=repo).stdout
    result = json.loads(out.splitlines()[-1])
    assert result["status"] == "ok" and result["val_bpb"] == pytest.approx(2.2)
    assert sh("git", "for-each-ref", cwd=repo).stdout == refs
    assert not (Store(repo).state_dir / "runs").exists()


def test_setup_runs_once_untimed_and_failures_are_clear(tmp_path):
    repo = make_repo(tmp_path / "repo", config="")
    toml = (repo / "gitresearch.toml").read_text().replace(
        "[run]\n", '[run]\nsetup = ["python", "-c", "open(\'setup-ran\', \'w\').write(\'x\')"]\n')
    (repo / "gitresearch.toml").write_text(toml)
    sh("git", "commit", "-qam", "setup", cwd=repo)
    cli("init", cwd=repo)
    out = cli("loop", "--max-experiments", "1", cwd=repo).stderr
    assert out.count("setup: python -c") == 1
    (repo / "gitresearch.toml").write_text(toml.replace("open(", "exit(3) or open("))
    failed = cli("loop", "--max-experiments", "2", cwd=repo, check=False)
    assert failed.returncode == EXIT_ERROR and "exited 3" in failed.stderr
