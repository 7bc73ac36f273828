"""Inspecting a research repo: status, the plot, results.tsv, and `git bisect run`."""
import csv
import json
import subprocess
import sys

import pytest

from gitresearch.gitstore import Store
from helpers import cli, make_repo, sh


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A repo with a baseline, a few keeps, discards, and one crash (the fake train.py)."""
    path = make_repo(tmp_path_factory.mktemp("inspect") / "repo", config="[early_stop]\nenabled = false\n")
    cli("init", cwd=path)
    cli("loop", "--max-experiments", "10", "--seed", "5", cwd=path)
    store = Store(path)
    base = store.best()
    source = store.read_file(base, "train.py")
    broken = store.make_diff("train.py", source, source.replace("DEPTH = ", "raise SystemExit(3)\nDEPTH = ", 1))
    store.create_experiment(base, store.apply_diff(base, broken)[0], "a crash", "test")
    cli("loop", "--max-experiments", "11", "--seed", "5", cwd=path)
    return path


def notes(path):
    """experiment number -> its note, with the commit it annotates."""
    return {e.number: {**e.record, "commit": e.commit} for e in Store(path).experiments() if e.record}


def test_status_summarises_the_repo(repo):
    summary = json.loads(cli("status", "--json", cwd=repo).stdout)
    records = notes(repo)
    assert summary["experiments"] == 11 == len(records) - 1
    statuses = [r["status"] for r in records.values()]
    assert summary["by_status"] == {s: statuses.count(s) for s in set(statuses)}
    assert summary["by_status"]["keep"] >= 2 and summary["by_status"]["crash"] == 1
    assert summary["best_val_bpb"] < summary["baseline_val_bpb"]
    assert summary["relative_gain"] == pytest.approx(1 - summary["best_val_bpb"] / summary["baseline_val_bpb"])
    assert summary["experiments_per_hour"] > 0 and 0 < summary["mean_budget_share"] <= 1
    chain = summary["best_chain"]
    assert [link["status"] for link in chain][-1] == "baseline" and chain[0]["val_bpb"] == summary["best_val_bpb"]
    assert all(link["description"] for link in chain)
    baseline = records[0]
    assert (summary["noise_std"], summary["noise_n"], summary["min_delta"]) == \
        (baseline["noise_std"], 2, baseline["min_delta"])
    assert summary["min_delta_rule"] == "[noise] min_delta_floor"  # the fake is noise-free
    assert [t["steps"] for t in baseline["noise_throughput"]] == [10, 10]
    text = cli("status", cwd=repo, env={"COLUMNS": "400"}).stdout  # no cell wraps
    assert f"std {baseline['noise_std']:.6f} pooled over 2 repeated runs (1 dof), upper bound " \
           f"{summary['noise_upper']:.6f}; a keep must beat best by {baseline['min_delta']:.6f} = " \
           f"[noise] min_delta_floor; a run gaining {summary['screen_threshold']:.6f} is confirmed in pairs" in text
    for words in ("experiments per hour", "mean budget share used", "compute saved by early stop",
                  "best chain", "% better", chain[0]["description"][:20]):
        assert words in text


def test_plot_writes_a_png(repo, tmp_path):
    out = tmp_path / "progress.png"
    assert "wrote" in cli("plot", "-o", str(out), cwd=repo).stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(out).shape
    assert (width, height) == (1320, 660)


def test_export_results_tsv(repo, tmp_path):
    out = tmp_path / "results.tsv"
    cli("export", "--tsv", str(out), cwd=repo)
    with open(out, newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    assert rows[0] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    records = sorted(notes(repo).values(), key=lambda r: r["experiment"])
    assert len(rows) - 1 == len(records)
    for row, record in zip(rows[1:], records):
        assert row[0] == record["commit"][:7] and row[3] == record["status"]
        assert row[1] == f"{record.get('val_bpb') or 0.0:.6f}"
        assert float(row[2]) == pytest.approx((record.get("peak_memory_mb") or 0) / 1024, abs=0.05)


def test_plot_export_and_status_count_the_same_experiments(repo, tmp_path):
    experiments = json.loads(cli("status", "--json", cwd=repo).stdout)["experiments"]
    for args in (("plot", "-o", str(tmp_path / "p.png")), ("export", "--tsv", str(tmp_path / "r.tsv"))):
        said = cli(*args, cwd=repo).stdout
        assert f"({experiments} experiments and the baseline)" in said, said


def test_output_to_a_file_is_not_wrapped(repo):
    """rich wraps at 80 columns when stdout is no terminal; status lines stay whole."""
    text = cli("status", cwd=repo).stdout
    noise = next(line for line in text.splitlines() if "noise floor" in line)
    assert "a run gaining" in noise and len(noise) > 120


def test_git_bisect_finds_the_commit_that_brought_the_gain(repo):
    store = Store(repo)
    chain = [{**store.read_note(c), "commit": c} for c in reversed(store.best_chain())]  # baseline first
    assert len(chain) >= 3
    # a threshold the second kept commit crosses but the first does not
    threshold = (chain[1]["val_bpb"] + chain[2]["val_bpb"]) / 2
    expected = chain[2]["commit"]
    run = [sys.executable, "-m", "gitresearch", "bisect-run", "--threshold", str(threshold)]
    sh("git", "bisect", "start", "--first-parent", "--term-old=worse", "--term-new=better",
       "best", chain[0]["commit"], cwd=repo)
    try:
        out = sh("git", "bisect", "run", *run, cwd=repo).stdout
    finally:
        sh("git", "bisect", "reset", cwd=repo)
    assert f"{expected} is the first better commit" in out, out


def bisect_exit(repo, *args, rev=None):
    if rev:
        sh("git", "checkout", "-q", "--detach", rev, cwd=repo)
    try:
        return subprocess.run([sys.executable, "-m", "gitresearch", "bisect-run", *args], cwd=repo,
                              capture_output=True, text=True)
    finally:
        if rev:
            sh("git", "checkout", "-q", "main", cwd=repo)


def test_bisect_run_exit_codes(repo):
    records = notes(repo)
    crash = next(r for r in records.values() if r["status"] == "crash")
    keep = next(r for r in records.values() if r["status"] == "keep")
    assert bisect_exit(repo, "--threshold", "9", rev=keep["commit"]).returncode == 1  # better
    assert bisect_exit(repo, "--threshold", "0.1", rev=keep["commit"]).returncode == 0  # worse
    skipped = bisect_exit(repo, "--threshold", "9", rev=crash["commit"])
    assert skipped.returncode == 125 and "no val_bpb" in skipped.stdout
    sh("git", "commit", "-q", "--allow-empty", "-m", "a commit of the user's, with no note", cwd=repo)
    plain = sh("git", "rev-parse", "HEAD", cwd=repo).stdout.strip()
    sh("git", "reset", "-q", "--hard", "HEAD~1", cwd=repo)
    assert bisect_exit(repo, "--threshold", "9", rev=plain).returncode == 125
    rerun = bisect_exit(repo, "--rerun", "--threshold", "9", rev=crash["commit"])
    assert rerun.returncode == 125 and "rerun crash" in rerun.stdout
    assert bisect_exit(repo, "--rerun", "--threshold", "9", rev=keep["commit"]).returncode == 1
    store = Store(repo)  # the default threshold: halfway between the baseline and best
    best, baseline = store.best(), store.experiment_commit(0)
    middle = (store.read_note(best)["val_bpb"] + store.read_note(baseline)["val_bpb"]) / 2
    at_best, at_baseline = bisect_exit(repo, rev=best), bisect_exit(repo, rev=baseline)
    assert (at_best.returncode, at_baseline.returncode) == (1, 0)
    assert f"vs threshold {middle:.6f}" in at_best.stdout
    broken = bisect_exit(repo, "--threshold", "not-a-number")
    assert broken.returncode == 2  # click's usage error, before any bisect step runs
