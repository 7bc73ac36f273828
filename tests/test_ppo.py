"""PPO on LoRA adapters of a tiny random GPT-2 (CPU, no download)."""
import math

import pytest
import torch

from gitresearch.config import LLMConfig, RLConfig
from gitresearch.policies.base import PolicyError
from gitresearch.policies.ppo import PPOLearner
from gitresearch.policies.ppo_terms import KL_K3_MAX, decision_mask, kl_k3
from tiny_lm import tiny_char_model, tiny_model

MESSAGES = [{"role": "system", "content": "Propose a change."}, {"role": "user", "content": "LR = 0.1"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(tiny_model(tmp_path_factory.mktemp("tiny") / "model", positions=256))


def learner(model, state_dir=None, seed=None, init_from=None, **rl):
    settings = dict(lora_r=8, lora_alpha=16.0, learning_rate=1e-2, ppo_epochs=2, update_every=1,
                    target_modules=("c_attn", "c_proj", "c_fc"))
    settings.update(rl)
    return PPOLearner(model, RLConfig(**settings), LLMConfig(max_tokens=12, temperature=1.0, device="cpu"),
                      state_dir, seed=seed, init_from=init_from)


def test_before_any_update_ratio_is_one_and_kl_is_zero(model):
    ppo = learner(model)
    _, episode = ppo.generate(MESSAGES, seed=1)
    with torch.no_grad():
        logp, _, _ = ppo.score([episode])
    assert torch.equal(logp[0], torch.tensor(episode.logprobs))  # ratio exactly 1
    assert torch.exp(logp[0] - torch.tensor(episode.logprobs)).eq(1).all()
    assert episode.logprobs == episode.ref_logprobs  # KL to the reference exactly 0
    assert episode.values == [0.0] * len(episode.response_ids)


def test_left_padding_with_position_ids_matches_unpadded(model):
    ppo = learner(model)
    short = ppo.generate(MESSAGES[:1], seed=2)[1]
    long = ppo.generate(MESSAGES, seed=3)[1]
    with torch.no_grad():
        batched, _, _ = ppo.score([short, long])
        alone, _, _ = ppo.score([short])
    assert len(short.prompt_ids) < len(long.prompt_ids)
    assert torch.allclose(batched[0], alone[0], atol=1e-5)


@pytest.mark.parametrize("reward, direction", [(1.0, 1), (-1.0, -1)])
def test_update_moves_the_log_prob_with_the_reward(model, reward, direction):
    ppo = learner(model, ppo_epochs=1)
    _, episode = ppo.generate(MESSAGES, seed=4)
    before = sum(episode.logprobs)
    ppo.add(episode, reward)
    stats = ppo.update()
    assert stats["version"] == 1 and stats["ratio"] == pytest.approx(1.0) and stats["kl"] == 0.0
    with torch.no_grad():
        after = float(ppo.score([episode])[0][0].sum())
    assert (after - before) * direction > 0.05


def test_one_seed_gives_the_same_init_and_updates_whatever_the_global_generator(model):
    """LoRA's A matrices are drawn at random (B starts at zero, so no sample shows them until
    an update): with one seed two learners agree through their updates and the samples after
    them, even where torch's global generator stood elsewhere when each was built."""
    runs = []
    for global_state in (1, 2):
        torch.manual_seed(global_state)  # what other code left in the global generator
        ppo = learner(model, seed=11)
        for i, reward in enumerate((1.0, -1.0, 0.5)):
            ppo.add(ppo.generate(MESSAGES, seed=i)[1], reward)
        ppo.update()
        ppo.add(ppo.generate(MESSAGES, seed=5)[1], 2.0)
        ppo.update()
        runs.append((ppo, ppo.generate(MESSAGES, seed=6)[1]))
    (first, after_first), (second, after_second) = runs
    trained = dict(first.model.named_parameters())
    assert all(torch.equal(trained[name], p) for name, p in second.model.named_parameters() if p.requires_grad)
    assert any("lora_B" in name and p.abs().sum() > 0 for name, p in second.model.named_parameters())  # it learned
    assert after_first.response_ids == after_second.response_ids and after_first.logprobs == after_second.logprobs
    other = learner(model, seed=12)
    a_matrices = [(name, p) for name, p in other.model.named_parameters() if "lora_A" in name]
    fresh = dict(learner(model, seed=11).model.named_parameters())
    assert any(not torch.equal(p, fresh[name]) for name, p in a_matrices)


def first_digit_reward(text: str) -> float:
    """The toy environment: the reply continues "LR = 0." and the reward is the digit it
    writes, / 9 (the constant moved in the good direction); no digit first, no reward."""
    return int(text[0]) / 9 if text[:1].isdigit() else 0.0


def test_learning_on_a_toy_environment(tmp_path):
    # logits of a random GPT-2 at the usual init (std 0.02) barely vary across tokens; a
    # wider init gives the tiny policy a real-model-like range to learn in
    model = str(tiny_char_model(tmp_path / "char", init=0.2))
    gains = []
    for init in range(3):  # the LoRA init draws from torch's global generator: seeded, 3 of them
        torch.manual_seed(init)
        # no recomputation in the backward pass: the same gradients (dropout is off), a quarter
        # less time on a model this small; the other tests here keep the default
        ppo = PPOLearner(model, RLConfig(lora_r=8, lora_alpha=16.0, learning_rate=1e-2, gradient_checkpointing=False,
                                         target_modules=("c_attn", "c_proj", "c_fc"), replay_size=8),
                         LLMConfig(max_tokens=4, temperature=1.0, device="cpu"))
        rewards = []
        for i in range(80):
            text, episode = ppo.generate([{"role": "user", "content": "LR = 0."}], seed=100 + 1000 * init + i)
            rewards.append(first_digit_reward(text))
            ppo.add(episode, rewards[-1])
            if (i + 1) % 4 == 0:
                ppo.update()
        first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
        print(f"toy learning curve, init {init}: first 20 episodes mean reward {first:.3f}, last 20 {last:.3f}")
        gains.append(last - first)
        assert ppo.version == 20
    assert sum(gains) / 3 > 0.1 and min(gains) > 0


def test_save_and_load_give_identical_outputs(model, tmp_path):
    ppo = learner(model, state_dir=tmp_path / "rl")
    for seed in (5, 6):
        _, episode = ppo.generate(MESSAGES, seed=seed)
        ppo.add(episode, 1.0 if seed == 5 else -1.0)
    ppo.update()  # saves
    assert sorted(p.name for p in (tmp_path / "rl").iterdir()) == [
        "adapter", "counters.json", "episodes.jsonl", "optimizer.pt", "value_head.pt"]
    again = learner(model, state_dir=tmp_path / "rl")
    assert (again.version, again.updates, len(again.episodes)) == (1, 1, 2)
    one, ep1 = ppo.generate(MESSAGES, seed=7)
    two, ep2 = again.generate(MESSAGES, seed=7)
    assert one == two and ep1.response_ids == ep2.response_ids and ep1.logprobs == ep2.logprobs
    assert ep1.values == ep2.values and ep1.values != [0.0] * len(ep1.values)  # the value head too
    state1, state2 = ppo.optimizer.state_dict()["state"], again.optimizer.state_dict()["state"]
    assert all(torch.equal(state1[k]["exp_avg"], state2[k]["exp_avg"]) for k in state1)


def test_a_learner_started_from_another_loops_state_carries_its_weights_not_its_episodes(model, tmp_path):
    first = learner(model, state_dir=tmp_path / "first", seed=1)
    for seed in (5, 6):
        _, episode = first.generate(MESSAGES, seed=seed)
        first.add(episode, 1.0 if seed == 5 else -1.0)
    first.experiments = 7
    first.update()  # saves
    started = PPOLearner(model, first.rl, first.llm, tmp_path / "second", seed=2, init_from=tmp_path / "first")
    assert (started.version, started.updates, started.experiments, started.episodes) == (1, 1, 0, [])
    assert started.reward_stats == first.reward_stats and started.kl_coef == first.kl_coef
    one, ep1 = first.generate(MESSAGES, seed=7)
    two, ep2 = started.generate(MESSAGES, seed=7)  # another seed's init, overwritten by the carried adapters
    assert one == two and ep1.logprobs == ep2.logprobs and ep1.logprobs != ep1.ref_logprobs
    assert ep1.values == ep2.values and ep1.values != [0.0] * len(ep1.values)
    assert same_state(first.optimizer.state_dict(), started.optimizer.state_dict())
    started.experiments = 3
    started.save()
    again = PPOLearner(model, first.rl, first.llm, tmp_path / "second", init_from=tmp_path / "first")
    assert again.experiments == 3  # its own saved state wins over init_from: a restart resumes


def test_init_from_a_folder_without_a_learner_or_with_another_shape_is_refused(model, tmp_path):
    with pytest.raises(PolicyError, match="no saved learner there"):
        PPOLearner(model, RLConfig(target_modules=("c_attn",)), LLMConfig(device="cpu"), None, init_from=tmp_path)
    learner(model, state_dir=tmp_path / "rank8").save()
    with pytest.raises(PolicyError, match="do not fit this model"):
        learner(model, init_from=tmp_path / "rank8", lora_r=4)
    with pytest.raises(PolicyError, match="do not fit this model"):  # layers this learner does not adapt
        learner(model, init_from=tmp_path / "rank8", target_modules=("c_attn",))
    learner(model, state_dir=tmp_path / "attention", target_modules=("c_attn",)).save()
    with pytest.raises(PolicyError, match="do not fit this model"):  # layers that would stay at their init
        learner(model, init_from=tmp_path / "attention")


class Payload:
    """Unpickling this would run code: torch.load must refuse it (weights_only=True)."""

    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['PWNED']).write_text('ran')",))


def test_saved_state_is_loaded_without_unpickling_code(model, tmp_path, monkeypatch):
    ppo = learner(model, state_dir=tmp_path / "rl")
    _, episode = ppo.generate(MESSAGES, seed=5)
    ppo.add(episode, 1.0)
    ppo.update()  # saves
    monkeypatch.setenv("PWNED", str(tmp_path / "pwned"))
    torch.save({"weight": Payload()}, tmp_path / "rl" / "value_head.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        learner(model, state_dir=tmp_path / "rl")
    assert not (tmp_path / "pwned").exists()


def full_scoring(ppo, episodes):
    """The reference: full-vocabulary logits over every position, then the replies' slice."""
    seqs = [e.prompt_ids + e.response_ids for e in episodes]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), ppo.pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):], mask[i, width - len(s):] = torch.tensor(s), 1
    out = ppo.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    output_hidden_states=True)
    logp_all = torch.log_softmax(out.logits[:, :-1].float() / ppo.temperature, dim=-1)
    token = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    values = ppo.value_head(out.hidden_states[-1][:, :-1].float()).squeeze(-1)
    n = [len(e.response_ids) for e in episodes]
    return ([token[i, -k:] for i, k in enumerate(n)], [values[i, -k:] for i, k in enumerate(n)],
            [entropy[i, -k:] for i, k in enumerate(n)])


