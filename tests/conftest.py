import fcntl
import importlib
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "target_repo"
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set when bin/test runs the suite on several workers


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: runs with no other test beside it, because what it "
                            "asserts depends on how far a fixed wall-clock budget trains")
    if WORKER:
        import torch
        torch.set_num_threads(1)  # the workers share the cores; in-process torch must not oversubscribe them


@pytest.fixture(autouse=True)
def share_the_machine(request, tmp_path_factory):
    """Under xdist, a test marked `alone` waits until no other test runs and keeps the others
    out while it runs; the rest run side by side. A turnstile lock in front of the shared one
    keeps a stream of other tests from starving the `alone` test."""
    if not WORKER:
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent  # the workers' common base temp
    alone = request.node.get_closest_marker("alone") is not None
    with open(shared / "turnstile.lock", "w") as turnstile, open(shared / "machine.lock", "w") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def nanochat_cache(tmp_path_factory):
    """A data cache of the default corpus, built once per test session."""
    cache = tmp_path_factory.mktemp("nanochat-cache")
    old = os.environ.get("NANOCHAT_CACHE_DIR")
    os.environ["NANOCHAT_CACHE_DIR"] = str(cache)
    prepare = load_target_modules(TARGET)["prepare"]
    prepare.verified_cache()
    yield cache
    if old is None:
        os.environ.pop("NANOCHAT_CACHE_DIR", None)
    else:
        os.environ["NANOCHAT_CACHE_DIR"] = old


@pytest.fixture
def target_copy(tmp_path):
    """A private copy of the bundled target to edit."""
    dest = tmp_path / "target"
    shutil.copytree(TARGET, dest)
    return dest


def load_target_modules(directory: Path, names=("prepare",)) -> dict:
    """Fresh imports of the target's modules from `directory` (train.py imports `prepare` by
    name, so both must come from the same folder)."""
    for name in ("prepare", "train"):
        sys.modules.pop(name, None)
    sys.path.insert(0, str(directory))
    try:
        return {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(directory))
