"""Repos recorded by older gitresearch versions still read, and a loop goes on from them.

tests/data/repo-<commit>.bundle were recorded by tests/data/record_old_repo.sh with the code of
that commit: 0e848d2 (notes before throughput and confirmation), 72f9b6f (throughput, no
confirmation), 841798c (confirmation pairs, verify notes)."""
import json
from pathlib import Path

import pytest

from helpers import cli, sh

BUNDLES = sorted((Path(__file__).parent / "data").glob("repo-*.bundle"))


def records(repo: Path) -> list[dict]:
    return [json.loads(line) for line in cli("log", "--json", cwd=repo).stdout.splitlines()]


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.stem for b in BUNDLES])
def test_an_old_repo_reads_and_the_loop_goes_on(tmp_path, bundle):
    repo = tmp_path / "repo"
    sh("git", "init", "-q", str(repo), cwd=tmp_path)
    sh("git", "fetch", "-q", str(bundle), "refs/*:refs/*", cwd=repo)  # branches, notes, experiments
    sh("git", "checkout", "-q", "main", cwd=repo)
    old = records(repo)
    assert [r["experiment"] for r in old] == [3, 2, 1, 0]
    assert [r["status"] for r in old] == ["discard", "keep", "discard", "baseline"]
    best = old[1]
    assert sh("git", "rev-parse", "best", cwd=repo).stdout.strip() == best["commit"]
    shown = json.loads(cli("show", "best", "--json", cwd=repo).stdout)
    assert shown["val_bpb"] == best["val_bpb"]
    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["best_val_bpb"] == best["val_bpb"] and status["experiments"] == 3
    kept_by = ("confirmed: kept after 1 pair" if bundle.stem == "repo-841798c"
               else "unconfirmed: kept on a single run")  # confirmation pairs came with 841798c
    assert status["best_chain"][0]["evidence"].startswith(kept_by)

    cli("init", cwd=repo)
    cli("loop", "--max-experiments", "4", "--seed", "1", cwd=repo)  # a total: one more
    new = records(repo)
    assert [r["experiment"] for r in new] == [4, 3, 2, 1, 0]
    assert new[0]["parent"] in {r["commit"] for r in old if r["status"] in ("keep", "baseline")}
    for before, after in zip(old, new[1:]):  # old results are kept as they were
        assert {k: after[k] for k in ("commit", "status", "val_bpb")} == \
               {k: before[k] for k in ("commit", "status", "val_bpb")}
