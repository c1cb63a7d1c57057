"""The straggler experiment's arithmetic: time to accuracy where it holds (not the first
touch), the time for the same steps, and each ratio per seed with its median."""

from __future__ import annotations

import pytest
import torch

from innet_aggregation.experiments import straggler as se
from innet_aggregation.testbed.model import accuracy_of as _accuracy

TARGET = 0.95


def curve(*accuracies: float, step_s: float = 2.0, every: int = 5):
    """(step, seconds, accuracy) a check, a check every ``every`` steps of ``step_s``."""
    return [(every * (i + 1), every * step_s * (i + 1), a) for i, a in enumerate(accuracies)]


def test_time_to_accuracy_is_where_it_holds_not_the_first_touch():
    touched = curve(0.80, 0.95, 0.93, 0.96, 0.94, 0.95, 0.96, 0.97, 0.90)
    assert se.first_crossing(touched, TARGET) == 1
    assert se.held_crossing(touched, TARGET) == 5          # 0.95, 0.96, 0.97 in a row
    assert se.held_crossing(touched, TARGET, hold=2) == 5   # 0.96, 0.94 is broken
    assert se.held_crossing(touched, TARGET, hold=1) == 1   # hold 1 is the first touch
    assert se.held_crossing(curve(0.90, 0.95, 0.96, 0.95, 0.97), TARGET) == 1


def test_an_accuracy_exactly_at_the_target_is_at_it():
    """342 of 360 test digits right is 0.95: a check at the target, not below it."""
    y = torch.arange(360) % 10
    logits = torch.nn.functional.one_hot(y, 10).float()
    logits[:18] = torch.nn.functional.one_hot((y[:18] + 1) % 10, 10).float()   # 18 wrong
    score = _accuracy(torch.nn.Identity(), logits, y)
    assert score == 342 / 360 and score >= 0.95
    assert se.held_crossing(curve(0.90, score, score, score), TARGET) == 1


def test_a_touch_the_run_ends_before_it_held_is_not_reached():
    assert se.held_crossing(curve(0.90, 0.94, 0.96, 0.97), TARGET) is None
    assert se.first_crossing(curve(0.90, 0.94), TARGET) is None
    assert se.held_crossing([], TARGET) is None


def answers(curves_s: list[list[float]], accuracies: list[float], steps: int, **counters):
    """Every rank's answer as testbed.train sends it with ``curve``: rank r's clock at
    each check, the same accuracies on every rank (they hold the same bits)."""
    every = steps // len(accuracies)
    return [{"accuracy": accuracies[-1], "steps": steps, "target_steps": None,
             "time_to_target_s": None, "step_times_ms": [10.0] * steps, "slept_steps": [],
             "curve": [[every * (i + 1), t, a] for i, (t, a) in enumerate(zip(times, accuracies))],
             "results_received": 100, "retransmissions": 0, "parameters": 1000, **counters}
            for times in curves_s]


def args(*argv: str):
    return se.settle(se._parser().parse_args(["--workers", "2", *argv]))


def row(seed, scenario, mode, curves_s, accuracies, steps=20, p99=None):
    r = se.summarize(scenario, mode, seed, answers(curves_s, accuracies, steps), args(),
                     50.0, 500.0, 0)
    if p99 is not None:
        r["step_p99_ms"] = p99
    return r


def test_a_run_is_timed_on_the_slowest_rank_at_the_held_check_and_at_its_last_step():
    r = row(0, "straggler", "ina", [[1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.5, 5.5]],
            [0.96, 0.90, 0.95, 0.97], steps=20)
    assert r["first_crossing_s"] == 1.5                      # check 0, rank 1's clock
    assert r["time_to_target_s"] is None and r["target_steps"] is None  # held 2 checks, not 3
    held = row(0, "straggler", "ina", [[1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.5, 5.5]],
               [0.90, 0.95, 0.96, 0.97], steps=20)
    assert (held["target_steps"], held["time_to_target_s"]) == (10, 2.5)
    assert held["first_crossing_s"] == 2.5 and held["steps_time_s"] == 5.5


def test_a_curve_that_ends_before_the_last_step_is_refused():
    broken = answers([[1.0, 2.0]], [0.9, 0.96], 20)
    broken[0]["curve"] = broken[0]["curve"][:1]
    with pytest.raises(ValueError, match="the last check is at step 10, not the run's last"):
        se.summarize("straggler", "ina", 0, broken, args(), 50.0, 500.0, 0)


