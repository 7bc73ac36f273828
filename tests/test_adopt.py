"""Adopting an existing repo (docs/adopting.md): an autoresearch-style train.py (progress lines
redrawn with \\r, a summary block, no metrics file) gets live progress, early stop on its
training loss, and edits that can matter; `init` writes every key, commits the toml and
creates best there; the hook runs without the system python3."""
import json
import os
import re
import random
import shutil
import subprocess
from pathlib import Path

from gitresearch.config import Config, FilesConfig, RunConfig, load
from gitresearch.config_reference import reference_toml
from gitresearch.gitstore import Store
from gitresearch.policies.constants import find_sites, relations, rewrite
from gitresearch.policies.random_search import random_changes
from gitresearch.report import progress_text
from gitresearch.runner import PROGRESS_FILE, run_training

from helpers import FAKES, cli, make_repo, sh

SOURCE = (FAKES / "autoresearch.py").read_text()


def values_in(source: str) -> dict:
    return {s.name: s.value for s in find_sites(source)}


def test_carriage_return_progress_is_shown_live_and_becomes_a_curve(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(FAKES / "autoresearch.py", work / "train.py")
    seen = []
    config = Config(run=RunConfig(budget_s=1.5, grace_s=10), files=FilesConfig(frozen=()))
    result = run_training(work, config, tmp_path / "run" / "log.txt", tmp_path / "run" / "metrics.jsonl",
                          on_progress=seen.append)
    assert result.status == "ok" and result.metric is not None
    live = [p for p in seen if p["step"] is not None and p["elapsed"] < 1.5]
    assert live and all(p["train_loss"] is not None for p in live)  # shown before the run ended
    assert re.search(r"step \d+ loss \d\.\d{4}", progress_text(dict(live[-1], experiment=3)))
    steps = [p["step"] for p in result.curve]
    assert steps == sorted(steps) and len(steps) >= 20 and steps[-1] == 24
    assert result.curve[-1]["t"] == 1.5  # 100.0 % of the budget, not the wall clock with start-up
    assert result.steps == 24
    saved = [json.loads(line) for line in (tmp_path / "run" / PROGRESS_FILE).read_text().splitlines()]
    assert saved == result.curve


def test_past_the_budget_the_clock_stops_and_says_evaluating():
    line = progress_text({"elapsed": 41.0, "budget": 30.0, "step": 7, "train_loss": 2.5, "metric": None})
    assert "30/30s evaluating" in line and "41" not in line
    assert "evaluating" in progress_text({"phase": "evaluating", "elapsed": 3.0, "budget": 30.0, "step": None,
                                          "train_loss": None, "metric": None})


def test_the_search_space_skips_reporting_and_the_base_of_a_power():
    sites = {s.name: s for s in find_sites(SOURCE)}
    assert "H100_BF16_PEAK_FLOPS" not in sites  # only feeds the printed MFU
    assert sites["TOTAL_BATCH_SIZE"].kind == "exponent" and sites["TOTAL_BATCH_SIZE"].value == 12
    assert sites["HEAD_DIM"].align == 32 and ("WIDTH", "HEAD_DIM") in relations(SOURCE)
    rng = random.Random(0)
    for _ in range(300):
        sites_now = find_sites(SOURCE)
        new = values_in(rewrite(SOURCE, random_changes(sites_now, rng, relations(SOURCE))))
        assert 8 <= new["TOTAL_BATCH_SIZE"] <= 16  # exponent steps, base untouched (asserted below)
        assert new["HEAD_DIM"] % 2 == 0 and new["WIDTH"] % new["HEAD_DIM"] == 0
    assert "2**" in rewrite(SOURCE, [(sites["TOTAL_BATCH_SIZE"], 13)])


def test_relations_are_found_through_defaulted_parameters():
    source = ("WIDTH = 128\nHEAD_DIM = 64\n\nclass GPT:\n    def __init__(self, width=WIDTH, head_dim=HEAD_DIM):\n"
              "        self.width = max(head_dim, round(width / head_dim) * head_dim)\n")
    assert relations(source) == {("WIDTH", "HEAD_DIM")}


def test_loop_on_an_autoresearch_style_target_stops_runs_on_the_training_loss(tmp_path):
    repo = make_repo(tmp_path / "repo", fake="autoresearch.py",
                     config="[early_stop]\nmin_history = 3\n[confirm]\nmax_pairs = 2\n")
    out = cli("loop", "--no-sandbox", "--policy", "random", "--seed", "3", "--max-experiments", "14",
              cwd=repo, timeout=900)
    store = Store(repo)
    notes = [e.record for e in store.experiments() if e.number > 0]
    assert len(notes) == 14
    stopped = [n for n in notes if n["status"] == "early_stop"]
    assert stopped, [(n["status"], n.get("early_stop_idle")) for n in notes]
    for note in stopped:
        assert note["early_stop_source"] == "train_loss" and note["checks"]
        assert note["checks"][-1]["decision"] == "stop" and "training loss mapped" in note["comment"]
    assert not [n for n in notes if n["status"] == "crash"]  # no shape crash
    for exp in store.experiments():
        if exp.number == 0:
            continue
        changed = [line for line in store.diff_of(exp.commit).splitlines()
                   if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert not [line for line in changed if "H100_BF16_PEAK_FLOPS" in line]
        assert all("2**" in line for line in changed if "TOTAL_BATCH_SIZE" in line)
    assert "early stop cannot act" not in out.stdout + out.stderr
    status = cli("status", cwd=repo).stdout
    assert "on the training loss of the progress lines" in status


def test_a_script_with_nothing_to_judge_says_so_once_and_status_says_why(tmp_path):
    repo = make_repo(tmp_path / "repo", fake="summary_only.py", config="[early_stop]\nmin_history = 2\n")
    out = cli("loop", "--no-sandbox", "--max-experiments", "3", "--seed", "1", cwd=repo)
    said = (out.stdout + out.stderr).count("early stop cannot act")
    assert said == 1, out.stdout + out.stderr
    status = cli("status", cwd=repo).stdout
    assert "cannot act" in status and "progress lines" in status


def plain_repo(repo: Path) -> Path:
    """A user's repo: train.py committed, no gitresearch.toml, never `init`-ed."""
    repo.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    shutil.copy(FAKES / "curve.py", repo / "train.py")
    sh("git", "add", "train.py", cwd=repo)
    sh("git", "commit", "-qm", "baseline", cwd=repo)
    return repo


def test_init_commits_the_toml_and_creates_best_there(tmp_path):
    repo = plain_repo(tmp_path / "repo")
    out = cli("init", "--commit", cwd=repo).stdout
    assert out.index("1. wrote") < out.index("2. committed") < out.index("3. created best")
    best = sh("git", "rev-parse", "best", cwd=repo).stdout.strip()
    assert best == sh("git", "rev-parse", "HEAD", cwd=repo).stdout.strip()
    assert "gitresearch.toml" in sh("git", "ls-tree", "--name-only", "best", cwd=repo).stdout
    assert sh("git", "status", "--porcelain", cwd=repo).stdout == ""


def test_init_without_commit_waits_for_the_users_commit(tmp_path):
    repo = plain_repo(tmp_path / "repo")
    out = cli("init", cwd=repo).stdout  # no terminal: nothing asked, nothing committed
    assert "is not committed" in out
    assert sh("git", "rev-parse", "--verify", "-q", "best", cwd=repo, check=False).returncode != 0
    sh("git", "add", "gitresearch.toml", cwd=repo)
    sh("git", "commit", "-qm", "config", cwd=repo)  # through the installed hook
    cli("init", cwd=repo)
    assert sh("git", "rev-parse", "best", cwd=repo).stdout == sh("git", "rev-parse", "HEAD", cwd=repo).stdout


def test_a_best_left_behind_by_an_earlier_init_moves_to_the_committed_toml(tmp_path):
    repo = make_repo(tmp_path / "repo")
    sh("git", "update-ref", "refs/heads/best", "HEAD", cwd=repo)
    (repo / "gitresearch.toml").write_text((repo / "gitresearch.toml").read_text() + "[loop]\nworkers = 1\n")
    sh("git", "commit", "-qam", "config", cwd=repo)
    assert "3. moved best" in cli("init", cwd=repo).stdout
    assert sh("git", "rev-parse", "best", cwd=repo).stdout == sh("git", "rev-parse", "HEAD", cwd=repo).stdout


def test_the_hook_runs_with_inits_interpreter_not_the_system_python3(tmp_path):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"  # a python3 that lacks tomli, as on a 3.10 system
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named tomli' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@x")
    assert subprocess.run(["python3", "-c", "1"], env=env).returncode == 1
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# an ordinary edit\n")
    ok = subprocess.run(["git", "commit", "-qam", "edit"], cwd=repo, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    (repo / "frozen.txt").write_text("tampered\n")
    refused = subprocess.run(["git", "commit", "-qam", "tamper"], cwd=repo, env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "refusing to commit changes to frozen file(s): frozen.txt" in refused.stderr


def test_the_generated_toml_lists_every_key_with_its_real_default(tmp_path):
    text = reference_toml()
    uncommented = "\n".join(re.sub(r"^# ([a-z_]+ = )", r"\1", line) for line in text.splitlines())
    (tmp_path / "gitresearch.toml").write_text(uncommented)
    loaded = load(tmp_path)
    assert loaded == Config()  # every default spelled as config.py has it
    from dataclasses import fields
    for section in fields(Config):
        if section.name in ("schema", "search"):
            continue
        for f in fields(section.default_factory):
            assert re.search(rf"^(# )?{f.name}(:| =)", text, re.M), (section.name, f.name)
    (tmp_path / "gitresearch.toml").write_text(text)
    assert load(tmp_path) == Config()  # as written: only defaults are live


def test_the_docs_show_the_toml_init_writes():
    doc = (Path(__file__).parents[1] / "docs" / "adopting.md").read_text()
    block = doc.split("<!-- reference_toml -->\n```toml\n", 1)[1].split("```", 1)[0]
    assert block == reference_toml()


def test_init_probe_times_a_run_and_suggests_a_grace(tmp_path):
    repo = make_repo(tmp_path / "repo", fake="autoresearch.py")
    out = cli("init", "--probe", cwd=repo).stdout
    assert re.search(r"probe: ok in [\d.]+ s wall for 1 s of budget \([\d.]+ s past the training time, "
                     r"first progress line after [\d.]+ s\); suggested grace_s = 60", out), out


def test_a_constant_whose_changes_crashed_twice_is_avoided_and_the_prompt_says_so(tmp_path):
    from gitresearch.config import load as load_config
    from gitresearch.history import build_state
    from gitresearch.policies.prompt import render_diagnostics
    from gitresearch.policies.random_search import RandomSearch

    crashes = [("crash", {"HEAD_DIM = 32": new}) for new in ("HEAD_DIM = 30", "HEAD_DIM = 6")]
    repo, store = repo_with_history(tmp_path, crashes)
    config = load_config(repo)
    state, _ = build_state(store, config, [e for e in store.experiments() if e.number > 0])
    assert state.diagnostics["crashed_constants"] == {"HEAD_DIM": [1, 2]}
    assert "avoid them: HEAD_DIM (#1, #2)" in render_diagnostics(state)
    policy = RandomSearch(config, store, seed=0, cuda=False)
    for _ in range(60):
        proposal = policy.propose(state)
        assert "HEAD_DIM" not in [c["name"] for c in proposal.data["changes"]]


def add_experiment(store: Store, base: str, number: int, status: str, edits: dict[str, str]) -> None:
    """Experiment `number` on `base`: SOURCE with each line of `edits` replaced, and its note."""
    after = SOURCE
    for line, new in edits.items():
        after = after.replace(line, new)
    diff = store.make_diff("train.py", SOURCE, after)
    _, commit = store.create_experiment(base, store.apply_diff(base, diff)[0], str(edits), "test", lambda *a: True)
    store.write_note(commit, {"experiment": number, "status": status, "reason": "shape mismatch"})


def repo_with_history(tmp_path, runs: list[tuple[str, dict[str, str]]]) -> tuple[Path, Store]:
    """An initialised repo with a baseline and the experiments `runs` ((status, edits), oldest first)."""
    repo = make_repo(tmp_path / "repo", fake="autoresearch.py")
    cli("init", cwd=repo)
    store = Store(repo)
    base = store.best()
    store.set_baseline(base)
    store.write_note(base, {"experiment": 0, "status": "baseline", "val_bpb": 2.0})
    for number, (status, edits) in enumerate(runs, 1):
        add_experiment(store, base, number, status, edits)
    return repo, store


def crash_blame_repo(tmp_path, runs: list[tuple[str, dict[str, str]]]) -> dict:
    """history.crashed_constants after the experiments `runs` ((status, edits), oldest first)."""
    from gitresearch.history import crashed_constants

    _, store = repo_with_history(tmp_path, runs)
    return crashed_constants(store, [e for e in store.experiments() if e.number > 0])


TWO_CHANGES = ({"HEAD_DIM = 32": "HEAD_DIM = 30", "MATRIX_LR = 0.04": "MATRIX_LR = 0.4"},
               {"HEAD_DIM = 32": "HEAD_DIM = 6", "MATRIX_LR = 0.04": "MATRIX_LR = 0.01"})


def test_a_crash_that_changed_two_constants_blames_each_half(tmp_path):
    # two crashes of two-change diffs: one crash's worth of blame each, so both stay offered
    assert crash_blame_repo(tmp_path / "a", [("crash", TWO_CHANGES[0]), ("timeout", TWO_CHANGES[1])]) == {}
    # four such crashes: two each
    four = [("crash", TWO_CHANGES[0]), ("crash", TWO_CHANGES[1])] * 2
    assert crash_blame_repo(tmp_path / "b", four) == {"HEAD_DIM": [1, 2, 3, 4], "MATRIX_LR": [1, 2, 3, 4]}
    # three-way shares add up to a whole crash
    three = {"HEAD_DIM = 32": "HEAD_DIM = 6", "MATRIX_LR = 0.04": "MATRIX_LR = 0.01", "WIDTH = 128": "WIDTH = 96"}
    alone = ("crash", {"WIDTH = 128": "WIDTH = 100"})
    assert crash_blame_repo(tmp_path / "c", [("crash", three)] * 3 + [alone]) == {"WIDTH": [1, 2, 3, 4]}


def test_a_measured_run_that_changed_a_constant_clears_its_crashes(tmp_path):
    crashes = [("crash", {"HEAD_DIM = 32": "HEAD_DIM = 30"}), ("crash", {"HEAD_DIM = 32": "HEAD_DIM = 6"})]
    for status in ("keep", "discard", "early_stop"):
        ran = (status, {"HEAD_DIM = 32": "HEAD_DIM = 64"})
        assert crash_blame_repo(tmp_path / status, crashes + [ran]) == {}, status
    # an invalid proposal never ran: it clears nothing; a run that changed another constant neither
    other = ("discard", {"MATRIX_LR = 0.04": "MATRIX_LR = 0.02"})
    assert crash_blame_repo(tmp_path / "x", crashes + [("invalid", {"HEAD_DIM = 32": "HEAD_DIM = 64"}), other]) \
        == {"HEAD_DIM": [1, 2]}
    # crashes after the measured run count afresh
    after = crashes + [("discard", {"HEAD_DIM = 32": "HEAD_DIM = 64"})] + crashes
    assert crash_blame_repo(tmp_path / "y", after) == {"HEAD_DIM": [4, 5]}


def test_blame_fades_after_blame_memory_experiments_and_random_search_moves_the_constant_again(tmp_path):
    from gitresearch.config import load as load_config
    from gitresearch.history import BLAME_MEMORY, build_state
    from gitresearch.policies.random_search import RandomSearch

    crashes = [("crash", {"HEAD_DIM = 32": "HEAD_DIM = 30"}), ("crash", {"HEAD_DIM = 32": "HEAD_DIM = 6"})]
    others = [("discard", {"MATRIX_LR = 0.04": f"MATRIX_LR = 0.{i % 9 + 1}"}) for i in range(BLAME_MEMORY - 1)]
    repo, store = repo_with_history(tmp_path, crashes + others)  # the newest is experiment BLAME_MEMORY + 1
    config = load_config(repo)

    def state_after(newest: int):
        return build_state(store, config, [e for e in store.experiments() if 0 < e.number <= newest])[0]

    # while both crashes are among the last BLAME_MEMORY experiments, HEAD_DIM is left alone
    assert state_after(BLAME_MEMORY).diagnostics["crashed_constants"] == {"HEAD_DIM": [1, 2]}
    # one experiment later the first crash is older: one crash's blame is left, and it is offered again
    state = state_after(BLAME_MEMORY + 1)
    assert state.diagnostics["crashed_constants"] == {}
    policy = RandomSearch(config, store, seed=0, cuda=False)
    moved = [c["name"] for _ in range(60) for c in policy.propose(state).data["changes"]]
    assert "HEAD_DIM" in moved
    # two fresh crashes blame it again, with only those crashes named
    again = crashes + others + crashes
    assert crash_blame_repo(tmp_path / "again", again) == {"HEAD_DIM": [BLAME_MEMORY + 2, BLAME_MEMORY + 3]}


def test_a_timeout_keeps_the_steps_its_progress_lines_showed(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import time\nfor i in range(1, 100):\n    print(f'\\rstep {i:05d} | loss: {3 - i / 100:.3f}', end='', flush=True)\n    time.sleep(0.05)\n")
    config = Config(run=RunConfig(budget_s=0.5, grace_s=0.5, term_grace_s=0.2), files=FilesConfig(frozen=()))
    result = run_training(work, config, tmp_path / "log.txt", tmp_path / "metrics.jsonl")
    assert result.status == "timeout" and result.steps is not None and result.steps >= 5


def test_the_loss_map_waits_for_a_slope_that_is_not_chance():
    from gitresearch.losscurve import fit_map

    def runs(pairs):
        return [((1.0,), (loss,), final) for loss, final in pairs]

    tracking = runs([(3.0, 2.5), (3.2, 2.7), (2.9, 2.45), (3.5, 2.9), (3.1, 2.62)])
    loss_map, why = fit_map(tracking, min_runs=5)
    assert why == "" and loss_map.slope > 0 and abs(loss_map(3.0) - 2.5) < 0.05
    assert fit_map(tracking[:4], min_runs=5)[0] is None  # too few
    unrelated = runs([(3.0, 2.5), (3.2, 2.4), (2.9, 2.6), (3.5, 2.45), (3.1, 2.55)])
    loss_map, why = fit_map(unrelated, min_runs=5)
    assert loss_map is None and why.startswith("waiting for finished runs whose training loss tracks")
