"""Nothing a rank contributes is lost or applied twice under a deadline (carry.py),
checked against an independent reference: the sum of every call's result, over the
calls and then calls of zeros that apply what is still carried, plus what the ranks
still carry at the end, equals the float64 sum of every rank's inputs; every result is
bit-identical on every rank. The zero calls go on until no rank carries anything, and
mostly get there; on a loaded host a rank may still miss the deadline in each of them,
and what it then carries is counted where it belongs.

Four ranks on the ``cpu:ina`` backend (job file, INA_FALLBACK=gloo), a 40 ms deadline;
rank 3 sleeps 0.4 s before call 2, ten deadlines, so the others release its rounds and
it carries its values of call 2 into call 3.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np

from innet_aggregation.p4src import protocol
from innet_aggregation.worker.run import make_inputs

from .conservation_calls import SEED
from .harness import Fabric

WORLD = 4
DEADLINE_MS = 40
CALLS, ZEROS = 6, 8
SIZE = 64 * protocol.packet_format().values_per_packet     # 4 rounds of 16 slots
SWITCH_TIMEOUT = 2.0


def run_and_check(fabric: Fabric, tmp_path, port: int, faults=None):
    """The ranks' calls (``faults``: call -> what to do to the job before it, given the
    job; a call may be the first zero call, CALLS), checked:
    each call bit-identical on every rank; the sum of all results within the documented
    bound of the float64 sum of all inputs; nothing carried at the end. The logs."""
    job = fabric.job(WORLD, num_slots=16, deadline_ms=DEADLINE_MS)
    master = f"{job.hosts[0].ip}:{port + job.id}"
    done = {}
    runner = threading.Thread(target=lambda: done.update(runs=fabric.run(
        job, ["--master", master, "--world", str(WORLD), "--out", str(tmp_path),
              "--calls", str(CALLS), "--zeros", str(ZEROS), "--size", str(SIZE),
              "--pause-before", ",".join(map(str, faults or {})),
              "--switch-timeout", str(SWITCH_TIMEOUT)],
        extra={3: ["--sleep", "0.4", "--sleep-calls", "2"]},
        module="tests.worker.conservation_calls", timeout=90)))
    runner.start()
    for call, fault in sorted((faults or {}).items()):
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready.{call}.{r}").exists() for r in range(WORLD)):
            assert runner.is_alive() and time.monotonic() < deadline, \
                f"the ranks never got to call {call}"
            time.sleep(0.05)
        fault(job)
        (tmp_path / f"go.{call}").touch()
    runner.join()
    for run in done["runs"]:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
    logs = check_conserved(tmp_path, CALLS + ZEROS)
    late = sum(log[2]["late"] for log in logs[3:])
    assert late > 0, "rank 3 was never left out: the test tested nothing"
    return logs


def check_conserved(out, most: int, world: int = WORLD, calls: int = CALLS,
                    size: int = SIZE) -> list[list[dict]]:
    """The ranks' logs in ``out`` (conservation_calls.py), checked: each call
    bit-identical on every rank; the sum of all results plus what is still carried
    within the documented bound of the float64 sum of all inputs; nothing carried at
    the end unless the zero calls ran out (``most`` calls in all)."""
    logs = [[json.loads(line) for line in (out / f"{r}.jsonl").read_text().splitlines()]
            for r in range(world)]
    total = len(logs[0])
    assert calls <= total <= most, total
    assert all(len(log) == total for log in logs), [len(log) for log in logs]
    results = [[np.load(out / f"{r}.{c}.npy") for c in range(total)] for r in range(world)]
    for c in range(total):
        assert all(results[r][c].tobytes() == results[0][c].tobytes() for r in range(world)), \
            f"call {c} differs between ranks"
    owed = sum(np.load(out / f"{r}.owed.npy") for r in range(world))
    assert (owed == 0).all() or total == most, "carried, yet the zero calls stopped"
    applied = sum(r.astype(np.float64) for r in results[0]) + owed
    exact = sum(make_inputs(size, SEED, c, r, steady=True).astype(np.float64)
                for c in range(calls) for r in range(world))
    # Per call, the switch's quantization bound (a value applied a call late is
    # quantized at most once more) or gloo's float32 sum of four, and the float32
    # result's own rounding; summed over the calls. A call of zeros that no rank
    # carried anything into sums zeros, exactly, whatever scale a fresh session's
    # first call probes with (its bound may be huge).
    def empty(c):
        return c >= calls and all(log[c - 1]["carried"] == 0 for log in logs)
    bound = sum(max(log[c]["bound"] for log in logs) for c in range(total) if not empty(c)) * 2 \
        + sum(np.abs(r.astype(np.float64)) for r in results[0]) * world * 2.0**-23
    error = np.abs(applied - exact)
    worst = int(np.argmax(error - bound))
    assert (error <= bound).all(), \
        f"value {worst}: applied {applied[worst]}, inputs sum to {exact[worst]}, bound {bound[worst]}"
    return logs


def test_the_late_ranks_values_are_all_applied_once(fabric, tmp_path):
    run_and_check(fabric, tmp_path, 31100)


def test_with_loss_on_the_late_ranks_link_every_value_is_applied_once(fabric, tmp_path):
    """1.5 % of the aggregation packets lost both ways on rank 3's port: a RELEASED
    result lost on its way to rank 3 after its (slot, set) moved on is never sent again
    by the switch (its resends are stale there); rank 3 gets it from a peer."""
    def loss(p):
        return lambda job: fabric.control.set_loss([job.hosts[3].switch_port], ingress=p,
                                                   egress=p)

    # Lossless again for the zero calls: under loss rank 3 is left out of some round of
    # almost every call (a deadline hit by a resend), so it would carry again and again.
    try:
        run_and_check(fabric, tmp_path, 31200, {0: loss(0.015), CALLS: loss(0.0)})
    finally:
        fabric.control.set_loss([h.switch_port for h in fabric.jobs[-1].hosts], ingress=0.0,
                                egress=0.0)


def test_values_carried_into_a_call_that_falls_back_to_gloo_are_applied_there(
        fabric, tmp_path):
    """Every rank's switch path fails at call 3, into which rank 3 carries its values of
    call 2: the call is redone through gloo with them in."""
    def drop_every_result(p):
        return lambda job: fabric.control.set_loss([h.switch_port for h in job.hosts], egress=p)

    try:
        logs = run_and_check(fabric, tmp_path, 31150, {3: drop_every_result(1.0)})
    finally:
        drop_every_result(0.0)(fabric.jobs[-1])
    for log in logs:
        assert [c["via"] for c in log[:3]] == ["switch"] * 3, log
        assert all(c["via"] == "gloo" for c in log[3:]), log


def test_a_carry_past_its_bound_is_an_error_naming_the_key_and_size():
    from innet_aggregation.worker.carry import Carry, CarryFull
    import pytest

    carry = Carry(limit=3 * 4)
    key = carry.key("bucket", 10)
    carry.keep(key, np.array([0, 2]), np.ones((2, 4), np.float32))
    carry.keep(key, np.array([2]), np.ones((1, 4), np.float32))     # merged: block 2 twice
    assert carry.values == 8
    with pytest.raises(CarryFull, match=r"carrying 8 values of call \('named', 'other', 10\) "
                                        r"would hold 16 left-out values, past the carry's "
                                        r"limit of 12"):
        carry.keep(carry.key("other", 10), np.array([0, 1]), np.ones((2, 4), np.float32))
    assert carry.values == 8                          # what was held is still held
    flat = np.zeros(10, np.float64)
    carry.add_into(key, flat)                          # blocks 0 and 2 (the partial last one)
    assert flat.tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 2, 2] and carry.values == 0
