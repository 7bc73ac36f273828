"""One real loop on the bundled target: init --template nanochat, then a tiny-budget loop."""
import json
import re

import pytest

from gitresearch.gitstore import Store
from helpers import cli, sh

pytestmark = pytest.mark.alone  # "it learned" needs the budget's steps


def test_loop_on_the_bundled_target(tmp_path, nanochat_cache):
    repo = tmp_path / "research"
    out = cli("init", "--template", "nanochat", str(repo), cwd=tmp_path).stdout
    assert "copied the nanochat template" in out and "created best" in out
    toml = re.sub(r"noise_runs = \d+", "noise_runs = 2", (repo / "gitresearch.toml").read_text())
    assert "noise_runs = 2" in toml
    toml = toml.replace("grace_s = 60", "grace_s = 300")  # a loaded CI machine evaluates slowly
    (repo / "gitresearch.toml").write_text(toml)
    sh("git", "commit", "-qam", "two noise runs for the test", cwd=repo)
    sh("git", "branch", "-f", "best", "HEAD", cwd=repo)
    head = sh("git", "rev-parse", "HEAD", cwd=repo).stdout
    cli("loop", "--policy", "random", "--budget", "3", "--max-experiments", "1", "--seed", "0",
        cwd=repo, timeout=900)  # 2 baseline runs, 1 experiment, maybe confirmation pairs
    rows = [json.loads(line) for line in cli("log", "--json", cwd=repo).stdout.splitlines()]
    assert len(rows) == 2 and rows[-1]["status"] == "baseline"
    baseline = Store(repo).read_note(Store(repo).experiment_commit(0))
    assert len(baseline["noise_runs"]) == 2 and baseline["val_bpb"] < 3.68  # it learned (step 0: 3.696)
    assert baseline["metric_source"] == "evaluator" and baseline["sandbox"] in ("bwrap", "none")
    rate = baseline["throughput"]
    assert rate["steps"] > 0 and rate["steps_per_s"] > 0 and rate["tokens_per_s"] > 1000
    # any recorded outcome is fine here (a deep mutation can even time out on a loaded CPU)
    assert all(r["status"] in ("keep", "discard", "crash", "early_stop", "timeout", "invalid")
               for r in rows[:-1])
    assert sh("git", "rev-parse", "HEAD", cwd=repo).stdout == head
    assert sh("git", "status", "--porcelain", cwd=repo).stdout == ""
    assert "gitresearch #0 | baseline | val_bpb" in sh("git", "log", "best", cwd=repo).stdout
