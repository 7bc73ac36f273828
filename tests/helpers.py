import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

FAKES = Path(__file__).parent / "fakes"
BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def benchmark_module(name: str):
    """A module of benchmarks/ (scripts, not a package), loaded by path."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sh(*args, cwd, check=True):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@x")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=check)


def make_repo(path: Path, fake="curve.py", config: str = "") -> Path:
    """A research repo whose train.py is a fake with a scripted curve."""
    path.mkdir(parents=True, exist_ok=True)
    sh("git", "init", "-q", "-b", "main", cwd=path)
    shutil.copy(FAKES / fake, path / "train.py")
    (path / "frozen.txt").write_text("frozen\n")
    (path / "gitresearch.toml").write_text(
        'schema = 1\n[run]\nbudget_s = 1\ngrace_s = 20\n[files]\neditable = ["train.py"]\n'
        'frozen = ["frozen.txt"]\n[noise]\nnoise_runs = 2\n' + config)
    (path / "notes.md").write_text("user's work in progress\n")
    sh("git", "add", "train.py", "frozen.txt", "gitresearch.toml", cwd=path)
    sh("git", "commit", "-qm", "baseline", cwd=path)
    (path / "notes.md").write_text("user's uncommitted edit\n")  # must survive the loop
    return path


def cli(*args, cwd, check=True, timeout=600, env=None):
    proc = subprocess.run([sys.executable, "-m", "gitresearch", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})
    if check and proc.returncode != 0:
        raise AssertionError(f"gitresearch {' '.join(args)} exited {proc.returncode}\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def share_through_bare_remote(seed: Path, names=("a", "b"), everything=True) -> tuple[Path, list[Path]]:
    """A bare remote next to `seed` holding its main (and, with `everything`, best, the notes
    and the experiment refs), and a clone of it per name, each `gitresearch init`-ed."""
    bare = seed.parent / "remote.git"
    sh("git", "init", "-q", "--bare", str(bare), cwd=seed.parent)
    refs = ["main", "best", "refs/notes/*:refs/notes/*", "refs/gitresearch/*:refs/gitresearch/*"]
    sh("git", "push", "-q", str(bare), *(refs if everything else refs[:1]), cwd=seed)
    clones = []
    for name in names:
        sh("git", "clone", "-q", "-b", "main", str(bare), name, cwd=seed.parent)
        cli("init", cwd=seed.parent / name)
        clones.append(seed.parent / name)
    return bare, clones
