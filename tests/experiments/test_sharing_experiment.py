"""`make sharing-experiment`, run small: a low job holding the whole pool and a high
one arriving while it runs, under both policies, through the real manager and
switch; bad settings refused with one line before anything starts."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from innet_aggregation.experiments import sharing as se
from tests.switch_ctl.manager_harness import skip_unless_runnable

REPO = Path(__file__).resolve().parents[2]
CALLS = 60
SEED = 3          # schedule(3, 2, ...): job0 low at 0, job1 high at 0.39 x --gap


@pytest.mark.parametrize("argv, message", [
    (("--fit", "6"), "--fit must be 1 to --jobs - 1 (some must wait), not 6"),
    (("--ranks", "1"), "--ranks must be at least 2"),
    (("--jobs", "17"), "--jobs must be 2 to 16"),
    (("--calls", "0"), "--calls, --size and --seeds must be at least 1, not 0, 131072, 3"),
    (("--gap", "-1"), "--gap must be at least 0"),
    (("--high", "6"), "--high must be 1 to 5 (both classes present), not 6"),
    (("--bw", "5000"), "cannot be shaped"),
])
def test_settings_that_cannot_run_are_refused(argv, message):
    done = subprocess.run([sys.executable, "-m", "innet_aggregation.experiments.sharing",
                           *argv], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 1 and message in done.stderr.splitlines()[-1], done.stderr


def test_the_schedule_is_seeded_with_a_third_of_the_jobs_high():
    jobs = se.schedule(1, 6, 4.0)
    assert jobs == se.schedule(1, 6, 4.0) != se.schedule(2, 6, 4.0)
    assert sorted(j["class"] for j in jobs) == ["high"] * 2 + ["low"] * 4
    assert sorted(j["class"] for j in se.schedule(1, 6, 4.0, 3)) == ["high"] * 3 + ["low"] * 3
    assert jobs[0]["arrival"] == 0 and [j["arrival"] for j in jobs] == sorted(
        j["arrival"] for j in jobs)
    assert [j["class"] for j in se.schedule(SEED, 2, 1.0)] == ["low", "high"]


def test_a_preemption_is_costed_from_the_calls_paths():
    why = "lease lost (job job0 was preempted by job job1 of tenant lab (priority 5 over 0))"
    paths = ["gloo", "switch", "switch", "gloo", "gloo", "switch", "gloo", "gloo"]
    calls = [{"path": p, "at": float(i)} for i, p in enumerate(paths)]
    # Started on gloo (not joined), preempted in call 3 (its result a peer's: switch),
    # back from call 6; preempted again in call 7 and finished on gloo.
    changes = [[1, "gloo", "not joined within 2 s"], [2, "switch", "installed"],
               [3, "gloo", why], [6, "switch", "installed again"], [7, "gloo", why]]
    assert se.preemptions(calls, changes) == [{"gloo_calls": 2, "to_return_s": 3.0},
                                              {"gloo_calls": 2, "to_return_s": None}]
    # Back on the switch "from call 9", which it never made: it finished on gloo.
    assert se.preemptions(calls, changes + [[9, "switch", "installed again"]])[-1] == {
        "gloo_calls": 2, "to_return_s": None}


def test_the_best_ratio_puts_every_high_job_on_the_switch_from_arrival():
    def job(policy, cls, jct, gloo):
        return {"policy": policy, "class": cls, "jct_s": jct, "gloo_calls": gloo}
    rows = [job("priority", "high", 12.0, 0), job("priority", "low", 30.0, 20),
            job("fcfs", "low", 10.0, 0), job("fcfs", "high", 20.0, 30),
            job("fcfs", "high", 9.0, 0)]
    # Alone: the median JCT of jobs that never left the switch (12, 10, 9): 10.
    assert se.best_ratio(rows) == pytest.approx((10.0 + 9.0) / (20.0 + 9.0))
    assert se.best_ratio([r for r in rows if r["gloo_calls"]]) is None


def test_a_high_job_preempts_a_low_one_under_priority_and_not_under_fcfs(tmp_path):
    """Two jobs of 2 ranks, a pool for one: about 30 s."""
    skip_unless_runnable()
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "innet_aggregation.experiments.sharing", "--jobs", "2",
         "--fit", "1", "--ranks", "2", "--calls", str(CALLS), "--size", "32768", "--gap", "5",
         "--seed", str(SEED), "--seeds", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "sharing.csv")))
    assert [(r["policy"], r["job"], r["class"]) for r in rows] == [
        ("priority", "job0", "low"), ("priority", "job1", "high"),
        ("fcfs", "job0", "low"), ("fcfs", "job1", "high")]
    # Every job finished every call, every result exact, each call on one path.
    assert all(int(r["calls"]) == CALLS and r["wrong"] == "0" for r in rows)
    assert all(int(r["switch_calls"]) + int(r["gloo_calls"]) == CALLS for r in rows)
    preempted = {(r["policy"], r["job"]): int(r["preemptions"]) for r in rows}
    assert preempted == {("priority", "job0"): 1, ("priority", "job1"): 0,
                         ("fcfs", "job0"): 0, ("fcfs", "job1"): 0}
    record = json.loads((out / "sharing-experiment.json").read_text())
    f = record["figures"]
    assert f["all_finished"] and f["runs"]["3-priority"]["preemptions"] == 1
    (cost,) = f["preemption_costs"]
    assert cost["gloo_calls"] >= 1
    assert f["high_jct_ratios"][0] == pytest.approx(
        float(rows[1]["jct_s"]) / float(rows[3]["jct_s"]), rel=1e-3)
    assert (out / "sharing.png").stat().st_size > 10_000
    assert "high-priority mean JCT, priority over fcfs" in done.stdout
    # Where the time went: the high job never left the switch; its phases add up to its JCT.
    t = f["time_spent"]
    assert t["start_s"] > 0 and t["first_call_s"] > 0 and t["switch_call_s"] > 0
    assert t["gloo_call_s"] > 0          # the preempted job's calls on gloo
    (high,) = [j for j in f["jobs"] if (j["policy"], j["job"]) == ("priority", "job1")]
    p = high["phases"]
    assert p["start_s"] + p["first_call_s"] + p["switch_s"] + p["tail_s"] == pytest.approx(
        high["jct_s"], abs=0.01) and not p["gloo_n"]
    assert "a job that never left the switch (median)" in done.stdout


def test_a_jobs_time_is_split_into_its_start_its_calls_by_path_and_its_tail():
    # Arrived at 1, back from init_process_group at 2.5, calls ending at 3, 3.5 (switch),
    # 4.5 (gloo), 5 (switch), its group destroyed at 5.25.
    p = se.phases(1.0, 2.5, [3.0, 3.5, 4.5, 5.0], ["switch", "switch", "gloo", "switch"], 5.25)
    assert p == {"start_s": 1.5, "first_call_s": 0.5, "switch_s": 1.0, "gloo_s": 1.0,
                 "tail_s": 0.25, "switch_n": 2, "gloo_n": 1}
    alone = {"gloo_calls": 0, "phases": p}
    on_gloo = {"gloo_calls": 3, "phases": se.phases(0.0, 3.0, [4.0, 5.0, 7.0],
                                                    ["gloo"] * 3, 7.0)}
    spent = se.time_spent([alone, on_gloo])
    assert spent["start_s"] == 1.5 and spent["switch_s"] == 1.0      # the alone job's
    assert spent["switch_call_s"] == 0.5 and spent["gloo_call_s"] == pytest.approx(4 / 3)
