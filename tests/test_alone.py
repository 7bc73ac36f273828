"""The suite's own scheduling (conftest.share_the_machine): under two xdist workers a test
marked `alone` runs with no other test beside it, and the others still run side by side."""
import os
import subprocess
import sys
from pathlib import Path

INNER = '''
import time
import pytest

def hold(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open({log!r}, "a") as log:
        log.write(f"{{name}} {{start}} {{time.monotonic()}}\\n")

@pytest.mark.parametrize("n", range(8))
def test_before(n):
    hold(f"before{{n}}", 1.5 if n == 0 else 0.2)  # one long test, so the alone test arrives mid-test

@pytest.mark.alone
def test_alone():
    hold("alone", 0.5)

@pytest.mark.parametrize("n", range(4))
def test_after(n):
    hold(f"after{{n}}", 0.2)
'''


def test_an_alone_test_runs_with_nothing_beside_it_and_the_rest_overlap(tmp_path):
    log = tmp_path / "intervals.txt"
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_inner.py").write_text(INNER.format(log=str(log)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a fresh session
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    spans = {name: (float(a), float(b)) for name, a, b in (line.split() for line in log.read_text().splitlines())}
    assert len(spans) == 13
    alone = spans.pop("alone")
    assert all(end <= alone[0] or start >= alone[1] for start, end in spans.values()), (alone, spans)
    others = sorted(spans.values())
    assert any(b[0] < a[1] for a, b in zip(others, others[1:])), others  # two workers did overlap
