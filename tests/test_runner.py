"""The runner against hostile train.py scripts: each ends with the right status and reason,
and no process is left behind."""
import shutil
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from gitresearch.config import Config, FilesConfig, RunConfig
from gitresearch.processes import tagged
from gitresearch.runner import clean_env, network_isolation_available, run_training

FAKES = Path(__file__).parent / "fakes"


def run_fake(tmp_path, script, budget=2.0, grace=1.0, **run_options):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    shutil.copy(FAKES / script, work / "train.py")
    (work / "frozen.txt").write_text("frozen\n")
    config = Config(run=RunConfig(command=("python", "train.py"), budget_s=budget, grace_s=grace,
                                  term_grace_s=0.5, **run_options),
                    files=FilesConfig(frozen=("frozen.txt",)))
    return run_training(work, config, tmp_path / "log.txt", tmp_path / "metrics.jsonl")


def left_behind(under: Path, wait_s: float = 5.0) -> list[psutil.Process]:
    """Live training processes (tagged with a GITRESEARCH_RUN_ID) working under `under`, once
    those already dying have had `wait_s` to finish exiting: a loaded machine takes a moment to
    tear down a killed process, and other tests' runs (under xdist) are not this test's."""
    found = tagged(lambda p, tag: p.cwd().startswith(str(under)))
    _, alive = psutil.wait_procs(list(found.values()), timeout=wait_s)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(autouse=True)
def no_process_left_behind(tmp_path):
    yield
    assert left_behind(tmp_path) == []


def test_normal_run_parses_both_metric_formats(tmp_path):
    result = run_fake(tmp_path, "curve.py")
    assert result.status == "ok", result.reason
    assert result.metric == pytest.approx(2.0 + 0.1 + 0.1)
    assert len(result.points) == 10 and result.points[-1]["step"] == 10
    assert result.summary["training_seconds"] == 2.0 and result.training_seconds == 2.0
    assert result.exit_code == 0 and result.reason == ""
    assert "val_bpb:" in Path(result.log_path).read_text()


def test_hang_that_ignores_sigterm_times_out(tmp_path):
    start = time.monotonic()
    result = run_fake(tmp_path, "hang.py", budget=0.5, grace=0.5)
    assert result.status == "timeout"
    assert "over the wall-clock limit of 1 s (budget 0.5 + grace 0.5)" in result.reason
    # bwrap exits on SIGTERM; the script ignores it and dies by SIGKILL (no process left: the fixture)
    assert result.exit_code in (-9, -15)
    assert time.monotonic() - start < 5


def test_children_left_running_are_killed(tmp_path):
    result = run_fake(tmp_path, "child.py")
    assert result.status == "ok"
    pids = [int(p) for p in (tmp_path / "work" / "pids.txt").read_text().split()]
    assert len(pids) >= 2  # (pids inside the sandbox's own pid namespace)
    assert left_behind(tmp_path) == []


def test_output_flood_is_capped(tmp_path):
    result = run_fake(tmp_path, "flood.py", log_cap_mb=1)
    assert result.status == "crash"
    assert "no val_bpb reported" in result.reason and "no metric after the flood" in result.reason
    size = Path(result.log_path).stat().st_size
    assert 2 ** 20 <= size < 2 ** 20 + 128 * 1024
    assert "bytes over the log cap dropped" in Path(result.log_path).read_text()


@pytest.mark.parametrize("script, reason", [
    ("nometric.py", "no val_bpb reported (no summary block line and no GITRESEARCH_METRICS point)"),
    ("nan.py", "val_bpb is nan"),
    ("exit1.py", "exited with code 1: RuntimeError: CUDA out of memory (simulated)"),
])
def test_crashes_have_a_reason(tmp_path, script, reason):
    result = run_fake(tmp_path, script)
    assert result.status == "crash"
    assert reason in result.reason
    assert result.metric is None


def test_tampering_with_a_frozen_file_is_invalid(tmp_path):
    result = run_fake(tmp_path, "tamper.py")
    assert result.status == "invalid"
    assert result.reason == "frozen file(s) changed during the run: frozen.txt"


def test_memory_limit(tmp_path):
    result = run_fake(tmp_path, "memory.py", budget=10, memory_limit_mb=300)
    assert result.status == "crash"
    assert "memory limit" in result.reason and "run.memory_limit_mb = 300" in result.reason
    assert result.peak_memory_mb > 300


