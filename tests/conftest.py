import importlib
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "target_repo"


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
