"""PPO on the LoRA adapters of a causal LM, for rewards that arrive minutes after the text:
episodes, the update, sampling and saved state (docs/policies.md)."""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..config import LLMConfig, RLConfig
from .base import PolicyError
from .grammar import GrammarMask, MovesGrammar
from .ppo_terms import RunningStats, decision_mask, kl_k3, reply_logp_entropy

STATE_FILES = ("adapter", "value_head.pt", "optimizer.pt", "episodes.jsonl", "counters.json")


@dataclass
class Episode:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # behaviour log-probs of the response tokens, at generation
    ref_logprobs: list[float]  # reference (adapters off) log-probs, at generation
    values: list[float]  # value estimates, at generation
    version: int  # policy version that generated it
    reward: float | None = None
    experiment: int | None = None
    stats: dict = field(default_factory=dict)
    prior: bool = False  # sampled from the reference (adapters off): `logprobs` are the reference's
    grammar: list[str] | None = None  # sampled under the Moves grammar of these constants ([rl] grammar)


def zero_dropout(config) -> None:
    for name in list(vars(config)):
        if ("dropout" in name or "pdrop" in name) and isinstance(getattr(config, name), float):
            setattr(config, name, 0.0)


def make_optimizer(params: list, rl: RLConfig):
    """AdamW from torch, or bitsandbytes' 8-bit (states quantised blockwise: ~1/4 of AdamW's 8
    bytes per parameter) or paged (states in unified memory, evicted to the host under
    pressure; CUDA only, plain on a CPU) variants."""
    if rl.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=rl.learning_rate)
    try:
        import bitsandbytes
    except ImportError as err:
        raise PolicyError(f"[rl] optimizer = {rl.optimizer!r} needs bitsandbytes: pip install "
                          f"'gitresearch[rl8bit]' (or set optimizer = \"adamw\")") from err
    names = {"adamw8bit": "AdamW8bit", "paged_adamw8bit": "PagedAdamW8bit", "paged_adamw": "PagedAdamW"}
    return getattr(bitsandbytes.optim, names[rl.optimizer])(params, lr=rl.learning_rate)


