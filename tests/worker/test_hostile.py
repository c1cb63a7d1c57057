"""Workers under hostile traffic from a host that is not a member of the job.

Forged ICMP destination-unreachable errors quoting a worker's aggregation flow make
the worker's kernel fail its next send or receive on the connected socket. The
worker counts them as losses (Stats.socket_errors) and its timers repair them:
only peer_timeout ends a call.
"""

from __future__ import annotations

import threading
import time

from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether


from .harness import SERVICE_IP, WORKER_UDP_PORT
from .test_end_to_end import check_run

# Destination unreachable: host, protocol, port, host prohibited, filtered. Linux
# reports 2, 3, 10 and 13 on a connected UDP socket; 1 only with IP_RECVERR.
UNREACHABLE_CODES = (1, 2, 3, 10, 13)


def forged_unreachable(attacker, worker, code: int, job_port: int) -> bytes:
    """An ICMP error from ``attacker`` to ``worker`` quoting the worker's packet
    to the switch, as if a router on the way had refused it."""
    quoted = bytes(IP(src=worker.ip, dst=SERVICE_IP)
                   / UDP(sport=WORKER_UDP_PORT, dport=job_port))[:28]
    return bytes(Ether(src=attacker.mac, dst=worker.mac)
                 / IP(src=attacker.ip, dst=worker.ip) / ICMP(type=3, code=code) / quoted)


class Flood:
    """Sends ``frames`` round robin from ``host``'s port, ``rate`` per second, in a
    thread, until stopped; counts what it sent."""

    def __init__(self, host, frames: list[bytes], rate: float):
        self.sock = host.raw_socket()
        self.frames, self.interval = frames, 1.0 / rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            self.sock.send(self.frames[self.sent % len(self.frames)])
            self.sent += 1
            self._stop.wait(max(0.0, start + self.sent * self.interval - time.monotonic()))

    def __enter__(self) -> "Flood":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_forged_icmp_unreachable_is_a_loss_not_a_failure(fabric, tmp_path):
    job = fabric.job(3, num_slots=16)
    attacker = fabric.topology.hosts[-1]         # not a worker of the job
    frames = [forged_unreachable(attacker, w, code, job.udp_port) for w in job.hosts
              for code in UNREACHABLE_CODES]
    size, reps = 20_000, 6
    # BMv2 forwards 1-3 k frames/s in all, and drops what queues beyond that.
    rate = 150 if fabric.target == "bmv2" else 500
    with Flood(attacker, frames, rate) as flood:
        runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed", "13",
                                "--save", str(tmp_path)])
    check_run(runs, job, tmp_path, size=size, seed=13, reps=reps)
    errors = sum(r["counters"]["socket_errors"] for run in runs for r in run.reports)
    assert errors > 0, f"{flood.sent} forged ICMP errors, none seen by a worker"
    fabric.remove(job)
