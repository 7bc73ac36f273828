"""The bundled target's result, as the harness gets it: the frozen evaluate.py on the model a
train.py run saved. Shared by the benchmarks that run train.py by hand (no sandbox here: the
target code is the bundled one, not a policy's)."""
import re
import subprocess
import sys
from pathlib import Path


def evaluated_val_bpb(work: Path, env: dict) -> float | None:
    """val_bpb of the model saved in env["GITRESEARCH_ARTIFACTS"], None when refused or failed."""
    proc = subprocess.run([sys.executable, "evaluate.py"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=900)
    found = re.findall(r"^val_bpb:\s+([-\d.]+)$", proc.stdout, flags=re.M)
    return float(found[-1]) if proc.returncode == 0 and found else None
