"""Packets per second a switch forwards on the aggregation program, at each packet size.

Four workers, each in its own network namespace behind a veth pair, send
contributions with at most ``--window`` aggregations in flight (halved for a target
until a warm-up run loses nothing: saturated, not dropping); the switch sums
them and multicasts each result back to all four. The figure is contributions
processed per second, from the first send to the last result (a contribution
carries k register read-add-writes), and the values they carry in Gbit/s (k x 32
bits each, headers not counted). The load comes from C (benchmarks/native/
loadgen.c, batched sendmmsg/recvmmsg, called without the GIL), so the generator is
not what is measured.

For each build of the program (innet_aggregation/p4src/build: 256 values per packet, the software
targets'; build/k64: 64, Tofino's; build/k1024: 1024, on links of a jumbo MTU, testbed.layout's
link_mtu): the softswitch's native and Python
backends, BMv2 where simple_switch_grpc is on PATH, and the machine's ceiling for
frames of that size: benchmarks/native/reflector.c, compiled now, which only
reflects frames over the same veth pairs with the same system calls as the native
switch. Every target is timed ``--repeats`` times, in rounds over all of them (the
order reversed every other round), so a change in the machine's load hits them
alike; each figure is the median with its min-max, each ratio the median of the
rounds' ratios with theirs. Beside the rate, the switch process's CPU time (all
threads) per contribution: what the rate becomes where the switch shares the cores
with the workers, and less moved by other load than the rate is.

Both the native switch and the reflector send as SOFTSWITCH_TX says (sendmmsg, or
af_xdp: AF_XDP in copy mode, the same code in both); --tx sendmmsg af_xdp times
every target with each, in the same rounds, and gives each its own ceiling. Each
prints how it sends before the runs.

    sudo .venv/bin/python benchmarks/bench_switch.py [--seconds 1] [--window 64]
        [--repeats 9] [--sizes 64 256] [--targets ceiling softswitch softswitch-python bmv2]
        [--tx sendmmsg af_xdp]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from innet_aggregation.p4src import protocol  # noqa: E402
from innet_aggregation.switch_ctl import config as config_mod  # noqa: E402
from innet_aggregation.switch_ctl.client import SwitchConnection  # noqa: E402
from innet_aggregation.switch_ctl.controller import Controller  # noqa: E402
from innet_aggregation.experiments import record  # noqa: E402
from innet_aggregation.testbed.layout import link_mtu  # noqa: E402
from innet_aggregation.testbed.netns import Namespaces, in_netns  # noqa: E402
from innet_aggregation.experiments.progress import Progress  # noqa: E402
from innet_aggregation.testbed.stopping import dies_with_parent, stop_on_signals  # noqa: E402
from innet_aggregation.testbed.targets import (SwitchProcess, available_targets, bmv2_path,  # noqa: E402
                                               cpu_seconds)

# The reflector sending as sendmmsg does by default (a frame over a page in page
# fragments), and sending linear frames, as the switch does (mmsg.c; timed only
# where frames can be longer than a page): whichever is faster in a round is the
# ceiling (ceilings()).
CEILINGS = ["ceiling", "ceiling-linear"]
WORKERS = 4             # the default; --workers for more ports (a lane a port at most)
JOB_ID = 1
GROUP = 1
SERVICE_MAC = "02:aa:00:00:00:01"
SERVICE_IP = "10.0.0.100"
WORKER_UDP_BASE = 40000
RESULT = int(protocol.MsgType.RESULT)
CONTRIBUTION = int(protocol.MsgType.CONTRIBUTION)
NATIVE = Path(__file__).resolve().parent / "native"
SOL_PACKET, PACKET_IGNORE_OUTGOING = 263, 23
# What this machine's simple_switch_grpc is; p4lang's docs/performance.md gives the
# optimized build's flags. Printed beside every BMv2 figure.
BMV2_BUILD = ("BMv2's default build (this machine's simple_switch_grpc: not p4lang's optimized "
              "build, configure 'CXXFLAGS=-g -O3' --disable-logging-macros --disable-elogger, "
              "which is not measured here)")


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


def worker_mac(i: int) -> str:
    """The MAC a worker has in the job: not its interface's, so results (like the
    ceiling's reflected frames) stop at the host's link layer instead of reaching
    its UDP stack, which would answer each one with an ICMP port unreachable."""
    return f"02:bb:00:00:00:{i + 1:02x}"


def job_config(switch: SwitchProcess, topo: Namespaces, pool_size: int):
    return config_mod.parse({
        "switch": {"grpc_addr": switch.grpc_addr, "ports": sorted(topo.switch_ports)},
        "job": {"id": JOB_ID, "udp_port": protocol.AGG_UDP_PORT_BASE, "service_ip": SERVICE_IP,
                "service_mac": SERVICE_MAC, "first_slot": 0, "num_slots": pool_size,
                "multicast_group": GROUP,
                "workers": [{"id": i, "mac": worker_mac(i), "ip": h.ip, "udp_port": WORKER_UDP_BASE + i,
                             "switch_port": h.switch_port} for i, h in enumerate(topo.hosts)]},
    }, pool_size)


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
    """The ceiling, started like a switch target (no P4Runtime), sending as ``tx``;
    ``linear``: sendmmsg's frames linear, as the switch sends them (mmsg.c)."""

    def __init__(self, native: Native, topo: Namespaces, tx: str, linear: bool):
        self.process = subprocess.Popen(dies_with_parent([native.reflector]
                                                         + [h.switch_ifname for h in topo.hosts]),
                                        stdout=subprocess.PIPE, text=True,
                                        env=dict(os.environ, SOFTSWITCH_TX=tx,
                                                 REFLECTOR_LINEAR="1" if linear else "0"))
        self.sends = "?"

    def __enter__(self):
        """Once it says it is ready, and how it sends."""
        if select.select([self.process.stdout], [], [], 10)[0]:
            self.sends = self.process.stdout.readline().strip().removeprefix("ready: ")
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=10)