def test_reply_only_scoring_equals_full_scoring(model):
    ppo = learner(model, logit_chunk=3)  # chunks smaller than a reply: the seams are exercised
    torch.nn.init.normal_(ppo.value_head.weight)  # values that are not all zero
    episodes = [ppo.generate(MESSAGES[:1], seed=2)[1], ppo.generate(MESSAGES, seed=3)[1]]
    assert len({len(e.prompt_ids) for e in episodes}) == 2  # left padding in play
    with torch.no_grad():
        fast, full = ppo.score(episodes), full_scoring(ppo, episodes)
    for got, want in zip(fast, full):
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.allclose(g, w, atol=1e-5)
    # the gradients agree as well (the chunks are recomputed in the backward pass)
    grads = []
    for scorer in (ppo.score, lambda eps: full_scoring(ppo, eps)):
        ppo.model.zero_grad()
        logps, vals, ents = scorer(episodes)
        (sum(l.sum() for l in logps) + sum(e.sum() for e in ents)).backward()
        grads.append([p.grad.clone() for p in ppo.model.parameters() if p.requires_grad])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads))


def test_out_of_memory_halves_the_micro_batch_then_skips_with_a_reason(model, tmp_path):
    ppo = learner(model, tmp_path / "state", minibatch_size=4, ppo_epochs=1)
    for seed in range(4):
        _, episode = ppo.generate(MESSAGES, seed=seed)
        ppo.add(episode, 1.0 if seed % 2 else -1.0)
    real_score, calls = ppo.score, []

    def score_with_little_memory(episodes):  # as a GPU would: more than one episode does not fit
        calls.append(len(episodes))
        if len(episodes) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return real_score(episodes)

    ppo.score = score_with_little_memory
    stats = ppo.update()
    assert calls[:3] == [4, 2, 1] and stats["micro_batch"] == 1 and stats["version"] == 1
    assert "skipped" not in stats and ppo.version == 1

    def no_memory(episodes):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    ppo.score = no_memory
    before = [p.detach().clone() for p in ppo.model.parameters() if p.requires_grad]
    stats = ppo.update()
    assert stats["skipped"].startswith("out of memory at a micro-batch of one episode: CUDA out of memory")
    assert ppo.version == 1 and ppo.updates == 1  # no update happened, none is counted
    after = [p.detach() for p in ppo.model.parameters() if p.requires_grad]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    saved = PPOLearner(model, ppo.rl, ppo.llm, tmp_path / "state")  # the state on disk is whole
    assert len(saved.episodes) == 4 and saved.version == 1


