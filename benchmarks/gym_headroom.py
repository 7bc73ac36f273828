#!/usr/bin/env python
"""How much better than random search can any proposal policy do in the research gym, and how
many seeds does `gitresearch bench research` need to see it? Issue 17 asks that the rl
policy's best after 300 experiments beat random search's. This benchmark measures the room
there is for that, away from the loop: it replays hill-climbing rules against the gym's
surrogate (gym_repo/train.py's own functions and surrogate.json: a run's true mean final,
its run-to-run noise, the hard rules), thousands of experiments a minute.

Every arm starts from the gym's baseline and proposes from best with the random policy's
code (random_search.random_changes: one to three constants, factors in [1/3, 3], divisor
relations kept), except where the arm says otherwise:

- random: the random policy;
- oracle-K: K of random's proposals, the one with the lowest true mean run (a perfect
  reranker: the ceiling of a policy that learns which of random's moves to make);
- wide: factors in [1/5, 5], beyond the bench's cap at x3 (does move size pay here?);
- narrow: factors in [3^-0.75, 3^0.75] (|ln factor| x0.75: a policy LM's moves, narrower than
  the random moves it imitated, docs/gym.md);
- bold: factors at least x1.5 from 1 (|ln factor| uniform in [ln 1.5, ln 3], either sign:
  `pretrain-policy --min-factor 1.5`'s teacher); bolder: at least x2;
- momentum: after a keep, the same steps again (moves.step_for, applied as the harness applies
  a Moves line) until one is not kept, at most 3;
- repeat: momentum with no cap (the rule `pretrain-policy --momentum` teaches: the newest past
  experiment was kept, so its steps again);
- bold-repeat, narrow-repeat: repeat, its fresh moves bold or narrow; bold100-repeat and
  bold150-repeat: bold for the first 100 or 150 experiments, then random's factors (wide
  early, fine late);
- bandit: Thompson sampling over the constants from their keeps and misses (a learner of
  which constants pay, the preference PPO could learn from keeps).

The keep rule stands in for the loop's (a screen at 1 sigma, then paired SPRT confirmation;
early stopping): a run is kept when its measured final (true mean + the surrogate's noise)
beats best's true mean by `margin` noise sigmas and its true mean is lower. Calibration: the
random arm's median over seeds against the bench's random loops (docs/gym.md).

    python benchmarks/gym_headroom.py OUT.json [--seeds 20] [--experiments 300] [--margin 2]

Output: OUT.json {"schema": 1, "seeds", "experiments", "margin", "noise_sd", "wall_s",
"arms": {arm: {"best": [final true best per seed], "median", "median_at": {experiments: median
best so far}, "mean", "sd", "kept_share": {constant: share of the proposals moving it that were kept}}},
"against_random": {arm: {"median_gain", "mean_gain", "mannwhitney_p", "seeds_needed"}}}
(gains in val_bpb, positive: lower than random; seeds_needed: seeds per arm for a two-sided
5 % test with 80 % power to see the mean gain, normal approximation), and a table on stdout.
"""
import argparse, collections, importlib.util, json, math, random, statistics, time
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from gitresearch.policies import random_search
from gitresearch.policies import InvalidReply
from gitresearch.policies.moves import moved, step_for
from gitresearch.policies.constants import find_sites, relations, rewrite
from gitresearch.resources import resource

GYM = resource("gym")  # gym_repo/: the template `gitresearch init --template gym` copies
SKIP = ("CURVE_POINTS",)  # gym_repo/gitresearch.toml's skip_constants
CHECKPOINTS = (25, 50, 100, 200, 300)  # experiments after which the medians over seeds are kept
NARROW = (3 ** -0.75, 3 ** 0.75)  # the random policy's range with |ln factor| x0.75


@dataclass(frozen=True)
class Arm:
    """How an arm's fresh proposals differ from the random policy's, and whether it repeats keeps."""
    factors: tuple[float, float] = random_search.FACTOR_RANGE
    floor: float = 1.0  # the least factor from 1 (random_search.draw_factor)
    floor_until: float = math.inf  # experiments after which the floor is lifted
    streak: float = 0  # kept steps repeated at most this many times in a row (0: never)


ARMS = {"random": Arm(), "oracle-2": Arm(), "oracle-4": Arm(),
        "wide": Arm(factors=(1 / 5, 5.0)),  # beyond the bench's cap at x3
        "narrow": Arm(factors=NARROW), "bold": Arm(floor=1.5), "bolder": Arm(floor=2.0),
        "momentum": Arm(streak=3), "repeat": Arm(streak=math.inf),
        "narrow-repeat": Arm(factors=NARROW, streak=math.inf), "bold-repeat": Arm(floor=1.5, streak=math.inf),
        "bold100-repeat": Arm(floor=1.5, floor_until=100, streak=math.inf),
        "bold150-repeat": Arm(floor=1.5, floor_until=150, streak=math.inf),
        "bandit": Arm()}


