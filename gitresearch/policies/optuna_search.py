"""Optuna's samplers as a policy (docs/policies.md): the live constants of the editable files
(constants.py) are the search space, the study is rebuilt from the git notes at every
proposal (the repo stays the only state), and a proposal sets every searched constant to the
sampler's next suggestion.

    gitresearch loop --policy optuna --sampler tpe      # or gp
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from ..diffs import diff_sha
from ..gitstore import GitError
from ..workers import visible_gpus
from . import PolicyError, Proposal, State
from .cma import CmaReplay
from .constants import find_sites, rewrite

# CMA-ES and QMC keep their state (generation, sequence index) outside the trials: each
# note records it, and the state is rebuilt from the notes (cma.py; QMC's index below).
SAMPLERS = ("tpe", "gp", "cmaes", "qmc")
SPAN = 10.0  # floats are searched within x/÷ this of the baseline's value
INT_SPAN = 4  # ints within x/÷ this
MAX_ASKS = 50  # suggestions tried per proposal before giving up (repeats, no change)


def _share(odds: float) -> float:
    return odds / (1 + odds)


@dataclass(frozen=True)
class Dimension:
    """One searched constant: Optuna's distribution on the search scale, the baseline's value,
    and whether that scale is a share's log-odds (a beta of 0.9 and one of 0.99 are as far
    apart as 0.5 and 0.9: searched linearly, the region near 1 is almost never sampled)."""
    dist: object
    baseline: object
    logit: bool = False

    def to_search(self, value):
        if not self.logit:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            return None
        return math.log(value / (1 - value))

    def from_search(self, value):
        """A search-scale value back on the file's scale, unrounded (to 12 digits)."""
        return float(f"{_share(math.exp(value)):.12g}") if self.logit else value

    def to_file(self, value):
        """A search-scale value as it is written into the file (4 significant digits; a share
        near 1 to 4 digits of its distance from 1), in bounds."""
        if self.logit:
            share = _share(math.exp(value))
            share = 1 - float(f"{1 - share:.4g}") if share > 0.5 else float(f"{share:.4g}")
            low, high = _share(math.exp(self.dist.low)), _share(math.exp(self.dist.high))
            return min(max(share, low), high)
        if isinstance(value, float) and getattr(self.dist, "step", None) is None:
            return min(max(float(f"{value:.4g}"), self.dist.low), self.dist.high)
        return value

    def inside(self, value) -> bool:
        """Whether a value read from a note or a file lies in the space (else that trial cannot
        enter the study: Optuna refuses it)."""
        dist = self.dist
        if hasattr(dist, "choices"):
            return value in dist.choices and any(type(value) is type(c) for c in dist.choices)
        value = self.to_search(value)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        slack = 1e-9 * (dist.high - dist.low) if self.logit else 0  # the file's rounding
        return dist.low - slack <= value <= dist.high + slack

    def search_value(self, value):
        """A file value on the search scale, clamped into the bounds it lies within."""
        value = self.to_search(value)
        if self.logit:
            value = min(max(value, self.dist.low), self.dist.high)
        return value


