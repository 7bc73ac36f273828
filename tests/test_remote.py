"""The remote protocol piece by piece: numbers reserved by lease, best moved by an atomic
lease push, notes merged without loss, against a real bare remote."""
import pytest

from gitresearch.gitstore import StaleRefError, Store
from gitresearch.remote import Remote, RemoteError
from helpers import cli, make_repo, sh, share_through_bare_remote


def machines(tmp_path):
    seed = make_repo(tmp_path / "seed", config="[early_stop]\nenabled = false\n")
    source = (seed / "train.py").read_text()  # constants apart: changes to two of them merge
    (seed / "train.py").write_text(source.replace("DEPTH = 4", "#\n#\n#\n#\n#\n#\nDEPTH = 4"))
    sh("git", "commit", "-qam", "constants apart", cwd=seed)
    cli("init", cwd=seed)
    cli("loop", "--max-experiments", "0", cwd=seed)
    bare, clones = share_through_bare_remote(seed)
    stores = [Store(path) for path in clones]
    remotes = [Remote(store, "origin") for store in stores]
    for remote in remotes:
        remote.sync()
    return bare, stores, remotes


def experiment(store: Store, remote: Remote, new: str, old: str = "DEPTH = 4"):
    base = store.best()
    source = store.read_file(base, "train.py")
    tree, _ = store.apply_diff(base, store.make_diff("train.py", source, source.replace(old, new)))
    return store.create_experiment(base, tree, new, "test", remote.reserve)


def test_numbers_best_and_notes_through_the_remote(tmp_path):
    bare, (a, b), (remote_a, remote_b) = machines(tmp_path)
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


def test_a_keep_that_never_reached_the_remote_is_rebased_not_lost(tmp_path):
    bare, (a, b), (remote_a, remote_b) = machines(tmp_path)
    base = a.best()
    # a keeps DEPTH 6 locally, then dies before moving best anywhere
    number_a, commit_a = experiment(a, remote_a, "DEPTH = 6")
    a.write_note(commit_a, {"experiment": number_a, "status": "keep", "val_bpb": 2.1,
                            "parent_val_bpb": 2.2, "description": "DEPTH = 6"})
    # meanwhile b keeps LR 0.05 and publishes it
    number_b, commit_b = experiment(b, remote_b, "LR = 0.05", old="LR = 0.1")
    b.write_note(commit_b, {"experiment": number_b, "status": "keep", "val_bpb": 2.15})
    assert remote_b.push_best(base, commit_b)
    remote_b.publish_notes()
    # a resumes: its keep lost the race, so it is rebased onto b's best and run again
    out = cli("loop", "--remote", "origin", "--max-experiments", "3", cwd=a.root)
    note = Store(a.root).read_note(commit_a)
    assert note["status"] == "discard" and "best moved before its keep was published" in note["reason"]
    assert "rebased onto best" in note["reason"], out.stdout + out.stderr
    rebased = [e for e in Store(a.root).experiments() if e.description.startswith(f"rebase of #{number_a}")]
    assert rebased and rebased[0].record is not None and rebased[0].parent == commit_b


def test_adopting_the_remote_best_is_a_compare_and_swap(tmp_path, monkeypatch):
    """A local move of best made between sync's read and its write (another worker) is never
    overwritten blindly: the swap fails, sync reads again and retries."""
    bare, (a, b), (remote_a, remote_b) = machines(tmp_path)
    base = a.best()
    _, commit_a = experiment(a, remote_a, "DEPTH = 6")
    _, commit_b = experiment(b, remote_b, "DEPTH = 5")
    assert remote_a.push_best(base, commit_a)
    real_set_best, seen = b.set_best, []

    def racing_set_best(old, new, message):
        if not seen:  # a local worker moves best just before our write
            sh("git", "update-ref", "refs/heads/best", commit_b, cwd=b.root)
        seen.append((old, b.best()))
        return real_set_best(old, new, message)

    monkeypatch.setattr(b, "set_best", racing_set_best)
    remote_b.sync()
    assert seen == [(base, commit_b), (commit_b, commit_b)]  # the first swap saw the move and failed
    assert b.best() == commit_a
    with pytest.raises(StaleRefError):
        b.set_best(base, commit_b, "stale")
    assert b.best() == commit_a
