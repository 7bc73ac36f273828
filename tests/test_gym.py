"""The research gym (gitresearch init --template gym) and `gitresearch bench research`: the
gym's train.py follows its surrogate and the target's hard rules, loops on it run through the
real runner with early stop, and the bench's figures come out of those loops."""
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gitresearch import research_bench
from gitresearch.gitstore import Store
from gitresearch.resources import resource
from gitresearch.reward import constants_assigned, novelty
from helpers import cli

GYM = resource("gym")


def gym_copy(tmp_path: Path, **constants) -> Path:
    work = tmp_path / "gym"
    shutil.copytree(GYM, work)
    source = (work / "train.py").read_text()
    for name, value in constants.items():
        lines = [f"{name} = {value!r}  # set by the test" if line.startswith(f"{name} = ") else line
                 for line in source.splitlines()]
        source = "\n".join(lines) + "\n"
    (work / "train.py").write_text(source)
    return work


def run_gym(work: Path, budget: float = 30.0) -> subprocess.CompletedProcess:
    metrics = work / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    return subprocess.run([sys.executable, "train.py"], cwd=work, capture_output=True, text=True,
                          env=dict(os.environ, GITRESEARCH_BUDGET_S=str(budget), GITRESEARCH_METRICS=str(metrics)))


def final_of(proc) -> float:
    return float(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("val_bpb:")))


@pytest.mark.parametrize("constants,message", [
    ({"WIDTH": 100}, "WIDTH must be a multiple of an even HEAD_DIM"),
    ({"HEAD_DIM": 3, "WIDTH": 129}, "WIDTH must be a multiple"),
    ({"DEPTH": 0}, "DEPTH = 0: a size must be a positive int"),
])
def test_a_config_the_real_target_cannot_build_crashes_at_start(tmp_path, constants, message):
    proc = run_gym(gym_copy(tmp_path, **constants))
    assert proc.returncode == 1 and message in proc.stdout
    assert not (tmp_path / "gym" / "metrics.jsonl").exists()  # no curve: it never trained


def test_the_baseline_follows_the_surrogate_with_the_measured_noise(tmp_path):
    model = json.loads((GYM / "surrogate.json").read_text())
    sys.path.insert(0, str(GYM))
    import train as gym

    values = gym.constants()
    x = gym.features(model, values)
    predicted = dict(zip(model["gps"][0]["outputs"], gym.gp_mean(model["gps"][0], x)))
    work = gym_copy(tmp_path)
    finals, crashed = [], 0
    for _ in range(30):
        proc = run_gym(work, budget=3.0)  # the same curve over 3 simulated s: a twentieth of a second
        if proc.returncode:
            crashed += 1
            continue
        finals.append(final_of(proc))
        points = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
        assert [p["t"] for p in points] == [round(3.0 * k / 40, 3) for k in range(41)]
    assert crashed <= 5  # the baseline's crash probability is small
    sd = model["noise"]["final_sd"]
    assert abs(statistics.fmean(finals) - predicted["final"]) < 4 * sd / math.sqrt(len(finals))
    assert 0.5 * sd < statistics.stdev(finals) < 1.6 * sd  # fresh noise per run, at the measured sd


def test_a_gym_loop_is_judged_by_the_real_runner_check_by_check(tmp_path):
    """Early stop sees every check on its grid, though the gym reports a whole simulated run
    in half a second (several points per poll of the runner)."""
    repo = tmp_path / "repo"
    cli("init", "--template", "gym", str(repo), cwd=tmp_path)
    cli("loop", "--policy", "random", "--seed", "3", "--max-experiments", "14", cwd=repo)
    records = [e.record for e in reversed(Store(repo).experiments())]
    assert records[0]["status"] == "baseline" and len(records[0]["noise_runs"]) == 5
    assert len(records) == 15 and {"keep", "discard", "early_stop", "crash"} & {r["status"] for r in records[1:]}
    judged = [r for r in records[1:] if r.get("checks")]
    assert judged
    for record in judged:
        times = [c["t"] for c in record["checks"]]
        grid = [6.0 + 3 * i for i in range(len(times))]
        assert all(abs(t - g) <= 0.75 for t, g in zip(times, grid)), times  # no check skipped
        if record["status"] == "early_stop":
            assert record["checks"][-1]["decision"] in ("stop", "diverged")
        elif record["status"] in ("keep", "discard"):
            # 6, 9, ..., 27 s and the one due at 30 s (served by the point 0.75 s before it):
            # every check of a 30 s run, those of the points written in the last poll included
            assert len(times) == 9


