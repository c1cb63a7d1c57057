"""After a failed call the job goes on without moving its slots or restarting the
switch: a new session's start makes any slot state safe (a session killed mid-call
included), and ``switch_ctl reset`` returns the job's slots to a fresh switch's
state through PacketOuts."""

from __future__ import annotations

import subprocess
import sys
import time

from innet_aggregation.p4src import protocol
from tests.worker.harness import REPO
from tests.worker.test_end_to_end import check_run


def switch_ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", *args, "--election-id", "20"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_failed_call_then_reset_then_new_sessions_are_exact(fabric, tmp_path):
    job = fabric.job(3, num_slots=8)
    # Worker 2 never comes: 0 and 1 leave their bits in every slot, then give up.
    runs = fabric.run(job, ["--size", "2000", "--peer-timeout", "2", "--max-rto", "0.5"],
                      workers=[0, 1], timeout=60)
    for run in runs:
        assert run.returncode == 1 and run.error.startswith("AggregationTimeout"), run.error
    before = fabric.counters(job)["ingress.slot_reset"]
    reset = switch_ctl("reset", str(job.path))
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.strip() == f"job {job.id}: 8 slots reset"
    assert fabric.counters(job)["ingress.slot_reset"] - before == 8
    runs = fabric.run(job, ["--size", "3000", "--reps", "3", "--seed", "13",
                            "--save", str(tmp_path)])
    check_run(runs, job, tmp_path, size=3000, seed=13, reps=3)
    fabric.remove(job)


def test_a_session_killed_mid_call_then_new_sessions_are_exact_or_fail_clearly(fabric,
                                                                               tmp_path):
    """Every worker of a session dies (os._exit) in the middle of its calls, leaving
    finished, half-filled and half-vacated (slot, set)s behind. New sessions on the
    job, without a reset, either aggregate exactly or all fail at their start,
    promptly, saying that the slots hold another session's state; never a stale sum
    (their inputs differ from the dead session's, so one would be far off). After
    the reset the error asks for, new sessions are exact."""
    job = fabric.job(3, num_slots=8)
    # Together: each worker's 1.5 s run from the common start, so every one dies in
    # its calls, none before the others have started their session.
    runs = fabric.run(job, ["--size", "6000", "--reps", "100000", "--die-after", "1.5"],
                      together=True, timeout=60)
    assert all(run.returncode == 137 and run.reports for run in runs), \
        [(run.returncode, len(run.reports)) for run in runs]
    outcomes = set()
    for attempt in range(3):
        outdir = tmp_path / f"after{attempt}"
        runs = fabric.run(job, ["--size", "3000", "--reps", "2", "--seed", str(17 + attempt),
                                "--save", str(outdir), "--peer-timeout", "30"], timeout=60)
        failed = [run for run in runs if run.returncode]
        if not failed:
            check_run(runs, job, outdir, size=3000, seed=17 + attempt, reps=2)
            outcomes.add("exact")
            break
        assert len(failed) == len(runs), "some workers started, some did not"
        for run in runs:
            (report,) = run.reports
            assert report["error"].startswith(f"CallMismatch: job {job.id}, worker "
                                              f"{run.worker}, session start: slot "), report
            assert "holds another session's state" in report["error"]
            assert "switch_ctl reset" in report["error"] and report["seconds"] < 10
        assert not outdir.exists(), "a worker saved a result"
        outcomes.add("refused")
        reset = switch_ctl("reset", str(job.path))
        assert reset.returncode == 0, reset.stderr
    assert "exact" in outcomes, outcomes
    fabric.remove(job)


def test_a_frame_on_a_data_port_cannot_reset(fabric):
    """The packet_out header is parsed only on the CPU port: the same four bytes from
    a host are an Ethernet frame too short to parse, switched or dropped at L2."""
    job = fabric.job(2, num_slots=8)
    before = fabric.counters(job)
    host = job.hosts[0]
    sock = host.raw_socket()
    try:
        command = bytes([protocol.ControlOp.RESET_SLOT, job.id]) + (0).to_bytes(2, "big")
        for _ in range(10):
            sock.send(command + bytes(60))
    finally:
        sock.close()
    time.sleep(0.3)                 # ample for the slowest target to take ten frames
    assert fabric.counters(job)["ingress.slot_reset"] == before["ingress.slot_reset"]
    fabric.remove(job)
