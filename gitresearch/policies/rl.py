"""The RL policy: a local LM writes the diffs and is fine-tuned online with PPO on the
experiments' rewards (docs/policies.md).

    gitresearch loop --policy rl --model Qwen/Qwen2.5-Coder-0.5B-Instruct
    gitresearch loop --policy rl --model ./my-model      # [rl] settings in gitresearch.toml

It shares the prompt builder and the reply parsing with the LLM policy, and the loop's
validation and retry path. Every sample is an episode: a try that fails validation gets the
invalid penalty as its reward at once (the loop then asks again, with the error in the
prompt); the proposal that ran gets the reward of its note. With [rl] prior_share set, each
proposal is sampled from the frozen prior (adapters off) with that probability; with [rl]
grammar, under the Moves grammar of the constants shown (grammar.py). Every `update_every`
experiments the learner runs a PPO update and saves its state under
<git dir>/gitresearch/rl/, from which a later `loop --policy rl` resumes; a loop with no
saved learner of its own starts from the one [rl] init_from names, if any. Each note's
policy_data records the policy version (updates so far) that proposed it.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from . import InvalidReply, PolicyError, Proposal, State
from .llm import load_system_prompt
from .ppo import PPOLearner
from .prompt import prompt_for, read_reply, shown_sites


class RLPolicy:
    name = "rl"

    def __init__(self, config, store, learner: PPOLearner | None = None):
        self.config, self.store = config, store
        self.state_dir = store.state_dir / "rl"
        if learner is None and not config.llm.model:
            raise PolicyError("the rl policy needs a local model: --model PATH_OR_HUB_ID ([llm] model)")
        # [rl] seed, else the loop's --seed ([policy] seed), so bench research's seeds differ;
        # it seeds the adapters' init and every sample, so one setting's runs are the same
        self.seed = config.rl.seed if config.rl.seed is not None else config.policy.seed
        init_from = Path(store.root) / config.rl.init_from if config.rl.init_from else None
        self.learner = learner or PPOLearner(config.llm.model, config.rl, config.llm, self.state_dir, seed=self.seed,
                                             init_from=init_from)
        self.system = load_system_prompt(store.root, config.policy.system_prompt)
        self.rng = random.Random(self.seed)
        # its own stream: drawing prior-or-policy leaves the sample seeds of `rng` as they were,
        # so a loop with prior_share set proposes what one without it does until the first update
        self.source_rng = random.Random(f"prior-share-{self.seed}") if self.seed is not None else random.Random()
        self.pending = None  # the episode of the last sample, waiting for its reward

    def propose(self, state: State) -> Proposal:
        if state.attempts and self.pending is not None:  # the last sample failed validation
            self.learner.add(self.pending, -self.config.reward.invalid_penalty)
            self.pending = None
        prompt = prompt_for(state, self.learner.count_tokens, self.learner.context_tokens,
                            self.learner.reply_tokens, self.system)
        seed = self.rng.randrange(2 ** 31) if self.seed is not None else None
        prior = self.config.rl.prior_share > 0 and self.source_rng.random() < self.config.rl.prior_share
        grammar = None  # the Moves grammar's constants: those the prompt shows
        if self.config.rl.grammar:
            grammar = sorted(site.name for sites in shown_sites(state).values() for site in sites)
        text, episode = self.learner.generate(prompt.messages, seed=seed, prior=prior, grammar=grammar)
        self.pending = episode
        data = {"policy_version": self.learner.version, "model": self.config.llm.model, "sampled_from_prior": prior,
                "prompt_tokens": len(episode.prompt_ids), "response_tokens": len(episode.response_ids),
                "history_shown": prompt.history_shown}
        try:
            description, diff = read_reply(text, state, self.store.make_diff)
        except InvalidReply as err:
            raise InvalidReply(str(err), text, data) from None
        return Proposal(diff, description, data, reply=text)

    def observe(self, record: dict) -> None:
        """The finished experiment: its reward goes to the sample that proposed it; every
        `update_every` experiments from `update_after` on, and up to `update_until` where set,
        a PPO update."""
        if self.pending is not None:
            self.learner.add(self.pending, (record.get("reward") or {}).get("total", 0.0), record.get("experiment"))
            self.pending = None
        self.learner.experiments += 1
        rl, done = self.config.rl, self.learner.experiments
        learning = rl.update_after <= done and (rl.update_until <= 0 or done <= rl.update_until)
        if learning and done % max(1, rl.update_every) == 0:
            stats = self.learner.update()
            if stats:
                with open(self.state_dir / "updates.jsonl", "a") as log:
                    log.write(json.dumps({"experiment": record.get("experiment"), **stats}) + "\n")
        else:
            self.learner.save(self.state_dir)  # the buffer and counters survive a restart