def test_loops_with_one_seed_meet_the_same_noise_run_for_run(tmp_path):
    """Common random numbers: a loop's --seed seeds every run (GITRESEARCH_SEED, one per run
    slot), so two loops on one seed draw the same noise for the same slot, whatever their
    policies propose; within a loop every run draws its own."""
    def loop(name: str, seed: int, *settings: str) -> list[dict]:
        repo = tmp_path / name
        cli("init", "--template", "gym", str(repo), cwd=tmp_path)
        cli("loop", "--policy", "random", "--seed", str(seed), "--max-experiments", "8", *settings, cwd=repo)
        return [e.record for e in reversed(Store(repo).experiments())]

    first, again = loop("first", 3), loop("again", 3)
    other_policy = loop("momentum", 3, "--set", "policy.random_momentum=1")
    other_seed = loop("other", 4)
    noise = first[0]["noise_runs"]
    assert len(set(noise)) == len(noise) == 5  # each baseline run its own draw
    assert [r.get("val_bpb") for r in again] == [r.get("val_bpb") for r in first]
    assert [r["status"] for r in again] == [r["status"] for r in first]
    assert other_policy[0]["noise_runs"] == noise
    assert [r["description"] for r in other_policy[1:]] != [r["description"] for r in first[1:]]
    assert not set(other_seed[0]["noise_runs"]) & set(noise)


def test_a_run_seed_is_set_only_for_an_experiments_runs_of_a_seeded_loop(tmp_path):
    from dataclasses import replace

    from gitresearch.config import load
    from gitresearch.trial import run_seed_env

    repo = tmp_path / "gym"
    cli("init", "--template", "gym", str(repo), cwd=tmp_path)
    store, config = Store(repo), load(repo)
    seeded = replace(config, policy=replace(config.policy, seed=7))
    runs = store.state_dir / "runs"
    slots = [runs / "000000" / "noise-0", runs / "000000" / "noise-1", runs / "000012",
             runs / "000012" / "confirm-1-candidate", runs / "000012" / "confirm-1-best", runs / "000013"]
    seeds = [run_seed_env(store, seeded, slot)["GITRESEARCH_SEED"] for slot in slots]
    assert len(set(seeds)) == len(slots) and all(0 <= int(s) < 2 ** 31 for s in seeds)
    assert [run_seed_env(store, seeded, slot)["GITRESEARCH_SEED"] for slot in slots] == seeds  # stable
    other = replace(config, policy=replace(config.policy, seed=8))
    assert run_seed_env(store, other, slots[2]) != run_seed_env(store, seeded, slots[2])
    assert run_seed_env(store, config, slots[2]) == {}  # no loop seed
    assert run_seed_env(store, seeded, runs / "verify" / "abc123-1-candidate") == {}  # fresh each verify
    assert run_seed_env(store, seeded, tmp_path / "elsewhere") == {}  # bisect's, `run`'s


def test_summary_medians_and_experiments_to_random_final():
    def run(bests, step=30.0):
        return {"best": bests, "compute": [step * (i + 1) for i in range(len(bests))], "statuses": ["keep"] * len(bests)}

    runs = {"random": [run([3.0, 2.9, 2.9, 2.8]), run([3.0, 3.0, 2.7, 2.7]), run([3.0, 2.95, 2.9, 2.9])],
            "tpe": [run([3.0, 2.8, 2.7, 2.6]), run([3.0, 3.0, 3.0, 2.75]), run([3.0, 3.0, 3.0, 3.0])]}
    summary = research_bench.summarise(runs, compute_points=4)
    assert summary["reference_random_final"] == 2.8  # median of 2.8, 2.7, 2.9
    random_s, tpe = summary["policies"]["random"], summary["policies"]["tpe"]
    assert random_s["experiments_to_random_final"] == 4  # reached at 4, 3, never: the median 4
    assert tpe["experiments_to_random_final"] == 4  # 2, 4, never
    assert tpe["final_best"]["median"] == 2.75 and tpe["best_by_experiment"]["median"] == [3.0, 3.0, 3.0, 2.75]
    assert tpe["area_under_best"] == statistics.median([statistics.fmean(r["best"]) for r in runs["tpe"]])
    assert tpe["compute_grid_s"] == [30.0, 60.0, 90.0, 120.0]
    assert tpe["best_by_compute"]["median"] == [3.0, 3.0, 3.0, 2.75]
    never = research_bench.summarise({"random": runs["random"], "tpe": [run([3.0] * 4)] * 3})
    assert never["policies"]["tpe"]["experiments_to_random_final"] is None