def test_the_sampled_distribution_is_the_scored_one_despite_the_models_generation_config(tmp_path):
    """A model whose generation_config.json sets a repetition penalty, top-k and top-p (as an
    instruct model's does): the log-probs of the tokens actually drawn, from generate's own
    processed scores, equal the stored behaviour log-probs and a re-scoring at version 0."""
    import transformers

    path = tiny_model(tmp_path / "model", positions=256)
    transformers.GenerationConfig(repetition_penalty=1.8, top_k=5, top_p=0.5, temperature=0.3,
                                  do_sample=True).save_pretrained(path)
    ppo = learner(str(path))
    assert ppo.model.generation_config.repetition_penalty == 1.8  # the model's own config is there
    prompt_ids = ppo.tokenizer(ppo.render(MESSAGES), add_special_tokens=False)["input_ids"]
    torch.manual_seed(7)
    inputs = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = ppo.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                                 generation_config=ppo.sampling_config(), return_dict_in_generate=True,
                                 output_scores=True)
    drawn = out.sequences[0, len(prompt_ids):]
    sampled = torch.stack([torch.log_softmax(s[0].float(), -1)[t] for s, t in zip(out.scores, drawn)])
    torch.manual_seed(7)
    _, episode = ppo.generate(MESSAGES)
    assert episode.response_ids == drawn.tolist()[:len(episode.response_ids)]
    n = len(episode.response_ids)
    assert torch.allclose(sampled[:n], torch.tensor(episode.logprobs), atol=1e-5)
    with torch.no_grad():
        rescored = ppo.score([episode])[0][0]
    assert ppo.version == 0 and torch.allclose(rescored, torch.tensor(episode.logprobs), atol=1e-6)


