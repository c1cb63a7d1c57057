"""Slow is not dead: a rank that pauses between calls holds the others up, who say
whom they wait for, and the job goes on exactly; a rank that dies is named by every
other rank's error, within peer_timeout."""

from __future__ import annotations

import re

import pytest

from .test_end_to_end import check_run

PAUSE = 40.0          # seconds: longer than the old 30 s peer_timeout, as a checkpoint is


def test_a_rank_that_dies_is_named_by_every_other_within_the_timeout(fabric):
    job = fabric.job(3, num_slots=8)
    # Together: worker 2's 2 s start from the common start, so it dies in a call, not
    # in a session start the others have not reached yet.
    runs = fabric.run(job, ["--size", "6000", "--reps", "100000", "--peer-timeout", "5",
                            "--max-rto", "0.5"], extra={2: ["--die-after", "2"]},
                      together=True, timeout=60)
    assert runs[2].returncode == 137
    for run in runs[:2]:
        assert run.returncode == 1
        error = run.reports[-1]["error"]
        assert re.match(rf"AggregationTimeout: job {job.id}, worker {run.worker}, call \d+ "
                        r"\(6000 elements\): no result for \d+ slot", error), error
        assert "the switch waits for worker(s) 2." in error, error
        waited = float(re.search(r"after (\d+\.\d) s \(peer_timeout 5 s", error)[1])
        assert 5.0 <= waited and run.reports[-1]["seconds"] < 5.0 + 3.0
    fabric.remove(job)


def test_a_rank_that_pauses_longer_than_before_is_waited_for(fabric, tmp_path):
    """One target is enough: the waiting is the workers' timers and the switch's
    WAITING replies, the same program on every target, and each run costs 40 s."""
    if fabric.target != "softswitch":
        pytest.skip("run on the native embedded switch only (40 s per target)")
    job = fabric.job(3, num_slots=8)
    runs = fabric.run(job, ["--size", "6000", "--reps", "2", "--seed", "5", "--save",
                            str(tmp_path)], extra={1: ["--pause", f"1:{PAUSE}"]}, timeout=180)
    check_run(runs, job, tmp_path, size=6000, seed=5, reps=2)
    for run in (runs[0], runs[2]):
        waited = run.reports[1]
        # Its call began when its call-0 result came, worker 1's pause when worker 1's
        # did: a scheduling delay apart, either way.
        assert waited["seconds"] >= PAUSE - 1.0
        # While waiting, a line every progress_interval (10 s) names the paused rank
        # (before the call's first result a timeout resends one slot's packet a
        # period, so the first lines may count slots not asked about yet).
        lines = re.findall(rf"job {job.id}, worker {run.worker}, call 2 \(6000 elements\): no "
                           r"result for \d+ slot\(s\) for \d+ s; the switch waits for "
                           r"worker\(s\) 1( \(\d+ slot\(s\) without a reply yet\))?\n",
                           run.stderr)
        assert len(lines) >= 3, run.stderr
        # The timers backed off (to max_rto, 2 s), and with no result yet in the call
        # each timeout resent one packet, not the window's eight: a few dozen in all,
        # and the WAITING replies they asked for did not speed them up.
        counters = waited["counters"]
        assert 0 < counters["waiting_replies"] <= counters["retransmissions"]
        assert counters["retransmissions"] <= PAUSE / 2.0 + 20
    fabric.remove(job)


def test_a_rank_paused_past_the_switch_timeout_keeps_the_job_on_the_switch(fabric, tmp_path):
    """On the ``ina`` backend with a fallback (INA_SWITCH_TIMEOUT=2 s), rank 1 pauses
    12 s before a call, as a checkpoint would: the switch's WAITING replies say it is
    there, so the others wait (no gloo call on any rank), and every call is exact and
    bit-identical."""
    import json

    import numpy as np

    from innet_aggregation.worker.run import make_inputs

    from .conservation_calls import SEED

    if fabric.target != "softswitch":
        pytest.skip("run on the native embedded switch only (the pause costs 12 s)")
    size, calls, pause = 6000, 4, 12.0
    job = fabric.job(3, num_slots=8)
    runs = fabric.run(job, ["--master", f"{job.hosts[0].ip}:{31300 + job.id}", "--world", "3",
                            "--out", str(tmp_path), "--calls", str(calls), "--zeros", "0",
                            "--size", str(size), "--switch-timeout", "2"],
                      extra={1: ["--sleep", str(pause), "--sleep-calls", "2"]},
                      module="tests.worker.conservation_calls", timeout=90)
    for run in runs:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
        assert "through gloo" not in run.stderr, run.stderr[-3000:]
    logs = [[json.loads(line) for line in (tmp_path / f"{r}.jsonl").read_text().splitlines()]
            for r in range(3)]
    assert all(c["via"] == "switch" for log in logs for c in log), logs
    for call in range(calls):
        results = [np.load(tmp_path / f"{r}.{call}.npy") for r in range(3)]
        assert all(r.tobytes() == results[0].tobytes() for r in results), f"call {call}"
        exact = sum(make_inputs(size, SEED, call, r, steady=True).astype(np.float64)
                    for r in range(3))
        bound = max(log[call]["bound"] for log in logs) + np.abs(exact) * 2.0**-23
        assert (np.abs(results[0] - exact) <= bound).all(), f"call {call}"
    # The others waited the pause out in the switch call, naming rank 1 every
    # progress_interval (10 s).
    for run in (runs[0], runs[2]):
        assert re.search(r"the switch waits for worker\(s\) 1", run.stderr), run.stderr[-3000:]