def load_gym():
    spec = importlib.util.spec_from_file_location("gym_train", GYM / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, json.loads((GYM / "surrogate.json").read_text())


class Surrogate:
    """The gym's true mean final of a train.py text (None: it crashes at start)."""

    def __init__(self):
        self.gym, self.model = load_gym()
        self.cache: dict[str, float | None] = {}

    def __call__(self, source: str):
        if source not in self.cache:
            values = {s.name: s.value for s in find_sites(source, SKIP)}
            if self.gym.hard_rules(values):
                self.cache[source] = None
            else:
                x = self.gym.features(self.model, values)
                predicted = {}
                for gp in self.model["gps"]:
                    predicted.update(zip(gp["outputs"], self.gym.gp_mean(gp, x)))
                self.cache[source] = predicted["final"]
        return self.cache[source]


def climb(arm: str, seed: int, surrogate: Surrogate, source: str, experiments: int, margin: float,
          noise_sd: float) -> tuple[list[float], collections.Counter, collections.Counter]:
    """One loop of `arm`: the true mean final of its best after each experiment, and per
    constant the proposals that moved it and were kept, and were not."""
    rng, spec = random.Random(seed), ARMS[arm]
    best = surrogate(source)
    hits, misses = collections.Counter(), collections.Counter()
    again, streak = None, 0
    trajectory = []
    for number in range(experiments):
        trajectory.append(best)
        floor = spec.floor if number < spec.floor_until else 1.0
        sites = find_sites(source, SKIP)
        rels = relations(source)
        changes = []
        if again and streak < spec.streak:  # the kept steps again, as the harness applies a Moves line
            try:
                changes = moved(again, {"train.py": source}, {"train.py": sites})[1]
            except InvalidReply:  # the steps round to no change here: a fresh proposal
                again, streak = None, 0
        if not changes and arm == "bandit":
            score = {s.name: rng.betavariate(1 + hits[s.name], 1 + misses[s.name]) for s in sites}
            chosen = sorted(sites, key=lambda s: -score[s.name])[:rng.randint(1, 3)]
            changes = random_search.keep_relations(
                [(s, new) for s in chosen if (new := random_search.mutate_site(s, rng)) is not None], sites, rels)
        elif not changes:
            changes = random_search.random_changes(sites, rng, rels, factors=spec.factors, floor=floor)
        if arm.startswith("oracle-"):
            candidates = [changes] + [random_search.random_changes(sites, rng, rels) for _ in range(int(arm[7:]) - 1)]
            changes = min((c for c in candidates if c), default=[],
                          key=lambda c: surrogate(rewrite(source, c)) or math.inf)
        if not changes:
            continue
        candidate = rewrite(source, changes)
        value = surrogate(candidate)
        kept = value is not None and value < best and value + rng.gauss(0, noise_sd) < best - margin * noise_sd
        for site, _ in changes:
            (hits if kept else misses)[site.name] += 1
        if kept:
            if spec.streak:
                again, streak = "; ".join(step_for(s, new) for s, new in changes), streak + 1
            source, best = candidate, value
        else:
            again, streak = None, 0
    return trajectory[1:] + [best], hits, misses


def seeds_needed(gain: float, sd: float) -> float | None:
    """Seeds per arm for a two-sided 5 % test with 80 % power to see `gain` (normal approx)."""
    if gain <= 0:
        return None
    return math.ceil(2 * ((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / gain) ** 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--experiments", type=int, default=300)
    parser.add_argument("--margin", type=float, default=2.0, help="noise sigmas a kept run beats best by")
    parser.add_argument("--arms", default=",".join(ARMS))
    args = parser.parse_args()
    surrogate = Surrogate()
    noise_sd = surrogate.model["noise"]["final_sd"]
    baseline = (GYM / "train.py").read_text()
    start = time.time()
    arms = {}
    for arm in args.arms.split(","):
        loops = [climb(arm, seed, surrogate, baseline, args.experiments, args.margin, noise_sd)
                 for seed in range(args.seeds)]
        trajectories = [t for t, _, _ in loops]
        hits, misses = sum((h for _, h, _ in loops), collections.Counter()), sum((m for _, _, m in loops), collections.Counter())
        bests = [t[-1] for t in trajectories]
        arms[arm] = {"best": [round(b, 5) for b in bests], "median": round(statistics.median(bests), 5),
                     "median_at": {n: round(statistics.median(t[n - 1] for t in trajectories), 5)
                                   for n in CHECKPOINTS if n <= args.experiments},
                     "mean": round(statistics.mean(bests), 5), "sd": round(statistics.stdev(bests), 5),
                     "kept_share": {name: round(hits[name] / (hits[name] + misses[name]), 4)
                                    for name in sorted(hits | misses, key=lambda n: -hits[n] / (hits[n] + misses[n]))}}
        at = " / ".join(f"{v:.4f}" for v in arms[arm]["median_at"].values())
        print(f"{arm:10s} median {arms[arm]['median']:.4f} mean {arms[arm]['mean']:.4f} sd {arms[arm]['sd']:.4f} "
              f"| median after {'/'.join(map(str, arms[arm]['median_at']))}: {at}", flush=True)
    against = {}
    if "random" in arms:
        base = arms["random"]
        for arm, figures in arms.items():
            if arm == "random":
                continue
            mean_gain = base["mean"] - figures["mean"]
            pooled = math.sqrt((base["sd"] ** 2 + figures["sd"] ** 2) / 2)
            against[arm] = {"median_gain": round(base["median"] - figures["median"], 5),
                            "mean_gain": round(mean_gain, 5),
                            "mannwhitney_p": round(stats.mannwhitneyu(figures["best"], base["best"],
                                                                      alternative="two-sided").pvalue, 4),
                            "seeds_needed": seeds_needed(mean_gain, pooled)}
            print(f"{arm:10s} vs random: median gain {against[arm]['median_gain']:+.4f}, mean gain "
                  f"{mean_gain:+.4f}, p = {against[arm]['mannwhitney_p']}, seeds needed {against[arm]['seeds_needed']}")
    Path(args.out).write_text(json.dumps({
        "schema": 1, "seeds": args.seeds, "experiments": args.experiments, "margin": args.margin,
        "noise_sd": noise_sd, "wall_s": round(time.time() - start, 1), "arms": arms,
        "against_random": against}, indent=1) + "\n")


if __name__ == "__main__":
    main()
