"""A QUORUM resent to a switch that forgot its round (deadline.md, "A slot reset"):
a round finished with both workers, the one that sends QUORUMs lost its result, and
the job's slots are reset (``switch_ctl reset``: entries, round ids, counts and values
stay, the bitmaps are emptied) before its timer resends the packet. With the bitmap
empty the resend is the round's first packet, and a QUORUM of one would release the
round at once with that worker's values alone, asking nobody: it applies those, its
peer the whole sum.

Two ranks of conservation_calls.py, a 2 s deadline (so that the steps below fit in
it). Rank 1 is stopped (SIGSTOP) through call 1: rank 0 releases its rounds and
sends QUORUMs of one from then on, rank 1 the plain contributions of the worker the
quorum awaits. Call 2: rank 1 sends its first window alone and is stopped, so that
it cannot answer rank 0's asks; the switch's packets to rank 0 are dropped; rank 0
sends, every round of the window finishes with both, and rank 0's results are lost.
The slots are reset and the loss lifted, rank 0 resends for a while, then rank 1
goes on and answers the asks it holds. Checked against an independent reference
(check_conserved): every call bit-identical on both ranks, every input applied once.

On the code that resent a QUORUM as a QUORUM, call 2 differed between the ranks in
9 runs of 9; with the QUORUM resent as a plain contribution it passed 14 of 14.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from innet_aggregation.p4src import protocol

from .harness import Fabric
from .test_conservation import SWITCH_TIMEOUT, check_conserved
from .test_lead_fallback import wait_for

WORLD, SLOTS = 2, 4
SIZE = 2 * SLOTS * protocol.packet_format().values_per_packet   # two rounds a slot
CALLS, ZEROS = 4, 8
QUORUM_FROM, LATE = 1, 2       # rank 1 stopped through call 1; the reset in call 2
DEADLINE_MS = 2000
RESENDS = 0.8                  # seconds rank 0 resends to the reset slots, alone


def counter(fabric: Fabric, job, name: str) -> int:
    return fabric.counters(job)[f"ingress.{name}"]


def wait_counter(fabric: Fabric, job, name: str, target: int, runner) -> None:
    deadline = time.monotonic() + 30
    while counter(fabric, job, name) < target:
        assert runner.is_alive() and time.monotonic() < deadline, \
            f"ingress.{name} never reached {target}"
        time.sleep(0.01)


def test_a_quorum_resent_to_reset_slots_is_not_released_alone(fabric: Fabric, tmp_path):
    if fabric.target != "softswitch":
        pytest.skip("run on the native embedded switch only (the fault is the workers')")
    job = fabric.job(WORLD, num_slots=SLOTS, deadline_ms=DEADLINE_MS)
    done = {}
    runner = threading.Thread(target=lambda: done.update(runs=fabric.run(
        job, ["--master", f"{job.hosts[0].ip}:{31800 + job.id}", "--world", str(WORLD),
              "--out", str(tmp_path), "--calls", str(CALLS), "--zeros", str(ZEROS),
              "--size", str(SIZE), "--switch-timeout", str(SWITCH_TIMEOUT),
              "--pause-before", f"{QUORUM_FROM},{LATE}"],
        module="tests.worker.conservation_calls", timeout=120)))
    runner.start()
    quorum_port, late_port = [job.hosts[0].switch_port], [job.hosts[1].switch_port]
    stopped = []

    def stop(rank: int) -> None:
        os.kill(int((tmp_path / f"ready.{QUORUM_FROM}.{rank}").read_text()), signal.SIGSTOP)
        stopped.append(rank)

    def go_on(rank: int) -> None:
        os.kill(int((tmp_path / f"ready.{QUORUM_FROM}.{rank}").read_text()), signal.SIGCONT)
        stopped.remove(rank)

    try:
        wait_for(tmp_path, QUORUM_FROM, range(WORLD), runner)
        stop(1)                      # rank 0 releases call 1 without it: a quorum of one
        (tmp_path / f"go.{QUORUM_FROM}").touch()
        wait_for(tmp_path, LATE, [0], runner)
        stop(0)
        go_on(1)                     # catches up from the released rounds, awaited
        wait_for(tmp_path, LATE, [1], runner)
        consumed = counter(fabric, job, "consumed")
        (tmp_path / f"go.{LATE}").touch()
        wait_counter(fabric, job, "consumed", consumed + SLOTS, runner)   # rank 1's window
        stop(1)
        fabric.control.set_loss(quorum_port, egress=1.0)
        completed = counter(fabric, job, "completed")
        go_on(0)                     # its QUORUMs finish the rounds; its results are lost
        wait_counter(fabric, job, "completed", completed + SLOTS, runner)
        # Rank 1 has the whole results queued; what the reset slots send it later is
        # lost, as it is when it took them at once (else it would take the later
        # RELEASED of its batch first, as rank 0 did).
        fabric.control.set_loss(late_port, egress=1.0)
        assert fabric.control.reset(fabric._config(job)) == SLOTS
        fabric.control.set_loss(quorum_port, egress=0.0)
        time.sleep(RESENDS)          # rank 0's timers resend to the reset slots
        fabric.control.set_loss(late_port, egress=0.0)
        go_on(1)                     # takes the whole results, answers rank 0's asks
    finally:
        fabric.control.set_loss(quorum_port + late_port, egress=0.0)
        for rank in stopped:
            os.kill(int((tmp_path / f"ready.{QUORUM_FROM}.{rank}").read_text()), signal.SIGCONT)
    runner.join()
    for run in done["runs"]:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
    logs = check_conserved(tmp_path, CALLS + ZEROS, WORLD, calls=CALLS, size=SIZE)
    assert all(c["via"] == "switch" for log in logs for c in log), logs
    # The fault was met: rank 0's timers asked rank 1 for rounds of call 2.
    assert logs[0][LATE]["repairs_asked"] > logs[0][QUORUM_FROM]["repairs_asked"], logs[0]
