"""Early stop: the forecast's fit, and both rules' decisions on hand-made curves (the race
rule's measured error rates are in test_bench.py, on the recorded corpora)."""
import math
import statistics
from dataclasses import replace

import numpy as np
import pytest

from gitresearch.earlystop import Monitor, Race, Settings, check_due, forecast_test, value_at
from gitresearch.forecast import Calibration, FinishedRun, fit_curve, power_law

FORECAST = dict(rule="forecast")


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


def test_forecast_rule_stops_a_clear_loser_early():
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history(),
                      settings=Settings(interval_s=10, min_fraction=0.2, **FORECAST))
    reason, at = replay(curve(1.0, 0.5, 2.3, end_drop=0.03), monitor)
    assert reason and reason.startswith("stopped at") and "vs threshold 2.0050" in reason
    assert at <= 40
    assert monitor.checks[-1].decision == "stop" and monitor.checks[-1].llr > math.log(0.8 / 0.05)


def test_forecast_rule_keeps_a_slow_starter_that_ends_best():
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history(),
                      settings=Settings(interval_s=10, min_fraction=0.2, **FORECAST))
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


def test_forecast_rule_indifference_zone_gives_the_lowest_stop_boundary():
    settings = Settings(**FORECAST)
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history(), settings=settings)
    log_a = math.log((1 - settings.alpha) / settings.beta)
    for sd in (0.005, 0.02, 0.1):
        delta = monitor.delta(sd)
        boundary = lambda d: d / 2 + sd ** 2 * log_a / d  # x - theta where the LLR reaches log A
        assert delta >= settings.delta_k * 0.005
        assert boundary(delta) <= min(boundary(d) for d in np.linspace(0.001, 1.0, 2000)) + 1e-9 \
            or delta == settings.delta_k * 0.005
        # the decision flips exactly at the boundary
        assert forecast_test(2.0 + boundary(delta) + 1e-6, sd, 2.0, delta, settings)[1] == "stop"
        assert forecast_test(2.0 + boundary(delta) - 1e-6, sd, 2.0, delta, settings)[1] == "continue"


def test_forecast_rule_stops_a_moderate_loser():
    """A run that misses the best by many forecast sds, but by less than a typical finished run
    misses by, is still stopped: the indifference zone follows the forecast's precision, not
    the spread of the history (which would make the test a cutoff far above the best)."""
    spread_out = [(a, b, c + shift) for (a, b, c), shift in zip(SIMILAR_RUNS, (0, 0.4, 0.1, 0.5, 0.3, 0.6, 0.2))]
    calibration = history(params=spread_out)
    best = min(run.final for run in calibration.runs)
    monitor = Monitor(budget=100.0, best=best, noise=0.005, calibration=calibration,
                      settings=Settings(interval_s=10, min_fraction=0.2, **FORECAST))
    reason, _ = replay(curve(1.0, 0.5, best + 0.1, end_drop=0.03), monitor)
    assert reason and reason.startswith("stopped at")
    assert all(c.decision != "accept" for c in monitor.checks)


# -- the race rule -------------------------------------------------------------------------------

RACE = Settings(rule="race", interval_s=10, min_fraction=0.2)


def test_race_stops_a_run_behind_the_field_at_the_first_check():
    field = history(params=SIMILAR_RUNS + [(0.3, 0.3, 2.08)])  # a fast starter that ends worse
    monitor = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=field, settings=RACE)
    loser = curve(1.0, 0.5, 2.3, end_drop=0.03)
    reason, at = replay(loser, monitor)
    # the first check is due at 20 s; the point at 17.5 s (within a quarter interval) serves it
    assert at == 17.5 and reason.startswith("stopped at 18 s") and len(monitor.checks) == 1
    at_check = sorted(Race.field_at(field.runs, at))
    best_run = min(field.runs, key=lambda r: r.final)  # the anchor is the best run's own curve
    anchor, median = value_at(best_run.times, best_run.values, at), statistics.median(at_check)
    assert anchor > at_check[0]  # the fast starter leads at 17.5 s; the line is not drawn from it
    check = monitor.checks[-1]
    assert (check.lead, check.median, check.c) == (pytest.approx(anchor), pytest.approx(median), RACE.race_c)
    assert check.line == pytest.approx(anchor + RACE.race_c * (median - anchor))
    assert check.value > check.line and check.decision == "stop"
    # the final it points to: the best run's final plus the distance to it
    assert check.mean == pytest.approx(best_run.final + check.value - anchor)


def test_value_at_interpolates_between_points():
    times, values = (1.0, 3.0, 4.0), (3.0, 2.0, 1.5)
    assert value_at(times, values, 2.0) == pytest.approx(2.5)
    assert value_at(times, values, 3.0) == 2.0 and value_at(times, values, 4.0) == 1.5
    assert value_at(times, values, 0.5) is None and value_at(times, values, 4.5) is None


