"""Settings of a research repo: typed defaults, overridden by gitresearch.toml, then by flags."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .errors import GitresearchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_FILE = "gitresearch.toml"
SCHEMA = 1  # gitresearch.toml schema; older files stay readable


class ConfigError(GitresearchError):
    pass


@dataclass(frozen=True)
class RunConfig:
    command: tuple[str, ...] = ("python", "train.py")  # run in the experiment worktree root
    setup: tuple[str, ...] = ()  # run once per loop before any training (data preparation)
    setup_timeout_s: float = 3600.0  # wall seconds allowed for the setup command
    budget_s: float = 300.0  # training seconds per experiment (GITRESEARCH_BUDGET_S)
    grace_s: float = 60.0  # extra wall seconds for start-up and final evaluation
    term_grace_s: float = 5.0  # seconds between SIGTERM and SIGKILL
    memory_limit_mb: float = 0.0  # kill the run above this tree RSS; 0: no limit
    log_cap_mb: float = 8.0  # bytes of output kept in the log file
    isolate_network: bool = True  # run training in a new network namespace where the OS allows
    env_allow: tuple[str, ...] = ()  # extra environment variables passed to train.py


@dataclass(frozen=True)
class FilesConfig:
    editable: tuple[str, ...] = ("train.py",)  # the only files a policy may change
    frozen: tuple[str, ...] = ()  # hash-checked before and after every run
    hidden: tuple[str, ...] = ()  # left out of training's checkout (e.g. the raw data the validation split comes from)


@dataclass(frozen=True)
class MetricConfig:
    name: str = "val_bpb"  # key in the summary block and metrics JSON lines
    direction: str = "minimize"  # the only direction: print the negative of a metric to maximise
    # A frozen evaluation command (run in the repo's frozen files, in a fresh sandbox, after
    # training) whose number is the result; empty: train.py's own number is (self-reported).
    evaluate: tuple[str, ...] = ()
    evaluate_timeout_s: float = 600.0  # wall seconds allowed for the evaluation
    tolerance: float = 1e-3  # train.py's own final number may differ from the evaluator's by this


@dataclass(frozen=True)
class SandboxConfig:
    mode: str = "bwrap"  # bwrap (Linux namespaces) | none (opt-out: train.py sees what you see)
    train_read_only: tuple[str, ...] = ()  # paths training may read (~, $VAR, ${VAR:-x} expand)
    evaluate_read_only: tuple[str, ...] = ()  # paths the evaluator may read (the validation data)


@dataclass(frozen=True)
class NoiseConfig:
    noise_runs: int = 5  # baseline repeats that start the noise floor
    min_delta: float | None = None  # the smallest gain worth keeping; None: k_sigma x noise std
    k_sigma: float = 2.0  # min_delta = k_sigma x the pooled std's upper confidence bound
    min_delta_floor: float = 1e-4  # never keep a change smaller than this
    confidence: float = 0.9  # level of the std's upper bound (chi-square, pooled repeats)
    outlier_share: float = 0.8  # a run below this x its peers' median steps/s is re-run, not pooled
    max_outlier_reruns: int = 3  # re-runs of slow runs per baseline or confirmation


@dataclass(frozen=True)
class ConfirmConfig:
    enabled: bool = True  # false: the single-run rule (keep when one run beats best by min_delta)
    screen_sigma: float = 1.0  # a run beating best by this x the std's upper bound is confirmed
    alpha: float = 0.05  # SPRT: bound on keeping a change whose true gain is 0
    beta: float = 0.10  # SPRT: bound on discarding a true gain of min_delta (before the cap)
    max_pairs: int = 5  # undecided after this many (candidate, best) pairs: discard
    remeasure_every: int = 10  # experiments between re-runs of best (0: never)
    remeasure_hours: float = 6.0  # hours between re-runs of best (0: never)
    drift_sigma: float = 3.0  # a re-run of best this many sigma_d from its mean is drift
    drift_throughput: float = 0.15  # a steps/s change of this share from best's own is drift


@dataclass(frozen=True)
class EarlyStopConfig:
    enabled: bool = True
    rule: str = "race"  # race (equal-time race) | forecast (calibrated forecast); docs/early-stop.md
    interval_s: float = 30.0  # seconds of training between checks
    min_fraction: float = 0.2  # no stop before this share of the budget
    min_history: int = 5  # finished runs at this budget needed before any stop but a divergence
    race_c: float = 0.7  # place of the stop line between the best run (0) and the median (1)
    race_c_closing: float = 0.85  # race_c for a run whose place, on the same runs, fell since its last check
    race_safety: float = 0.0  # the line leaves this x the room the repo's winners needed (0: off)
    race_noise_k: float = 2.0  # the line is at least this x sqrt(2) x noise floor above the best run
    beta: float = 0.05  # forecast rule: level of the stop boundary
    alpha: float = 0.01  # forecast rule: level of the accept boundary
    margin_k: float = 1.0  # forecast rule: threshold = best + margin_k x noise floor
    delta_k: float = 4.0  # forecast rule: indifference zone = delta_k x noise floor


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "random"  # random | optuna | agent | llm | rl
    agenda: str = "AGENDA.md"  # research agenda shown to LLM policies (path in the repo)
    history_k: int = 32  # experiments in the history window
    diff_chars: int = 1500  # characters of each history entry's diff shown in the prompt
    max_tries: int = 3  # proposals tried (each failure fed back) before recording `invalid`
    max_diff_bytes: int = 65536  # larger diffs are invalid
    max_move_factor: float = 0.0  # a diff moving a positive constant beyond x this (or 1/this) is invalid; 0: off
    min_move_factor: float = 0.0  # a diff whose largest move of a positive constant is under x this is invalid; 0: off
    repair_stale_lines: bool = True  # a removed `NAME = value` line with a stale value is read as the file's
    system_prompt: str = ""  # file with a system prompt replacing the built-in one
    seed: int | None = None  # random, optuna (and rl, unless [rl] seed) policies' seed, and each run's GITRESEARCH_SEED; None: fresh entropy
    skip_constants: tuple[str, ...] = ()  # constants the random and optuna policies leave alone
    random_min_factor: float = 1.0  # random policy: every factor at least this far from 1 (x or /, within x3); 1: off
    random_momentum: float = 0.0  # random policy: after a keep, the chance to repeat its steps (moves `again`); 0: off
    sampler: str = "tpe"  # optuna policy: tpe | gp | cmaes | qmc
    suggest: str = ""  # llm policy: "" | tpe | gp: show this sampler's suggestion in the prompt
    agent_command: str = ""  # agent policy: the coding agent's shell command (docs/policies.md)
    agent_timeout_s: float = 1800.0  # agent policy: wall seconds one proposal may take


@dataclass(frozen=True)
class RewardConfig:
    improvement_weight: float = 1.0  # per noise sigma of val_bpb gained over the parent
    improvement_clip: float = 10.0  # sigmas; one lucky or broken run does not swamp the rest
    # x each sigma lost against the parent: 1 scores a loss as a gain of the same size; below 1 a
    # loser costs less (0: only gains count, the expected improvement of a search for the best)
    loss_weight: float = 1.0
    # all: any valid run's gain over its parent is paid; keeps: only a kept (confirmed) run's, so a
    # discard near best that came out better than its parent by noise earns nothing for it
    paid_gains: str = "all"
    time_weight: float = 0.2  # x share of the budget the run trained for
    memory_weight: float = 0.1  # x relative peak memory above the baseline's
    novelty_epsilon: float = 0.1  # x (1 - max Jaccard similarity to the window's diffs)
    # lines: novelty is that alone; constants: also x (1 - the mean share of the window's
    # constant-moving diffs that move each constant this diff moves), so narrowing costs
    novelty: str = "lines"
    # a failed experiment scores -penalty - its time share, below any valid run (whose floor is
    # -improvement_weight x loss_weight x improvement_clip - 1); load() refuses penalties that break the order
    invalid_penalty: float = 12.0
    crash_penalty: float = 12.0
    timeout_penalty: float = 12.0

    def valid_floor(self) -> float:
        """The lowest total a valid run can score: the clipped improvement and efficiency."""
        return -self.improvement_weight * self.loss_weight * self.improvement_clip - 1.0


PROMPTS = ("full", "compact")  # [llm] prompt: what the policy's model reads (policies/prompt.py)
REPLIES = ("diff", "moves")  # [llm] reply: the form the compact prompt asks for (policies/moves.py)
OPTIMIZERS = ("adamw", "adamw8bit", "paged_adamw8bit", "paged_adamw")
PAID_GAINS = ("all", "keeps")  # [reward] paid_gains: whose gain over its parent is paid (reward.py)
NOVELTY_FORMS = ("lines", "constants")  # [reward] novelty: what the novelty term measures (reward.py)
KL_MODES = ("loss", "reward")  # [rl] kl_mode: where the penalty to the reference acts (policies/ppo.py)


@dataclass(frozen=True)
class RLConfig:
    lora_r: int = 16  # LoRA rank
    lora_alpha: float = 32.0
    target_modules: tuple[str, ...] = ()  # empty: peft's default for the architecture
    learning_rate: float = 5e-5  # AdamW on the adapters and the value head
    kl_coef: float = 0.05  # per-token KL penalty to the reference (the base, adapters off)
    kl_mode: str = "loss"  # loss: a bounded k3 term in the loss (GRPO); reward: -kl_coef*(logp-ref) per token
    kl_target: float = 0.0  # per-token KL (nats) the adaptive controller holds kl_coef to; 0: fixed
    kl_coef_max: float = 1.0  # the adaptive controller's ceiling on kl_coef
    kl_coef_min: float = 0.0  # its floor: drift that starts while kl_coef is tiny is still resisted
    kl_horizon: int = 16  # episodes over which kl_coef moves by at most 20 % (adaptive control)
    gamma: float = 1.0  # discount over response tokens
    lam: float = 1.0  # GAE lambda; 1: the whole reply shares the experiment's reward
    reward_norm: bool = True  # rewards centred and scaled by the running mean and std of all so far
    reward_clip: float = 5.0  # normalised rewards clipped to +-this (std units)
    adv_std_floor: float = 1.0  # advantages divided by max(batch std, this); 0: plain whitening
    clip_range: float = 0.2  # policy ratio clip
    clip_range_value: float = 0.2  # value clip, around the values stored at generation
    vf_coef: float = 0.5  # value loss weight
    ent_coef: float = 0.01  # entropy bonus weight
    token_share: float = 1.0  # share of each reply's tokens, its highest-entropy ones, in the policy and entropy terms
    max_grad_norm: float = 1.0
    ppo_epochs: int = 4  # passes over the replay per update
    minibatch_size: int = 1  # episodes per forward pass (left-padded with position_ids)
    update_every: int = 4  # experiments between updates
    # experiments before the first update: the first updates otherwise learn from a handful of
    # episodes scaled by statistics of a handful of rewards (the gym: PPO fell behind its prior there)
    update_after: int = 0
    update_until: int = 0  # no update after this many experiments (the adapters stay as learned); 0: no end
    # share of proposals sampled from the frozen prior (adapters off), drawn per proposal; they are
    # learned from with the prior as their behaviour policy, and left out of the KL controller's drift
    prior_share: float = 0.0
    # sample the Moves reply under its grammar ([llm] reply = "moves"): tokens that would make
    # it unreadable or name a constant not shown get probability 0 (policies/grammar.py)
    grammar: bool = False
    replay_size: int = 32  # the newest episodes an update learns from
    max_staleness: int = 2  # drop episodes generated more than this many versions ago
    seed: int | None = None  # sampling and adapter-init seed; None: [policy] seed (loop --seed), else fresh entropy
    # a fresh learner starts from another loop's saved one (its <git dir>/gitresearch/rl; relative
    # paths from the repo root): adapters, value head, optimiser, reward statistics, KL coefficient
    init_from: str = ""
    logit_chunk: int = 64  # reply positions per chunk of the log-softmax and entropy
    gradient_checkpointing: bool = True  # recompute the model's activations in the backward pass
    optimizer: str = "adamw"  # adamw (torch) | adamw8bit | paged_adamw8bit | paged_adamw (bitsandbytes)


@dataclass(frozen=True)
class LLMConfig:
    backend: str = "openai"  # openai (any chat-completions endpoint) | local (transformers)
    model: str = ""  # the endpoint's model name, or a local path / hub id
    base_url: str = ""  # empty: $<base_url_env>, else https://api.openai.com/v1
    base_url_env: str = "OPENAI_BASE_URL"
    api_key_env: str = "OPENAI_API_KEY"  # name of the variable holding the key (never its value)
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 2048  # tokens of reply
    context_tokens: int = 16384  # prompt + reply; the prompt drops old history to fit
    timeout_s: float = 300.0  # seconds to wait for one reply
    connect_timeout_s: float = 10.0
    retries: int = 4  # extra requests on 429, 5xx, timeouts and connection errors
    backoff_s: float = 2.0  # first wait between retries; doubles, jittered; Retry-After wins
    max_backend_failures: int = 3  # consecutive experiments lost to the endpoint stop the loop
    device: str = "auto"  # local backend: auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # local backend: auto | float32 | bfloat16 | float16
    prompt: str = "full"  # full (agenda, code, history with diffs) | compact (constants, short history)
    reply: str = "diff"  # the form the compact prompt asks for: diff | moves ("Moves: LR x2; DEPTH +1"; `again` repeats best's change)


@dataclass(frozen=True)
class LoopConfig:
    max_experiments: int | None = None  # stop after this many experiments (baseline excluded)
    max_hours: float | None = None
    patience: int | None = None  # stop after this many experiments without improvement
    workers: int = 1  # experiments at once on this machine (one per GPU; on a CPU, cores split)
    remote: str = ""  # a git remote shared with other machines ("": this repo alone)


@dataclass(frozen=True)
class Config:
    schema: int = SCHEMA
    run: RunConfig = field(default_factory=RunConfig)
    files: FilesConfig = field(default_factory=FilesConfig)
    metric: MetricConfig = field(default_factory=MetricConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    confirm: ConfirmConfig = field(default_factory=ConfirmConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    # [search]: the optuna policy's space, per constant ("NAME" or "path:NAME"): an inline table
    # of low, high (numbers), log (bool), step (number), fixed (bool: not searched)
    search: dict = field(default_factory=dict)


SEARCH_KEYS = {"low": "float", "high": "float", "step": "float", "log": "bool", "fixed": "bool"}


def _search_table(table: dict, where: str) -> dict:
    out = {}
    for name, spec in table.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"{where} {name} = {spec!r}: expected a table such as {{low = 1e-4, high = 0.1, log = true}}")
        unknown = set(spec) - set(SEARCH_KEYS)
        if unknown:
            raise ConfigError(f"{where} {name}: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(SEARCH_KEYS)})")
        out[name] = {key: checked(value, SEARCH_KEYS[key], f"{where} {name}.{key}") for key, value in spec.items()}
        if "low" in spec and "high" in spec and not spec["low"] < spec["high"]:
            raise ConfigError(f"{where} {name}: low {spec['low']!r} is not below high {spec['high']!r}")
    return out


def _section(cls, table: dict, where: str):
    known = {f.name: f for f in fields(cls)}
    unknown = set(table) - set(known)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")
    values = {}
    for name, value in table.items():
        if isinstance(value, list):
            value = tuple(value)
        if name in ("command", "setup", "evaluate") and isinstance(value, str):
            value = tuple(value.split())
        values[name] = checked(value, known[name].type, f"{where} {name}")
    return cls(**values)


def checked(value, annotation: str, where: str):
    """`value` if it has the setting's declared type (an int passes where a float is declared,
    and stays an int so notes that record it read as before); anything else is a ConfigError
    naming the key and the expected type."""
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None and "None" in kinds:
        return None
    for kind in kinds:
        if kind == "bool" and isinstance(value, bool):
            return value
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if kind == "str" and isinstance(value, str):
            return value
        if kind == "tuple[str, ...]" and isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            return value
    raise ConfigError(f"{where} = {value!r}: expected {annotation.replace('tuple[str, ...]', 'a list of strings')}")


def parse_settings(items) -> dict[str, object]:
    """`--set SECTION.NAME=VALUE` items -> load()'s overrides. VALUE is read as a TOML value
    (0.0, true, "text", [1, 2]); anything TOML does not read is taken as a bare string. The key
    must name a setting of gitresearch.toml ([search] is a table of its own: not settable)."""
    sections = {f.name: f.default_factory() for f in fields(Config) if f.name not in ("schema", "search")}
    out: dict[str, object] = {}
    for item in items:
        key, equals, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        known = {f.name: f.type for f in fields(sections[section])} if section in sections else {}
        if not equals or not dot or name not in known:
            raise ConfigError(f"--set {item}: expected SECTION.NAME=VALUE naming a setting of "
                              f"gitresearch.toml (sections: {', '.join(sections)})")
        try:
            value = tomllib.loads(f"value = {text.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        value = tuple(value) if isinstance(value, list) else value
        out[f"{section}.{name}"] = checked(value, known[name], f"--set {section}.{name}")
    return out


def load(root: Path, overrides: dict[str, object] | None = None) -> Config:
    """Read ROOT/gitresearch.toml (absent: all defaults); `overrides` maps "section.name" to a
    value from the command line; None values are ignored."""
    path = Path(root) / CONFIG_FILE
    data = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: {err}") from err
    schema = data.pop("schema", SCHEMA)
    if schema > SCHEMA:
        raise ConfigError(f"{path}: schema {schema} is newer than this gitresearch ({SCHEMA})")
    sections = {}
    for f in fields(Config):
        if f.name == "search":
            sections["search"] = _search_table(data.pop("search", {}), f"{path} [search]")
            continue
        if f.name == "schema":
            continue
        sections[f.name] = _section(f.default_factory().__class__, data.pop(f.name, {}),
                                    f"{path} [{f.name}]")
    if data:
        raise ConfigError(f"{path}: unknown section(s) {', '.join(sorted(data))}")
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        section, name = key.split(".")
        annotation = next(f.type for f in fields(sections[section]) if f.name == name)
        sections[section] = replace(sections[section], **{name: checked(value, annotation, f"--{name}")})
    if sections["metric"].direction != "minimize":
        raise ConfigError(f"{path} [metric] direction = {sections['metric'].direction!r}: only "
                          f"\"minimize\" is supported; to maximise a score, have the script (or the "
                          f"evaluator) report its negative, e.g. neg_accuracy")
    if sections["policy"].max_move_factor != 0 and not sections["policy"].max_move_factor > 1:
        raise ConfigError(f"{path} [policy] max_move_factor = {sections['policy'].max_move_factor!r}: "
                          f"expected a factor above 1, or 0 (off)")
    low, high = sections["policy"].min_move_factor, sections["policy"].max_move_factor
    if low != 0 and not (low > 1 and (high == 0 or low < high)):
        raise ConfigError(f"{path} [policy] min_move_factor = {low!r}: expected a factor above 1 and below "
                          f"max_move_factor ({high!r}, 0: off), or 0 (off)")
    if not sections["policy"].random_min_factor >= 1:  # its upper bound is the policy's (RandomSearch)
        raise ConfigError(f"{path} [policy] random_min_factor = {sections['policy'].random_min_factor!r}: expected "
                          f"a factor of 1 (off) or more")
    if not 0 <= sections["policy"].random_momentum <= 1:
        raise ConfigError(f"{path} [policy] random_momentum = {sections['policy'].random_momentum!r}: expected "
                          f"a chance from 0 (off) to 1 (always repeat a keep)")
    if sections["policy"].suggest not in ("", "tpe", "gp"):
        raise ConfigError(f"{path} [policy] suggest = {sections['policy'].suggest!r}: expected "
                          f"\"tpe\", \"gp\" or \"\" (off)")
    if sections["policy"].sampler not in ("tpe", "gp", "cmaes", "qmc"):
        raise ConfigError(f"{path} [policy] sampler = {sections['policy'].sampler!r}: expected "
                          f"\"tpe\", \"gp\", \"cmaes\" or \"qmc\"")
    if sections["llm"].prompt not in PROMPTS:
        raise ConfigError(f"{path} [llm] prompt = {sections['llm'].prompt!r}: expected one of {', '.join(PROMPTS)}")
    if sections["llm"].reply not in REPLIES:
        raise ConfigError(f"{path} [llm] reply = {sections['llm'].reply!r}: expected one of {', '.join(REPLIES)}")
    if sections["rl"].optimizer not in OPTIMIZERS:
        raise ConfigError(f"{path} [rl] optimizer = {sections['rl'].optimizer!r}: expected one of "
                          f"{', '.join(OPTIMIZERS)}")
    if sections["rl"].kl_mode not in KL_MODES:
        raise ConfigError(f"{path} [rl] kl_mode = {sections['rl'].kl_mode!r}: expected one of {', '.join(KL_MODES)}")
    if not 0 <= sections["rl"].kl_coef_min <= sections["rl"].kl_coef_max:
        raise ConfigError(f"{path} [rl] kl_coef_min = {sections['rl'].kl_coef_min!r}: expected between 0 "
                          f"and kl_coef_max ({sections['rl'].kl_coef_max!r})")
    if not 0 <= sections["rl"].prior_share <= 1:
        raise ConfigError(f"{path} [rl] prior_share = {sections['rl'].prior_share!r}: expected a share in [0, 1]")
    if sections["rl"].grammar and sections["llm"].reply != "moves":
        raise ConfigError(f"{path} [rl] grammar = true samples the Moves reply's grammar: it needs [llm] reply = "
                          f"\"moves\", not {sections['llm'].reply!r}")
    if not 0 < sections["rl"].token_share <= 1:
        raise ConfigError(f"{path} [rl] token_share = {sections['rl'].token_share!r}: expected a share in (0, 1]")
    reward_config = sections["reward"]
    if not 0 <= reward_config.loss_weight <= 1:
        raise ConfigError(f"{path} [reward] loss_weight = {reward_config.loss_weight!r}: expected a weight in [0, 1]")
    if reward_config.novelty not in NOVELTY_FORMS:
        raise ConfigError(f"{path} [reward] novelty = {reward_config.novelty!r}: expected one of "
                          f"{', '.join(NOVELTY_FORMS)}")
    if reward_config.paid_gains not in PAID_GAINS:
        raise ConfigError(f"{path} [reward] paid_gains = {reward_config.paid_gains!r}: expected one of "
                          f"{', '.join(PAID_GAINS)}")
    for name in ("invalid_penalty", "crash_penalty", "timeout_penalty"):
        if -getattr(reward_config, name) >= reward_config.valid_floor():
            raise ConfigError(f"{path} [reward] {name} = {getattr(reward_config, name)!r}: a failed "
                              f"experiment must score below any valid run, whose floor is "
                              f"{reward_config.valid_floor():g} (improvement_weight x loss_weight x improvement_clip + 1); "
                              f"set it above {-reward_config.valid_floor():g}")
    if sections["early_stop"].rule not in ("race", "forecast"):
        raise ConfigError(f"{path} [early_stop] rule = {sections['early_stop'].rule!r}: expected "
                          f"\"race\" or \"forecast\"")
    return Config(schema=schema, **sections)
