"""A deadline job's rank frozen (SIGSTOP) while the switch restarts and its job is
installed again under the same id and slots: the switch's round tracker is wiped, so
a round the others took before the restart, and the frozen rank never got, counts as
a new one there when the rank sends it on waking. Released with its values alone, it
would be applied by that rank only: replicas diverge silently (deadline.md, "A
switch that restarted").

Four ranks of conservation_calls.py (and two, "stayed" only), a 40 ms deadline.
Every rank pauses before call 2; the switch's packets to the last rank, rank 3, are
dropped, rank 3 is stopped, and the others
release its rounds through calls 2, 3 and 4 and pause before call 5. The switch is
killed, started again and the job installed again, lossless. Then either
``fell_back``: the others' call 5 met the dead switch and went to gloo (they wait in
the fallback's agreement for rank 3), or ``stayed``: the others still wait before call
5, on the switch path, while rank 3 catches up alone on the fresh switch; rank 3 goes
on (SIGCONT). Checked against an independent reference (check_conserved): every call
bit-identical on every rank, every input applied once.

``reset`` (the others stay, one call ahead, two rounds a slot): instead of the
restart, the job's slots are reset with its entries kept (``Controller.reset``, what
``switch_ctl reset`` does) and the loss lifted. The round tracker keeps its ids: rank
3's first packet of a slot gets the round the others released by a RELEASE, as
before; its second is the (slot, set)'s last round, which the others' QUORUMs
released, and with the bitmap empty it starts that round anew with its values alone
(deadline.md, "A slot reset"). With both guards of bounded.py taken out it failed 2
runs of 6 (call 2 differs between ranks; a timer that expires before the deadline
asks the peers anyway), and passed 5 of 5 with them.

Before a slot asked its peers for its round ahead of its release (bounded.py),
``stayed`` failed: rank 3's first calls differed from the others' in most values. With
two ranks it failed with that guard alone too, until the rank a quorum awaits sent
plain contributions (its quorum of one released a round on the restarted switch at
once).
``fell_back`` passed then too: the others wait for rank 3 in the agreement, and its
look in the group's store hears of their fall first (deadline.md, "A switch that
restarted").
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from innet_aggregation.p4src import protocol

from .harness import Fabric
from .test_conservation import DEADLINE_MS, SWITCH_TIMEOUT, WORLD, check_conserved
from .test_fallback import restart_switch
from .test_lead_fallback import AHEAD, CALLS, HELD, SIZE, ZEROS, wait_for

PACKET = protocol.packet_format().values_per_packet


@pytest.mark.parametrize("fault, others, world", [
    ("restart", "fell_back", WORLD), ("restart", "stayed", WORLD), ("restart", "stayed", 2),
    ("reset", "stayed", WORLD)])
def test_a_rank_frozen_across_a_switch_restart_applies_what_the_others_did(
        fabric: Fabric, tmp_path, fault, others, world):
    if fabric.target != "softswitch":
        pytest.skip("run on the native embedded switch only (the fallback is the workers')")
    # A reset: the others one call ahead, two rounds a slot, so that rank 3's first
    # packet of a slot gets the RELEASED round, and its second is the (slot, set)'s
    # last round, released at the others' quorum (further behind, its first packet
    # would be stale and its timer would fetch all it lacks from the peers).
    slots, ahead = (16, AHEAD) if fault == "restart" else (SIZE // PACKET // 2, HELD + 1)
    job = fabric.job(world, num_slots=slots, deadline_ms=DEADLINE_MS)
    done = {}
    late_rank = world - 1          # the rank stopped
    late_pauses = f"{HELD},{ahead}" if others == "stayed" else str(HELD)
    runner = threading.Thread(target=lambda: done.update(runs=fabric.run(
        job, ["--master", f"{job.hosts[0].ip}:{31700 + job.id}", "--world", str(world),
              "--out", str(tmp_path), "--calls", str(CALLS), "--zeros", str(ZEROS),
              "--size", str(SIZE), "--switch-timeout", str(SWITCH_TIMEOUT)],
        extra={r: ["--pause-before", late_pauses if r == late_rank else f"{HELD},{ahead}"]
               for r in range(world)},
        module="tests.worker.conservation_calls", timeout=120)))
    runner.start()
    wait_for(tmp_path, HELD, range(world), runner)
    late = int((tmp_path / f"ready.{HELD}.{late_rank}").read_text())
    os.kill(late, signal.SIGSTOP)
    try:
        fabric.control.set_loss([job.hosts[late_rank].switch_port], egress=1.0)
        (tmp_path / f"go.{HELD}").touch()
        wait_for(tmp_path, ahead, range(late_rank), runner)
        if fault == "reset":              # entries, round ids, counts and values stay
            fabric.control.set_loss([job.hosts[late_rank].switch_port], egress=0.0)
            assert fabric.control.reset(fabric._config(job)) == slots
        else:
            fabric.switch.process.kill()      # and with it its loss, and the rounds it held
            fabric.switch.process.wait()
            if others == "fell_back":
                (tmp_path / f"go.{ahead}").touch()
                time.sleep(SWITCH_TIMEOUT + 1)    # the others' call 5 hears nothing: gloo
            restart_switch(fabric)            # the same job, id and slots, on a wiped switch
    finally:
        os.kill(late, signal.SIGCONT)
    if others == "stayed":
        wait_for(tmp_path, ahead, [late_rank], runner)   # it caught up, alone
        (tmp_path / f"go.{ahead}").touch()
    runner.join()
    for run in done["runs"]:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
    logs = check_conserved(tmp_path, CALLS + ZEROS, world, calls=CALLS, size=SIZE)
    if others == "stayed":        # nobody left the switch: it caught up from its peers
        assert all(c["via"] == "switch" for log in logs for c in log), logs
        assert logs[late_rank][ahead - 1]["repairs_asked"] > 0, logs[late_rank]
