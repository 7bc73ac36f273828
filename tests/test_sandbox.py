"""The sandbox piece by piece: what a training process can see and write, path expansion,
refusing without a sandbox, the opt-out recorded in every note and shown by status."""
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gitresearch import sandbox
from gitresearch.config import Config, FilesConfig, RunConfig, SandboxConfig
from gitresearch.loop import Loop, LoopError
from gitresearch.runner import run_training
from helpers import cli, make_repo

needs_sandbox = pytest.mark.skipif(not sandbox.probe().available, reason="no sandbox on this host")

PROBE = '''\
import json, os, sys
report = {}
def attempt(name, action):
    try:
        report[name] = action()
    except OSError as err:
        report[name] = f"error: {err.__class__.__name__}"
attempt("read_data", lambda: open(os.environ["DATA"] + "/data.txt").read())
attempt("write_data", lambda: open(os.environ["DATA"] + "/data.txt", "a").write("x"))
attempt("read_secret", lambda: open(os.environ["SECRET_FILE"]).read())
attempt("list_home", lambda: os.listdir(os.environ["HOME"]))
attempt("write_tmp", lambda: open("/tmp/t.txt", "w").write("ok"))
attempt("write_here", lambda: open("here.txt", "w").write("ok"))
attempt("write_repo", lambda: open(os.environ["REPO"] + "/planted.txt", "w").write("x"))
attempt("etc_shadow", lambda: open("/etc/shadow").read())
def write_cache():
    os.makedirs(os.environ["TORCHINDUCTOR_CACHE_DIR"], exist_ok=True)
    return open(os.environ["TORCHINDUCTOR_CACHE_DIR"] + "/kernel", "w").write("k")
attempt("write_cache", write_cache)
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
report["no_new_privs"] = status["NoNewPrivs"].strip()
report["cap_eff"] = status["CapEff"].strip()
print(json.dumps(report))
print("---")
print("val_bpb: 1.0")
'''


@needs_sandbox
def test_what_a_sandboxed_run_can_touch(tmp_path, monkeypatch):
    home, data, repo = tmp_path / "home", tmp_path / "data", tmp_path / "repo"
    for folder in (home, data, repo, tmp_path / "compile-cache"):
        folder.mkdir()
    (home / "id_rsa").write_text("SECRET\n")
    (data / "data.txt").write_text("train data\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(PROBE)
    monkeypatch.setenv("HOME", str(home))
    for name, value in (("DATA", data), ("SECRET_FILE", home / "id_rsa"), ("REPO", repo)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("DATA_ROOT", str(tmp_path))
    config = Config(run=RunConfig(budget_s=5, env_allow=("DATA", "SECRET_FILE", "REPO")),
                    sandbox=SandboxConfig(train_read_only=("${DATA_ROOT}/data",)))
    result = run_training(work, config, tmp_path / "log.txt", tmp_path / "metrics.jsonl",
                          compile_cache=tmp_path / "compile-cache")
    assert result.status == "ok" and result.sandbox == "bwrap", result.log_tail
    report = json.loads(Path(result.log_path).read_text().splitlines()[0])
    assert report["read_data"] == "train data\n"
    assert report["write_data"].startswith("error")  # read-only
    assert report["read_secret"].startswith("error") and report["list_home"].startswith("error")
    assert report["write_tmp"] == 2 and report["write_here"] == 2
    assert report["write_repo"].startswith("error") and report["etc_shadow"].startswith("error")
    assert report["no_new_privs"] == "1" and int(report["cap_eff"], 16) == 0
    assert report["write_cache"] == 1  # the compile cache outlives the run
    assert (tmp_path / "compile-cache" / "inductor" / "kernel").read_text() == "k"
    assert (work / "here.txt").exists() and not (repo / "planted.txt").exists()
    assert (data / "data.txt").read_text() == "train data\n"
    assert not Path("/tmp/t.txt").exists() or Path("/tmp/t.txt").read_text() != "ok"


def test_paths_expand_like_a_shell(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.setenv("CACHE", "/c")
    monkeypatch.delenv("UNSET_VAR", raising=False)
    assert sandbox.expand("${CACHE:-~/x}/train") == "/c/train"
    assert sandbox.expand("${UNSET_VAR:-~/.cache/n}/default") == "/home/u/.cache/n/default"
    assert sandbox.expand("$CACHE/a") == "/c/a" and sandbox.expand("~/d") == "/home/u/d"


def test_loop_refuses_without_a_sandbox_and_runs_when_opted_out(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    missing = sandbox.Probe(False, None, "", "no user namespaces here (test)")
    monkeypatch.setattr(sandbox, "probe", lambda: missing)
    config = Config(run=RunConfig(budget_s=1), files=FilesConfig(frozen=("frozen.txt",)))
    with pytest.raises(LoopError, match=r"no user namespaces here \(test\).*--no-sandbox"):
        Loop(repo, config, display=lambda line: None).run()
    out = cli("loop", "--no-sandbox", "--max-experiments", "2", "--seed", "1", cwd=repo).stdout
    assert "reached 2 experiments" in out
    notes = [json.loads(line) for line in cli("log", "--json", cwd=repo).stdout.splitlines()]
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["sandboxes"] == {"none": 3}  # the baseline and 2 experiments
    assert status["metric_sources"] == {"self-reported": 3} and status["evaluator"] is None
    text = cli("status", cwd=repo).stdout
    assert "self-reported" in text and "runs without a sandbox" in text
    assert len(notes) == 3


def test_a_planted_symlink_is_not_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text('{"t": 1, "val_bpb": 0.001}\nSECRET\n')
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(
        "import os\n"
        f"os.symlink({str(secret)!r}, os.environ['GITRESEARCH_METRICS'])\n"
        "print('---'); print('val_bpb: 2.0')\n")
    config = Config(run=RunConfig(budget_s=5), sandbox=SandboxConfig(mode="none"))
    result = run_training(work, config, tmp_path / "log.txt", tmp_path / "metrics.jsonl")
    assert result.status == "ok" and result.points == [] and result.metric == 2.0
    assert "SECRET" not in (tmp_path / "metrics.jsonl").read_text()


@needs_sandbox
def test_training_dies_with_the_harness(tmp_path):
    """kill -9 of the harness: the sandboxed training goes with it at once (--die-with-parent),
    not only when the next loop cleans up."""
    repo = make_repo(tmp_path / "repo", fake="hang.py")
    cli("init", cwd=repo)
    harness = subprocess.Popen([sys.executable, "-m", "gitresearch", "run", "--budget", "60"], cwd=repo,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not tagged(repo):
        time.sleep(0.1)
    assert tagged(repo), "the training never started"
    harness.kill()
    harness.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and tagged(repo):
        time.sleep(0.1)
    assert not tagged(repo)


def tagged(repo: Path) -> list:
    """Live training processes of runs under `repo`."""
    found = []
    for p in psutil.process_iter():
        try:
            if "GITRESEARCH_RUN_ID" in p.environ() and p.status() != psutil.STATUS_ZOMBIE \
                    and p.cwd().startswith(str(repo)):
                found.append(p)
        except psutil.Error:
            continue
    return found