def test_every_reply_token_gets_the_experiments_reward(model):
    """lam = 1 (the default): before any update (values 0, KL 0) the first token's advantage
    is the whole reward, as the last token's is; at the old lam = 0.95 the first tokens of a
    long reply got almost nothing."""
    ppo = learner(model)
    _, episode = ppo.generate(MESSAGES, seed=4)
    episode.response_ids, episode.logprobs = episode.response_ids * 10, episode.logprobs * 10  # 120 tokens
    episode.ref_logprobs, episode.values = episode.logprobs[:], [0.0] * len(episode.logprobs)
    ppo.add(episode, 3.0)
    advantages, _ = ppo.advantages(episode)
    assert len(advantages) == 120 and torch.allclose(advantages, torch.full((120,), 3.0))
    old = learner(model, lam=0.95)
    old.add(episode, 3.0)
    assert float(old.advantages(episode)[0][0]) < 0.01


def test_rewards_are_normalised_by_their_running_statistics(model, tmp_path):
    import json

    import numpy as np

    ppo = learner(model, state_dir=tmp_path / "rl", reward_clip=1.5)
    raw = [-12.0, 0.5, 2.0, -1.0, 4.0]
    episodes = []
    for i, reward in enumerate(raw):
        _, episode = ppo.generate(MESSAGES, seed=i)
        if i == 0:  # one reward: no spread yet, the raw value (clipped)
            ppo.add(episode, reward)
            assert ppo.scaled_reward(episode) == -1.5
            first = episode
            continue
        ppo.add(episode, reward)
        episodes.append(episode)
    mean, std = np.mean(raw), np.std(raw, ddof=1)
    for episode in episodes:
        assert ppo.scaled_reward(episode) == pytest.approx(np.clip((episode.reward - mean) / std, -1.5, 1.5))
    assert ppo.scaled_reward(episodes[-1]) == pytest.approx(0.8465, abs=1e-4)  # (4 + 1.3) / 6.261
    assert ppo.scaled_reward(first) == -1.5  # (-12 + 1.3) / 6.261 = -1.71, clipped
    ppo.save()
    again = learner(model, state_dir=tmp_path / "rl", reward_clip=1.5)
    assert (again.reward_stats.count, again.reward_stats.mean) == (5, pytest.approx(mean))
    counters = tmp_path / "rl" / "counters.json"  # a schema-1 state: rebuilt from the buffer
    old = {k: v for k, v in json.loads(counters.read_text()).items() if k != "reward_stats"}
    counters.write_text(json.dumps({**old, "schema": 1}))
    assert learner(model, state_dir=tmp_path / "rl").reward_stats.std() == pytest.approx(std)
    assert learner(model, reward_norm=False).scaled_reward(episodes[0]) == 0.5


