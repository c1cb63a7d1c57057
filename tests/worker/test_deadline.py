"""Bounded-time aggregation (a job's ``deadline_ms``, p4src/v1model/deadline.p4): a rank
that sleeps no longer holds the others, every rank applies the same bits, and the
values a release left out arrive in the next call of the same name, never lost.

Three ranks; rank 2 sleeps 0.4 s before two of eight calls, ten times the deadline,
so the others release its rounds and move on (into the next call: a slot sees later
rounds while rank 2 still sends earlier ones, which the switch drops as stale or
answers with their released sums). Every call's result is checked on every rank
against a float64 reference built from what each rank says it left out: each block
sums, over the ranks that were in it, their input plus what they carried into it.
"""

from __future__ import annotations

import numpy as np

from innet_aggregation.p4src import protocol
from innet_aggregation.worker.run import make_inputs

from .deadline_calls import SEED

DEADLINE_MS = 40
CALLS = 8
SIZE = 64 * protocol.packet_format().values_per_packet     # 4 rounds of 16 slots


def effective_inputs(logs, call: int, k: int) -> list[np.ndarray]:
    """Each rank's input to ``call``, with what it carried out of the call before."""
    inputs = []
    for rank, log in enumerate(logs):
        x = make_inputs(SIZE, SEED, call, rank, steady=True)
        if call:
            before = log[call - 1]
            for chunk, values in zip(before["left_out"], before["carried"]):
                x[chunk * k:(chunk + 1) * k] += values       # float32, as the worker adds
        inputs.append(x)
    return inputs


def test_a_sleeping_rank_is_released_without_and_gets_its_values_in_a_call_later(
        fabric, tmp_path):
    k = protocol.packet_format().values_per_packet
    job = fabric.job(3, num_slots=16, deadline_ms=DEADLINE_MS)
    before = fabric.control.deadline_counters(job.id)
    runs = fabric.run(job, ["--out", str(tmp_path), "--calls", str(CALLS), "--size", str(SIZE)],
                      extra={2: ["--sleep", "0.4", "--sleep-calls", "2,5"]},
                      module="tests.worker.deadline_calls", timeout=60)
    for run in runs:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
    logs = [[dict(np.load(tmp_path / f"{r}.{c}.npz")) for c in range(CALLS)] for r in range(3)]
    for call in range(CALLS):
        results = [log[call]["result"] for log in logs]
        assert all(r.tobytes() == results[0].tobytes() for r in results), f"call {call}"
        inputs = effective_inputs(logs, call, k)
        expected = np.zeros(SIZE)
        for rank, x in enumerate(inputs):
            inside = np.ones(SIZE // k, dtype=bool)
            inside[logs[rank][call]["left_out"]] = False
            expected += np.where(inside.repeat(k), x.astype(np.float64), 0.0)
        # The quantization's bound, plus the float32 result's own rounding.
        bound = max(run.reports[call]["bound"] for run in runs) + np.abs(expected) * 2.0**-23
        error = np.abs(results[0] - expected)
        worst = int(np.argmax(error - bound))
        assert (error <= bound).all(), \
            f"call {call}, value {worst}: off by {error[worst]}, bound {bound[worst]}"
    # Rank 2 was left out of rounds (the others too, if a busy host kept one past the
    # deadline); every rank saw them released.
    left_out = [sum(len(log[c]["left_out"]) for c in range(CALLS)) for log in logs]
    assert left_out[2] >= 2 * SIZE // k, left_out       # at least its two sleeps' calls
    late = [sum(r["late"] for r in run.reports) for run in runs]
    released = [sum(r["released"] for r in run.reports) for run in runs]
    assert late == left_out and min(released) >= left_out[2], (late, released)
    counted = fabric.control.deadline_counters(job.id)
    assert counted["released"] - before["released"] > 0, counted
    assert counted["release_refused"] == before["release_refused"], counted