def dimension_for(value, override: dict | None = None) -> Dimension | None:
    """How a constant is searched: around its baseline value by default (floats x/÷10 on a log
    scale, shares x/÷10 in odds on the log-odds scale, positive ints x/÷4, bools both ways),
    with a [search] entry's low, high, log and step on top; None: left fixed."""
    import optuna.distributions as d

    override = override or {}
    if override.get("fixed"):
        return None
    if isinstance(value, bool):
        return Dimension(d.CategoricalDistribution([False, True]), value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    default = None
    if isinstance(value, int) and value > 0:
        default = (max(1, value // INT_SPAN), value * INT_SPAN, True)
    elif isinstance(value, float) and 0 < value < 1:  # a share (momentum, beta, fraction) stays a share
        odds = value / (1 - value)
        default = (_share(odds / SPAN), _share(odds * SPAN), False)
    elif isinstance(value, float) and value > 0:
        default = (value / SPAN, value * SPAN, True)
    if not {"low", "high"} <= set(override) and default is None:
        return None  # a zero or a sign has no scale to search around: give low and high
    low, high, log = (default or (None, None, False))
    low, high = override.get("low", low), override.get("high", high)
    log, step = override.get("log", log and "step" not in override), override.get("step")
    if isinstance(value, int):
        return Dimension(d.IntDistribution(int(low), int(high), log=log, step=int(step or 1)), value)
    logit = (isinstance(value, float) and 0 < value < 1 and "log" not in override and step is None
             and 0 < low < high < 1)
    if logit:
        return Dimension(d.FloatDistribution(math.log(low / (1 - low)), math.log(high / (1 - high))),
                         value, logit=True)
    return Dimension(d.FloatDistribution(float(low), float(high), log=log, step=step), value)


def make_sampler(name: str, seed: int | None):
    """The Optuna sampler the study asks; CMA-ES asks its own replay (cma.py) and the study
    only holds its trials."""
    import optuna

    if name in ("tpe", "cmaes"):
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "qmc":  # one scrambled Sobol sequence for the whole search: the seed stays fixed
        with warnings.catch_warnings():  # "experimental" since Optuna 3.0: said once in the docs
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed or 0)
    raise PolicyError(f"unknown sampler {name!r} (available: {', '.join(SAMPLERS)})")


class OptunaSearch:
    name = "optuna"

    def __init__(self, config, store, seed: int | None = None, sampler: str | None = None,
                 cuda: bool | None = None):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.store = store
        self.seed = seed if seed is not None else config.policy.seed
        self.sampler = sampler or config.policy.sampler
        make_sampler(self.sampler, 0)  # an unknown name fails here, not at the first proposal
        self.skip = config.policy.skip_constants
        self.metric = config.metric.name
        self.overrides = config.search  # [search]: per-constant bounds, log, step, fixed
        self.cuda = bool(visible_gpus()) if cuda is None else cuda
        self.space: dict[str, Dimension] = {}  # "path:constant" -> how it is searched, from the baseline

    def search_space(self, paths) -> dict[str, Dimension]:
        """The baseline's live constants and how each is searched ("path:NAME" keys)."""
        if not self.space:
            baseline = self.store.experiment_commit(0)
            for path in sorted(paths):
                source = self.store.read_file(baseline, path)
                for site in find_sites(source, self.skip, cuda=self.cuda, metric=self.metric):
                    key = f"{path}:{site.name}"
                    override = self.overrides.get(key, self.overrides.get(site.name))
                    if override is None and site.kind == "exponent":  # 2**k: k in steps, not x/÷4
                        override = {"low": max(0, site.value - 3), "high": site.value + 3, "log": False}
                    try:
                        dim = dimension_for(site.value, override)
                    except ValueError as err:  # Optuna refuses the combination (log with a step...)
                        raise PolicyError(f"[search] {key}: {err}") from err
                    if dim is not None:
                        self.space[key] = dim
        return self.space

    def read_params(self, commit: str) -> dict:
        """The searched constants' values in an experiment's files: how an experiment still
        training (no note yet), rerun after a kill or made by another policy enters the study."""
        files = {}
        for path in sorted({key.split(":", 1)[0] for key in self.space}):
            try:
                files[path] = self.store.read_file(commit, path)
            except GitError:  # the file is not in that tree
                continue
        return self.values_in(files)

    def study(self, paths):
        """The study as the notes tell it: every experiment with parameters, in order."""
        import optuna
        from optuna.trial import TrialState, create_trial

        space = self.search_space(paths)
        experiments = list(reversed(self.store.experiments()))
        seed = None if self.seed is None else self.seed + len(experiments)
        study = optuna.create_study(direction="minimize", sampler=make_sampler(
            self.sampler, self.seed if self.sampler == "qmc" else seed))
        invalid = []
        for exp in experiments:
            record = exp.record
            if exp.number == 0:
                params = {key: dim.baseline for key, dim in space.items()}
            else:
                params = ((record or {}).get("policy_data") or {}).get("params") or self.read_params(exp.commit)
            file_params = {k: v for k, v in params.items() if k in space and space[k].inside(v)}
            params = {k: space[k].search_value(v) for k, v in file_params.items()}
            if not params:
                continue
            dists = {k: space[k].dist for k in params}
            data = (record or {}).get("policy_data") or {}
            # the sampler's own state (CMA-ES generation, QMC index) when this policy made it
            attrs = {k: data[k] for k in ("generation", "qmc_index") if data.get("sampler") == self.sampler
                     and isinstance(data.get(k), int)}
            status = (record or {}).get("status")
            if status in ("keep", "discard", "baseline") and record.get("val_bpb") is not None:
                study.add_trial(create_trial(params=params, distributions=dists, user_attrs=attrs, value=record["val_bpb"]))
            elif status == "early_stop":
                steps = {i: c["value"] if c.get("value") is not None else c.get("mean")
                         for i, c in enumerate(record.get("checks") or [])}
                study.add_trial(create_trial(params=params, distributions=dists, user_attrs=attrs, state=TrialState.PRUNED,
                                             intermediate_values={i: v for i, v in steps.items() if v is not None}))
            elif record is None or status == "confirming":  # running: constant liar counts it
                study.add_trial(create_trial(params=params, distributions=dists, user_attrs=attrs, state=TrialState.RUNNING))
            else:  # crash, timeout, invalid
                study.add_trial(create_trial(params=params, distributions=dists, user_attrs=attrs, state=TrialState.FAIL))
                if status == "invalid":
                    invalid.append(file_params)
        return study, invalid

    def suggest(self, state: State):
        """(params, diff, description, study, state): the sampler's next suggestion as an edit
        of best, the study it came from, and the sampler's state to record in the note."""
        import numpy as np
        from optuna.trial import TrialState

        study, invalid = self.study(state.files)
        space = self.space
        if not space:
            raise PolicyError("no live constant to search in the editable files")
        trials = study.get_trials(deepcopy=False)
        worst = max((t.value for t in trials if t.state == TrialState.COMPLETE), default=None)
        proposal_seed = None if self.seed is None else self.seed + len(trials)
        if self.sampler == "cmaes":
            replay = CmaReplay(space)
            cma, rng = replay.optimizer(trials, proposal_seed), np.random.default_rng(proposal_seed)
        qmc_index = 1 + max((t.user_attrs.get("qmc_index", -1) for t in trials), default=-1)
        if self.sampler == "qmc":  # the sequence continues where the notes left it
            for _ in range(qmc_index):
                study.tell(study.ask({key: dim.dist for key, dim in space.items()}), state=TrialState.FAIL)
        # the sites of best's files, found once: every ask below edits the same sources
        sites = {f"{path}:{site.name}": (path, site) for path, source in state.files.items()
                 for site in find_sites(source, self.skip, cuda=self.cuda, metric=self.metric)}
        for ask in range(MAX_ASKS):
            if self.sampler == "cmaes":
                values, generation = replay.ask(cma, rng)
                trial, sampler_state = None, {"generation": generation}
            else:
                trial = study.ask({key: dim.dist for key, dim in space.items()})
                values = trial.params
                sampler_state = {"qmc_index": qmc_index + ask} if self.sampler == "qmc" else {}
            params = {key: dim.to_file(values[key]) for key, dim in space.items()}
            edits = {}
            for key, value in params.items():
                if key in sites and sites[key][1].value != value:
                    path, site = sites[key]
                    edits.setdefault(path, (state.files[path], []))[1].append((site, value))
            diff = "".join(self.store.make_diff(path, source, rewrite(source, changes))
                           for path, (source, changes) in edits.items())
            if not edits or params in invalid or diff_sha(diff) in state.tried_diffs:
                # told as the worst result so far, not as failed: a sampler that models only
                # completed trials (GP) would suggest the same point again
                if trial is not None:
                    study.tell(trial, state=TrialState.FAIL) if worst is None else study.tell(trial, worst)
                continue
            described = [f"{c[0].name} {c[0].value!r} -> {c[1]!r}" for _, changes in edits.values() for c in changes]
            description = f"{self.sampler}: " + "; ".join(described[:6]) + (
                f"; +{len(described) - 6} more" if len(described) > 6 else "")
            return params, diff, description, study, sampler_state
        raise PolicyError(f"{self.sampler}: no new suggestion in {MAX_ASKS} asks")

    def propose(self, state: State) -> Proposal:
        params, diff, description, _, sampler_state = self.suggest(state)
        return Proposal(diff, description, {"sampler": self.sampler, "params": params, **sampler_state})

    def top(self, study, k: int = 5) -> list[tuple[float, dict]]:
        """The k best completed configurations so far, (value, params), best first."""
        from optuna.trial import TrialState

        done = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.value)
        return [(t.value, self.file_params(t)) for t in done[:k]]

    def file_params(self, trial) -> dict:
        """A trial's parameters as the files hold them (a share's log-odds back to the share)."""
        return {key: self.space[key].from_search(v) for key, v in trial.params.items()}

    def values_in(self, files: dict[str, str]) -> dict:
        """The searched constants' values in these files ("path:NAME" keys)."""
        return {f"{path}:{site.name}": site.value for path, source in files.items()
                for site in find_sites(source, self.skip, cuda=self.cuda, metric=self.metric)
                if f"{path}:{site.name}" in self.space}

    def observe(self, record: dict) -> None:
        """Nothing to keep: the next proposal rebuilds the study from the notes."""