def same_state(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_an_8bit_optimiser_updates_and_its_state_survives_a_restart(model, tmp_path, monkeypatch):
    pytest.importorskip("bitsandbytes")  # in the test extra; users opt in with gitresearch[rl8bit]
    # rank 128: LoRA matrices of 128 x 32 = 4096 values, the smallest bitsandbytes quantises
    ppo = learner(model, state_dir=tmp_path / "rl", optimizer="adamw8bit", ppo_epochs=1, lora_r=128)
    assert type(ppo.optimizer).__name__ == "AdamW8bit"
    for seed, reward in ((5, 1.0), (6, -1.0)):
        ppo.add(ppo.generate(MESSAGES, seed=seed)[1], reward)
    before = [p.detach().clone() for p in ppo.model.parameters() if p.requires_grad]
    stats = ppo.update()
    after = [p.detach() for p in ppo.model.parameters() if p.requires_grad]
    assert stats["version"] == 1 and any(not torch.equal(a, b) for a, b in zip(before, after))
    quantised = [t for state in ppo.optimizer.state.values() for t in state.values()
                 if isinstance(t, torch.Tensor) and t.dtype == torch.uint8]
    assert quantised  # the moments are stored in 8 bits
    again = learner(model, state_dir=tmp_path / "rl", optimizer="adamw8bit", ppo_epochs=1, lora_r=128)
    state1, state2 = ppo.optimizer.state_dict()["state"], again.optimizer.state_dict()["state"]
    assert state1 and same_state(state1, state2)  # every tensor of the quantised state, as saved
    import builtins
    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "bitsandbytes" else real_import(name, *a, **k))
    from gitresearch.policies import PolicyError
    with pytest.raises(PolicyError, match=r"optimizer = 'paged_adamw8bit' needs bitsandbytes: pip install 'gitresearch\[rl8bit\]'"):
        learner(model, optimizer="paged_adamw8bit")


def test_a_model_window_shorter_than_the_context_leaves_the_reply_half_of_it(model):
    """pretrain-policy's models read 1,024 positions: with the default [llm] settings (a
    16,384-token context, a 2,048-token reply) the reply budget alone would exceed the window
    and no prompt could be built. The window caps the context and the reply gets half of it."""
    default = PPOLearner(model, RLConfig(lora_r=8, target_modules=("c_attn",)), LLMConfig(temperature=1.0, device="cpu"))
    assert (default.context_tokens, default.reply_tokens) == (256, 128)  # the tiny model reads 256 positions
    assert default.sampling_config().max_new_tokens == 128
    _, episode = default.generate(MESSAGES, seed=4)
    assert len(episode.prompt_ids) + len(episode.response_ids) <= 256
    assert learner(model).reply_tokens == 12  # a reply budget that fits is kept as set


def test_the_adaptive_kl_coefficient_follows_the_sampled_drift(model, tmp_path):
    """kl_target set: kl_coef moves by the clipped relative error x episodes / horizon,
    measured on the episodes sampled since the last update, and the advantages use it;
    kl_target 0 (the default) leaves it fixed; a restart keeps it."""
    def sampled(ppo, drift, count):
        for i in range(count):
            _, episode = ppo.generate(MESSAGES, seed=10 + i)
            episode.logprobs = [r + drift for r in episode.ref_logprobs]  # `drift` nats per token
            ppo.add(episode, 1.0)

    ppo = learner(model, state_dir=tmp_path / "rl", kl_coef=0.1, kl_target=0.02, kl_horizon=8, ppo_epochs=1,
                  kl_mode="reward")
    sampled(ppo, 0.03, 4)  # 50 % above target: the error clips at +20 %, x 4/8 episodes
    stats = ppo.update()
    assert stats["sampled_kl"] == pytest.approx(0.03) and ppo.kl_coef == pytest.approx(0.1 * 1.1)
    sampled(ppo, 0.015, 2)  # 25 % below: -20 % x 2/8, only the 2 episodes of this version
    assert ppo.update()["kl_coef"] == pytest.approx(0.11 * 0.95)
    episode = ppo.episodes[-1]
    without_reward = ppo.advantages(episode)[0] - ppo.scaled_reward(episode)
    values = torch.tensor(episode.values)
    expected = torch.flip(torch.cumsum(torch.flip(torch.full((len(values),), -0.1045 * 0.015), [0]), 0), [0]) - values
    assert torch.allclose(without_reward, expected, atol=1e-5)
    assert learner(model, state_dir=tmp_path / "rl").kl_coef == pytest.approx(0.1045)  # saved
    fixed = learner(model, kl_coef=0.1, ppo_epochs=1)
    sampled(fixed, 0.5, 3)
    assert "kl_coef" not in fixed.update() and fixed.kl_coef == 0.1
    capped = learner(model, kl_coef=0.1, kl_target=0.02, kl_horizon=1, kl_coef_max=0.15, ppo_epochs=1)
    for _ in range(3):  # +20 % a step without the cap: 0.12, 0.144, 0.173
        sampled(capped, 0.5, 1)
        capped.update()
    assert capped.kl_coef == pytest.approx(0.15)
    floored = learner(model, kl_coef=0.1, kl_target=0.02, kl_horizon=1, kl_coef_min=0.07, ppo_epochs=1)
    for _ in range(3):  # -20 % a step without the floor: 0.08, 0.064, 0.0512
        sampled(floored, 0.0, 1)
        floored.update()
    assert floored.kl_coef == pytest.approx(0.07)


