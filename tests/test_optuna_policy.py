"""The optuna policy: the study rebuilt from the notes, invalid suggestions not asked again,
a loop end to end and resumed from git alone."""
import difflib
import math
from dataclasses import replace

import pytest
from optuna.trial import TrialState

from gitresearch.config import Config, PolicyConfig
from gitresearch.gitstore import Experiment
from gitresearch.policies import PolicyError, State
from gitresearch.policies.constants import find_sites, rewrite
from gitresearch.policies.optuna_search import OptunaSearch, dimension_for
from gitresearch.policies.random_search import RandomSearch
from helpers import cli, make_repo

SOURCE = '''import torch
CUDA = torch.cuda.is_available()
LR = 0.01  # optimum 0.003
WIDTH = 64 if CUDA else 32  # optimum 96 (the CPU branch is searched, within x/÷4)
BETA = 0.9  # optimum 0.97
USE_NORM = False  # optimum True
STEPS_PER_LOG = 0.0  # a zero: left fixed
'''


def objective(source: str) -> float:
    v = {s.name: s.value for s in find_sites(source)}
    return ((math.log10(v["LR"]) - math.log10(0.003)) ** 2 + (math.log2(v["WIDTH"]) - math.log2(96)) ** 2 / 4
            + (v["BETA"] - 0.97) ** 2 * 20 + (0.0 if v["USE_NORM"] else 0.2))


class NotesStore:
    """The store's reading side over a list of notes, and a loop that keeps improvements."""

    def __init__(self, source, baseline_value=None, target=None):
        self.sources = {"c0": source}
        self.target = target or objective
        value = self.target(source) if baseline_value is None else baseline_value
        self.exps = [Experiment(0, "c0", None, "baseline", {"status": "baseline", "val_bpb": value})]
        self.best = "c0"

    def experiments(self):
        return list(reversed(self.exps))

    def experiment_commit(self, number):
        return self.exps[number].commit

    def read_file(self, commit, path):
        return self.sources[commit]

    def make_diff(self, path, old, new):
        self.last_new = new  # what the proposal's diff makes of the file
        return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), path, path))

    def run(self, policy, state_config):
        state = State(self.best, {"train.py": self.sources[self.best]}, [], [], state_config)
        proposal = policy.propose(state)
        commit = f"c{len(self.exps)}"
        self.sources[commit] = self.last_new
        value = self.target(self.last_new)
        best_value = self.target(self.sources[self.best])
        status = "keep" if value < best_value else "discard"
        self.exps.append(Experiment(len(self.exps), commit, self.best, proposal.description,
                                    {"status": status, "val_bpb": value, "policy_data": proposal.data}))
        if status == "keep":
            self.best = commit
        return value


