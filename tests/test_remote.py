"""The remote protocol piece by piece: numbers reserved by lease, best moved by an atomic
lease push, notes merged without loss, against a real bare remote."""
import pytest

from gitresearch.gitstore import Store
from gitresearch.remote import Remote, RemoteError
from helpers import cli, make_repo, sh


def machines(tmp_path):
    seed = make_repo(tmp_path / "seed", config="[early_stop]\nenabled = false\n")
    cli("init", cwd=seed)
    cli("loop", "--max-experiments", "0", cwd=seed)
    bare = tmp_path / "remote.git"
    sh("git", "init", "-q", "--bare", str(bare), cwd=tmp_path)
    sh("git", "push", "-q", str(bare), "main", "best", "refs/notes/*:refs/notes/*",
       "refs/gitresearch/*:refs/gitresearch/*", cwd=seed)
    stores = []
    for name in ("a", "b"):
        sh("git", "clone", "-q", "-b", "main", str(bare), name, cwd=tmp_path)
        stores.append(Store(tmp_path / name))
    return bare, stores


def experiment(store: Store, remote: Remote, new: str):
    base = store.best()
    source = store.read_file(base, "train.py")
    tree, _ = store.apply_diff(base, store.make_diff("train.py", source, source.replace("DEPTH = 4", new)))
    return store.create_experiment(base, tree, new, "test", remote.reserve)


def test_numbers_best_and_notes_through_the_remote(tmp_path):
    bare, (a, b) = machines(tmp_path)
    remote_a, remote_b = Remote(a, "origin"), Remote(b, "origin")
    remote_a.sync()
    remote_b.sync()
    base = a.best()
    assert b.best() == base and a.read_note(base)["status"] == "baseline"  # fetched with the notes
    number_a, commit_a = experiment(a, remote_a, "DEPTH = 6")
    number_b, commit_b = experiment(b, remote_b, "DEPTH = 5")  # b has not fetched: 1 is taken
    assert (number_a, number_b) == (1, 2)
    remote_refs = sh("git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/gitresearch/", cwd=bare).stdout
    assert f"refs/gitresearch/experiments/000001 {commit_a}" in remote_refs
    assert f"refs/gitresearch/experiments/000002 {commit_b}" in remote_refs
    # best: a moves it first; b's push against the old best is refused, and b adopts a's
    assert remote_a.push_best(base, commit_a)
    assert not remote_b.push_best(base, commit_b)
    remote_b.sync()
    assert b.best() == commit_a
    assert sh("git", "rev-parse", "best", cwd=bare).stdout.strip() == commit_a
    # notes: both sides write one; the second push is refused, merged, pushed: none lost
    a.write_note(commit_a, {"experiment": 1, "status": "keep", "val_bpb": 2.1})
    b.write_note(commit_b, {"experiment": 2, "status": "discard", "val_bpb": 2.15})
    remote_a.publish_notes()
    remote_b.publish_notes()
    sh("git", "clone", "-q", "-b", "main", str(bare), "check", cwd=tmp_path)
    sh("git", "fetch", "-q", "origin", "+refs/notes/*:refs/notes/*", cwd=tmp_path / "check")
    check = Store(tmp_path / "check")
    assert check.note_count() == 3
    assert check.read_note(commit_a)["status"] == "keep" and check.read_note(commit_b)["status"] == "discard"
    assert check.read_note(base)["status"] == "baseline"


def test_an_unreachable_remote_is_retried_then_named(tmp_path):
    repo = make_repo(tmp_path / "repo")
    sh("git", "remote", "add", "origin", str(tmp_path / "nowhere.git"), cwd=repo)
    remote = Remote(Store(repo), "origin", network_retries=2, backoff_s=0.0)
    try:
        remote.sync()
    except RemoteError as err:
        assert "cannot reach origin" in str(err) and "nowhere.git" in str(err)
    else:
        raise AssertionError("sync with an unreachable remote must fail")
    with pytest.raises(RemoteError, match="no git remote named 'upstream'"):
        Remote(Store(repo), "upstream")