def test_a_batch_without_signal_is_centred_but_never_scaled_up(model):
    """Every reply of the batch got the same reward: what is left of its advantages is noise
    (here per-token KL), which plain whitening blew up to unit variance; with adv_std_floor
    (1, the default) it keeps its own small scale. A batch with a real spread is whitened."""
    def batch(ppo, rewards):
        episodes = []
        for i, reward in enumerate(rewards):
            _, episode = ppo.generate(MESSAGES, seed=20 + i)
            episode.ref_logprobs = [lp - 0.01 * ((i + t) % 3) for t, lp in enumerate(episode.logprobs)]
            ppo.add(episode, reward)
            episodes.append(episode)
        return episodes

    for floor in (1.0, 0.0):
        ppo = learner(model, adv_std_floor=floor, reward_norm=False, kl_mode="reward")
        flat = torch.cat([a for a, _ in ppo.batch_advantages(batch(ppo, [-12.0] * 6))[0]])
        raw = torch.cat([ppo.advantages(e)[0] for e in ppo.episodes])
        assert 0 < float(raw.std()) < 0.01 and abs(float(flat.mean())) < 1e-3  # float32 around -12
        assert float(flat.std()) == pytest.approx(float(raw.std()) if floor else 1.0, rel=1e-4)
        spread = learner(model, adv_std_floor=floor, reward_norm=False, kl_mode="reward")
        flat = torch.cat([a for a, _ in spread.batch_advantages(batch(spread, [-12.0, 3.0, -1.0, 2.5]))[0]])
        assert float(flat.std()) == pytest.approx(1.0, rel=1e-4)


def test_the_k3_penalty_is_never_negative_zero_at_the_reference_and_bounded():
    ref = torch.zeros(6)
    logp = torch.tensor([0.0, 0.5, -0.5, 3.0, 40.0, -40.0], requires_grad=True)
    k3 = kl_k3(logp, ref).detach()
    assert k3[0] == 0 and (k3 >= 0).all()
    assert float(k3[3]) == pytest.approx(math.exp(-3) + 3 - 1)  # linear in logp - ref above the reference
    assert float(k3[4]) == float(k3[5]) == KL_K3_MAX  # the reward-side term logp - ref was 40 here, unbounded
    k3 = kl_k3(logp, ref)
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()  # even where exp(ref - logp) would overflow
    assert logp.grad[1] > 0 and logp.grad[2] < 0  # its gradient pushes logp back toward ref


def test_with_the_kl_in_the_loss_the_return_is_the_reward_and_the_loss_pulls_to_the_reference(model, tmp_path):
    """kl_mode = "loss" (the default): a drifted reply's tokens all get the same return, the
    experiment's reward, whatever its KL; the k3 term in the loss then pulls the policy back,
    so the same update with a larger kl_coef ends nearer the reference."""
    ppo = learner(model, kl_coef=0.0, ppo_epochs=4, state_dir=tmp_path / "drift", reward_norm=False)
    _, episode = ppo.generate(MESSAGES, seed=4)
    for _ in range(3):  # drift: push this reply's log-prob up, with no penalty
        ppo.add(episode, 1.0)
        ppo.update()
    _, drifted = ppo.generate(MESSAGES, seed=5)
    assert sum(drifted.logprobs) - sum(drifted.ref_logprobs) != 0
    drifted.values = [0.0] * len(drifted.values)
    ppo.add(drifted, 2.0)
    assert torch.equal(ppo.advantages(drifted)[0], torch.full((len(drifted.values),), 2.0))
    ppo.save()

    def kl_after(kl_coef):
        again = learner(model, kl_coef=kl_coef, ppo_epochs=4, state_dir=tmp_path / "drift", reward_norm=False)
        again.episodes = [again.episodes[-1]]  # the drifted reply, reward 2
        stats = again.update()
        with torch.no_grad():
            logp = again.score([episode])[0][0]
        return float((logp - torch.tensor(episode.ref_logprobs)).mean()), stats

    free, free_stats = kl_after(0.0)
    held, held_stats = kl_after(5.0)
    assert free_stats["kl_penalty"] > 0 and held_stats["kl_penalty"] > 0
    assert abs(held) < abs(free)