def switch_sends(switch: SwitchProcess) -> str:
    """How the switch's native loop sends, from the line its log has once a pipeline
    runs (softswitch.dataplane.describe_tx); "-" for other targets."""
    for _ in range(50):
        lines = [line for line in switch.log_path.read_text(errors="replace").splitlines()
                 if " sends: " in line]
        if lines:
            return lines[-1].split(" sends: ", 1)[1]
        if not switch.target == "softswitch":
            return "-"
        time.sleep(0.1)
    return "?"


def worker_sockets(topo: Namespaces) -> list[socket.socket]:
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


class Bench:
    """One target running one build on its own topology, programmed and ready;
    ``run`` times one run."""

    def __init__(self, native: Native, target: str, build: tuple[Path, Path], window: int,
                 stack: ExitStack, tag: str, workers: int = WORKERS, tx: str = "sendmmsg"):
        """``target``: ceiling (CEILINGS), a switch target, or softswitch:L (the native
        backend on L packet I/O lanes, --io-threads); ``tx``: how it sends (SOFTSWITCH_TX)."""
        program, p4info = build
        fmt = protocol.PacketFormat.load(program)
        self.native, self.target, self.k, self.tx = native, target, fmt.values_per_packet, tx
        self.workers = workers
        switch_target, _, lanes = target.partition(":")
        pool = fmt.pool_size
        self.window = min(window, pool)
        self.cycle = 2 * pool        # slot n % pool, shadow set flipping on each reuse
        topo = stack.enter_context(Namespaces(workers, tag=tag, mtu=link_mtu(fmt)))
        if target in CEILINGS:
            reflector = stack.enter_context(Reflector(native, topo, tx, target == "ceiling-linear"))
            self.pid, self.sends = reflector.process.pid, reflector.sends
            self.want = CONTRIBUTION
        else:
            switch = SwitchProcess(switch_target, topo.switch_ports,
                                   io_threads=int(lanes) if lanes else None)
            outer = os.environ.get("SOFTSWITCH_TX")
            os.environ["SOFTSWITCH_TX"] = tx        # the switch's environment
            try:
                stack.enter_context(switch)
            finally:
                os.environ.pop("SOFTSWITCH_TX")
                if outer is not None:
                    os.environ["SOFTSWITCH_TX"] = outer
            self.pid = switch.process.pid
            with SwitchConnection(switch.grpc_addr, switch.device_id) as conn:
                controller = Controller(conn)
                controller.push(program, p4info)
                controller.apply(job_config(switch, topo, pool))
            self.sends = switch_sends(switch)
            self.want = RESULT
        self.socks = worker_sockets(topo)
        stack.callback(lambda: [sock.close() for sock in self.socks])
        frames = frames_for([(worker_mac(i), h.ip) for i, h in enumerate(topo.hosts)],
                            self.cycle, 0, fmt)
        self.flen = len(frames[0][0])
        self.blob = b"".join(f for per_worker in frames for f in per_worker)
        self.fds = (ctypes.c_int * workers)(*[sock.fileno() for sock in self.socks])
        self.first = 0
        self.rates, self.cpu_us, self.received, self.lost, self.naggs = [], [], 0, 0, 0

    def settle(self, naggs: int) -> float:
        """Halve the window until a run loses nothing (saturated, not dropping): the rate."""
        while True:
            lost = self.lost
            rate = self.run(naggs)
            if self.lost == lost or self.window == 1:
                self.received, self.lost = 0, 0
                return rate
            self.window //= 2

    def run(self, naggs: int) -> float:
        """Contributions per second over ``naggs`` aggregations."""
        elapsed = ctypes.c_double()
        cpu = cpu_seconds(self.pid)
        got = self.native.lib.run(self.workers, self.fds, self.blob, self.flen, self.cycle,
                                  self.first, naggs, self.window, self.want, 1.0,
                                  ctypes.byref(elapsed))
        self.cpu_us.append((cpu_seconds(self.pid) - cpu) / max(got, 1) * 1e6)
        self.first += naggs
        self.received += got
        self.lost += naggs * self.workers - got
        return got / max(elapsed.value, 1e-6)

    def gbits(self, rate: float) -> float:
        """Gbit/s of values (k int32 per contribution), headers not counted."""
        return rate * self.k * 32 / 1e9


