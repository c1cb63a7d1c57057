"""Workers under hostile traffic from a host that is not a member of the job.

Forged ICMP errors quoting a worker's aggregation flow make the worker's kernel fail
its next send or receive on the connected socket, once. The worker counts them as
losses (Stats.socket_errors), resends at once what a send left, and its timers
repair the rest: only peer_timeout ends a call. "Fragmentation needed" never shrinks
its packets below the program's frame; a route that really refuses them (the send
failing again and again) ends the call at once, naming the errno.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether


from .harness import SERVICE_IP, WORKER_UDP_PORT
from .test_end_to_end import check_run

# Destination unreachable: host, protocol, port, host prohibited, filtered. Linux
# reports 2, 3, 10 and 13 on a connected UDP socket; 1 only with IP_RECVERR.
UNREACHABLE_CODES = (1, 2, 3, 10, 13)
PATHS = {"fast": [], "python": ["--python-path"]}


def forged(attacker, worker, icmp: ICMP, job_port: int) -> bytes:
    """``icmp`` from ``attacker`` to ``worker`` quoting the worker's packet to the
    switch, as if a router on the way had sent it."""
    quoted = bytes(IP(src=worker.ip, dst=SERVICE_IP)
                   / UDP(sport=WORKER_UDP_PORT, dport=job_port))[:28]
    return bytes(Ether(src=attacker.mac, dst=worker.mac)
                 / IP(src=attacker.ip, dst=worker.ip) / icmp / quoted)


def forged_unreachable(attacker, worker, code: int, job_port: int) -> bytes:
    return forged(attacker, worker, ICMP(type=3, code=code), job_port)


def every_icmp(attacker) -> list[ICMP]:
    """Every ICMP type (code 0), and every code of those whose codes Linux tells
    apart: destination unreachable (fragmentation needed down to the smallest MTUs),
    redirect (to the attacker), time exceeded, parameter problem."""
    out = [ICMP(type=t, code=0) for t in range(256) if t not in (3, 5)]
    out += [ICMP(type=3, code=c) for c in range(16) if c != 4]
    out += [ICMP(type=3, code=4, nexthopmtu=mtu) for mtu in (0, 68, 552, 576, 1000)]
    out += [ICMP(type=5, code=c, gw=attacker.ip) for c in range(4)]
    return out + [ICMP(type=11, code=1), ICMP(type=12, code=1), ICMP(type=12, code=2)]


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


@pytest.mark.parametrize("path", PATHS)
def test_forged_icmp_of_every_type_and_code_is_at_most_a_loss(fabric, tmp_path, path):
    """Before IP_PMTUDISC_INTERFACE, one forged "fragmentation needed" locked the
    route's MTU at 552 B (``ip route get``: ``mtu lock 552``) and every send of the
    call failed with EMSGSIZE until peer_timeout."""
    job = fabric.job(3, num_slots=16)
    attacker = fabric.topology.hosts[-1]
    icmps = every_icmp(attacker)
    frag_needed = [i for i in icmps if i.type == 3 and i.code == 4]
    # Fragmentation needed a tenth of the frames: every call meets some.
    frames = [forged(attacker, w, icmp, job.udp_port) for w in job.hosts
              for icmp in icmps + frag_needed * 6]
    size, reps = 20_000, 24
    errors = 0
    try:
        # Each frame twice at least: once while calls ran, whatever a start took. How
        # many frames a run of calls meets depends on the machine's load: runs go on
        # until the flood has sent them all twice (at most 4).
        with Flood(attacker, frames, 300 if fabric.target == "bmv2" else 1500) as flood:
            for attempt in range(4):
                out = tmp_path / f"run{attempt}"
                out.mkdir()
                runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed",
                                        "17", "--save", str(out), "--peer-timeout", "20",
                                        *PATHS[path]])
                check_run(runs, job, out, size=size, seed=17, reps=reps)
                errors += sum(r["counters"]["socket_errors"] for run in runs
                              for r in run.reports)
                if flood.sent >= 2 * len(frames):
                    break
        assert flood.sent >= 2 * len(frames), f"{flood.sent} sent, of {len(frames)} frames"
        assert errors > 0, f"{flood.sent} forged ICMP messages, none seen by a worker"
        for w in job.hosts:
            route = w.run(["ip", "-4", "route", "get", SERVICE_IP], capture_output=True,
                          text=True, check=True).stdout
            # No path MTU learnt, no redirect taken: the service is on the link.
            assert "mtu" not in route and "via" not in route, f"{w.netns}: {route}"
    finally:
        for w in job.hosts:
            w.run(["ip", "-4", "route", "flush", "cache"], check=False)


@pytest.mark.parametrize("path", PATHS)
def test_a_route_that_refuses_the_packets_ends_the_call_at_once(fabric, tmp_path, path):
    """Worker 0 waits in call 1 (its window sent) for worker 1, four seconds late,
    when its route to the service becomes unreachable: the packets it sends on
    worker 1's results (the fast path's sendmmsg, or Python's) fail with
    EHOSTUNREACH every time, and its call ends then, naming it, not at its
    peer_timeout. Its timers cannot fire first (min_rto 30 s)."""
    job = fabric.job(2, num_slots=16)
    host = job.hosts[0]
    sysctls = [f"net.ipv4.conf.{dev}.rp_filter" for dev in ("all", host.ifname)]
    before = [host.run(["sysctl", "-n", k], capture_output=True, text=True,
                       check=True).stdout.strip() for k in sysctls]
    unreachable = ["ip", "-4", "route", "add", "unreachable", f"{SERVICE_IP}/32"]
    out = {}

    def add_route_in_call_1():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for f in fabric.workdir.glob(f"job{job.id}-*/0.out"):
                if '"rep": 0' in f.read_text():
                    out["route"] = host.run(unreachable, capture_output=True, text=True)
                    out["at"] = time.monotonic()
                    return
            time.sleep(0.02)

    try:
        for k in sysctls:           # results from the service still come in
            host.run(["sysctl", "-q", "-w", f"{k}=0"], check=True)
        watcher = threading.Thread(target=add_route_in_call_1)
        watcher.start()
        runs = fabric.run(job, ["--size", "20000", "--reps", "2", *PATHS[path]],
                          extra={0: ["--min-rto", "30", "--initial-rto", "30", "--max-rto", "30",
                                     "--peer-timeout", "60"],
                                 1: ["--pause", "1:4", "--peer-timeout", "3"]})
        watcher.join()
    finally:
        host.run(["ip", "-4", "route", "del", "unreachable", f"{SERVICE_IP}/32"], check=False)
        for k, v in zip(sysctls, before):
            host.run(["sysctl", "-q", "-w", f"{k}={v}"], check=False)
    assert out["route"].returncode == 0, out["route"].stderr
    zero = runs[0]
    assert zero.returncode == 1, zero.stderr[-2000:]
    assert len(zero.reports) == 2 and "counters" in zero.reports[0]
    error, seconds = zero.reports[1]["error"], zero.reports[1]["seconds"]
    assert re.match(rf"SendRefused: job {job.id}, worker 0, call 2 \(20000 elements\): sending "
                    rf"to {re.escape(SERVICE_IP)}:{job.udp_port} fails with EHOSTUNREACH "
                    rf"\(No route to host\) 3 times in a row", error), error
    # Worker 1 came four seconds into the call; worker 0 ended within one more.
    assert 3.0 < seconds < 5.5, seconds
    assert "AggregationTimeout" in runs[1].error
