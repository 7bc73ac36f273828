"""CMA-ES whose state is the notes: the optuna policy's `--sampler cmaes` (docs/policies.md).

CMA-ES's state (mean, step size, covariance) is a function of the generations told so far,
in order. Each CMA-ES proposal's note records its generation; the state is rebuilt by
telling every complete generation again, from the baseline, at every proposal. So a killed
or resumed loop, or a second machine, continues the same search with no state outside git.

A generation is told once `population_size` of its experiments have an outcome (the first
ones by experiment number): a finished run with its value, and an early-stopped, crashed or
invalid one as worse than every finished run (CMA-ES reads only the ranking). Booleans, which
CMA-ES cannot search, are drawn at random, as Optuna's CmaEsSampler does.
"""
from __future__ import annotations

import math

import numpy as np

SIGMA0 = 1 / 6  # initial step size in the unit cube (Optuna's CmaEsSampler default)


def _bounds(dim) -> tuple[float, float]:
    low, high = dim.dist.low, dim.dist.high
    return (math.log(low), math.log(high)) if dim.dist.log else (low, high)


def to_unit(dim, search_value: float) -> float:
    """A value on the search scale as a position in [0, 1]."""
    low, high = _bounds(dim)
    value = math.log(search_value) if dim.dist.log else search_value
    return (value - low) / (high - low) if high > low else 0.5


def from_unit(dim, position: float):
    """A position in [0, 1] as a value on the search scale (on an int's step grid)."""
    low, high = _bounds(dim)
    value = low + min(max(float(position), 0.0), 1.0) * (high - low)
    value = math.exp(value) if dim.dist.log else value
    step = getattr(dim.dist, "step", None)
    if step is not None:
        value = dim.dist.low + round((value - dim.dist.low) / step) * step
        value = min(max(value, dim.dist.low), dim.dist.high)
        if isinstance(dim.baseline, int):
            value = int(round(value))
    return value


class CmaReplay:
    """CMA-ES over the numeric dimensions of a space, rebuilt from the study's trials (each
    CMA-ES trial carries its generation in user_attrs["generation"])."""

    def __init__(self, space: dict):
        self.space = space
        self.numeric = [k for k, dim in space.items() if not hasattr(dim.dist, "choices")]
        self.categorical = [k for k in space if k not in self.numeric]

    def optimizer(self, trials, proposal_seed: int | None):
        """The CMA-ES state after every complete generation of `trials` (Optuna FrozenTrials)."""
        from cmaes import CMA
        from optuna.trial import TrialState

        mean = np.array([to_unit(self.space[k], self.space[k].search_value(self.space[k].baseline))
                         for k in self.numeric])
        bounds = np.array([[0.0, 1.0]] * len(self.numeric))
        # the replay draws nothing, so the proposal's own seed only sets the next sample
        cma = CMA(mean=np.clip(mean, 0, 1), sigma=SIGMA0, bounds=bounds, seed=proposal_seed)
        complete = [t.value for t in trials if t.state == TrialState.COMPLETE]
        worst = max(complete, default=0.0)
        by_generation: dict[int, list] = {}
        for t in trials:
            generation = t.user_attrs.get("generation")
            if generation is None or t.state == TrialState.RUNNING:
                continue
            if not all(k in t.params for k in self.numeric):
                continue  # made before the space changed: not a point of this search
            value = t.value if t.state == TrialState.COMPLETE else worst + 1.0
            x = np.array([to_unit(self.space[k], t.params[k]) for k in self.numeric])
            by_generation.setdefault(generation, []).append((x, value))
        while len(by_generation.get(cma.generation, [])) >= cma.population_size:
            cma.tell(by_generation[cma.generation][:cma.population_size])
        return cma

    def ask(self, cma, rng: np.random.Generator) -> tuple[dict, int]:
        """(params on the search scale, generation) for the next experiment."""
        x = cma.ask() if self.numeric else np.array([])
        params = {k: from_unit(self.space[k], x[i]) for i, k in enumerate(self.numeric)}
        for k in self.categorical:
            choices = self.space[k].dist.choices
            params[k] = choices[int(rng.integers(len(choices)))]
        return params, cma.generation
