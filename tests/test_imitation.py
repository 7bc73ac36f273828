"""Imitation data for a small policy LM: every reply parses and applies with git to the file
its prompt showed, edits only live constants, and shows the model every line it must copy."""
import random
from pathlib import Path

from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.policies.constants import Site, find_sites
from gitresearch.policies.imitation import compact_view, examples
from gitresearch.policies.reply import parse_reply
from helpers import sh

TARGET = Path(__file__).parents[1] / "target_repo"


def test_compact_view_keeps_the_lines_around_each_constant_and_numbers_its_runs():
    source = "import os\n\n\nA = 1\nx = 2\n\n\n\n\n\n\nB = 0.5\ny = A * B\n"
    view = compact_view(source, [Site("A", 4, 4, 5, 1), Site("B", 12, 4, 7, 0.5)], context=1)
    assert view == "# lines 3-5\n\nA = 1\nx = 2\n# lines 11-13\n\nB = 0.5\ny = A * B"


def test_every_reply_parses_and_applies_to_the_file_its_prompt_showed(tmp_path):
    config = load(TARGET)
    source = (TARGET / "train.py").read_text()
    repo = tmp_path / "repo"
    repo.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    store = Store(repo)
    pairs = examples({"train.py": source}, random.Random(0), store.make_diff, n=25,
                     skip=config.policy.skip_constants)
    assert len({ex.before for ex in pairs}) >= 15  # starts moved off the baseline, not one file
    live = {s.name for s in find_sites(source, config.policy.skip_constants)}
    for ex in pairs:
        (repo / "train.py").write_text(ex.before)
        sh("git", "add", "train.py", cwd=repo)
        sh("git", "commit", "-qm", "start", "--allow-empty", cwd=repo)
        description, diff = parse_reply(ex.reply, {"train.py": ex.before}, store.make_diff)
        assert diff.startswith("--- a/train.py\n+++ b/train.py\n@@ ")
        tree, changed = store.apply_diff(store.resolve("HEAD"), diff)
        assert changed == ["train.py"] and store.tree_file(tree, "train.py") == ex.after
        before = {s.name: s.value for s in find_sites(ex.before, config.policy.skip_constants)}
        after = {s.name: s.value for s in find_sites(ex.after, config.policy.skip_constants)}
        moved = {name for name in before if before[name] != after[name]}
        assert 1 <= len(moved) <= 3 and moved <= live
        assert description == ex.reply.splitlines()[0].removeprefix("Description: ")
        for name in moved:
            assert f"{name} {before[name]!r} -> {after[name]!r}" in description
        # what the model must copy (context and removed lines) is in its prompt
        for line in diff.splitlines()[2:]:
            if line[:1] in (" ", "-"):
                assert line[1:] in ex.prompt.splitlines(), line