def test_race_median_counts_the_stopped_runs_that_reached_the_time():
    """The median is over every run that got this far: stopped runs count up to their stop, so
    stopping many losers does not pull the median (and the line) towards the best run."""
    field = history()
    race = Race(field)
    for a, b, c in [(1.3, 0.5, 2.4), (1.2, 0.5, 2.5), (1.4, 0.5, 2.45), (1.1, 0.5, 2.6)] * 2:
        points = [p for p in curve(a, b, c) if p["t"] <= 30.0]  # stopped at 30 s
        race.add_stopped([p["t"] for p in points], [p["val_bpb"] for p in points])
    assert len(race.reached(20.0, 10.0)) == 8 and race.reached(40.0, 10.0) == []
    middling = curve(1.2, 0.5, 2.12, end_drop=0.03)
    with_stopped = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=field, settings=RACE, race=race)
    reason, at = replay(middling, with_stopped)
    first = with_stopped.checks[0]
    values = sorted(Race.field_at(field.runs, first.t) + race.reached(first.t, 10.0))
    assert first.median == pytest.approx(statistics.median(values)) and first.decision == "continue"
    # past the stops only the finished runs are left, and the same run is behind their line
    assert reason is not None and at > 30.0
    survivors_only = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=field, settings=RACE)
    assert replay(middling, survivors_only)[1] < 30.0


def test_a_check_is_due_from_a_quarter_interval_before_its_time():
    settings = Settings(interval_s=10.0, min_fraction=0.2)
    assert not check_due(17.4, 0, 100.0, settings) and check_due(17.5, 0, 100.0, settings)
    assert not check_due(27.4, 1, 100.0, settings) and check_due(27.5, 1, 100.0, settings)


def test_race_never_stops_the_leader_nor_a_run_within_the_noise():
    field = history()
    leader = curve(0.8, 0.4, 1.95, end_drop=0.03)  # ahead of every finished run all along
    monitor = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=field, settings=RACE)
    assert replay(leader, monitor)[0] is None and len(monitor.checks) == 9
    assert all(c.value <= c.lead <= c.line for c in monitor.checks)
    # a run 0.05 behind another is stopped with no noise, kept when 2 sqrt(2) x noise > 0.05
    behind = [dict(p, val_bpb=p["val_bpb"] + 0.05) for p in curve(0.8, 0.4, 1.98, end_drop=0.03)]
    assert replay(behind, Monitor(budget=100.0, best=1.9, noise=0.0, calibration=field, settings=RACE))[0]
    noisy = Monitor(budget=100.0, best=1.9, noise=0.05, calibration=field, settings=RACE)
    assert replay(behind, noisy)[0] is None
    assert all(c.line - c.lead >= 2 * math.sqrt(2) * 0.05 - 1e-12 for c in noisy.checks)