def test_the_study_is_rebuilt_from_the_notes():
    store = NotesStore(SOURCE)
    policy = OptunaSearch(Config(policy=PolicyConfig(seed=0)), store, cuda=False)
    keys = ["train.py:LR", "train.py:WIDTH", "train.py:BETA", "train.py:USE_NORM"]
    assert sorted(policy.search_space(["train.py"])) == sorted(keys)  # STEPS_PER_LOG 0.0: fixed
    params = [{"train.py:LR": 0.005 * i, "train.py:WIDTH": 16 * i, "train.py:BETA": 0.8,
               "train.py:USE_NORM": bool(i % 2)} for i in range(1, 6)]
    checks = [{"t": 1.0, "value": 3.1, "decision": "continue"}, {"t": 2.0, "value": 2.9, "decision": "stop"}]
    records = [{"status": "keep", "val_bpb": 1.5}, {"status": "early_stop", "checks": checks},
               {"status": "crash"}, {"status": "invalid"}, {"status": "confirming"}]
    for i, (p, record) in enumerate(zip(params, records), start=1):
        store.exps.append(Experiment(i, f"c{i}", "c0", "x", {**record, "policy_data": {"params": p}}))
    # made by another policy, and still training (no note): their values are read from their files
    store.sources["c6"] = SOURCE.replace("LR = 0.01", "LR = 0.004")
    store.sources["c7"] = SOURCE.replace("BETA = 0.9", "BETA = 0.95")
    store.exps.append(Experiment(6, "c6", "c0", "by another policy", {"status": "keep", "val_bpb": 1.0}))
    store.exps.append(Experiment(7, "c7", "c0", "in flight", None))
    study, invalid = policy.study(["train.py"])
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED,
                                         TrialState.FAIL, TrialState.FAIL, TrialState.RUNNING,
                                         TrialState.COMPLETE, TrialState.RUNNING]
    assert policy.file_params(trials[6])["train.py:LR"] == 0.004 and trials[6].value == 1.0
    assert policy.file_params(trials[7])["train.py:BETA"] == 0.95  # TPE's constant liar counts it as running
    assert policy.file_params(trials[0]) == {"train.py:LR": 0.01, "train.py:WIDTH": 32, "train.py:BETA": 0.9,
                                "train.py:USE_NORM": False}  # the baseline's values
    assert [policy.file_params(t) for t in trials[1:6]] == params and trials[1].value == 1.5
    assert trials[2].intermediate_values == {0: 3.1, 1: 2.9} and invalid == [params[3]]


def test_a_share_is_searched_on_its_log_odds_and_written_back_as_a_share():
    beta = dimension_for(0.9)
    assert beta.logit and math.isclose(beta.dist.low, math.log(0.9)) and math.isclose(beta.dist.high, math.log(90))
    assert beta.from_search(beta.to_search(0.97)) == 0.97 and beta.to_file(beta.to_search(0.97)) == 0.97
    assert beta.to_file(beta.dist.high + 1) == 90 / 91  # clamped into the bounds
    assert dimension_for(0.999).to_file(math.log(0.99987 / 0.00013)) == 1 - 0.00013  # 4 digits of 1 - share
    assert not beta.inside(1.0) and not beta.inside(0.3) and beta.inside(0.95)
    linear = dimension_for(0.9, {"low": 0.5, "high": 0.99, "log": False})  # asked for: linear
    assert not linear.logit and (linear.dist.low, linear.dist.high) == (0.5, 0.99)
    assert not dimension_for(3.0).logit and dimension_for(3.0).dist.log  # above 1: log scale (a small share's log-odds is nearly its log)


# A second target, written after the samplers' settings were frozen on the first (SOURCE):
# other constants, other optima, another share near 1.
SOURCE_2 = '''import torch
CUDA = torch.cuda.is_available()
DROPOUT = 0.1  # optimum 0.02
WEIGHT_DECAY = 0.1  # optimum 0.03
HIDDEN = 256 if CUDA else 128  # optimum 200
WARMUP = 100  # optimum 40
MOMENTUM = 0.95  # optimum 0.9
EPS = 1e-8  # does not matter
'''


def objective_2(source: str) -> float:
    v = {s.name: s.value for s in find_sites(source)}
    return ((math.log10(v["DROPOUT"] / 0.02)) ** 2 / 2 + math.log10(v["WEIGHT_DECAY"] / 0.03) ** 2
            + math.log2(v["HIDDEN"] / 200) ** 2 / 3 + math.log2(v["WARMUP"] / 40) ** 2 / 5
            + math.log((1 - v["MOMENTUM"]) / 0.1) ** 2 / 3)


def best_after(policy_name: str, seed: int, experiments: int, source=SOURCE, target=objective,
               config: Config | None = None) -> float:
    """The best value a policy reaches on a deterministic target in N experiments (the loop
    keeps strict improvements); the baseline's value counts."""
    config = config or Config()
    store, config = NotesStore(source, target=target), replace(config, policy=replace(config.policy, seed=seed))
    policy = (RandomSearch(config, store, cuda=False) if policy_name == "random"
              else OptunaSearch(config, store, sampler=policy_name, cuda=False))
    return min([target(source)] + [store.run(policy, config) for _ in range(experiments)])


