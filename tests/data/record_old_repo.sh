#!/usr/bin/env bash
# Records a research repo with an older gitresearch, for tests/test_old_data.py:
#   tests/data/record_old_repo.sh <commit of gitresearch> <out.bundle>
# It runs that commit's code (git archive, not a checkout) on a repo whose train.py is the fake
# curve of tests/fakes, three experiments, and bundles every ref (branches, notes, experiments).
set -euo pipefail
commit="$1"; out="$(realpath "$2")"; root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
mkdir "$work/code" "$work/repo"
git -C "$root" archive "$commit" | tar -x -C "$work/code"
cd "$work/repo"
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@x GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@x
git init -q -b main
cp "$work/code/tests/fakes/curve.py" train.py
printf 'schema = 1\n[run]\nbudget_s = 1\ngrace_s = 20\n[files]\neditable = ["train.py"]\n[noise]\nnoise_runs = 2\n' \
    > gitresearch.toml
git add -A && git commit -qm baseline
export PYTHONPATH="$work/code"
python -m gitresearch init
python -m gitresearch loop --max-experiments 3 --seed 0
git bundle create "$out" --all