def test_the_decision_mask_keeps_the_highest_entropy_share_and_at_least_one_token():
    entropy = torch.tensor([0.01, 2.0, 0.0, 0.5, 1.2, 0.02, 0.03, 0.9, 0.04, 0.05])
    assert decision_mask(entropy, 0.2).tolist() == [0, 1, 0, 0, 1, 0, 0, 0, 0, 0]
    assert decision_mask(entropy, 0.3).tolist() == [0, 1, 0, 0, 1, 0, 0, 1, 0, 0]  # 0.3 x 10 is 3.0000000000000004
    assert decision_mask(entropy, 0.35).tolist() == [0, 1, 0, 1, 1, 0, 0, 1, 0, 0]  # a part token counts whole
    assert decision_mask(entropy, 0.01).tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]  # never none
    assert decision_mask(entropy, 1.0).eq(1).all()
    assert decision_mask(torch.tensor([0.5, 0.5, 0.1]), 0.34).tolist() == [1, 1, 0]  # a tie at the threshold stays


@pytest.mark.parametrize("share", [0.25, 1.0])
def test_only_the_decision_tokens_carry_the_policy_and_entropy_terms(model, share):
    """The update's own per-episode loss: with token_share < 1 its policy and entropy terms
    have no gradient at the reply's low-entropy tokens (copies, format), and the KL term
    still reaches every token; at 1 (the default) every token carries them, as before."""
    ppo = learner(model, token_share=share, kl_mode="loss", kl_coef=0.0, ent_coef=0.5, reward_norm=False)
    _, episode = ppo.generate(MESSAGES, seed=7)
    ppo.add(episode, 2.0)
    (adv, ret), = ppo.batch_advantages([episode])[0]
    with torch.no_grad():
        logps, vals, ents = ppo.score([episode])
    logp = (logps[0] + 0.05 * torch.randn(len(episode.response_ids))).requires_grad_()  # away from ratio 1 and 0 KL
    entropy = ents[0].clone().requires_grad_()
    loss, terms = ppo.episode_loss(episode, adv, ret, logp, vals[0], entropy)
    logp_grad, entropy_grad = torch.autograd.grad(loss, [logp, entropy])
    picked = decision_mask(ents[0], share).bool()
    n = len(episode.response_ids)
    assert n == 12 and int(picked.sum()) == (3 if share < 1 else 12)
    assert terms["decision_tokens"] == pytest.approx(int(picked.sum()) / n)
    assert (logp_grad[~picked] == 0).all() and (logp_grad[picked] != 0).all()
    assert (entropy_grad[~picked] == 0).all() and (entropy_grad[picked] < 0).all()  # the bonus raises them
    kl_only = learner(model, token_share=share, kl_mode="loss", kl_coef=1.0, ent_coef=0.0, reward_norm=False)
    kl_loss, _ = kl_only.episode_loss(episode, torch.zeros(n), ret, logp, vals[0], entropy)
    assert (torch.autograd.grad(kl_loss, logp)[0] != 0).all()  # the KL term on every token


def test_gradient_checkpointing_changes_the_time_not_the_update(model):
    trained = []
    for checkpointing in (True, False):
        torch.manual_seed(0)  # the LoRA init
        ppo = learner(model, gradient_checkpointing=checkpointing)
        name = "is_activation_checkpointing" if hasattr(ppo.model, "is_activation_checkpointing") else "is_gradient_checkpointing"
        assert getattr(ppo.model, name) == checkpointing  # transformers 5.x renamed it
        for seed, reward in ((5, 1.0), (6, -1.0)):
            _, episode = ppo.generate(MESSAGES, seed=seed)
            ppo.add(episode, reward)
        ppo.update()
        trained.append({name: p.detach().clone() for name, p in ppo.model.named_parameters() if p.requires_grad})
    with_checkpoints, without = trained
    assert with_checkpoints.keys() == without.keys() and with_checkpoints
    moved = False
    for name, weight in with_checkpoints.items():
        torch.testing.assert_close(weight, without[name], rtol=1e-5, atol=1e-6)
        moved |= "lora_B" in name and weight.abs().sum() > 0  # lora_B starts at 0: the update moved it
    assert moved


