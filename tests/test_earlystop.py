"""Self-evaluation: the fit, the SPRT's error rates, and decisions on hand-made curves."""
import math

import numpy as np
import pytest

from gitresearch.earlystop import (Calibration, FinishedRun, Monitor, Settings, fit_curve,
                                  power_law, sprt)


@pytest.mark.parametrize("a, b, c", [(2.0, 0.5, 1.0), (5.0, 0.8, 2.2), (1.0, 0.3, 0.5)])
def test_fit_recovers_known_parameters(a, b, c):
    rng = np.random.default_rng(0)
    t = np.linspace(1, 300, 60)
    y = power_law(t, a, b, c) + rng.normal(0, 0.002, t.size)
    fit = fit_curve(t, y)
    assert fit is not None
    assert fit.predict(300) == pytest.approx(power_law(300, a, b, c), abs=0.01)
    assert (fit.a, fit.b, fit.c) == pytest.approx((a, b, c), rel=0.15, abs=0.05)


def test_fit_is_robust_to_spikes():
    t = np.linspace(1, 100, 40)
    y = power_law(t, 3.0, 0.6, 1.5)
    y[[10, 25]] += 2.0  # two loss spikes
    fit = fit_curve(t, y)
    assert fit.predict(100) == pytest.approx(power_law(100, 3.0, 0.6, 1.5), abs=0.02)


def simulate(mu, theta, delta, settings, rng, looks=2000, sigma=0.05):
    """A stream whose forecast is the running mean of iid N(mu, sigma^2) observations, so the
    latest forecast is a sufficient statistic: the setting of Wald's guarantee."""
    total = 0.0
    for n in range(1, looks + 1):
        total += rng.normal(mu, sigma)
        _, decision = sprt(total / n, sigma / math.sqrt(n), theta, delta, settings)
        if decision != "continue":
            return decision
    return "end"


def test_sprt_error_rates_on_simulated_streams():
    settings = Settings(alpha=0.2, beta=0.05)
    rng = np.random.default_rng(1)
    theta, delta, trials = 1.0, 0.02, 4000
    false_stops = sum(simulate(theta, theta, delta, settings, rng) == "stop" for _ in range(trials))
    missed = sum(simulate(theta + delta, theta, delta, settings, rng) != "stop" for _ in range(trials))
    se = lambda p: 3 * math.sqrt(p * (1 - p) / trials)
    assert false_stops / trials <= settings.beta + se(settings.beta)
    assert missed / trials <= settings.alpha + se(settings.alpha)
    # and the test has power: a clear loser is nearly always stopped
    assert sum(simulate(theta + 3 * delta, theta, delta, settings, rng) == "stop" for _ in range(500)) > 480


def curve(a, b, c, budget=100.0, n=40, end_drop=0.0):
    t = np.linspace(budget / n, budget, n)
    values = power_law(t, a, b, c) - end_drop * np.clip((t / budget - 0.6) / 0.4, 0, 1)
    return [{"t": float(ti), "step": i, "val_bpb": float(v)} for i, (ti, v) in enumerate(zip(t, values))]


SIMILAR_RUNS = [(1.0, 0.5, 2.0), (1.2, 0.6, 2.05), (0.8, 0.4, 1.98), (1.1, 0.5, 2.1),
                (0.9, 0.45, 2.02), (1.05, 0.55, 2.07), (0.95, 0.5, 1.99)]


def history(budget=100.0, params=SIMILAR_RUNS):
    runs = []
    for a, b, c in params:
        points = curve(a, b, c, budget, end_drop=0.03)
        runs.append(FinishedRun(tuple(p["t"] for p in points), tuple(p["val_bpb"] for p in points),
                                points[-1]["val_bpb"], budget))
    return Calibration(runs)


def replay(points, monitor):
    for i in range(1, len(points) + 1):
        reason = monitor.update(points[:i])
        if reason:
            return reason, points[i - 1]["t"]
    return None, points[-1]["t"]


def test_clear_loser_is_stopped_early():
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history(),
                      settings=Settings(interval_s=10, min_fraction=0.2))
    reason, at = replay(curve(1.0, 0.5, 2.3, end_drop=0.03), monitor)
    assert reason and reason.startswith("stopped at") and "vs threshold 2.0050" in reason
    assert at <= 40
    assert monitor.checks[-1].decision == "stop" and monitor.checks[-1].llr > math.log(0.8 / 0.05)


def test_slow_starter_that_ends_best_is_not_stopped():
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history(),
                      settings=Settings(interval_s=10, min_fraction=0.2))
    slow = curve(6.0, 0.9, 1.9, end_drop=0.03)  # far behind early, best at the end
    others = curve(1.0, 0.5, 2.0, end_drop=0.03)
    assert slow[7]["val_bpb"] > others[7]["val_bpb"] + 0.05 and slow[-1]["val_bpb"] < 1.98
    reason, _ = replay(slow, monitor)
    assert reason is None
    assert monitor.checks and all(c.decision != "stop" for c in monitor.checks)


def test_divergence_is_stopped_at_once():
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history())
    points = curve(1.0, 0.5, 2.0)[:3] + [{"t": 9.0, "step": 3, "val_bpb": float("nan")}]
    reason, at = replay(points, monitor)
    assert reason.startswith("diverged at 9 s") and at == 9.0
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history())
    points = curve(1.0, 0.5, 2.0)[:3] + [{"t": 9.0, "step": 3, "val_bpb": 50.0}]
    assert replay(points, monitor)[0].startswith("diverged")


def test_no_stop_without_history_or_best():
    loser = curve(1.0, 0.5, 2.5)
    assert replay(loser, Monitor(budget=100.0, best=2.0, noise=0.005, calibration=Calibration()))[0] is None
    assert replay(loser, Monitor(budget=100.0, best=None, noise=0.005, calibration=history()))[0] is None


def test_indifference_zone_gives_the_lowest_stop_boundary():
    settings = Settings()
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history(), settings=settings)
    log_a = math.log((1 - settings.alpha) / settings.beta)
    for sd in (0.005, 0.02, 0.1):
        delta = monitor.delta(sd)
        boundary = lambda d: d / 2 + sd ** 2 * log_a / d  # x - theta where the LLR reaches log A
        assert delta >= settings.delta_k * 0.005
        assert boundary(delta) <= min(boundary(d) for d in np.linspace(0.001, 1.0, 2000)) + 1e-9 \
            or delta == settings.delta_k * 0.005
        # the decision flips exactly at the boundary
        assert sprt(2.0 + boundary(delta) + 1e-6, sd, 2.0, delta, settings)[1] == "stop"
        assert sprt(2.0 + boundary(delta) - 1e-6, sd, 2.0, delta, settings)[1] == "continue"


def test_moderate_loser_is_stopped_not_accepted():
    """A run that misses the best by many forecast sds, but by less than a typical finished run
    misses by, is still stopped: the indifference zone follows the forecast's precision, not
    the spread of the history (which would make the test a cutoff far above the best)."""
    spread_out = [(a, b, c + shift) for (a, b, c), shift in zip(SIMILAR_RUNS, (0, 0.4, 0.1, 0.5, 0.3, 0.6, 0.2))]
    calibration = history(params=spread_out)
    best = min(run.final for run in calibration.runs)
    monitor = Monitor(budget=100.0, best=best, noise=0.005, calibration=calibration,
                      settings=Settings(interval_s=10, min_fraction=0.2))
    reason, _ = replay(curve(1.0, 0.5, best + 0.1, end_drop=0.03), monitor)
    assert reason and reason.startswith("stopped at")
    assert all(c.decision != "accept" for c in monitor.checks)
