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
import json
import os
import select
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import p4runtime_sh.shell as sh  # noqa: E402

from p4src import protocol  # noqa: E402
from testbed.netns import Topology  # noqa: E402
from testbed.targets import SwitchProcess, available_targets  # noqa: E402

WORKERS = 4
JOB_ID = 1
GROUP = 1
SERVICE_MAC = "02:aa:00:00:00:01"
SERVICE_IP = "10.0.0.100"
WORKER_UDP_BASE = 40000
CONTRIBUTION, RESULT = int(protocol.MsgType.CONTRIBUTION), int(protocol.MsgType.RESULT)


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack("!10H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def contribution(host, worker: int, slot: int, shadow: int, values: bytes) -> bytes:
    payload = struct.pack("!BBHIbB", CONTRIBUTION, JOB_ID, (shadow << 15) | slot, slot, 0, 0)
    payload += values
    udp_len = 8 + len(payload)
    udp = struct.pack("!HHHH", WORKER_UDP_BASE + worker, protocol.AGG_UDP_PORT_BASE, udp_len, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0, 64, 17, 0,
                     socket.inet_aton(host.ip), socket.inet_aton(SERVICE_IP))
    ip = ip[:10] + struct.pack("!H", ip_checksum(ip)) + ip[12:]
    eth = mac_bytes(SERVICE_MAC) + mac_bytes(host.mac) + b"\x08\x00"
    return eth + ip + udp + payload


def configure(switch: SwitchProcess, topo: Topology, pool_size: int) -> None:
    sh.setup(device_id=0, grpc_addr=switch.grpc_addr, election_id=(0, 1),
             config=sh.FwdPipeConfig(str(protocol.P4INFO), str(protocol.PROGRAM_JSON)),
             verbose=False)
    job = sh.TableEntry("AggIngress.job_lookup.jobs")(action="AggIngress.job_lookup.set_job")
    job.match["job_id"] = str(JOB_ID)
    job.match["udp_port"] = str(protocol.AGG_UDP_PORT_BASE)
    job.action["num_workers"] = str(WORKERS)
    job.action["group"] = str(GROUP)
    job.action["first_slot"] = "0"
    job.action["num_slots"] = str(pool_size)
    job.insert()
    group = sh.MulticastGroupEntry(GROUP)
    for i, host in enumerate(topo.hosts):
        sender = sh.TableEntry("AggIngress.sender_identification.senders")(
            action="AggIngress.sender_identification.set_sender")
        sender.match["ingress_port"] = str(host.switch_port)
        sender.match["src_ip"] = host.ip
        sender.match["src_udp_port"] = str(WORKER_UDP_BASE + i)
        sender.match["job_id"] = str(JOB_ID)
        sender.action["worker_id"] = str(i)
        sender.action["worker_bit"] = str(1 << i)
        sender.insert()
        worker = sh.TableEntry("AggEgress.result_rewrite.workers")(
            action="AggEgress.result_rewrite.set_worker_address")
        worker.match["job_id"] = str(JOB_ID)
        worker.match["worker_id"] = str(i)
        worker.action["mac"] = host.mac
        worker.action["ip"] = host.ip
        worker.action["udp_port"] = str(WORKER_UDP_BASE + i)
        worker.insert()
        group.add(host.switch_port, i)
    group.insert()


def drain(sock) -> None:
    while select.select([sock], [], [], 0)[0]:
        sock.recv(65536)


def measure(target: str, aggregations: int, window: int, repeats: int) -> dict:
    program = json.loads(protocol.PROGRAM_JSON.read_text())
    fmt = protocol.PacketFormat(program)
    k, pool = fmt.values_per_packet, fmt.pool_size
    values = struct.pack(f"!{k}i", *range(1, k + 1))
    with Topology(WORKERS, tag=f"bs{os.getpid() % 10000}") as topo, \
            SwitchProcess(target, topo.switch_ports) as switch:
        configure(switch, topo, pool)
        sh.teardown()
        socks = [h.raw_socket() for h in topo.hosts]
        for sock in socks:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            sock.setblocking(False)
        # The n-th aggregation uses slot n % pool and flips the shadow set on each reuse.
        frames = [[contribution(h, i, n % pool, (n // pool) & 1, values)
                   for i, h in enumerate(topo.hosts)] for n in range(aggregations * repeats)]
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
    program = json.loads(protocol.PROGRAM_JSON.read_text())
    fmt = protocol.PacketFormat(program)
    k, pool = fmt.values_per_packet, fmt.pool_size

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
            (int.from_bytes(mac_bytes(h.mac), "big"),
             int.from_bytes(socket.inet_aton(h.ip), "big"), WORKER_UDP_BASE + i))
    pipe.groups[GROUP] = [(h.port, i) for i, h in enumerate(hosts)]
    values = struct.pack(f"!{k}i", *range(1, k + 1))
    process = pipe.process
    best = 0.0
    for run in range(3):   # the best of three: other load on the machine only slows it
        frames = [[(contribution(h, i, n % pool, (n // pool) & 1, values), h.port)
                   for i, h in enumerate(hosts)]
                  for n in range(run * aggregations, (run + 1) * aggregations)]
        out = 0
        start = time.perf_counter()
        for per_worker in frames:
            for frame, port in per_worker:
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
