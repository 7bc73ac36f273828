"""`gitresearch loop --policy rl` end to end: a tiny random LM proposes, PPO updates happen,
notes carry rewards and policy versions, a later loop resumes the learner's state, a
second loop on the same repo and seed learns the same adapters, and a loop in another repo
starts from the first one's learner."""
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from gitresearch.config import load
from gitresearch.gitstore import Store
from gitresearch.policies import InvalidReply, State
from gitresearch.policies.ppo import Episode
from gitresearch.policies.prompt import shown_sites
from gitresearch.policies.rl import RLPolicy
from helpers import cli, make_repo
from tiny_lm import tiny_model

RL_CONFIG = ('[policy]\nmax_tries = 2\n[llm]\nmax_tokens = 16\ncontext_tokens = 4096\ntemperature = 1.0\n'
             '[rl]\nupdate_every = 2\nppo_epochs = 1\nlora_r = 4\nlora_alpha = 8.0\nseed = 7\n')


def test_rl_loop_updates_records_and_resumes(tmp_path):
    model = tiny_model(tmp_path / "model")
    repo = make_repo(tmp_path / "repo", config=RL_CONFIG)
    twin = Path(shutil.copytree(repo, tmp_path / "twin"))  # the same baseline commit, for a second run
    third = Path(shutil.copytree(repo, tmp_path / "third"))  # for a loop that starts from this one's learner
    cli("init", cwd=repo)
    out = cli("loop", "--policy", "rl", "--model", str(model), "--max-experiments", "4", cwd=repo).stdout
    assert "stopped: reached 4 experiments" in out
    store = Store(repo)
    records = sorted((e.record for e in store.experiments() if e.number > 0), key=lambda r: r["experiment"])
    assert [r["policy_data"]["policy_version"] for r in records] == [0, 0, 1, 1]
    for record in records:  # a random model writes no valid diff: each try is an episode
        assert record["status"] == "invalid" and record["policy"] == "rl"
        assert record["reward"]["total"] == -12.0 and len(record["attempts"]) == 2
    state = repo / ".git" / "gitresearch" / "rl"
    updates = [json.loads(line) for line in (state / "updates.jsonl").read_text().splitlines()]
    assert [u["version"] for u in updates] == [1, 2] and all(u["episodes"] >= 2 for u in updates)
    assert updates[0]["mean_reward"] == -12.0 and abs(updates[0]["ratio"] - 1.0) < 0.05  # fresh episodes
    counters = json.loads((state / "counters.json").read_text())
    assert {k: counters[k] for k in ("schema", "version", "experiments", "updates")} == {
        "schema": 3, "version": 2, "experiments": 4, "updates": 2}
    assert counters["kl_coef"] == 0.05  # [rl] kl_target 0: fixed
    assert counters["reward_stats"]["count"] == 8 and counters["reward_stats"]["mean"] == -12.0
    # the same loop on the same seed ([rl] seed 7) and repo learns the same adapters: the init is seeded too
    cli("init", cwd=twin)
    cli("loop", "--policy", "rl", "--model", str(model), "--max-experiments", "4", cwd=twin)
    adapter = Path("adapter", "adapter_model.safetensors")
    assert (twin / ".git" / "gitresearch" / "rl" / adapter).read_bytes() == (state / adapter).read_bytes()
    # a new loop resumes the learner: version 2 proposes the next experiment
    cli("loop", "--policy", "rl", "--model", str(model), "--max-experiments", "5", cwd=repo)
    newest = Store(repo).experiments()[0].record
    assert newest["experiment"] == 5 and newest["policy_data"]["policy_version"] == 2
    assert json.loads((state / "counters.json").read_text())["experiments"] == 5
    # a loop in another repo starts from this one's learner ([rl] init_from, from its root): the
    # carried adapters are version 2; its experiments count from its own first
    cli("init", cwd=third)
    cli("loop", "--policy", "rl", "--model", str(model), "--max-experiments", "1",
        "--set", "rl.init_from=../repo/.git/gitresearch/rl", cwd=third)
    assert Store(third).experiments()[0].record["policy_data"]["policy_version"] == 2
    carried = json.loads((third / ".git" / "gitresearch" / "rl" / "counters.json").read_text())
    assert (carried["version"], carried["experiments"]) == (2, 1)