def seed_rows(seed: int, touch_s: float, held_s: float, steps_s: float, dl_steps_s: float,
              dl_held_s: float):
    """One seed's runs: without a deadline the curve touches 0.95 at ``touch_s`` and
    holds it from ``held_s``; with one it holds from its first touch."""
    no = [0.90] * 10
    t_no = [touch_s * (i + 1) / 2 for i in range(10)]
    no[1], no[2] = 0.95, 0.94                                # a touch at check 1, gone
    for i in range(10):
        if t_no[i] >= held_s:
            no[i:] = [0.96] * (10 - i)
            break
    t_no[-1] = steps_s
    dl = [0.90] * 10
    t_dl = [dl_held_s * (i + 1) / 3 for i in range(10)]
    dl[2:] = [0.96] * 8
    t_dl[-1] = dl_steps_s
    return [row(seed, "reference", "ina", [t_no], [0.96] * 10, p99=400.0),
            row(seed, "straggler", "ina", [t_no], no),
            row(seed, "straggler", "ina+deadline", [t_dl], dl),
            row(seed, "loss", "ina+deadline", [t_no], [0.96] * 10, p99=440.0 + 40 * seed)]


def test_the_ratios_are_the_held_times_and_the_same_steps_times_per_seed_and_their_median():
    # seed 0 is the run: without the deadline the curve touched 0.95 at about
    # 18 s and held it at 25.8; the same steps took 66.6 s, and 57.1 s with the deadline
    rows = (seed_rows(0, 9.0, 25.8, 66.6, 57.1, 15.0) + seed_rows(1, 9.0, 20.0, 60.0, 54.0, 18.0)
            + seed_rows(2, 9.0, 22.0, 75.0, 63.0, 22.0))
    by = {(r["seed"], r["scenario"], r["mode"]): r for r in rows}
    assert by[(0, "straggler", "ina")]["first_crossing_s"] == 9.0
    assert by[(0, "straggler", "ina")]["time_to_target_s"] == pytest.approx(27.0)  # first check >= 25.8
    ratios = se.seed_ratios(rows, [0, 1, 2])
    assert list(ratios) == ["straggler_time_ratio", "straggler_steps_ratio",
                            "straggler_accuracy_points", "loss_p99_ratio"]
    held = [15.0 / 27.0, 18.0 / 22.5, 22.0 / 22.5]
    assert ratios["straggler_time_ratio"]["per_seed"] == pytest.approx(held)
    assert ratios["straggler_time_ratio"]["median"] == pytest.approx(18.0 / 22.5)
    steps = [57.1 / 66.6, 54.0 / 60.0, 63.0 / 75.0]
    assert ratios["straggler_steps_ratio"]["per_seed"] == pytest.approx(steps)
    assert ratios["straggler_steps_ratio"]["median"] == pytest.approx(57.1 / 66.6)
    assert ratios["loss_p99_ratio"]["per_seed"] == pytest.approx([1.1, 1.2, 1.3])
    assert ratios["loss_p99_ratio"]["median"] == pytest.approx(1.2)
    assert ratios["straggler_accuracy_points"]["median"] == 0.0
    lines = se.ratio_lines(ratios, [0, 1, 2])
    assert lines[1] == "straggler_steps_ratio: seed 0 0.86, seed 1 0.90, seed 2 0.84; median 0.86"


def test_a_seed_that_never_held_the_target_leaves_the_median_unread():
    rows = seed_rows(0, 9.0, 25.8, 66.6, 57.1, 15.0) + seed_rows(1, 9.0, 20.0, 60.0, 54.0, 18.0)
    never = seed_rows(2, 9.0, 22.0, 70.0, 63.0, 22.0)
    for r in never:
        if r["mode"] == "ina+deadline" and r["scenario"] == "straggler":
            r["time_to_target_s"] = None
    ratios = se.seed_ratios(rows + never, [0, 1, 2])
    assert ratios["straggler_time_ratio"]["per_seed"][2] is None
    assert ratios["straggler_time_ratio"]["median"] is None
    assert ratios["straggler_steps_ratio"]["median"] == pytest.approx(0.9)
    assert se.ratio_lines(ratios, [0, 1, 2])[0].endswith("seed 2 -; median -")
