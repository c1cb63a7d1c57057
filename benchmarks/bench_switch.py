"""Packets per second a switch forwards on the aggregation program (k values/packet).

Four workers, each in its own network namespace behind a veth pair, send
contributions with at most ``--window`` aggregations in flight; the switch sums
them and multicasts each result back to all four. The figure is contributions
processed per second, from the first send to the last result (a contribution
carries k register read-add-writes). The load comes from C (benchmarks/native/
loadgen.c, batched sendmmsg/recvmmsg, called without the GIL), so the generator is
not what is measured.

In one run: the softswitch's native and Python backends, BMv2 where
simple_switch_grpc is on PATH, and the machine's ceiling: benchmarks/native/
reflector.c, compiled now, which only reflects frames over the same veth pairs
with the same system calls as the native switch.

    sudo .venv/bin/python benchmarks/bench_switch.py [--seconds 2] [--window 64]
        [--repeats 3] [--targets ceiling softswitch softswitch-python bmv2]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from p4src import protocol  # noqa: E402
from switch_ctl import config as config_mod  # noqa: E402
from switch_ctl.client import SwitchConnection  # noqa: E402
from switch_ctl.controller import Controller  # noqa: E402
from testbed.netns import Topology, in_netns  # noqa: E402
from testbed.targets import SwitchProcess, available_targets  # noqa: E402

WORKERS = 4
JOB_ID = 1
GROUP = 1
SERVICE_MAC = "02:aa:00:00:00:01"
SERVICE_IP = "10.0.0.100"
WORKER_UDP_BASE = 40000
RESULT = int(protocol.MsgType.RESULT)
CONTRIBUTION = int(protocol.MsgType.CONTRIBUTION)
NATIVE = Path(__file__).resolve().parent / "native"
SOL_PACKET, PACKET_IGNORE_OUTGOING = 263, 23


def frames_for(host_addresses, aggregations: int, first: int, fmt) -> list[list[bytes]]:
    """Contribution frames: [aggregation][worker]. The n-th aggregation uses slot
    n % pool and flips the shadow set on each reuse of the slot."""
    k, pool = fmt.values_per_packet, fmt.pool_size
    n = np.arange(first, first + aggregations)
    payloads = fmt.pack(np.broadcast_to(np.arange(1, k + 1, dtype=np.int32), (aggregations, k)),
                        msg_type=protocol.MsgType.CONTRIBUTION, job_id=JOB_ID,
                        slot=n % pool, set=(n // pool) & 1, pkt_id=n)
    payloads = [p.tobytes() for p in payloads]
    headers = []
    for i, (mac, ip) in enumerate(host_addresses):
        # Every frame of a host has the same headers (UDP checksum 0: none, in IPv4).
        pkt = (Ether(src=mac, dst=SERVICE_MAC) / IP(src=ip, dst=SERVICE_IP)
               / UDP(sport=WORKER_UDP_BASE + i, dport=protocol.AGG_UDP_PORT_BASE, chksum=0)
               / payloads[0])
        headers.append(bytes(pkt)[:-len(payloads[0])])
    return [[header + payload for header in headers] for payload in payloads]


def job_config(switch: SwitchProcess, topo: Topology, pool_size: int):
    return config_mod.parse({
        "switch": {"grpc_addr": switch.grpc_addr, "ports": sorted(topo.switch_ports)},
        "job": {"id": JOB_ID, "udp_port": protocol.AGG_UDP_PORT_BASE, "service_ip": SERVICE_IP,
                "service_mac": SERVICE_MAC, "first_slot": 0, "num_slots": pool_size,
                "multicast_group": GROUP,
                "workers": [{"id": i, "mac": h.mac, "ip": h.ip, "udp_port": WORKER_UDP_BASE + i,
                             "switch_port": h.switch_port} for i, h in enumerate(topo.hosts)]},
    })


class Native:
    """The C helpers, compiled into a temporary directory at bench time."""

    def __init__(self):
        cc = shutil.which(os.environ.get("CC") or "cc")
        if cc is None:
            raise SystemExit("bench_switch needs a C compiler (make setup installs gcc)")
        self.dir = tempfile.mkdtemp(prefix="bench-switch-")
        self.reflector = os.path.join(self.dir, "reflector")
        loadgen = os.path.join(self.dir, "loadgen.so")
        subprocess.run([cc, "-O2", "-o", self.reflector, str(NATIVE / "reflector.c")], check=True)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", loadgen, str(NATIVE / "loadgen.c")],
                       check=True)
        self.lib = ctypes.CDLL(loadgen)
        self.lib.run.restype = ctypes.c_uint64
        self.lib.run.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                 ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_double,
                                 ctypes.POINTER(ctypes.c_double)]

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Reflector:
    """The ceiling, started like a switch target (no P4Runtime)."""

    def __init__(self, native: Native, topo: Topology):
        self.process = subprocess.Popen([native.reflector] + [h.switch_ifname for h in topo.hosts])

    def __enter__(self):
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=10)


def worker_sockets(topo: Topology) -> list[socket.socket]:
    socks = []
    for h in topo.hosts:
        with in_netns(h.netns):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        sock.bind((h.ifname, 0))
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        socks.append(sock)
    return socks


def measure(native: Native, target: str, seconds: float, window: int, repeats: int) -> dict:
    fmt = protocol.packet_format()
    k, pool = fmt.values_per_packet, fmt.pool_size
    cycle = 2 * pool              # slot n % pool, shadow set flipping on each reuse
    with Topology(WORKERS, tag=f"bs{os.getpid() % 10000}") as topo:
        if target == "ceiling":
            switch, want = Reflector(native, topo), CONTRIBUTION
        else:
            switch, want = SwitchProcess(target, topo.switch_ports), RESULT
        with switch:
            if target != "ceiling":
                with SwitchConnection(switch.grpc_addr, switch.device_id) as conn:
                    controller = Controller(conn)
                    controller.push()
                    controller.apply(job_config(switch, topo, pool))
            socks = worker_sockets(topo)
            frames = frames_for([(h.mac, h.ip) for h in topo.hosts], cycle, 0, fmt)
            flen = len(frames[0][0])
            blob = b"".join(f for per_worker in frames for f in per_worker)
            fds = (ctypes.c_int * WORKERS)(*[s.fileno() for s in socks])
            first = 0

            def run(naggs: int) -> tuple[int, float]:
                nonlocal first
                elapsed = ctypes.c_double()
                got = native.lib.run(WORKERS, fds, blob, flen, cycle, first, naggs,
                                     min(window, pool), want, 1.0, ctypes.byref(elapsed))
                first += naggs
                return got, elapsed.value

            got, elapsed = run(500)                     # warm up, and size the runs
            rate = got / max(elapsed, 1e-6)
            naggs = max(500, int(rate * seconds / WORKERS))
            rates, received, lost = [], 0, 0
            for _ in range(repeats):
                got, elapsed = run(naggs)
                received += got
                lost += naggs * WORKERS - got
                rates.append(got / max(elapsed, 1e-6))
            for sock in socks:
                sock.close()
    return {"target": target, "k": k, "contributions": naggs * WORKERS,
            "results_received": received, "results_lost": lost, "rates": rates,
            "pps": statistics.median(rates)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each timed run")
    parser.add_argument("--window", type=int, default=64, help="aggregations in flight")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs per target; the median is reported")
    parser.add_argument("--targets", nargs="*", default=["ceiling"] + available_targets())
    args = parser.parse_args()
    if not protocol.PROGRAM_JSON.exists():
        print(f"{protocol.PROGRAM_JSON} is missing: compile the P4 program first", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("bench_switch needs root for network namespaces", file=sys.stderr)
        return 1
    native = Native()
    results = {}
    try:
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        for target in args.targets:
            r = measure(native, target, args.seconds, args.window, args.repeats)
            results[target] = r
            runs = ", ".join(f"{rate:,.0f}" for rate in r["rates"])
            print(f"{target:>17}: {r['pps']:>10,.0f} packets/s  (median of {runs}; "
                  f"{r['contributions']} contributions of k={r['k']} per run, "
                  f"{r['results_received']} received, {r['results_lost']} lost)", flush=True)
    finally:
        native.close()
    pps = {t: r["pps"] for t, r in results.items()}
    for name, a, b, goal in (("native / python", "softswitch", "softswitch-python", " (goal >= 5)"),
                             ("native / ceiling", "softswitch", "ceiling", " (goal >= 0.5)"),
                             ("native / BMv2", "softswitch", "bmv2", "")):
        if a in pps and b in pps:
            print(f"{name} = {pps[a] / pps[b]:.2f}x{goal}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