def test_learning_figures_per_window_of_experiments():
    statuses = ["baseline"] + ["discard", "invalid", "keep", "early_stop"] * 3  # 12 after the baseline
    rewards = [None] + [float(i) for i in range(12)]
    diffs = [None] + ["a", "b", "a", "c", "d", "d", None, "e", "f", "f", "f", "g"]
    run = {"best": [3.0] * 13, "compute": [1.0] * 13, "statuses": statuses, "rewards": rewards, "diffs": diffs}
    first, second, third = research_bench.windows(run, size=5)
    assert (first["first"], first["last"], first["experiments"]) == (1, 5, 5)
    assert first["mean_reward"] == statistics.fmean([0, 1, 2, 3, 4]) and first["distinct_diffs"] == 4  # a b c d
    assert first["valid_share"] == 4 / 5 and first["keeps"] == 1
    assert (second["first"], second["last"], second["distinct_diffs"]) == (6, 10, 3)  # d e f, one without a diff
    assert (third["first"], third["last"], third["experiments"], third["mean_reward"]) == (11, 12, 2, 10.5)
    padded = dict(run, statuses=statuses[:8] + [None] * 5)  # a loop that ended early
    assert [w["experiments"] for w in research_bench.windows(padded, size=5)] == [5, 2]
    other = dict(run, rewards=[None] + [1.0] * 12)
    means = research_bench.mean_windows([run, other])
    assert len(means) == 1 and means[0]["seeds"] == 2  # one window of WINDOW (50) experiments
    assert means[0]["mean_reward"] == statistics.fmean([statistics.fmean(range(12)), 1.0])


def test_compute_charges_what_the_loop_spent():
    assert research_bench.compute_of({"status": "baseline", "budget_s": 30, "noise_runs": [1, 2, 3]}) == 90
    stopped = {"status": "early_stop", "budget_s": 30, "training_seconds": 29.0,
               "checks": [{"t": 6.1}, {"t": 9.0}]}
    assert research_bench.compute_of(stopped) == 9.0  # up to the check that stopped it
    confirmed = {"status": "keep", "budget_s": 30, "training_seconds": 30.0,
                 "confirmation": {"pairs": [{}, {}], "slow": [{}]}}
    assert research_bench.compute_of(confirmed) == 30 + 6 * 30
    assert research_bench.compute_of({"status": "invalid", "budget_s": 30}) == 0


