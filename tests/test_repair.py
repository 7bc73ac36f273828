"""The repair of removed lines that carry a stale value (diffs.repair_stale_lines), alone and
through the validation every proposal passes (proposal.validate) on a real repo."""
import pytest

from gitresearch.config import load
from gitresearch.diffs import repair_stale_lines
from gitresearch.gitstore import Store
from gitresearch.proposal import InvalidProposal, validate
from helpers import cli, make_repo, sh

SOURCE = "import os\nLR = 0.1  # learning rate\nDEPTH = 6  # layers\nSTEP_S = 0.0\n"


def hunk(*lines: str) -> str:
    return "--- a/train.py\n+++ b/train.py\n@@ -2 +2 @@\n" + "".join(f"{line}\n" for line in lines)


def read(path):
    return SOURCE if path == "train.py" else None


def test_a_stale_value_is_replaced_by_the_files_own_line():
    diff, repairs = repair_stale_lines(hunk("-DEPTH = 4  # layers", "+DEPTH = 5  # layers"), read)
    assert "-DEPTH = 6  # layers\n+DEPTH = 5  # layers\n" in diff
    assert repairs == ["DEPTH = 4  # layers -> DEPTH = 6  # layers"]
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n@@ -2 +2 @@\n")  # the rest as written


@pytest.mark.parametrize("source, lines", [
    (SOURCE, ("-LR = 0.1  # learning rate", "+LR = 0.2")),  # nothing stale: nothing to repair
    (SOURCE, ("-WIDTH = 4", "+WIDTH = 5")),  # a name the file does not assign
    (SOURCE, ("-print(DEPTH)", "+print(LR)")),  # not an assignment
    (SOURCE + "DEPTH = 8\n", ("-DEPTH = 4", "+DEPTH = 5")),  # two assignments: ambiguous
    (SOURCE, ("-DEPTH = 6  # layers", "-DEPTH = 4", "+DEPTH = 5")),  # its line is removed already
    (SOURCE, ("-DEPTH == 4", "+DEPTH = 5")),  # a comparison, not an assignment
    (SOURCE, ("-DEPTH = 4",)),  # no line sets DEPTH again: the repair would delete the constant
    (SOURCE, ("-DEPTH = 4", "+LR = 0.2")),  # another name is set, not DEPTH
])
def test_nothing_is_repaired_unless_one_line_is_plainly_meant(source, lines):
    assert repair_stale_lines(hunk(*lines), lambda path: source) is None


def test_only_removed_lines_in_hunks_of_a_file_that_exists_are_repaired():
    assert repair_stale_lines(hunk("-DEPTH = 4", "+DEPTH = 5"), lambda path: None) is None
    context = hunk(" DEPTH = 4  # layers", "-STEP_S = 0.0", "+STEP_S = 0.1")  # a stale context line
    assert repair_stale_lines(context, read) is None


def test_validation_applies_the_repaired_diff_and_refuses_when_repair_is_off(tmp_path):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    store, config = Store(repo), load(repo)
    base = store.best()
    stale = "--- a/train.py\n+++ b/train.py\n@@ -8 +8 @@\n-DEPTH = 3  # layers\n+DEPTH = 5  # layers\n"
    tree, applied, repairs = validate(store, config, base, stale)
    assert repairs == ["DEPTH = 3  # layers -> DEPTH = 4  # layers"]
    assert "-DEPTH = 4  # layers\n+DEPTH = 5  # layers" in applied
    text = store.tree_file(tree, "train.py")
    assert "DEPTH = 5  # layers\n" in text and "DEPTH = 4" not in text
    assert text == store.read_file(base, "train.py").replace("DEPTH = 4", "DEPTH = 5")

    exact = validate(store, config, base, applied)
    assert exact == (tree, applied, [])  # a diff that applies as written is not touched
    with pytest.raises(InvalidProposal, match="does not apply"):
        validate(store, load(repo, overrides={"policy.repair_stale_lines": False}), base, stale)
    # the repair still has to apply with git: a stale context line keeps the diff invalid
    context = ("--- a/train.py\n+++ b/train.py\n@@ -7,3 +7,3 @@\n LR = 0.1  # learning rate\n"
               "-DEPTH = 3  # layers\n+DEPTH = 5  # layers\n STEP_S = 0.5  # seconds per step (wall)\n")
    with pytest.raises(InvalidProposal, match="does not apply"):
        validate(store, config, base, context)
    assert sh("git", "status", "--porcelain", cwd=repo).stdout == "?? notes.md\n"  # nothing written
