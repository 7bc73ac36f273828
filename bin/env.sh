# Sourced by bin/test and bin/demo: creates .venv (or $GITRESEARCH_VENV) and installs the
# project into it. Where no NVIDIA GPU answers, torch is pinned to the 2.13.0 CPU wheel first,
# so the plain `torch` requirement does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${GITRESEARCH_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
stamp="$VENV/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    # pip's own progress bars (rich, with an ETA) on a terminal; a plain line per step elsewhere
    quiet=$([ -t 1 ] || echo "-q")
    if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
        echo "set-up 1/2: torch 2.13.0, the CPU build (no NVIDIA GPU answers)"
        "$VENV/bin/pip" install $quiet "torch==2.13.0"
    fi
    echo "set-up 2/2: gitresearch and its dependencies into $VENV"
    "$VENV/bin/pip" install $quiet -e ".[test]"
    touch "$stamp"
fi
export PATH="$(cd "$VENV" && pwd)/bin:$PATH"  # $GITRESEARCH_VENV may be absolute