def spread(values: list[float], fmt: str) -> str:
    """Median (min-max)."""
    return (f"{format(statistics.median(values), fmt)} "
            f"({format(min(values), fmt)}-{format(max(values), fmt)})")


def over_a_page(build: tuple[Path, Path]) -> bool:
    """Whether the build's frames can be longer than a page (mmsg.c's rule: the MTU,
    an Ethernet header and a tag, 256 bytes of headroom), the only frames the
    reflector's two sends treat apart."""
    return (link_mtu(protocol.PacketFormat.load(build[0])) + 18 + 256
            > os.sysconf("SC_PAGE_SIZE"))


class Best:
    """The faster of a size's ceilings in each round (its rates), with the CPU of the
    one faster over all rounds."""

    def __init__(self, benches: list[Bench]):
        self.rates = [max(rates) for rates in zip(*(b.rates for b in benches))]
        self.cpu_us = max(benches, key=lambda b: statistics.median(b.rates)).cpu_us


def ceilings(benches: list[Bench]) -> dict[int, Bench | Best]:
    """Each size's ceiling for the ratios: the reflector, or where it ran with both
    sends (CEILINGS), the faster each round, so it stays a ceiling whichever send this
    machine favours."""
    by_k: dict[int, list[Bench]] = {}
    for b in benches:
        if b.target in CEILINGS:
            by_k.setdefault(b.k, []).append(b)
    return {k: group[0] if len(group) == 1 else Best(group) for k, group in by_k.items()}