def test_bench_research_end_to_end(tmp_path):
    loops = tmp_path / "loops"  # --workdir: the loops' repos are kept
    result = research_bench.bench_research(["random", "optuna-tpe"], experiments=8, seeds=2, parallel=2,
                                           workdir=loops, settings=("reward.novelty_epsilon=0", "reward.novelty=constants"))
    assert set(result["policies"]) == {"random", "optuna-tpe"}
    assert result["settings"] == ["reward.novelty_epsilon=0", "reward.novelty=constants"]
    # --set reaches every loop: the diffs were novel, the reward paid nothing for it
    records = [e.record for repo in loops.iterdir() for e in Store(repo).experiments() if e.record.get("diff_sha")]
    assert len(records) == 32 and any(r["novelty"] > 0 for r in records)
    assert all(r["reward"]["novelty"] == 0 for r in records)
    # ... and the novelty each note stores is the constants form over the experiments before it
    # (random's diffs are short enough for the history window to show them whole)
    narrowed = 0
    for repo in loops.glob("random-*"):
        store = Store(repo)
        exps = [e for e in reversed(store.experiments()) if e.number > 0]
        diffs = [e.record.get("rejected_diff") or store.diff_of(e.commit) for e in exps]
        for i, e in enumerate(exps):
            if e.record.get("diff_sha"):
                paid = novelty(diffs[i], diffs[:i], "constants")
                assert e.record["novelty"] == pytest.approx(paid, abs=1e-6)
                narrowed += paid < novelty(diffs[i], diffs[:i]) - 1e-6
    assert narrowed > 0  # a constant moved again was paid less than the lines form pays
    for policy, runs in result["runs"].items():
        assert len(runs) == 2
        for r in runs:
            assert len(r["best"]) == 9 and r["statuses"][0] == "baseline"  # the baseline, then 8
            assert all(b2 <= b1 for b1, b2 in zip(r["best"], r["best"][1:]))  # kept best only falls
            assert r["compute"][0] == 150.0  # five noise runs of 30 simulated s
            assert all(c2 >= c1 for c1, c2 in zip(r["compute"], r["compute"][1:]))
            assert all(isinstance(x, float) for x in r["rewards"][1:]) and r["wall_s"] > 0
            assert all(len(d) == 16 for d in r["diffs"][1:] if d is not None)
        window = result["policies"][policy]["windows"][0]
        assert (window["first"], window["last"], window["seeds"]) == (1, 8, 2)
        assert window["mean_reward"] == pytest.approx(statistics.fmean(statistics.fmean(r["rewards"][1:]) for r in runs))
        assert 1 <= window["distinct_diffs"] <= 8
    assert result["reference_random_final"] == statistics.median(r["best"][-1] for r in result["runs"]["random"])
    research_bench.plot(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the snapshot script reads the same figures back from the kept repos' notes
    script = Path(__file__).parents[1] / "benchmarks" / "research_snapshot.py"
    subprocess.run([sys.executable, str(script), str(loops), str(tmp_path / "snap.json")], check=True,
                   capture_output=True)
    snap = json.loads((tmp_path / "snap.json").read_text())["loops"]
    assert snap.keys() == {f"{p}-seed{s}" for p in ("random", "optuna-tpe") for s in (0, 1)}
    for policy, runs in result["runs"].items():
        for r in runs:
            got = snap[f"{policy}-seed{r['seed']}"]
            assert got["experiments"] == 8 and got["best_final"] == r["best"][-1]
            assert got["windows"][0]["mean_reward"] == pytest.approx(statistics.fmean(r["rewards"][1:]))
            # every keep but the last experiment's is followed by one; no search here repeats a step
            assert got["repeats"] == {"after_keep": r["statuses"][1:-1].count("keep"), "repeated": 0}
    # the move sizes, read off the commits: random search multiplies by factors in [1/3, 3]
    # (an int rounded to its alignment or divisor may land just beyond)
    moves = snap["random-seed0"]["moves"][0]
    assert 0 < moves["median_abs_log"] <= math.log(3) and moves["beyond_factor_3"] <= 0.25
    # the most-moved constant per window, read off the commits' values, agrees with the diffs'
    # assignments (ADAM_BETAS[0] is a line ADAM_BETAS = ...)
    for name, got in snap.items():
        store = Store(loops / name)
        moved = [constants_assigned(store.diff_of(e.commit)) for e in store.experiments()
                 if e.number > 0 and e.record["status"] != "invalid"]
        moved = [m for m in moved if m]
        top = got["top_constant"][0]
        assert top["share"] * len(moved) == pytest.approx(sum(top["name"].split("[")[0] in m for m in moved), abs=0.01)
        assert top["share"] * len(moved) == pytest.approx(max(sum(n in m for m in moved) for n in set().union(*moved)), abs=0.01)


def test_first_seed_adds_seeds_without_repeating_an_earlier_runs_loops(tmp_path):
    loops = tmp_path / "loops"
    result = research_bench.bench_research(["random"], experiments=2, seeds=2, parallel=2, workdir=loops,
                                           first_seed=3)
    assert sorted(p.name for p in loops.iterdir()) == ["random-seed3", "random-seed4"]
    assert sorted(r["seed"] for r in result["runs"]["random"]) == [3, 4] and result["first_seed"] == 3
    # each loop ran with its own seed: the random policy's proposals differ between them
    diffs = {repo.name: [e.record.get("diff_sha") for e in Store(repo).experiments() if e.record.get("diff_sha")]
             for repo in loops.iterdir()}
    assert diffs["random-seed3"] != diffs["random-seed4"] and all(len(d) == 2 for d in diffs.values())


def test_the_policies_search_every_constant_the_surrogate_reads():
    """The gym's train.py reads its constants through globals(); a constant it also used only
    in a print would look like bookkeeping to the policies and never be searched."""
    from gitresearch.config import load
    from gitresearch.policies.constants import find_sites

    config = load(GYM)
    model = json.loads((GYM / "surrogate.json").read_text())
    searched = [s.name for s in find_sites((GYM / "train.py").read_text(), config.policy.skip_constants, cuda=False)]
    assert searched == [f["name"] for f in model["features"]]


def test_parallel_loops_share_the_cores_unless_the_caller_set_the_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert [research_bench.loop_env(n)["OMP_NUM_THREADS"] for n in (1, 3, 8, 16)] == ["8", "2", "1", "1"]
    assert research_bench.loop_env(3)["MKL_NUM_THREADS"] == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert research_bench.loop_env(3)["OMP_NUM_THREADS"] == "5"


def test_bench_research_passes_a_local_model_as_an_absolute_path(tmp_path, monkeypatch):
    """Each loop runs in its own repo, so a --model relative to where the bench started would
    name nothing there (the loop then asks the hub for it)."""
    from click.testing import CliRunner
    from gitresearch.cli import main

    seen = {}

    def fake_bench(names, experiments, seeds, parallel, target, workdir, progress, model_args, settings, first_seed):
        seen["model_args"] = model_args
        return {"policies": {}, "runs": {}}

    monkeypatch.setattr(research_bench, "bench_research", fake_bench)
    monkeypatch.setattr("gitresearch.report.print_research", lambda result, console: None)
    (tmp_path / "lm").mkdir()
    monkeypatch.chdir(tmp_path)
    for model, passed in (("lm", str(tmp_path / "lm")), ("org/hub-model", "org/hub-model")):
        result = CliRunner().invoke(main, ["bench", "research", "--policies", "rl", "--model", model, "--seeds", "1"])
        assert result.exit_code == 0, result.output
        assert seen["model_args"] == ["--model", passed]


def test_the_headroom_benchmark_reads_the_gyms_own_prediction(tmp_path):
    """benchmarks/gym_headroom.py judges its arms by the surrogate's true mean, read through
    the policies' constant finder: it must equal what the gym's own train.py predicts for the
    same file, moved or not, and a file the real target cannot build must crash."""
    from helpers import benchmark_module

    headroom = benchmark_module("gym_headroom")
    surrogate = headroom.Surrogate()
    model = json.loads((GYM / "surrogate.json").read_text())
    for constants in ({}, {"DEPTH": 2, "MATRIX_LR": 0.02, "ADAM_BETAS": (0.7, 0.99)}, {"WIDTH": 256, "HEAD_DIM": 32}):
        work = gym_copy(tmp_path / str(len(constants)) / "x", **constants)
        spec = importlib.util.spec_from_file_location("moved_train", work / "train.py")
        gym = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gym)
        x = gym.features(model, gym.constants())
        predicted = {}
        for gp in model["gps"]:
            predicted.update(zip(gp["outputs"], gym.gp_mean(gp, x)))
        assert surrogate((work / "train.py").read_text()) == pytest.approx(predicted["final"], abs=1e-12)
    assert surrogate((gym_copy(tmp_path / "bad", WIDTH=100) / "train.py").read_text()) is None


