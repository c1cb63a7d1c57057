"""`make sharing-experiment` in its smallest form (experiments/sharing.py): three
jobs of two ranks through the real manager and embedded switch, the high one last,
when the two low ones hold the pool. Under priorities it preempts one of them,
which finishes through gloo or back on the switch; under FCFS nothing is preempted
and it waits its turn. Every step of every job is checked exact inside the
experiment (it fails otherwise). The lows arrive seconds apart and each runs for
longer than the high one needs to arrive and register. About two minutes (marked slow)."""

from __future__ import annotations

import csv
import json
import os

import pytest

from innet_aggregation.experiments import sharing
from innet_aggregation.testbed.targets import unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or unavailable("softswitch") is not None,
    reason="needs root (namespaces) and the embedded switch")]
ARGS = ["--jobs", "3", "--high", "1", "--steps", "60", "--compute", "0.3", "--gap", "4",
        "--seeds", "1", "--seed", "3"]


def test_the_high_job_last_finds_the_pool_full():
    """The schedule this test relies on: seed 3 puts the one high job last."""
    args = sharing._parser().parse_args(ARGS)
    plan = sharing.schedule(args, 3)
    assert [tier for _, tier in plan] == ["low", "low", "high"]
    assert plan[0][0] == 0 and all(a < b for (a, _), (b, _) in zip(plan, plan[1:]))


def test_priorities_preempt_fcfs_does_not_and_every_job_finishes(tmp_path, capsys):
    out = tmp_path / "sharing"
    assert sharing.main([*ARGS, "--out", str(out)]) == 0, capsys.readouterr().err
    figures = json.loads((out / "sharing-experiment.json").read_text())["figures"]
    rows = list(csv.DictReader(open(out / "sharing.csv")))
    assert len(rows) == len(figures["runs"]) == 6        # 3 jobs under each policy
    for row in figures["runs"]:
        assert row["switch_steps"] + row["gloo_steps"] == 60
        assert 0 < row["jct_s"] and row["finish_s"] > row["arrival_s"]
    policies = figures["policies"]
    assert policies["priority"]["preemptions"] >= 1, figures["runs"]
    assert policies["fcfs"]["preemptions"] == 0, figures["runs"]
    preempted = [r for r in figures["runs"] if r["preemptions"]]
    assert all(r["tier"] == "low" and r["gloo_steps"] > 0 for r in preempted)
    assert figures["preemption_cost"]["gloo_calls"]["min"] >= 1
    assert len(figures["high_ratios"]) == 1 and figures["high_ratios"][0] > 0
    assert (out / "sharing.png").stat().st_size > 0
    assert "high jobs' mean JCT, priorities over FCFS" in capsys.readouterr().out
