"""Optuna's samplers as a policy (docs/policies.md): the live constants of the editable files
(constants.py) are the search space, the study is rebuilt from the git notes at every
proposal (the repo stays the only state), and a proposal sets every searched constant to the
sampler's next suggestion.

    gitresearch loop --policy optuna --sampler tpe      # or gp
"""
from __future__ import annotations

import math

from ..diffs import diff_sha
from ..gitstore import GitError
from ..workers import visible_gpus
from . import PolicyError, Proposal, State
from .constants import find_sites, rewrite

# CMA-ES and QMC keep their state (generation, sequence index) in the study's system
# attributes, which a study rebuilt from the notes does not have: not offered yet.
SAMPLERS = ("tpe", "gp")
SPAN = 10.0  # floats are searched within x/÷ this of the baseline's value
INT_SPAN = 4  # ints within x/÷ this
MAX_ASKS = 50  # suggestions tried per proposal before giving up (repeats, no change)


def _share(odds: float) -> float:
    return odds / (1 + odds)


def distribution_for(value, override: dict | None = None):
    """The search distribution of a constant: around its baseline value by default, with a
    [search] entry's low, high, log and step on top; None: left fixed."""
    import optuna.distributions as d

    override = override or {}
    if override.get("fixed"):
        return None
    if isinstance(value, bool):
        return d.CategoricalDistribution([False, True])
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
        return d.IntDistribution(int(low), int(high), log=log, step=int(step or 1))
    return d.FloatDistribution(float(low), float(high), log=log, step=step)


def make_sampler(name: str, seed: int | None):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise PolicyError(f"unknown sampler {name!r} (available: {', '.join(SAMPLERS)})")


def _inside(dist, value) -> bool:
    """Whether a value read from a note or a file lies in the distribution (else that trial
    cannot enter the study: Optuna refuses it)."""
    if hasattr(dist, "choices"):
        return value in dist.choices and any(type(value) is type(c) for c in dist.choices)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return dist.low <= value <= dist.high


def _round(value, dist):
    """A suggestion as it is written into the file (4 significant digits), kept in bounds."""
    if isinstance(value, float) and getattr(dist, "step", None) is None:
        value = min(max(float(f"{value:.4g}"), dist.low), dist.high)
    return value


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
        self.space: dict[str, object] = {}  # "path:constant" -> distribution, from the baseline

    def search_space(self, paths) -> dict:
        """The baseline's live constants and their distributions ("path:NAME" keys)."""
        if not self.space:
            baseline = self.store.experiment_commit(0)
            for path in sorted(paths):
                source = self.store.read_file(baseline, path)
                for site in find_sites(source, self.skip, cuda=self.cuda, metric=self.metric):
                    key = f"{path}:{site.name}"
                    override = self.overrides.get(key, self.overrides.get(site.name))
                    try:
                        dist = distribution_for(site.value, override)
                    except ValueError as err:  # Optuna refuses the combination (log with a step...)
                        raise PolicyError(f"[search] {key}: {err}") from err
                    if dist is not None:
                        self.space[key] = (dist, site.value)
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
        study = optuna.create_study(direction="minimize", sampler=make_sampler(self.sampler, seed))
        invalid = []
        for exp in experiments:
            record = exp.record
            if exp.number == 0:
                params = {key: value for key, (_, value) in space.items()}
            else:
                params = ((record or {}).get("policy_data") or {}).get("params") or self.read_params(exp.commit)
            params = {k: v for k, v in params.items() if k in space and _inside(space[k][0], v)}
            if not params:
                continue
            dists = {k: space[k][0] for k in params}
            status = (record or {}).get("status")
            if status in ("keep", "discard", "baseline") and record.get("val_bpb") is not None:
                study.add_trial(create_trial(params=params, distributions=dists, value=record["val_bpb"]))
            elif status == "early_stop":
                steps = {i: c["value"] if c.get("value") is not None else c.get("mean")
                         for i, c in enumerate(record.get("checks") or [])}
                study.add_trial(create_trial(params=params, distributions=dists, state=TrialState.PRUNED,
                                             intermediate_values={i: v for i, v in steps.items() if v is not None}))
            elif record is None or status == "confirming":  # running: constant liar counts it
                study.add_trial(create_trial(params=params, distributions=dists, state=TrialState.RUNNING))
            else:  # crash, timeout, invalid
                study.add_trial(create_trial(params=params, distributions=dists, state=TrialState.FAIL))
                if status == "invalid":
                    invalid.append(params)
        return study, invalid

    def suggest(self, state: State):
        """(params, diff, description, study): the sampler's next suggestion as an edit of
        best, and the study it came from."""
        from optuna.trial import TrialState

        study, invalid = self.study(state.files)
        space = self.space
        if not space:
            raise PolicyError("no live constant to search in the editable files")
        # the sites of best's files, found once: every ask below edits the same sources
        sites = {f"{path}:{site.name}": (path, site) for path, source in state.files.items()
                 for site in find_sites(source, self.skip, cuda=self.cuda, metric=self.metric)}
        for _ in range(MAX_ASKS):
            trial = study.ask({key: dist for key, (dist, _) in space.items()})
            params = {key: _round(trial.params[key], space[key][0]) for key in space}
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
                worst = max((t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))),
                            default=None)
                if worst is None:
                    study.tell(trial, state=TrialState.FAIL)
                else:
                    study.tell(trial, worst)
                continue
            described = [f"{c[0].name} {c[0].value!r} -> {c[1]!r}" for _, changes in edits.values() for c in changes]
            description = f"{self.sampler}: " + "; ".join(described[:6]) + (
                f"; +{len(described) - 6} more" if len(described) > 6 else "")
            return params, diff, description, study
        raise PolicyError(f"{self.sampler}: no new suggestion in {MAX_ASKS} asks")

    def propose(self, state: State) -> Proposal:
        params, diff, description, _ = self.suggest(state)
        return Proposal(diff, description, {"sampler": self.sampler, "params": params})

    def top(self, study, k: int = 5) -> list[tuple[float, dict]]:
        """The k best completed configurations so far, (value, params), best first."""
        from optuna.trial import TrialState

        done = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.value)
        return [(t.value, t.params) for t in done[:k]]

    def values_in(self, files: dict[str, str]) -> dict:
        """The searched constants' values in these files ("path:NAME" keys)."""
        return {f"{path}:{site.name}": site.value for path, source in files.items()
                for site in find_sites(source, self.skip, cuda=self.cuda, metric=self.metric)
                if f"{path}:{site.name}" in self.space}

    def observe(self, record: dict) -> None:
        """Nothing to keep: the next proposal rebuilds the study from the notes."""
