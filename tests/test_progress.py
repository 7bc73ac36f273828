"""Long commands show their count with an ETA: a rich bar on a terminal, plain lines elsewhere
(loop --max-experiments, verify, bench early-stop, bench research)."""
import io
import re
import time

from rich.console import Console

from gitresearch.progress import Eta, Steps
from helpers import BENCHMARKS, cli

PLAIN = re.compile(r"^(?P<what>[^:]+): (?P<done>\d+)/(?P<total>\d+), \d+:\d\d elapsed(, ETA \d+:\d\d)?", re.M)


def counts(text: str, what: str) -> list[tuple[int, int]]:
    return [(int(m["done"]), int(m["total"])) for m in PLAIN.finditer(text) if m["what"].endswith(what)]


def test_a_terminal_gets_a_bar_with_the_count_and_an_eta():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with Steps(console, "replays", 3) as steps:
        for _ in range(2):
            time.sleep(0.05)
            steps.advance("one")
        steps.bar.refresh()
        shown = out.getvalue()
    assert "2/3" in shown and "ETA" in shown and "━" in shown  # the bar's glyphs


def test_the_eta_is_the_pace_of_this_run_times_what_is_left():
    eta = Eta()
    eta.first = (time.monotonic() - 60, 10)  # ten done when this process started, a minute ago
    assert eta.plain("experiments", 13, 19).endswith("1:00 elapsed, ETA 2:00")  # 20 s each, 6 left
    assert "ETA" not in eta.plain("experiments", 19, 19)


def test_pipes_get_plain_lines_from_loop_verify_and_the_benches(tmp_path):
    repo = tmp_path / "gym"
    cli("init", "--template", "gym", str(repo), cwd=tmp_path)
    loop = cli("loop", "--policy", "random", "--seed", "2", "--max-experiments", "4", cwd=repo).stderr
    assert counts(loop, "experiments") == [(n, 4) for n in range(5)], loop
    assert "ETA" in loop
    verify = cli("verify", "--runs", "1", "refs/gitresearch/experiments/000001", cwd=repo, check=False).stderr
    assert counts(verify, "verification runs") == [(0, 2), (1, 2), (2, 2)], verify
    corpus = str(BENCHMARKS / "data" / "synthetic_stress.jsonl")
    bench = cli("bench", "early-stop", "--curves", corpus, "--curves", corpus,
                "--method", "race", "--method", "optuna-median", "--json", cwd=tmp_path).stderr
    assert counts(bench, "replays (corpus x method)") == [(n, 4) for n in range(1, 5)], bench
    research = cli("bench", "research", "--policies", "random", "--experiments", "3", "--seeds", "2",
                   "--json", cwd=tmp_path).stderr
    assert counts(research, "loops (policy x seed)") == [(1, 2), (2, 2)], research
