"""After a failed call, ``switch_ctl reset`` returns the job's slots to a fresh
switch's state through PacketOuts, and the job goes on without moving its slots or
restarting the switch."""

from __future__ import annotations

import subprocess
import sys
import time

from p4src import protocol
from tests.worker.harness import REPO
from tests.worker.test_end_to_end import check_run


def switch_ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "switch_ctl", *args, "--election-id", "20"],
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