def test_a_prior_sample_is_the_references_and_learned_from_as_such(model):
    """generate(prior=True) samples with the adapters off: after an update moved them, it draws
    what an un-updated learner draws from one seed, its behaviour log-probs are the reference's
    (so the update's ratio is adapted over prior), and the KL controller leaves it out."""
    ppo = learner(model, seed=3, ppo_epochs=1, replay_size=1, kl_target=0.02, kl_coef=0.1, kl_horizon=1)
    fresh = learner(model, seed=3)
    _, episode = ppo.generate(MESSAGES, seed=5)
    ppo.add(episode, 1.0)
    ppo.update()
    ppo.kl_coef = 0.1
    _, moved = ppo.generate(MESSAGES, seed=6)
    assert moved.logprobs != moved.ref_logprobs and not moved.prior  # the adapters moved
    _, prior = ppo.generate(MESSAGES, seed=6, prior=True)
    _, unmoved = fresh.generate(MESSAGES, seed=6)
    assert prior.prior and prior.response_ids == unmoved.response_ids
    assert prior.logprobs == prior.ref_logprobs and prior.ref_logprobs == pytest.approx(unmoved.logprobs, abs=1e-5)
    with torch.no_grad():
        adapted = ppo.score([prior])[0][0]
    ppo.add(prior, 1.0)
    stats = ppo.update()
    assert stats["ratio"] == pytest.approx(float(torch.exp(adapted - torch.tensor(prior.ref_logprobs)).mean()), rel=1e-4)
    assert "sampled_kl" not in stats and ppo.kl_coef == 0.1  # a prior sample measured no drift
    own = ppo.generate(MESSAGES, seed=7)[1]
    ppo.add(own, 1.0)
    drift = (sum(own.logprobs) - sum(own.ref_logprobs)) / len(own.logprobs)
    assert drift != 0 and ppo.update()["sampled_kl"] == pytest.approx(drift)  # the policy's own sample did


def test_a_grammar_sample_is_drawn_and_scored_under_the_masked_distribution(model, tmp_path):
    """generate(grammar=NAMES) samples only tokens the Moves grammar allows, and its stored
    log-probs are those of the masked, renormalised distribution: computed here afresh from
    the model's logits with each position's mask built by walking the decoded text (not the
    learner's token-state path). Before an update the rescoring equals them (ratio 1); an
    update on such episodes stays finite; the buffer keeps the names across a restart."""
    from gitresearch.policies.grammar import MovesGrammar

    names = ["LR", "DEPTH"]
    ppo = learner(model, state_dir=tmp_path / "rl", seed=1, ppo_epochs=1)
    ppo.reply_tokens = 24
    grammar, texts = MovesGrammar(names), ppo.token_texts()
    assert not grammar.complete(grammar.walk(ppo.generate(MESSAGES, seed=1)[0] + "\n"))  # unmasked: no Moves
    for seed in range(4):
        text, episode = ppo.generate(MESSAGES, seed=seed, grammar=names)
        assert episode.grammar == names and grammar.walk(text) is not None, text
        assert text.startswith("Moves: ") or "Moves: ".startswith(text)
        ids = torch.tensor([episode.prompt_ids + episode.response_ids])
        with torch.no_grad():
            logits = ppo.model(input_ids=ids).logits[0, len(episode.prompt_ids) - 1:-1].float() / ppo.temperature
        expected, prefix = [], ""
        for position, token in enumerate(episode.response_ids):
            state = grammar.walk(prefix)
            allowed = torch.tensor([bool(t) and grammar.walk(prefix + t) is not None for t in texts]
                                   + [False] * (logits.shape[-1] - len(texts)))
            allowed[ppo.eos] = grammar.complete(state) or not allowed.any()
            assert allowed[token], (prefix, texts[token])
            expected.append(float(torch.log_softmax(logits[position].masked_fill(~allowed, float("-inf")), -1)[token]))
            prefix += texts[token] if token != ppo.eos else ""
        assert episode.logprobs == pytest.approx(expected, abs=1e-5)
        masked_gain = sum(episode.logprobs) - float(torch.log_softmax(logits, -1).gather(
            -1, torch.tensor(episode.response_ids)[:, None]).sum())
        assert masked_gain > 0.5  # the mask renormalised: each token more likely than unmasked
        with torch.no_grad():
            assert torch.allclose(ppo.score([episode])[0][0], torch.tensor(episode.logprobs), atol=1e-6)
        ppo.add(episode, 1.0 if seed % 2 else -1.0)
    stats = ppo.update()
    assert all(math.isfinite(v) for v in (stats["ratio"], stats["kl"], stats["entropy"]))
    again = learner(model, state_dir=tmp_path / "rl", seed=1)
    assert [e.grammar for e in again.episodes] == [names] * 4
