"""The job manager (switch_ctl serve) with a real switch (the embedded one, native
backend), real P4Runtime, and ranks in namespaces that find their own interfaces,
join through the management network over TLS, and aggregate exactly.

The pool holds two jobs' slots (32, 16 a job): a third job waits, and goes on when
one ends; a fourth, with a short timeout, is refused. Killed ranks lose their job
within the lease; a restarted manager keeps its jobs; a restarted switch gets them
back.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import time

import pytest

from innet_aggregation.switch_ctl.manager import JoinError, join
from innet_aggregation.testbed.targets import unavailable

from .manager_harness import JOB_SLOTS, LEASE, POOL_SLOTS, SECRET, SWEEP, ManagerBed, until


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the manager tests need root to create network namespaces")
    reason = unavailable("softswitch")
    if reason:
        pytest.skip(reason)
    bed = ManagerBed(tmp_path_factory.mktemp("manager")).start()
    yield bed
    bed.stop()


@pytest.fixture(autouse=True)
def nothing_left_running(bed):
    """Each test ends with its jobs gone from the manager and the switch."""
    yield
    until(lambda: not bed.jobs()["running"] and not bed.jobs()["waiting"], 3 * LEASE,
          "the test's jobs left the manager")
    until(lambda: not bed.installed(), 5, "the test's jobs left the switch")


def joined(ranks, timeout=60):
    return until(lambda: all(r.event("joined") for r in ranks) and
                 [r.event("joined") for r in ranks], timeout, "every rank joined")


def held(ranks, timeout=60):
    until(lambda: all(r.event("held") or r.process.poll() is not None for r in ranks), timeout,
          "every rank ran its calls")
    for r in ranks:
        assert r.event("held"), f"rank {r.rank}: {r.events()}\n{r.stderr[-3000:]}"


def finished(ranks, timeout=60, calls=None):
    for r in ranks:
        assert r.wait(timeout) == 0, f"rank {r.rank}: {r.events()}\n{r.stderr[-3000:]}"
        results = [e for e in r.events() if e.get("event") == "call"]
        assert all(e["wrong"] == 0 for e in results)
        if calls is not None:
            assert len(results) == calls


def test_two_jobs_share_the_switch_a_third_waits_and_a_fourth_gives_up(bed):
    a = bed.launch("job-a", [0, 1], "--reps", "3", "--hold", str(bed.workdir / "release-a"))
    b = bed.launch("job-b", [2, 3], "--reps", "3", "--seed", "2",
                   "--hold", str(bed.workdir / "release-b"))
    ja, jb = joined(a)[0], joined(b)[0]
    # Disjoint: ids, slots, UDP ports, service addresses; every rank got the same job.
    assert all(r.event("joined") == {**ja, "ip": r.event("joined")["ip"]} for r in a)
    assert {ja["first_slot"], jb["first_slot"]} == {0, JOB_SLOTS}
    assert ja["num_slots"] == jb["num_slots"] == JOB_SLOTS
    for key in ("job_id", "udp_port", "service_ip", "service_mac"):
        assert ja[key] != jb[key], key
    # Each rank's data-plane address, found by the rank itself (mgmt0 is not in the fabric).
    assert [r.event("joined")["ip"] for r in a + b] == [
        bed.topology.hosts[i].ip for i in range(4)]
    installed = bed.installed()
    for j in (ja, jb):
        on_switch = installed[j["job_id"]]
        assert (on_switch.first_slot, on_switch.num_slots, on_switch.udp_port,
                on_switch.service_ip) == (j["first_slot"], JOB_SLOTS, j["udp_port"],
                                          j["service_ip"])
    held(a + b)

    # The pool is full: C waits, saying why; D gives up after its own timeout.
    c = bed.launch("job-c", [4, 5], "--reps", "2", "--seed", "3")
    d = bed.launch("job-d", [6, 7], extra_env={"INA_JOIN_TIMEOUT": "4"})
    for r in d:
        assert r.wait(30) == 2
        error = r.events()[0]["error"]
        assert error.startswith("JoinError: job job-d did not start within 4 s (waiting for "
                                f"slots: 2 jobs hold {POOL_SLOTS} of the pool's {POOL_SLOTS} "
                                f"slots; this job needs {JOB_SLOTS} in one range)"), error
    assert "waiting for slots: 2 jobs hold" in c[0].stderr
    assert not any(r.event("joined") for r in c)

    (bed.workdir / "release-a").touch()
    finished(a, calls=3)
    jc = joined(c)[0]
    assert jc["first_slot"] == ja["first_slot"]              # A's slots, reset for C
    assert jc["job_id"] not in (ja["job_id"], jb["job_id"])  # ids taken in turn
    finished(c, calls=2)
    (bed.workdir / "release-b").touch()
    finished(b, calls=3)