def test_race_leaves_the_room_this_repos_winners_needed():
    """With race_safety on, a winner that was far behind its field at 20 % widens the line for
    later runs."""
    runs = list(history().runs)
    slow = curve(6.0, 0.9, 1.85, end_drop=0.03)  # far behind early, best at the end
    winner = FinishedRun(tuple(p["t"] for p in slow), tuple(p["val_bpb"] for p in slow), slow[-1]["val_bpb"], 100.0)
    field = Calibration(runs + [winner])
    room = replace(RACE, race_safety=1.5)
    needs = Race(field).winners_needs(room)
    at_20 = sorted(Race.field_at(runs, 20.0))  # the winner's 20 % point is slow[7]
    best_run = min(runs, key=lambda r: r.final)
    anchor = value_at(best_run.times, best_run.values, 20.0)
    assert needs[0.2] == pytest.approx((slow[7]["val_bpb"] - anchor) / (at_20[len(at_20) // 2] - anchor))
    assert needs[0.2] > 1.0
    # a check uses the largest need within 0.1 of its fraction
    assert Race(field).winners_c(0.2, room) == max(needs[f] for f in (0.1, 0.15, 0.2, 0.25, 0.3))
    late = curve(5.5, 0.9, 1.84, end_drop=0.03)  # the same shape again
    kept = Monitor(budget=100.0, best=winner.final, noise=0.0, calibration=field, settings=room)
    assert replay(late, kept)[0] is None
    first = kept.checks[0]
    assert first.c == pytest.approx(1.5 * Race(field).winners_c(first.t / 100.0, room)) and first.c > 1.5
    # off (the default), the line is drawn from the winner's own slow curve: kept all the same
    plain = Monitor(budget=100.0, best=winner.final, noise=0.0, calibration=field, settings=RACE)
    assert replay(late, plain)[0] is None and plain.checks[0].c == RACE.race_c
    assert plain.checks[0].lead == pytest.approx(value_at(winner.times, winner.values, plain.checks[0].t))
    # without the winner in the history the same run is stopped at the first check
    stopped = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=Calibration(runs), settings=room)
    assert replay(late, stopped)[0].startswith("stopped at 18 s")


def test_race_gives_a_run_closing_on_the_same_runs_more_room():
    """Losers stopped at the first check leave the median at the second, so a late bloomer's
    place against whoever is left rises although it gains on every run: measured on the runs
    that reached the second check, read at both checks, its place fell, and it gets
    race_c_closing instead of race_c."""
    field = history(params=[(1.0, 0.5, 1.95 + 0.05 * i) for i in range(7)])
    best = min(r.final for r in field.runs)

    def with_stopped_losers():
        race = Race(field)
        for a, b, c in [(1.3, 0.5, 2.4), (1.2, 0.5, 2.5), (1.4, 0.5, 2.45), (1.1, 0.5, 2.6)] * 2:
            points = [p for p in curve(a, b, c) if p["t"] <= 20.0]  # stopped at the first check
            race.add_stopped([p["t"] for p in points], [p["val_bpb"] for p in points])
        return race

    bloomer = curve(5.0, 0.8, 1.9, end_drop=0.03)  # far behind early, ends below every run
    assert bloomer[-1]["val_bpb"] < best
    kept = Monitor(budget=100.0, best=best, noise=0.0, calibration=field, settings=RACE, race=with_stopped_losers())
    assert replay(bloomer, kept)[0] is None
    first, second = kept.checks[:2]
    assert first.place_before is None and first.c == RACE.race_c and first.decision == "continue"
    # against whoever is left (the finished runs) the place rose past race_c...
    assert second.median == pytest.approx(statistics.median(Race.field_at(field.runs, second.t)))
    assert second.place == pytest.approx((second.value - second.lead) / (second.median - second.lead))
    assert second.place > first.place and second.place > RACE.race_c
    # ...but on those same runs at the first check it was further behind: it is closing
    best_run = min(field.runs, key=lambda r: r.final)
    lead_then = value_at(best_run.times, best_run.values, first.t)
    median_then = statistics.median(Race.field_at(field.runs, first.t))
    assert second.place_before == pytest.approx((first.value - lead_then) / (median_then - lead_then))
    assert second.place < second.place_before and second.c == RACE.race_c_closing == 0.85
    assert second.line == pytest.approx(second.lead + 0.85 * (second.median - second.lead))
    assert "closing" in kept.comment
    # every check: the closing room exactly when the place fell on the same runs
    for check in kept.checks[1:]:
        assert (check.c == RACE.race_c_closing) == (check.place < check.place_before)
    # without the closing room the same run is stopped at the second check
    plain = Monitor(budget=100.0, best=best, noise=0.0, calibration=field,
                    settings=replace(RACE, race_c_closing=RACE.race_c), race=with_stopped_losers())
    reason, at = replay(bloomer, plain)
    assert reason.startswith("stopped at 28 s") and at == second.t


def test_race_needs_a_field():
    few = Calibration(history().runs[:RACE.min_history - 1])
    monitor = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=few, settings=RACE)
    assert replay(curve(1.0, 0.5, 2.5), monitor)[0] is None
    assert {c.decision for c in monitor.checks} == {"no_field"}


def test_the_config_section_sets_every_rule_setting_with_the_same_defaults():
    """[early_stop] reaches the rule through Settings: a key the rule lacks, or a default that
    differs, would make the loop run another rule than the one the bench measured."""
    from dataclasses import fields

    from gitresearch.config import EarlyStopConfig

    settings = {f.name: f.default for f in fields(Settings)}
    for f in fields(EarlyStopConfig):
        if f.name != "enabled":
            assert settings[f.name] == f.default, f.name


def test_points_read_in_a_burst_are_judged_one_by_one_as_if_read_alone():
    """The runner polls; a fast run (the gym) reports several points between two polls. The
    stop lands at the first check that stops, with every check before it made, exactly as
    when each point is read alone."""
    field = history(params=SIMILAR_RUNS)
    loser = curve(1.0, 0.5, 2.3, end_drop=0.03)
    alone = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=field, settings=RACE)
    reason_alone, at_alone = replay(loser, alone)
    burst = Monitor(budget=100.0, best=1.9, noise=0.0, calibration=field, settings=RACE)
    reason = burst.update(loser[:3]) or burst.update(loser)  # 3 points, then all at once
    assert reason == reason_alone and at_alone < 100.0
    assert [vars(c) for c in burst.checks] == [vars(c) for c in alone.checks]
    slow_starter = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history())
    assert slow_starter.update(curve(1.0, 0.5, 2.0)) is None  # judged point by point, to the end
    assert [c.t for c in slow_starter.checks] == [c.t for c in replay_checks(curve(1.0, 0.5, 2.0))]


def replay_checks(points):
    monitor = Monitor(budget=100.0, best=2.0, noise=0.005, calibration=history())
    replay(points, monitor)
    return monitor.checks
