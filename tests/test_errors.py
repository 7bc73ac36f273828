"""One error path: every command given bad input ends with one `Error:` line on stderr and
exit status 3 (errors.EXIT_ERROR), never a traceback; and every module imports on its own
(no import circle that works only in one order)."""
import importlib
import pkgutil
import subprocess
import sys

import pytest

import gitresearch
from gitresearch.errors import EXIT_ERROR
from helpers import cli, make_repo, sh

COMMANDS = [("status",), ("log",), ("show", "best"), ("run",), ("loop", "--max-experiments", "1"),
            ("verify",), ("plot", "-o", "x.png"), ("export", "--tsv", "x.tsv")]


def assert_one_line_error(proc, *needles):
    assert proc.returncode == EXIT_ERROR, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_outside_a_repository(tmp_path, args):
    assert_one_line_error(cli(*args, cwd=tmp_path, check=False), "not a git repository")


@pytest.mark.parametrize("args", [("run", "nosuchrev"), ("show", "nosuchrev"), ("show", "#99"),
                                  ("verify", "nosuchrev")], ids=" ".join)
def test_a_bad_revision(tmp_path, args):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    assert_one_line_error(cli(*args, cwd=repo, check=False), "nosuchrev" if "nosuchrev" in args else "#99")


@pytest.mark.parametrize("toml, needle", [("[run]\nbudget_s = \"300\"\n", "budget_s = '300': expected float"),
                                          ("[run\n", "gitresearch.toml"),
                                          ("[nosection]\n", "unknown section"),
                                          ("[metric]\ndirection = \"maximize\"\n", "only \"minimize\"")])
@pytest.mark.parametrize("args", [("status",), ("loop", "--max-experiments", "1"), ("run",)], ids=lambda a: a[0])
def test_a_broken_config(tmp_path, toml, needle, args):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    (repo / "gitresearch.toml").write_text(toml)
    assert_one_line_error(cli(*args, cwd=repo, check=False), needle)


@pytest.mark.parametrize("args", [("status",), ("log",), ("show", "best")], ids=lambda a: a[0])
def test_a_note_from_a_newer_schema(tmp_path, args):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    sh("git", "notes", "--ref=refs/notes/gitresearch", "add", "-m", 'gitresearch #0\n\n{"schema": 99}',
       "HEAD", cwd=repo)
    sh("git", "update-ref", "refs/gitresearch/experiments/000000", "HEAD", cwd=repo)
    assert_one_line_error(cli(*args, cwd=repo, check=False), "note schema 99 is newer")


def test_init_without_a_train_py(tmp_path):
    assert_one_line_error(cli("init", str(tmp_path / "empty"), cwd=tmp_path, check=False), "has no train.py")


@pytest.mark.parametrize("name", sorted(m.name for m in pkgutil.walk_packages(gitresearch.__path__, "gitresearch.")
                                        if ".data" not in m.name and not m.name.endswith("__main__")))
def test_every_module_imports_on_its_own(name):
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    importlib.import_module(name)
