"""gitresearch serve: a read-only page over a real research repo (the gym target), checked
over HTTP and in headless Chromium: the counts and best value, a live update without a reload,
hostile descriptions shown as text, and a screenshot kept in build/test-artifacts/."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from browser import ARTIFACTS, chromium
from gitresearch.gitstore import Store
from helpers import cli, sh

HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("serve") / "gym"
    cli("init", "--template", "gym", str(repo), cwd=repo.parent)
    cli("loop", "--policy", "random", "--seed", "3", "--max-experiments", "6", cwd=repo)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gitresearch", "serve", "--port", str(port)], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/api/state", timeout=2)
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError(proc.stdout.read())
    yield url, proc
    proc.terminate()
    proc.wait(10)


def request(url: str, method: str = "GET", host: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers={"Host": host} if host else {},
                                 data=b"{}" if method in ("POST", "PUT", "PATCH") else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def refs(repo: Path) -> str:
    return sh("git", "for-each-ref", "--format=%(refname) %(objectname)", cwd=repo).stdout


def test_only_reads_binds_to_loopback_and_refuses_other_hosts(repo, server):
    url, proc = server
    listening = [c.laddr.ip for c in psutil.Process(proc.pid).net_connections("inet") if c.status == "LISTEN"]
    assert listening == ["127.0.0.1"]
    before = refs(repo), sh("git", "status", "--porcelain", cwd=repo).stdout
    for path in ("/", "/api/state", "/api/summary", "/api/experiments", "/api/experiments/1", "/static/app.js"):
        status, _ = request(url + path)
        assert status == 200, path
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert request(url + path, method)[0] == 405, (method, path)
    assert request(url + "/api/state", host="attacker.example")[0] == 400  # a rebound DNS name
    assert request(url + "/static/..%2Fserve.py")[0] == 404
    assert (refs(repo), sh("git", "status", "--porcelain", cwd=repo).stdout) == before
    status, body = request(url + "/api/experiments")
    rows = json.loads(body)["experiments"]
    store = Store(repo)
    assert [r["number"] for r in rows] == sorted(e.number for e in store.experiments())
    assert [r["value"] for r in rows] == [e.record.get("val_bpb") for e in reversed(store.experiments())]


def add_experiment(repo: Path, description: str) -> int:
    """An experiment with this description and a finished note, as a policy's would be."""
    store = Store(repo)
    best = store.best()
    number, commit = store.create_experiment(best, store.tree_of(best), description, "random")
    store.write_note(commit, {"experiment": number, "status": "discard", "val_bpb": 2.9, "delta": 0.5,
                              "description": description, "policy": "random", "seconds": 0.5,
                              "reason": HOSTILE, "log_tail": HOSTILE})
    return number


def test_the_page_shows_the_repo_updates_live_and_escapes_what_it_shows(repo, server):
    url, _ = server
    store = Store(repo)
    driver = chromium()
    try:
        driver.get(url + "/")
        wait(driver, lambda: shows_now(driver, url, store))
        best = store.read_note(store.best())["val_bpb"]
        cards = {c.find_element("tag name", "span").text: c.find_element("tag name", "b").text
                 for c in driver.find_elements("css selector", "#summary .card")}
        assert cards["best val_bpb"] == f"{best:.6f}"
        assert cards["experiments"] == str(len(store.experiments()) - 1)  # the baseline is not one
        assert driver.find_element("id", "count").text == f"({len(store.experiments()) - 1} and the baseline)"
        driver.execute_script("window.sameDocument = true")

        number = add_experiment(repo, HOSTILE)  # a new note, written while the page is open
        wait(driver, lambda: shows_now(driver, url, store))
        assert driver.execute_script("return window.sameDocument") is True  # no reload
        row = next(r for r in table_rows(driver) if r.get_attribute("data-number") == str(number))
        assert HOSTILE in row.text  # shown as text
        row.click()
        wait(driver, lambda: "<script>window.pwned = 1</script>" in driver.find_element("id", "note").text)
        assert driver.execute_script("return window.pwned") is None
        assert driver.find_elements("css selector", "img[src='x'], #experiments script") == []

        cli("loop", "--max-experiments", str(number + 1), cwd=repo)  # a real experiment, by the loop
        wait(driver, lambda: shows_now(driver, url, store))
        os.makedirs(ARTIFACTS, exist_ok=True)
        driver.find_element("css selector", "#experiments tbody tr").click()
        time.sleep(1.0)
        driver.execute_script("window.scrollTo(0, 0)")
        assert driver.save_screenshot(os.path.join(ARTIFACTS, "serve.png"))
        assert os.path.getsize(os.path.join(ARTIFACTS, "serve.png")) > 20_000
    finally:
        driver.quit()


def table_rows(driver):
    return driver.find_elements("css selector", "#experiments tbody tr")


def shows_now(driver, url: str, store: Store) -> bool:
    """The page has rendered the repo's current state, so its rows are not replaced again.

    A row count alone can match an intermediate state (the experiment's commit before its
    note, or the note before `best` moves); the next render then replaces the rows that a
    click is about to use."""
    token = json.loads(request(url + "/api/state")[1])["token"]
    return (driver.execute_script("return document.body.dataset.token") == token
            and len(table_rows(driver)) == len(store.experiments()))


def wait(driver, condition, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out; browser log: {driver.get_log('browser')}")
