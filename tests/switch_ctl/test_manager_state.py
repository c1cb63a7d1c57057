"""The job manager's state against crashes and a misbehaving switch, with the
1,024-value program: a manager killed at each step of installing and removing a job
loses and leaks nothing; time the manager was stopped expires no lease; a hung
switch, and a restarted one that takes 15 s or more to load the program (its
compile cache empty), delay no renewal; a manager starts with its switch down and
installs the job that waits once the switch is up.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from innet_aggregation.switch_ctl.manager.installer import MARK
from innet_aggregation.switch_ctl.manager.wire import job_key

from .faulty_manager import FAULT_STEPS
from .manager_harness import LEASE, ManagerBed, credential_of, skip_unless_runnable, until
from .test_manager import finished, held, joined

VALUES = 1024


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    skip_unless_runnable()
    bed = ManagerBed(tmp_path_factory.mktemp("manager-state"), values=VALUES).start()
    yield bed
    bed.stop()


def agreed(bed) -> bool:
    """The manager holds nothing (in memory, in its database, on the switch)."""
    listing = bed.jobs()
    return (not any(listing[k] for k in ("running", "waiting", "removing"))
            and not bed.database() and not bed.installed())


@pytest.fixture(autouse=True)
def nothing_left(bed):
    yield
    until(lambda: agreed(bed), 3 * LEASE + 10, "the test's jobs left the manager and switch")


def log_lines(bed) -> str:
    return bed.manager_log()


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_a_manager_killed_at_each_step_loses_and_leaks_nothing(bed, step):
    bed.kill_manager()
    bed.start_manager(fault=step)
    name = f"fault-{step}"
    ranks = bed.launch(name, [0, 1], "--reps", "2", "--seed", str(FAULT_STEPS.index(step)))
    until(lambda: bed.manager.poll() is not None, 60, f"the manager killed itself at {step}")
    assert bed.manager.returncode == 137
    bed.restarts += 1
    # What the killed manager left: its row, in the state of the step, and the switch
    # as the step says.
    (state, job_id), = bed.database().values()
    assert state == ("installing" if step.startswith("install") else "removing")
    on_switch = bed.installed()
    assert (job_id in on_switch) == (step in ("installed", "remove")), (step, on_switch)
    if job_id in on_switch:
        assert on_switch[job_id].mark == MARK
    bed.start_manager()
    # Every rank ran its calls: killed while installing, the ranks registered again.
    finished(ranks, timeout=90, calls=2)
    until(lambda: agreed(bed), 20, "the job's row and entries gone")
    assert (f"job {job_key(name, credential_of(name))} (id {job_id}) was {state} when the "
            f"manager stopped") in log_lines(bed)


def test_time_the_manager_was_stopped_expires_no_lease(bed):
    release = bed.workdir / "release-stall"
    a = bed.launch("stall", [0, 1], "--reps", "2", "--hold", str(release))
    held(a)
    os.kill(bed.manager.pid, signal.SIGSTOP)
    try:
        time.sleep(2 * LEASE)
    finally:
        os.kill(bed.manager.pid, signal.SIGCONT)
    time.sleep(LEASE)
    assert [j["name"] for j in bed.jobs()["running"]] == ["stall"]
    assert "the manager was stuck for" in log_lines(bed)
    release.touch()
    finished(a, calls=2)
    assert "stopped renewing" not in log_lines(bed)


def test_a_hung_switch_delays_no_renewal(bed):
    release = bed.workdir / "release-hang"
    a = bed.launch("hang-a", [0, 1], "--reps", "2", "--hold", str(release))
    held(a)
    os.kill(bed.switch.process.pid, signal.SIGSTOP)
    slowest = 0.0
    try:
        b = bed.launch("hang-b", [2, 3], "--reps", "2")    # registers while the switch hangs
        end = time.monotonic() + 2 * LEASE + 1
        while time.monotonic() < end:
            start = time.monotonic()
            listing = bed.jobs()            # under the lock every renewal takes
            slowest = max(slowest, time.monotonic() - start)
            assert [j["name"] for j in listing["running"]] == ["hang-a"]
            time.sleep(0.2)
    finally:
        os.kill(bed.switch.process.pid, signal.SIGCONT)
    assert slowest < 1.0, slowest
    # hang-b waits: for its port proof, which the hung switch cannot send, or its slots.
    assert not any(r.event("joined") for r in b)
    release.touch()
    finished(a, calls=2)
    finished(b, timeout=90, calls=2)
    assert "stopped renewing" not in log_lines(bed)
    assert not any("cannot renew" in r.stderr for r in a)


def test_a_restarted_switch_delays_no_renewal_and_reclaims_no_job(bed, tmp_path):
    """Slow: 30 to 60 s (2 loaded cores), as the restarted switch compiles the program."""
    between = bed.workdir / "between-restart"
    a = bed.launch("restart-a", [0, 1], "--sessions", "2", "--reps", "2",
                   "--between", str(between))
    job_id = joined(a)[0]["job_id"]
    until(lambda: all(len(r.events()) == 3 for r in a), 60, "restart-a's first session")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path))     # the switch's alone
        bed.restart_switch()
    # Registrations while the manager pushes the program again (15 s or more); the
    # manager answers (under the lock every renewal takes) at once all along.
    b = bed.launch("restart-b", [2, 3], "--reps", "2")
    slowest = 0.0

    def back() -> bool:
        nonlocal slowest
        start = time.monotonic()
        bed.jobs()
        slowest = max(slowest, time.monotonic() - start)
        return job_id in bed.installed()
    until(back, 90, "restart-a back on the switch", interval=0.3)
    assert slowest < 1.0, slowest
    assert "stopped renewing" not in log_lines(bed)
    between.touch()
    finished(a, calls=4)
    finished(b, timeout=90, calls=2)
    assert "stopped renewing" not in log_lines(bed)
    assert not any("is lost" in r.stderr for r in a)


def test_the_manager_starts_with_its_switch_down(bed):
    bed.kill_manager()
    bed.kill_switch()
    bed.start_manager()
    until(lambda: "cannot be repaired or read now" in bed.log_path.read_text(), 20,
          "the manager says its switch is away")
    c = bed.launch("down", [4, 5], "--reps", "2")
    # The port proof is the first thing a rank waits for: the switch must send it.
    until(lambda: all("waiting for the switch to send the port proof" in r.stderr and
                      "cannot reach a P4Runtime server" in r.stderr for r in c), 30,
          "the ranks told why they wait")
    bed.start_switch()
    finished(c, timeout=120, calls=2)
    assert "the switches are reachable" in bed.log_path.read_text()