def render_chat(tokenizer, messages: list[dict]) -> str:
    """The prompt text of chat messages: the tokenizer's chat template, or plain role headers
    for a model without one (the imitation-pretrained LM is trained on exactly these)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(f"{m['role'].upper()}:\n{m['content']}" for m in messages) + "\n\nASSISTANT:\n"


class OutOfMemory(RuntimeError):
    """An update that ran out of memory even one episode at a time."""


class PPOLearner:
    def __init__(self, model: str, rl: RLConfig, llm: LLMConfig, state_dir: Path | None = None,
                 seed: int | None = None, init_from: Path | None = None):
        """`seed` draws the LoRA adapters' random init (peft's A matrices; B starts at zero);
        None draws it from torch's global generator as it stands. Two learners built with one
        seed, fed the same episodes, make the same updates: unseeded, the first update's
        gradient (through A) differed from run to run though every sample before it agreed.
        A learner with a saved state in `state_dir` resumes it; one without starts from the
        state saved in `init_from` where given (start_from)."""
        import peft
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as LORA_TARGETS
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.pytorch_utils import Conv1D

        self.rl, self.llm, self.state_dir = rl, llm, Path(state_dir) if state_dir else None
        self.device = llm.device if llm.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        config = AutoConfig.from_pretrained(model)
        zero_dropout(config)
        dtype = "auto" if llm.dtype == "auto" else getattr(torch, llm.dtype)
        base = AutoModelForCausalLM.from_pretrained(model, config=config, dtype=dtype)
        targets = list(rl.target_modules) or list(LORA_TARGETS.get(base.config.model_type, [])) or None
        # GPT-2-style Conv1D layers store their weight transposed: LoRA has to be told
        conv1d = any(isinstance(module, Conv1D) and name.rsplit(".", 1)[-1] in (targets or ())
                     for name, module in base.named_modules())
        lora = peft.LoraConfig(r=rl.lora_r, lora_alpha=rl.lora_alpha, lora_dropout=0.0,
                               target_modules=targets, fan_in_fan_out=conv1d, task_type="CAUSAL_LM")
        if rl.gradient_checkpointing and getattr(base, "supports_gradient_checkpointing", False):
            if hasattr(base, "activation_checkpointing_enable"):  # transformers 5.x's name
                base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with torch.random.fork_rng(devices=[]):  # the caller's generator stream is left as it was
            if seed is not None:
                torch.manual_seed(seed)
            self.model = peft.get_peft_model(base, lora).to(self.device)
        self.model.eval()  # no dropout; gradients still flow
        hidden = self.model.config.hidden_size if hasattr(self.model.config, "hidden_size") else self.model.config.n_embd
        self.value_head = torch.nn.Linear(hidden, 1).to(self.device)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        params = [p for p in self.model.parameters() if p.requires_grad] + list(self.value_head.parameters())
        self.optimizer = make_optimizer(params, rl)
        self.version, self.experiments, self.updates = 0, 0, 0
        self.micro_batch = 0  # episodes per forward pass in an update (0: the minibatch); halved on OOM
        self.scored = 0
        self.episodes: list[Episode] = []
        self.reward_stats = RunningStats()
        self.kl_coef = rl.kl_coef  # moves when kl_target is set (adapt_kl_coef)
        positions = getattr(self.model.config, "max_position_embeddings", None) or getattr(self.model.config, "n_positions", None)
        self.context_tokens = min(llm.context_tokens, positions) if positions else llm.context_tokens
        # a model whose window is shorter than [llm] context_tokens (a small LM trained by
        # pretrain-policy: 1,024 positions) leaves the reply at most half of it, so that prompt
        # and reply fit in the window instead of the default 2,048-token reply leaving no prompt
        self.reply_tokens = min(llm.max_tokens, self.context_tokens // 2)
        self.temperature = llm.temperature if llm.temperature > 0 else 1.0  # the policy samples
        self.eos = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (self.eos or 0)
        self.grammars: dict[tuple[str, ...], MovesGrammar] = {}  # by the constants' names
        self._token_texts: list[str] | None = None
        if self.state_dir and (self.state_dir / "counters.json").exists():
            self.load()
        elif init_from is not None:
            self.start_from(Path(init_from))

    # -- text ---------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, messages: list[dict]) -> str:
        return render_chat(self.tokenizer, messages)

    def generate(self, messages: list[dict], seed: int | None = None, prior: bool = False,
                 grammar: list[str] | None = None) -> tuple[str, Episode]:
        """Sample a reply and score it (behaviour and reference log-probs, values) at once.
        `prior`: sample from the reference (adapters off); the behaviour log-probs are then the
        reference's, so the update's ratio is the adapted policy's over the prior's.
        `grammar`: sample under the Moves grammar of these constant names (grammar.py); every
        log-prob, here and in later updates, is then that of the masked distribution."""
        from transformers import LogitsProcessorList

        prompt_ids = self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]
        if seed is not None:
            torch.manual_seed(seed)
        inputs = torch.tensor([prompt_ids], device=self.device)
        sampler = self.model.disable_adapter() if prior else contextlib.nullcontext()
        processors = LogitsProcessorList([] if grammar is None else [
            GrammarMask(self.grammar(grammar), self.token_texts(), self.eos, len(prompt_ids))])
        with torch.no_grad(), sampler:  # sample from exactly the distribution `score` evaluates
            out = self.model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs),
                                      generation_config=self.sampling_config(), logits_processor=processors)
        response = out[0, len(prompt_ids):].tolist()
        if self.eos is not None and self.eos in response:  # cut at the first EOS, not at the pad id
            response = response[:response.index(self.eos) + 1]
        if not response:
            response = [self.eos if self.eos is not None else self.pad]
        episode = Episode(prompt_ids, response, [], [], [], self.version, prior=prior, grammar=grammar)
        with torch.no_grad():
            logprobs, values, _ = self.score([episode])
            with self.model.disable_adapter():
                ref, _, _ = self.score([episode])
        episode.logprobs, episode.values, episode.ref_logprobs = logprobs[0].tolist(), values[0].tolist(), ref[0].tolist()
        if prior:
            episode.logprobs = list(episode.ref_logprobs)
        text = self.tokenizer.decode([t for t in response if t != self.eos], skip_special_tokens=True)
        if grammar is not None and text != "".join(self.token_texts()[t] for t in response if t != self.eos):
            raise PolicyError(f"[rl] grammar needs a tokenizer whose tokens decode on their own (byte-level BPE, "
                              f"as GPT-2's or Qwen's); this one decodes {response!r} as {text!r}")
        return text, episode

    # -- the Moves grammar ([rl] grammar) -----------------------------------------------------

    def token_texts(self) -> list[str]:
        """Each token id's text, decoded on its own."""
        if self._token_texts is None:
            self._token_texts = [self.tokenizer.decode([i]) for i in range(len(self.tokenizer))]
        return self._token_texts

    def grammar(self, names: list[str]) -> MovesGrammar:
        return self.grammars.setdefault(tuple(names), MovesGrammar(names))

    def sampling_config(self):
        """The whole generation config, explicit: plain sampling at the policy's temperature.
        A model's own generation_config.json (an instruct model's repetition penalty, top-k,
        top-p, ...) would otherwise reshape the distribution that is sampled, and the stored
        behaviour log-probs, which `score` computes without any of it, would be wrong."""
        from transformers import GenerationConfig

        return GenerationConfig(do_sample=True, max_new_tokens=self.reply_tokens, temperature=self.temperature,
                                top_k=0, top_p=1.0, min_p=None, typical_p=1.0, repetition_penalty=1.0,
                                no_repeat_ngram_size=0, bad_words_ids=None, suppress_tokens=None,
                                begin_suppress_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None,
                                min_new_tokens=0, pad_token_id=self.pad, eos_token_id=self.eos)

    # -- scoring ------------------------------------------------------------------------------

    def score(self, episodes: list[Episode]):
        """Per response token: log-prob, value and entropy, each a list of tensors (one per
        episode), from one left-padded forward pass. The LM head runs on the replies' slice
        only (`logits_to_keep`), and the log-softmax and entropy run over it in chunks that
        are recomputed in the backward pass, so no full-vocabulary tensor of the prompt is
        ever made or kept (a 152K vocabulary over a 14K-token prompt would be gigabytes)."""
        seqs = [e.prompt_ids + e.response_ids for e in episodes]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(seqs), width), dtype=torch.long, device=self.device)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s, device=self.device)
            mask[i, width - len(s):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: count real tokens only
        longest = max(len(e.response_ids) for e in episodes)
        captured = {}  # the LM head's input: the last hidden states of the kept positions
        hook = self.model.get_output_embeddings().register_forward_hook(
            lambda module, args, output: captured.__setitem__("hidden", args[0]))
        try:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             logits_to_keep=longest + 1, use_cache=False)
        finally:
            hook.remove()
        # the kept positions end at the last token; each one predicts the token after it
        logits, hidden = out.logits[:, :-1], captured["hidden"][:, :-1]
        blocked = None
        if any(e.grammar is not None for e in episodes):
            blocked = torch.zeros(logits.shape, dtype=torch.bool, device=self.device)
            for i, e in enumerate(episodes):
                if e.grammar is not None:  # the last n positions of row i predict its reply
                    n = len(e.response_ids)
                    rows = self.grammar(e.grammar).rows(self.token_texts(), self.eos, e.response_ids, logits.shape[-1])
                    blocked[i, -n:] = ~rows[:n].to(self.device)
        token_logp, entropy = reply_logp_entropy(logits, ids[:, width - longest:], self.temperature,
                                                 self.rl.logit_chunk, blocked)
        values = self.value_head(hidden.float()).squeeze(-1)
        logps, vals, ents = [], [], []
        for i, e in enumerate(episodes):
            n = len(e.response_ids)  # the last n of row i are the response tokens
            logps.append(token_logp[i, -n:])
            vals.append(values[i, -n:])
            ents.append(entropy[i, -n:])
        return logps, vals, ents

    # -- learning -----------------------------------------------------------------------------

    def add(self, episode: Episode, reward: float, experiment: int | None = None) -> None:
        episode.reward, episode.experiment = float(reward), experiment
        self.reward_stats.add(episode.reward)
        self.episodes.append(episode)
        self.episodes = self.episodes[-max(self.rl.replay_size * 4, 64):]

    def scaled_reward(self, episode: Episode) -> float:
        """The experiment's reward as the update sees it: normalised by the running statistics
        of all rewards so far (`reward_norm`), else raw."""
        if not self.rl.reward_norm:
            return episode.reward
        return self.reward_stats.normalise(episode.reward, self.rl.reward_clip)

    def advantages(self, episode: Episode) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over the response tokens; at the default lam = 1 every token's advantage is the
        whole reply's return minus its value, so the reward reaches the description and the
        first hunk, not only the diff's last lines. The return is the experiment's reward
        alone, unless kl_mode = "reward" adds the per-token KL penalty to it."""
        rl = self.rl
        rewards = torch.zeros(len(episode.values))
        if rl.kl_mode == "reward":
            rewards = -self.kl_coef * (torch.tensor(episode.logprobs) - torch.tensor(episode.ref_logprobs))
        rewards[-1] += self.scaled_reward(episode)
        values = torch.tensor(episode.values)
        adv, last = torch.zeros_like(values), 0.0
        for t in reversed(range(len(values))):
            next_value = values[t + 1] if t + 1 < len(values) else 0.0
            delta = rewards[t] + rl.gamma * next_value - values[t]
            last = delta + rl.gamma * rl.lam * last
            adv[t] = last
        return adv, adv + values

    def adapt_kl_coef(self) -> dict:
        """The adaptive KL controller of Ziegler et al. (2019), per token, for the next update:
        kl_coef grows when the episodes sampled since the last update drifted from the reference
        by more than kl_target nats per token, and shrinks when they drifted less, by at most
        20 % per kl_horizon episodes, within [kl_coef_min, kl_coef_max]. The drift is measured
        on the policy's own samples (behaviour minus reference log-probs, stored at generation);
        those sampled from the prior (`prior_share`) drifted by nothing and are left out."""
        rl = self.rl
        fresh = [e for e in self.episodes if e.version == self.version and e.reward is not None and not e.prior]
        tokens = sum(len(e.logprobs) for e in fresh)
        if rl.kl_target <= 0 or not tokens:
            return {}
        kl = sum(sum(e.logprobs) - sum(e.ref_logprobs) for e in fresh) / tokens
        error = max(-0.2, min(0.2, kl / rl.kl_target - 1.0))
        moved = self.kl_coef * (1.0 + error * len(fresh) / max(1, rl.kl_horizon))
        self.kl_coef = max(rl.kl_coef_min, min(rl.kl_coef_max, moved))
        return {"sampled_kl": kl, "kl_coef": self.kl_coef}

    def batch_advantages(self, batch: list[Episode]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float]:
        """Each episode's (normalised advantages, returns), and the batch's raw advantage std."""
        rl = self.rl
        gae = [self.advantages(e) for e in batch]
        flat = torch.cat([a for a, _ in gae])
        # centred over the batch (a single episode only scaled: centring its own tokens would
        # flip the sign of some of them) and divided by the batch's std, but never by less than
        # adv_std_floor: a batch whose rewards all agree (every reply invalid) has no signal,
        # and scaling its noise (value errors, per-token KL) up to unit variance made every
        # update a random step (measured: docs/gym.md, KL to the reference 0.05 -> 13)
        shift = flat.mean() if len(batch) > 1 else torch.tensor(0.0)
        raw = flat.std() if flat.numel() > 1 else torch.tensor(0.0)
        scale = raw if torch.isfinite(raw) and raw > 1e-8 else torch.tensor(1.0)
        scale = torch.clamp(scale, min=rl.adv_std_floor) if rl.adv_std_floor > 0 else scale
        gae = [((adv - shift) / scale, ret) for adv, ret in gae]
        return gae, float(raw)

    def update(self) -> dict:
        """One PPO update on the replay; returns its statistics (empty when nothing to learn)."""
        rl = self.rl
        batch = [e for e in self.episodes[-rl.replay_size:]
                 if e.reward is not None and self.version - e.version <= rl.max_staleness]
        if not batch:
            return {}
        gae, raw_std = self.batch_advantages(batch)
        self.scored = 0
        stats = {"episodes": len(batch), "mean_reward": sum(e.reward for e in batch) / len(batch),
                 "reward_mean": self.reward_stats.mean, "reward_std": self.reward_stats.std(), "adv_std": raw_std}
        totals = {"loss": 0.0, "policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "kl": 0.0, "kl_penalty": 0.0,
                  "ratio": 0.0, "clip_frac": 0.0, "decision_tokens": 0.0}
        if self.state_dir:
            self.save()  # before the risky part: an out-of-memory kill loses no episode
        self.model.train()  # gradient checkpointing acts in training mode only (dropout is zeroed)
        try:
            for _ in range(rl.ppo_epochs):
                for start in range(0, len(batch), rl.minibatch_size):
                    chunk = [(batch[i], gae[i]) for i in range(start, min(start + rl.minibatch_size, len(batch)))]
                    self._minibatch_step(chunk, totals)
        except OutOfMemory as err:
            self.optimizer.zero_grad(set_to_none=True)
            stats["skipped"] = f"out of memory at a micro-batch of one episode: {err}"[:500]
            return stats
        finally:
            self.model.eval()
        steps = max(self.scored, 1)
        stats.update({k: v / steps for k, v in totals.items()})
        stats["micro_batch"] = self.micro_batch
        stats.update(self.adapt_kl_coef())  # after a whole update: a skipped one counts no episode twice
        self.version += 1
        self.updates += 1
        stats["version"] = self.version
        if self.state_dir:
            self.save()
        return stats

    def episode_loss(self, e: Episode, adv: torch.Tensor, ret: torch.Tensor, logp: torch.Tensor,
                     value: torch.Tensor, entropy: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """One episode's PPO loss (clipped policy term and entropy bonus on its decision tokens,
        `token_share`; clipped value loss and the KL term on every token) and its terms."""
        rl = self.rl
        adv, ret = adv.to(self.device), ret.to(self.device)
        old_logp = torch.tensor(e.logprobs, device=self.device)
        old_v = torch.tensor(e.values, device=self.device)
        ratio = torch.exp(logp - old_logp)
        clipped = torch.clamp(ratio, 1 - rl.clip_range, 1 + rl.clip_range)
        mask = decision_mask(entropy, rl.token_share)
        picked = mask.sum()
        policy_loss = (torch.max(-adv * ratio, -adv * clipped) * mask).sum() / picked
        v_clip = old_v + torch.clamp(value - old_v, -rl.clip_range_value, rl.clip_range_value)
        value_loss = 0.5 * torch.max((value - ret) ** 2, (v_clip - ret) ** 2).mean()
        bonus = (entropy * mask).sum() / picked
        ref = torch.tensor(e.ref_logprobs, device=self.device)
        kl_penalty = kl_k3(logp, ref).mean()
        loss = policy_loss + rl.vf_coef * value_loss - rl.ent_coef * bonus
        if rl.kl_mode == "loss":
            loss = loss + self.kl_coef * kl_penalty
        with torch.no_grad():
            terms = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy.mean(),
                     "kl": (logp - ref).mean(), "kl_penalty": kl_penalty, "ratio": ratio.mean(),
                     "clip_frac": ((ratio - 1).abs() > rl.clip_range).float().mean(),
                     "decision_tokens": picked / max(1, mask.numel())}
        return loss, {key: float(value.detach()) for key, value in terms.items()}

    def _minibatch_step(self, chunk: list, totals: dict) -> None:
        """One optimiser step on a minibatch, in micro-batches whose gradients add up; an
        out-of-memory error halves the micro-batch and retries the minibatch from scratch."""
        rl = self.rl
        while True:
            micro = max(1, min(self.micro_batch or len(chunk), len(chunk)))
            self.optimizer.zero_grad(set_to_none=True)
            seen = dict.fromkeys(totals, 0.0)
            try:
                for start in range(0, len(chunk), micro):
                    part = chunk[start:start + micro]
                    logps, vals, ents = self.score([e for e, _ in part])
                    losses = []
                    for j, (e, (adv, ret)) in enumerate(part):
                        loss, terms = self.episode_loss(e, adv, ret, logps[j], vals[j], ents[j])
                        losses.append(loss)
                        for key, value in terms.items():
                            seen[key] += value
                    loss = torch.stack(losses).sum() / len(chunk)  # the minibatch's mean, summed over parts
                    seen["loss"] += float(loss.detach()) * len(chunk)
                    loss.backward()
            except torch.OutOfMemoryError as err:
                self.optimizer.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if micro == 1:
                    raise OutOfMemory(str(err).splitlines()[0] if str(err) else "torch.OutOfMemoryError") from err
                self.micro_batch = micro // 2
                continue
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, rl.max_grad_norm)
            self.optimizer.step()
            for key, value in seen.items():
                totals[key] += value
            self.scored += len(chunk)
            return

    # -- state --------------------------------------------------------------------------------

    def save(self, directory: Path | None = None) -> Path:
        directory = Path(directory or self.state_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory / "adapter")
        torch.save(self.value_head.state_dict(), directory / "value_head.pt")
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        tmp = directory / "episodes.jsonl.tmp"
        tmp.write_text("".join(json.dumps(asdict(e)) + "\n" for e in self.episodes))
        tmp.replace(directory / "episodes.jsonl")
        counters = {"schema": 3, "version": self.version, "experiments": self.experiments, "updates": self.updates,
                    "reward_stats": asdict(self.reward_stats), "kl_coef": self.kl_coef}
        tmp = directory / "counters.json.tmp"
        tmp.write_text(json.dumps(counters))
        tmp.replace(directory / "counters.json")  # last: a state with counters is complete
        return directory

    def load(self, directory: Path | None = None) -> None:
        """Resume the state saved in `directory` (this loop's own), episodes and counters too."""
        directory = Path(directory or self.state_dir)
        counters = self.load_weights(directory)
        self.episodes = [Episode(**json.loads(line)) for line in
                         (directory / "episodes.jsonl").read_text().splitlines() if line.strip()]
        self.experiments = counters["experiments"]
        if "reward_stats" not in counters:  # schema 1 kept no statistics: rebuilt from the rewarded episodes
            self.reward_stats = RunningStats()
            for episode in self.episodes:
                if episode.reward is not None:
                    self.reward_stats.add(episode.reward)

    def start_from(self, directory: Path) -> None:
        """Start this loop from another loop's saved learner (`[rl] init_from`): its adapters,
        value head, optimiser, reward statistics, KL coefficient and version (the updates its
        adapters carry), not its episodes (rewards of another repo's history) nor its experiment
        count (update_after counts this loop's experiments). Why: one loop's few hundred
        episodes carry a dozen or two keeps (docs/gym.md); a learner carried from loop to loop
        learns from all of them."""
        if not (directory / "counters.json").exists():
            raise PolicyError(f"[rl] init_from = {str(directory)!r}: no saved learner there (no counters.json; "
                              f"a loop's learner is saved under <git dir>/gitresearch/rl)")
        self.load_weights(directory)
        self.episodes, self.experiments = [], 0

    def load_weights(self, directory: Path) -> dict:
        """The learned state saved in `directory` (all but episodes); returns its counters."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        try:
            loaded = set_peft_model_state_dict(self.model, load_file(directory / "adapter" / "adapter_model.safetensors",
                                                                     device=str(self.device)))
        except RuntimeError as err:  # torch's size mismatch: another rank or another model's shapes
            raise PolicyError(f"the adapters saved in {directory} do not fit this model: {str(err)[:500]}") from err
        # peft loads leniently: adapters of other layers would load nothing, or leave some at their init
        unfit = list(loaded.unexpected_keys) + [key for key in loaded.missing_keys if "lora_" in key]
        if unfit:
            raise PolicyError(f"the adapters saved in {directory} do not fit this model ({len(unfit)} tensors "
                              f"on one side only, e.g. {unfit[0]})")
        self.value_head.load_state_dict(torch.load(directory / "value_head.pt", map_location=self.device, weights_only=True))
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location=self.device, weights_only=True))
        counters = json.loads((directory / "counters.json").read_text())
        self.version, self.updates = counters["version"], counters["updates"]
        self.kl_coef = counters.get("kl_coef", self.rl.kl_coef)  # schema < 3: a fixed coefficient
        if "reward_stats" in counters:
            self.reward_stats = RunningStats(**counters["reward_stats"])
        return counters
