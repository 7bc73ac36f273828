"""The agent policy end to end, with scripted fake agents: an edit, no edit, a forbidden file,
a hang."""
import sys
import time

import pytest

from gitresearch.gitstore import Store
from helpers import cli, make_repo

AGENTS = {
    "edit": '''
import os, pathlib, subprocess, sys
prompt = sys.stdin.read()
assert prompt == pathlib.Path("GITRESEARCH_PROMPT.md").read_text() and "LR = 0.1" in prompt
top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip()
assert os.path.realpath(top) == os.path.realpath(os.getcwd())  # its own scratch repo, not the research repo
source = pathlib.Path("train.py").read_text()
pathlib.Path("train.py").write_text(source.replace("LR = 0.1", "LR = 0.01"))
pathlib.Path("GITRESEARCH_DESCRIPTION").write_text("lower the learning rate to 0.01\\n")
subprocess.run(["git", "commit", "-qam", "an agent that commits (aider does)", "--no-verify"], check=True,
               env={**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
                    "GIT_COMMITTER_EMAIL": "a@b"})
print("key seen:", os.environ.get("AGENT_KEY"))
''',
    "none": 'import sys; sys.stdin.read(); print("nothing worth changing")\n',
    "forbidden": '''
import pathlib, sys
sys.stdin.read()
pathlib.Path("frozen.txt").write_text("thawed\\n")
print("edited the frozen file")
''',
    "hang": 'import subprocess, sys, time; sys.stdin.read(); subprocess.Popen(["sleep", "300"]); time.sleep(300)\n',
}


def run_agent(tmp_path, kind, timeout_s=60.0):
    script = tmp_path / f"agent_{kind}.py"
    script.write_text(AGENTS[kind])
    repo = make_repo(tmp_path / "repo", config=f"[policy]\nmax_tries = 1\nagent_timeout_s = {timeout_s}\n")
    cli("init", cwd=repo)
    started = time.monotonic()
    cli("loop", "--policy", "agent", "--command", f"{sys.executable} {script}", "--max-experiments", "1",
        "--no-early-stop", cwd=repo, env={"AGENT_KEY": "the user's key"})
    store = Store(repo)
    return store, store.read_note(store.experiment_commit(1)), time.monotonic() - started


def test_an_agent_edit_becomes_the_experiment(tmp_path):
    store, note, _ = run_agent(tmp_path, "edit")
    assert note["status"] in ("keep", "discard") and note["description"] == "lower the learning rate to 0.01"
    assert "LR = 0.01" in store.read_file(store.experiment_commit(1), "train.py")
    assert "GITRESEARCH_PROMPT.md" not in store.diff_of(store.experiment_commit(1))
    assert "key seen: the user's key" in note["policy_data"]["transcript_tail"]  # the user's environment


@pytest.mark.parametrize("kind, reason", [("none", "the agent changed no file"),
                                          ("forbidden", "frozen.txt")])
def test_an_agent_that_edits_nothing_or_a_frozen_file_is_invalid(tmp_path, kind, reason):
    store, note, _ = run_agent(tmp_path, kind)
    assert note["status"] == "invalid" and reason in note["reason"], note["reason"]
    assert store.read_file(store.experiment_commit(1), "frozen.txt") == "frozen\n"


def test_a_hanging_agent_is_killed_at_its_timeout(tmp_path):
    _, note, seconds = run_agent(tmp_path, "hang", timeout_s=2.0)
    assert note["status"] == "invalid" and "timeout" in note["reason"]
    assert seconds < 60  # the agent and the process it started are killed at 2 s
