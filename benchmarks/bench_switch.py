"""Packets per second a switch target forwards on the aggregation program (k values/packet).

Four workers, each in its own network namespace behind a veth pair, send
contributions for a window of slots at a time; the switch sums them and multicasts
each result back to all four. The figure is contributions processed per second,
measured from the first send to the last result received (a contribution carries
k register read-add-writes). Runs the softswitch, and BMv2 too where
simple_switch_grpc is on PATH, in the same run, and prints the ratio.

    sudo .venv/bin/python benchmarks/bench_switch.py [--aggregations 1500] [--window 16]
        [--repeats 3] [--targets softswitch bmv2]
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import sys
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
from testbed.netns import Topology  # noqa: E402
from testbed.targets import SwitchProcess, available_targets  # noqa: E402

WORKERS = 4
JOB_ID = 1
GROUP = 1
SERVICE_MAC = "02:aa:00:00:00:01"
SERVICE_IP = "10.0.0.100"
WORKER_UDP_BASE = 40000
RESULT = int(protocol.MsgType.RESULT)


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


def drain(sock) -> None:
    while select.select([sock], [], [], 0)[0]:
        sock.recv(65536)


def measure(target: str, aggregations: int, window: int, repeats: int) -> dict:
    fmt = protocol.packet_format()
    k, pool = fmt.values_per_packet, fmt.pool_size
    with Topology(WORKERS, tag=f"bs{os.getpid() % 10000}") as topo, \
            SwitchProcess(target, topo.switch_ports) as switch:
        with SwitchConnection(switch.grpc_addr, switch.device_id) as conn:
            controller = Controller(conn)
            controller.push()
            controller.apply(job_config(switch, topo, pool))
        socks = [h.raw_socket() for h in topo.hosts]
        for sock in socks:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            sock.setblocking(False)
        # The n-th aggregation uses slot n % pool and flips the shadow set on each reuse.
        frames = frames_for([(h.mac, h.ip) for h in topo.hosts], aggregations * repeats, 0, fmt)
        time.sleep(0.3)
        for sock in socks:
            drain(sock)
        received = lost = 0
        rates = []
        for run in range(repeats):
            start = time.perf_counter()
            for first in range(run * aggregations, (run + 1) * aggregations, window):
                batch = frames[first:min(first + window, (run + 1) * aggregations)]
                for per_worker in batch:
                    for sock, frame in zip(socks, per_worker):
                        sock.send(frame)
                want = len(batch) * WORKERS
                got = collect(socks, want, timeout=2.0)
                received += got
                lost += want - got
            rates.append(aggregations * WORKERS / (time.perf_counter() - start))
        for sock in socks:
            sock.close()
    return {"target": target, "k": k, "contributions": aggregations * WORKERS,
            "results_received": received, "results_lost": lost, "rates": rates,
            "pps": statistics.median(rates)}


def collect(socks, want: int, timeout: float) -> int:
    """Result frames received on all sockets, until ``want`` arrive or ``timeout`` passes."""
    got = 0
    deadline = time.monotonic() + timeout
    while got < want:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select(socks, [], [], remaining)
        for sock in ready:
            while True:
                try:
                    frame = sock.recv(2048)
                except BlockingIOError:
                    break
                if len(frame) > 42 and frame[23] == 17 and frame[42] == RESULT:
                    got += 1
    return got


def pipeline_only(aggregations: int) -> float:
    """The softswitch pipeline alone, in process (no sockets): contributions per second."""
    from softswitch.pipeline import Pipeline

    pipe = Pipeline(protocol.PROGRAM_JSON.read_bytes())
    fmt = protocol.packet_format()
    pool = fmt.pool_size

    class Host:
        def __init__(self, i):
            self.ip, self.mac, self.port = f"10.0.0.{i + 1}", f"02:00:00:00:00:{i + 1:02x}", i + 1
    hosts = [Host(i) for i in range(WORKERS)]
    # Configure through the tables' own structures: the same job as over P4Runtime.
    tables = pipe.tables
    actions = {a.name: a.id for a in pipe.actions.values()}
    tables["AggIngress.job_lookup.jobs"].exact[(JOB_ID, protocol.AGG_UDP_PORT_BASE)] = (
        actions["AggIngress.job_lookup.set_job"], (WORKERS, GROUP, 0, pool))
    for i, h in enumerate(hosts):
        tables["AggIngress.sender_identification.senders"].exact[
            (h.port, int.from_bytes(socket.inet_aton(h.ip), "big"), WORKER_UDP_BASE + i,
             JOB_ID)] = (actions["AggIngress.sender_identification.set_sender"], (i, 1 << i))
        tables["AggEgress.result_rewrite.workers"].exact[(JOB_ID, i)] = (
            actions["AggEgress.result_rewrite.set_worker_address"],
            (int(h.mac.replace(":", ""), 16),
             int.from_bytes(socket.inet_aton(h.ip), "big"), WORKER_UDP_BASE + i))
    pipe.groups[GROUP] = [(h.port, i) for i, h in enumerate(hosts)]
    process = pipe.process
    best = 0.0
    for run in range(3):   # the best of three: other load on the machine only slows it
        frames = frames_for([(h.mac, h.ip) for h in hosts], aggregations, run * aggregations, fmt)
        ports = [h.port for h in hosts]
        out = 0
        start = time.perf_counter()
        for per_worker in frames:
            for frame, port in zip(per_worker, ports):
                out += len(process(frame, port))
        elapsed = time.perf_counter() - start
        if out != aggregations * WORKERS:
            raise RuntimeError(f"pipeline produced {out} results, "
                               f"expected {aggregations * WORKERS}")
        best = max(best, aggregations * WORKERS / elapsed)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aggregations", type=int, default=1500,
                        help="aggregations per target (each is one contribution per worker)")
    parser.add_argument("--window", type=int, default=16, help="aggregations in flight")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs per target; the median is reported")
    parser.add_argument("--targets", nargs="*", default=available_targets())
    args = parser.parse_args()
    if not protocol.PROGRAM_JSON.exists():
        print(f"{protocol.PROGRAM_JSON} is missing: compile the P4 program first", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("bench_switch needs root for network namespaces", file=sys.stderr)
        return 1
    print(f"softswitch pipeline alone (no I/O, best of 3): {pipeline_only(args.aggregations):,.0f} "
          "contributions/s")
    results = {}
    for target in args.targets:
        r = measure(target, args.aggregations, args.window, args.repeats)
        results[target] = r
        runs = ", ".join(f"{rate:,.0f}" for rate in r["rates"])
        print(f"{target:>10}: {r['pps']:>9,.0f} packets/s  (median of {runs}; "
              f"{r['contributions']} contributions of k={r['k']} per run, "
              f"{r['results_received']} results received, {r['results_lost']} lost)")
    if "softswitch" in results and "bmv2" in results:
        ratio = results["softswitch"]["pps"] / results["bmv2"]["pps"]
        print(f"softswitch / BMv2 = {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