@pytest.mark.parametrize("source,target", [(SOURCE, objective), (SOURCE_2, objective_2)], ids=["target1", "target2"])
def test_tpe_gets_closer_to_the_optimum_than_random_search(source, target):
    """Same number of experiments, 5 seeds: TPE's mean best is below the random policy's."""
    tpe = [best_after("tpe", seed, 30, source, target) for seed in range(5)]
    random_search = [best_after("random", seed, 30, source, target) for seed in range(5)]
    assert sum(tpe) / 5 < sum(random_search) / 5, (tpe, random_search)
    assert min(tpe) < target(source) / 10  # and it got near the optimum (0), not merely moved


def test_cmaes_state_is_rebuilt_from_the_notes_generation_by_generation():
    store, config = NotesStore(SOURCE), Config(policy=PolicyConfig(seed=3))
    policy = OptunaSearch(config, store, sampler="cmaes", cuda=False)
    for _ in range(16):
        store.run(policy, config)
    generations = [e.record["policy_data"]["generation"] for e in store.exps[1:]]
    population = 4 + int(3 * math.log(3))  # three numeric constants (the bool is drawn at random)
    # a generation is told once `population` of its experiments are done: each proposal here
    # finishes before the next, so generation g holds experiments g*pop .. (g+1)*pop - 1
    assert generations == [i // population for i in range(16)]
    # a fresh process (kill -9, another machine) rebuilds the same state: the same next point
    again = OptunaSearch(config, store, sampler="cmaes", cuda=False)
    state = State(store.best, {"train.py": store.sources[store.best]}, [], [], config)
    assert again.propose(state).data == policy.propose(state).data
    assert again.propose(state).data["generation"] == 2


def test_qmc_continues_its_sequence_where_the_notes_left_it():
    store, config = NotesStore(SOURCE), Config(policy=PolicyConfig(seed=5))
    for _ in range(4):  # a new policy object each time: nothing but the notes carries over
        store.run(OptunaSearch(config, store, sampler="qmc", cuda=False), config)
    data = [e.record["policy_data"] for e in store.exps[1:]]
    assert [d["qmc_index"] for d in data] == [0, 1, 2, 3]
    assert len({tuple(sorted(d["params"].items())) for d in data}) == 4  # four distinct points


def test_an_invalid_suggestion_is_never_asked_again():
    source = "FLAG = False\nprint(FLAG and 1)\nrun(FLAG)\n"
    store = NotesStore(source, baseline_value=1.0)
    store.exps.append(Experiment(1, "c1", "c0", "x", {"status": "invalid",
                                                      "policy_data": {"params": {"train.py:FLAG": True}}}))
    policy = OptunaSearch(Config(policy=PolicyConfig(seed=0)), store, cuda=False)
    with pytest.raises(PolicyError, match="no new suggestion"):
        policy.propose(State("c0", {"train.py": source}, [], [], Config()))


@pytest.mark.parametrize("sampler", ["tpe", "gp", "cmaes", "qmc"])
def test_optuna_loop_end_to_end_and_resumed_from_git_alone(tmp_path, sampler):
    repo = make_repo(tmp_path / "repo")
    cli("init", cwd=repo)
    cli("loop", "--policy", "optuna", "--sampler", sampler, "--seed", "1", "--max-experiments", "3",
        "--no-early-stop", cwd=repo)
    from gitresearch.config import load
    from gitresearch.gitstore import Store

    store = Store(repo)
    notes = [e.record for e in reversed(store.experiments()) if e.number > 0]
    assert len(notes) == 3 and all(n["policy_data"]["sampler"] == sampler for n in notes)
    # a new process (as after kill -9) rebuilds the same trials from the notes alone
    resumed = OptunaSearch(load(repo), store, cuda=False)
    study, _ = resumed.study(["train.py"])
    trials = study.get_trials(deepcopy=False)[1:]
    assert [resumed.file_params(t) for t in trials] == [n["policy_data"]["params"] for n in notes]
    assert [t.value for t in trials] == [n.get("val_bpb") for n in notes]
    assert "train.py:STEP_S" not in trials[0].params  # 0.0: no scale, left alone


def test_the_search_table_sets_bounds_log_step_and_fixed(tmp_path):
    from gitresearch.config import ConfigError, load

    (tmp_path / "gitresearch.toml").write_text(
        '[search]\nLR = {low = 0.0001, high = 0.1, log = true}\n"train.py:WIDTH" = {low = 16, high = 128, step = 16}\n'
        'BETA = {fixed = true}\nSTEPS_PER_LOG = {low = 0.0, high = 5.0}\n')
    config = load(tmp_path)
    policy = OptunaSearch(config, NotesStore(SOURCE), cuda=False)
    space = {key: dim.dist for key, dim in policy.search_space(["train.py"]).items()}
    assert (space["train.py:LR"].low, space["train.py:LR"].high, space["train.py:LR"].log) == (0.0001, 0.1, True)
    assert (space["train.py:WIDTH"].low, space["train.py:WIDTH"].high, space["train.py:WIDTH"].step) == (16, 128, 16)
    assert "train.py:BETA" not in space  # fixed
    assert (space["train.py:STEPS_PER_LOG"].low, space["train.py:STEPS_PER_LOG"].high) == (0.0, 5.0)  # a zero, given bounds
    proposal = policy.propose(State("c0", {"train.py": SOURCE}, [], [], config))
    assert proposal.data["params"]["train.py:WIDTH"] % 16 == 0 and "train.py:BETA" not in proposal.data["params"]
    for bad, message in [("LR = 3", "expected a table"), ("LR = {low = 1, hi = 2}", "unknown key"),
                         ("LR = {low = 2, high = 1}", "not below high"), ("LR = {log = 1}", "expected bool")]:
        (tmp_path / "gitresearch.toml").write_text(f"[search]\n{bad}\n")
        with pytest.raises(ConfigError, match=message):
            load(tmp_path)


def test_kill_9_mid_experiment_then_resume_the_study_is_what_git_holds(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from gitresearch.config import load
    from gitresearch.gitstore import Store
    from helpers import sh

    repo = make_repo(tmp_path / "repo", config="[search]\nSTEP_S = {fixed = true}\n")
    (repo / "train.py").write_text((repo / "train.py").read_text().replace("STEP_S = 0.0", "STEP_S = 0.1"))
    sh("git", "commit", "-qam", "slow steps", cwd=repo)
    cli("init", cwd=repo)
    args = ["loop", "--policy", "optuna", "--seed", "2", "--max-experiments", "3", "--no-early-stop"]
    proc = subprocess.Popen([sys.executable, "-m", "gitresearch", *args], cwd=repo,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = Store(repo).state_dir / "runs" / "000002" / "log.txt"
    deadline = time.monotonic() + 120
    while not log.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)  # inside experiment 2: its proposal's data was in memory only
    proc.wait()
    cli(*args, cwd=repo)
    store = Store(repo)
    policy = OptunaSearch(load(repo), store, cuda=False)
    study, _ = policy.study(["train.py"])
    experiments = [e for e in reversed(store.experiments()) if e.number > 0]
    assert len(experiments) == 3 and all(e.record for e in experiments)
    trials = study.get_trials(deepcopy=False)[1:]
    # every trial is what git holds: the values in the experiment's train.py, its note's result
    assert [policy.file_params(t) for t in trials] == [policy.read_params(e.commit) for e in experiments]
    assert [t.value for t in trials] == [e.record.get("val_bpb") for e in experiments]