@pytest.mark.skipif(not network_isolation_available(), reason="no network namespaces here")
def test_opening_a_socket_fails_without_network(tmp_path, monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    monkeypatch.setenv("FAKE_PORT", str(server.getsockname()[1]))
    result = run_fake(tmp_path, "socket_open.py", env_allow=("FAKE_PORT",))
    assert result.network_isolated
    assert result.status == "crash"
    # no route at all (unshare) or an empty loopback of its own (bwrap)
    assert "Network is unreachable" in result.reason or "Connection refused" in result.reason
    with pytest.raises(socket.timeout):
        server.accept()  # nothing reached the host's loopback
    server.close()


def test_clean_env_drops_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-secret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = clean_env(())
    assert "OPENAI_API_KEY" not in env and "GITHUB_TOKEN" not in env
    assert env["LC_ALL"] == "C.UTF-8" and "PATH" in env


def test_stop_event_interrupts(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FAKES / "hang.py", work / "train.py")
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    config = Config(run=RunConfig(budget_s=30, term_grace_s=0.3))
    result = run_training(work, config, tmp_path / "log.txt", tmp_path / "m.jsonl", stop_event=stop)
    assert result.status == "crash" and result.reason.startswith("interrupted")
    assert result.seconds < 5


def test_throughput_from_progress_lines(tmp_path):
    from gitresearch.metrics import parse_progress

    line = "step 00014 (100.0%) | loss: 5.903965 | lrm: 0.17 | dt: 363ms | tok/sec: 11,294 | remaining: 0s"
    assert parse_progress(line) == {"step": 14, "percent": 100.0, "train_loss": 5.903965,
                                    "tokens_per_s": 11294.0}
    assert parse_progress("step 3 | loss: 2.5")["tokens_per_s"] is None
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(
        "import time\n"
        "for step, rate in enumerate([2000, 2000, 9000, 2000, 2000], start=1):\n"
        "    print(f'step {step:05d} | loss: 3.0 | tok/sec: {rate:,}', flush=True)\n"
        "    time.sleep(0.2)\n"
        "print('---'); print('val_bpb: 2.0'); print('num_steps: 5'); print('training_seconds: 1.5')\n")
    config = Config(run=RunConfig(budget_s=5))
    result = run_training(work, config, tmp_path / "log.txt", tmp_path / "metrics.jsonl")
    assert result.status == "ok"
    # the median of the lines seen (the pump reads the newest line of each chunk): one outlier
    # line, seen or not, does not move it
    assert result.tokens_per_s == 2000.0 and result.steps == 5 and result.training_seconds == 1.5


def test_the_newest_progress_line_of_a_chunk_is_found():
    from gitresearch.processes import newest_progress_line

    chunk = b"step 00001 | loss: 3.0\nstep 00002 | loss: 2.9 | tok/sec: 1,000\n---\nval_bpb: 2.0\nnum"
    assert newest_progress_line(chunk) == b"step 00002 | loss: 2.9 | tok/sec: 1,000"
    assert newest_progress_line(b"\rstep 00003 | loss: 2.8\rstep 00004 | loss: 2.7\r") == b"step 00004 | loss: 2.7"
    assert newest_progress_line(b"no progress here\n") is None
    assert newest_progress_line(b"step 00005 | loss: 2.6") is None  # not complete yet


def test_a_progress_line_written_in_two_pieces_is_seen(tmp_path):
    """print() writes a line and its newline apart: the pump joins them."""
    import os

    from gitresearch.processes import OutputPump

    read_end, write_end = os.pipe()
    seen = []
    pump = OutputPump(os.fdopen(read_end, "rb"), tmp_path / "log.txt", 1 << 20,
                      lambda line, complete: seen.append((line, complete)))
    pump.start()
    for piece in (b"step 00001 | loss: 3.0 | tok/sec: 1,234", b"\n", b"---\nval_bpb: 2.0\n"):
        os.write(write_end, piece)
        time.sleep(0.2)  # separate reads
    os.close(write_end)
    pump.join(timeout=5)
    pump.close()
    line = "step 00001 | loss: 3.0 | tok/sec: 1,234"
    assert seen == [(line, False), (line, True)]  # shown as it arrives, counted once complete
