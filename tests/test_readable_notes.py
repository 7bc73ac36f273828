"""What a person sees in plain git: no warning right after init, and `git log best` readable in
an 80-column terminal, with the whole record one `gitresearch show` away."""
import json

from gitresearch.gitstore import Store
from gitresearch.notes import NOTE_SCHEMA
from helpers import cli, make_repo, sh


def test_no_git_warning_right_after_init(tmp_path):
    repo = make_repo(tmp_path / "r")
    cli("init", "--commit", cwd=repo)
    for command in (("log",), ("log", "best"), ("show",), ("log", "--notes")):
        proc = sh("git", *command, cwd=repo)
        assert proc.stderr == "", (command, proc.stderr)


def test_git_log_best_reads_in_80_columns_and_show_gives_everything(tmp_path):
    repo = tmp_path / "gym"
    cli("init", "--template", "gym", str(repo), cwd=tmp_path)
    cli("loop", "--policy", "random", "--seed", "1", "--max-experiments", "12", cwd=repo)
    store = Store(repo)
    assert len(store.best_chain()) >= 2, "the seed keeps something"
    log = sh("git", "log", "best", "-3", cwd=repo)
    assert log.stderr == ""
    assert max(len(line.expandtabs()) for line in log.stdout.splitlines()) <= 80, log.stdout
    assert "{" not in log.stdout  # no JSON
    for commit in store.best_chain()[:-1]:  # the kept steps: metric, delta, noise, confirmation
        note = sh("git", "notes", "--ref=gitresearch", "show", commit, cwd=repo).stdout
        labels = [line.split(":")[0] for line in note.splitlines()[1:] if not line.startswith(" ")]
        assert {"metric", "delta", "noise", "confirmed", "early stop", "record"} <= set(labels), note
    stopped = [e for e in store.experiments() if e.record["status"] == "early_stop"]
    assert stopped, "the seed stops a run early"
    note = sh("git", "notes", "--ref=gitresearch", "show", stopped[0].commit, cwd=repo).stdout
    assert "reason:     stopped at" in note  # the early stop's verdict is the status reason
    shown = json.loads(cli("show", f"#{stopped[0].number}", "--json", cwd=repo).stdout)
    assert shown["schema"] == NOTE_SCHEMA and shown["checks"] and shown["log_tail"]
    assert shown == {"commit": stopped[0].commit, "message": store.message(stopped[0].commit),
                     **stopped[0].record, "diff": store.diff_of(stopped[0].commit)}