class CountingLearner:
    """The learner's bookkeeping without a model: which experiments an update followed."""
    def __init__(self):
        self.experiments, self.updated_after = 0, []

    def update(self):
        self.updated_after.append(self.experiments)
        return {}

    def save(self, state_dir):
        pass


def test_updates_every_update_every_from_update_after_to_update_until(tmp_path):
    repo = make_repo(tmp_path / "repo", config=RL_CONFIG + "update_after = 5\n")
    config = load(repo)
    assert config.rl.update_after == 5
    learner = CountingLearner()
    policy = RLPolicy(config, Store(repo), learner=learner)
    for number in range(1, 11):
        policy.observe({"experiment": number, "reward": {"total": 1.0}})
    assert learner.updated_after == [6, 8, 10]  # update_every 2, none before 5 experiments
    learner = CountingLearner()
    policy = RLPolicy(replace(config, rl=replace(config.rl, update_after=0)), Store(repo), learner=learner)
    for number in range(1, 5):
        policy.observe({"experiment": number, "reward": {"total": 1.0}})
    assert learner.updated_after == [2, 4]
    learner = CountingLearner()
    policy = RLPolicy(replace(config, rl=replace(config.rl, update_until=8)), Store(repo), learner=learner)
    for number in range(1, 13):
        policy.observe({"experiment": number, "reward": {"total": 1.0}})
    assert learner.updated_after == [6, 8]  # none after 8 experiments: the adapters stay as learned
    assert learner.experiments == 12


class SourceLearner(CountingLearner):
    """Records which distribution each proposal was sampled from, and the sample seeds."""
    version, context_tokens, reply_tokens = 0, 4096, 64

    def __init__(self):
        super().__init__()
        self.sources, self.seeds, self.grammars = [], [], []

    def count_tokens(self, text):
        return len(text) // 4

    def generate(self, messages, seed=None, prior=False, grammar=None):
        self.sources.append(prior)
        self.seeds.append(seed)
        self.grammars.append(grammar)
        return "no diff here", Episode([1], [2], [0.0], [0.0], [0.0], 0, prior=prior, grammar=grammar)

    def add(self, episode, reward, experiment=None):
        pass


def test_prior_share_draws_the_sampler_per_proposal_and_leaves_the_sample_seeds(tmp_path):
    repo = make_repo(tmp_path / "repo", config=RL_CONFIG)
    config = load(repo)
    state = State("0" * 40, {"train.py": "LR = 0.1\n"}, [], [], config)

    def proposals(share):
        learner = SourceLearner()
        policy = RLPolicy(replace(config, rl=replace(config.rl, prior_share=share)), Store(repo), learner=learner)
        flags = []
        for _ in range(200):
            with pytest.raises(InvalidReply) as err:
                policy.propose(state)
            flags.append(err.value.data["sampled_from_prior"])
        assert flags == learner.sources  # the note says which it was
        return learner

    never, always, half = proposals(0.0), proposals(1.0), proposals(0.3)
    assert not any(never.sources) and all(always.sources)
    assert 40 <= sum(half.sources) <= 80  # 60 expected of 200 at 0.3
    assert half.seeds == never.seeds == always.seeds  # the draws do not move the sample seeds
    assert proposals(0.3).sources == half.sources  # seeded by [rl] seed


def test_grammar_samples_under_the_names_of_the_constants_the_prompt_shows(tmp_path):
    repo = make_repo(tmp_path / "repo", config=RL_CONFIG)
    config = load(repo)
    config = replace(config, llm=replace(config.llm, reply="moves", prompt="compact"))
    state = State("0" * 40, {"train.py": "LR = 0.1\nDEPTH = 4\nBETAS = (0.9, 0.95)\n"}, [], [], config)
    for grammar, expected in ((False, None), (True, ["BETAS[0]", "BETAS[1]", "DEPTH", "LR"])):
        learner = SourceLearner()
        policy = RLPolicy(replace(config, rl=replace(config.rl, grammar=grammar)), Store(repo), learner=learner)
        with pytest.raises(InvalidReply):
            policy.propose(state)
        assert learner.grammars == [expected]
    assert sorted(site.name for sites in shown_sites(state).values() for site in sites) == expected