def report(benches: list[Bench]) -> None:
    print(f"\n{'values':>6} {'target':>17} {'packets/s, median (min-max)':>34} "
          f"{'payload Gbit/s':>22} {'/ ceiling':>18} {'CPU us per contribution':>24}")
    by = {(b.k, b.target): b for b in benches}
    best = ceilings(benches)
    for b in benches:
        ceiling = best.get(b.k)
        share = ("" if ceiling is None or b is ceiling
                 else spread([r / c for r, c in zip(b.rates, ceiling.rates)], ".2f"))
        print(f"{b.k:>6} {b.target:>17} {spread(b.rates, ',.0f'):>34} "
              f"{spread([b.gbits(r) for r in b.rates], '.3f'):>22} {share:>18} "
              f"{spread(b.cpu_us, '.2f'):>24}")
    for b in benches:
        print(f"  {b.k} values, {b.target}: {b.naggs * b.workers} contributions per run, window "
              f"{b.window}, {b.received} received, {b.lost} lost")
    print("\nratios (median of the rounds' ratios, min-max):")
    sizes = sorted({b.k for b in benches})
    for k in sizes:
        for lanes in sorted({b.target for b in benches if b.target.startswith("softswitch:")}):
            if k in best:
                b, ceiling = by[k, lanes], best[k]
                print(f"  {k:>4} values  {lanes + ' lanes':17s} / ceiling "
                      f"{spread([x / y for x, y in zip(b.rates, ceiling.rates)], '.2f')}, CPU "
                      f"per contribution {spread(b.cpu_us, '.2f')} us")
        others = {"ceiling": best.get(k), "softswitch-python": by.get((k, "softswitch-python")),
                  "bmv2": by.get((k, "bmv2"))}
        for name, c, goal in (
                ("native / ceiling", "ceiling", " (goal >= 0.8)" if k == 64 else ""),
                ("native / Python", "softswitch-python", ""),
                ("native / BMv2", "bmv2", " (BMv2's default build)")):
            if (k, "softswitch") in by and others[c]:
                ratios = [x / y for x, y in zip(by[k, "softswitch"].rates, others[c].rates)]
                print(f"  {k:>4} values  {name:17s} {spread(ratios, '.2f')}{goal}")
        if (k, "softswitch") in by and k in best:
            ratios = [x / y for x, y in zip(by[k, "softswitch"].cpu_us, best[k].cpu_us)]
            print(f"  {k:>4} values  CPU per contribution, native / ceiling {spread(ratios, '.2f')}")
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        for target in dict.fromkeys(b.target for b in benches):
            if (small, target) in by and (large, target) in by:
                lo, hi = by[small, target], by[large, target]
                ratios = [hi.gbits(x) / lo.gbits(y) for x, y in zip(hi.rates, lo.rates)]
                print(f"  payload Gbit/s at {large} / at {small} values, {target:17s} "
                      f"{spread(ratios, '.2f')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each timed run")
    parser.add_argument("--window", type=int, default=64,
                        help="aggregations in flight (halved for a target until it drops none)")
    parser.add_argument("--repeats", type=int, default=9,
                        help="timed runs per target; the median and min-max are reported")
    parser.add_argument("--sizes", type=int, nargs="*", default=None,
                        help="values per packet of the builds to run (default: every build)")
    parser.add_argument("--targets", nargs="*",
                        help="ceiling and the switches to time (default: ceiling and every "
                             "switch installed here)")
    parser.add_argument("--lanes", type=lambda text: [int(x) for x in text.split(",")],
                        default=None, metavar="L,L,...",
                        help="time the native backend on each of these lane counts "
                             "(--io-threads; at most one a port: --workers)")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"workers, each a port of the switch (default {WORKERS})")
    parser.add_argument("--tx", nargs="+", choices=("sendmmsg", "af_xdp"),
                        default=[os.environ.get("SOFTSWITCH_TX", "sendmmsg")],
                        help="how the native switch and the reflector send (SOFTSWITCH_TX; "
                             "default $SOFTSWITCH_TX, else sendmmsg); several: each target "
                             "with each, in the same rounds")
    args = parser.parse_args()
    if not set(args.tx) <= {"sendmmsg", "af_xdp"}:     # a default from the environment
        parser.error(f"SOFTSWITCH_TX must be one of sendmmsg, af_xdp, got {args.tx[0]!r}")
    args.targets = args.targets or CEILINGS + available_targets()
    if args.lanes:
        if max(args.lanes) > args.workers or min(args.lanes) < 1:
            print(f"--lanes {args.lanes}: 1 to --workers ({args.workers}) lanes, one a port "
                  "at most", file=sys.stderr)
            return 1
        args.targets = [t for t in args.targets if t != "softswitch"] + [
            f"softswitch:{lanes}" for lanes in args.lanes]
    if not protocol.PROGRAM_JSON.exists():
        print(f"{protocol.PROGRAM_JSON} is missing: compile the P4 program first (make p4)",
              file=sys.stderr)
        return 1
    builds = [(b.json, b.p4info) for b in protocol.builds()
              if args.sizes is None or b.values_per_packet in args.sizes]
    if not builds:
        print(f"no build has {args.sizes} values per packet", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("bench_switch needs root for network namespaces", file=sys.stderr)
        return 1
    stop_on_signals()       # a stop signal tears down as the end does
    native = Native()
    try:
        with ExitStack() as stack:
            runs = [(tx, build, target) for tx in args.tx for build in builds
                    for target in args.targets
                    if target != "ceiling-linear" or over_a_page(build)]
            benches = [Bench(native, target, build, args.window, stack,
                             f"bs{os.getpid() % 1000}x{i}", args.workers, tx)
                       for i, (tx, build, target) in enumerate(runs)]
            load = os.getloadavg()[0]
            print(f"load average before: {load:.2f} on {os.cpu_count()} cores")
            for bench in benches:
                print(f"  {bench.k} values, {bench.target}, SOFTSWITCH_TX={bench.tx}: "
                      f"{bench.sends}")
            if "bmv2" in args.targets:
                print(f"bmv2: {bmv2_path()}, {BMV2_BUILD}")
            for bench in benches:           # warm up, and size each target's runs
                bench.naggs = max(200, int(bench.settle(500) * args.seconds / bench.workers))
            # Rounds over all targets, the order reversed every other round, so a change
            # in the machine's load hits them alike.
            progress = Progress(args.repeats * len(benches), "bench-switch")
            for repeat in range(args.repeats):
                for bench in benches[::-1] if repeat % 2 else benches:
                    bench.rates.append(bench.run(bench.naggs))
                    progress.advance(f"round {repeat + 1}, {bench.k} values, {bench.target}")
    finally:
        native.close()
    rows = []
    for tx in args.tx:
        group = [b for b in benches if b.tx == tx]
        if len(args.tx) > 1:
            print(f"\n--- SOFTSWITCH_TX={tx} (switch and ceiling) ---")
        report(group)
        rows += [dict(row, tx=tx, target=row["target"] if len(args.tx) == 1
                      else f"{row['target']} ({tx})") for row in figures(group)]
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    record.write("bench-switch", rows, params=vars(args), load_before=load)
    return 0


def figures(benches: list[Bench]) -> list[dict]:
    """The record's rows: each target's figures, and the rounds' ratios report() prints."""
    by = {(b.k, b.target): b for b in benches}
    best = ceilings(benches)
    smallest = min(b.k for b in benches)

    def ratios(a: list[float], b: list[float]) -> dict:
        return record.spread([x / y for x, y in zip(a, b)])

    rows = []
    for b in benches:
        ceiling, native, small = (best.get(b.k), by.get((b.k, "softswitch")),
                                  by.get((smallest, b.target)))
        rows.append({
            "values": b.k, "target": b.target, "pps": record.spread(b.rates),
            "gbits": record.spread([b.gbits(r) for r in b.rates]), "cpu_us": record.spread(b.cpu_us),
            "of_ceiling": ratios(b.rates, ceiling.rates) if ceiling and b is not ceiling else None,
            "native_over": (ratios(native.rates, b.rates)
                            if native and b.target not in ("softswitch", *CEILINGS) else None),
            "cpu_of_ceiling": ratios(b.cpu_us, ceiling.cpu_us)
            if ceiling and b.target == "softswitch" else None,
            "gbits_over_smallest": ratios([b.gbits(r) for r in b.rates],
                                          [small.gbits(r) for r in small.rates])
            if small and b.k != smallest else None})
    return rows


if __name__ == "__main__":
    sys.exit(main())