def test_the_teachers_rules_run_in_a_real_loop(tmp_path):
    """[policy] random_momentum 1 and random_min_factor 1.5 in a real gym loop: each experiment
    right after a keep repeats the keep's steps (as steps_of states them from the keep's
    parent) on the same constants the same way, no other experiment is a repeat, and every
    fresh move of a float is at least x1.5."""
    from gitresearch.policies import InvalidReply
    from gitresearch.policies.constants import find_sites
    from gitresearch.policies.moves import AGAIN, moved, steps_of
    repo = tmp_path / "repo"
    cli("init", "--template", "gym", str(repo), cwd=tmp_path)
    cli("loop", "--policy", "random", "--seed", "3", "--max-experiments", "24", "--set", "policy.random_momentum=1",
        "--set", "policy.random_min_factor=1.5", cwd=repo)
    store = Store(repo)
    experiments = list(reversed(store.experiments()))
    sites_at = lambda commit: {"train.py": find_sites(store.read_file(commit, "train.py"))}  # noqa: E731
    repeats = 0
    for before, after in zip(experiments[1:], experiments[2:]):
        data = after.record.get("policy_data") or {}
        if before.record["status"] != "keep":
            assert "again" not in data
            for change in data.get("changes", []):
                old, new = change["old"], change["new"]
                if isinstance(old, float) and old > 0 and not 0 < old < 1:
                    assert abs(math.log(new / old)) >= math.log(1.5) - 2e-3, change
            continue
        kept = steps_of(before.record["description"], sites_at(store.parent_of(before.commit)))
        if "again" not in data:  # the fallback: here the kept steps change nothing (DEPTH 1 -2 stays 1)
            with pytest.raises(InvalidReply, match="leave every value where it was"):
                moved(AGAIN, {"train.py": store.read_file(before.commit, "train.py")}, sites_at(before.commit), kept)
            continue
        assert data["again"] == kept
        # the same constants, each the same way (a step may shrink at a bound: DEPTH 2 -2 stays 1)
        direction = lambda changes: {c["name"]: c["new"] > c["old"] for c in changes}  # noqa: E731
        assert direction(data["changes"]) == direction(before.record["policy_data"]["changes"])
        repeats += 1
    assert repeats >= 2
