"""make bench-worker: the worker's host pipeline, and allreduce through a switch beside gloo.

1. Host pipeline, one thread, float32: block exponents + quantize + pack (headers
   and values into the packets' structured array), then unpack (headers and the
   values view of result packets) + dequantize, for 4 workers; on a cache-sized
   batch of packets, and on a whole 4 MB tensor at once. Reported in MB/s of
   float32 gradient, next to two baselines timed in the same run on the same
   batch: a plain copy, and numpy's sum of 4 arrays (what a CPU reduction must at
   least do).
2. The worker's own packet rate: one worker (AggregationSession, the whole
   pipeline) against a minimal C reflector on loopback that answers each packet as
   a one-worker switch would, in turns with a minimal C client driving the same
   reflector with the same window (``udp_reflector.c``, compiled here with the
   system C compiler).
3. Allreduce, 4 worker processes in network namespaces behind one switch: on each
   switch target installed (the embedded softswitch's native and Python backends;
   BMv2 where simple_switch_grpc is on PATH) with the software targets' program
   (256 values per packet), and on the native backend with the 64-value build too,
   the same float32 tensor goes through the switch and through gloo's ring
   allreduce (torch.distributed, CPU; its TCP frames cross the same switch, as
   plain L2 traffic), call by call in turns, in the same worker processes
   (benchmarks/allreduce_worker.py). Printed: MB/s per worker of each and their
   ratio; CPU milliseconds per MB of the tensor, for a worker process and for the
   switch process, for each. Needs root; skipped otherwise.

Every figure is the median over repeated runs, with the min-max beside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from innet_aggregation.p4src import protocol  # noqa: E402
from innet_aggregation.experiments import record  # noqa: E402
from innet_aggregation.testbed.stopping import dies_with_parent, stop_on_signals  # noqa: E402
from innet_aggregation.worker import quantize  # noqa: E402
from namespace_job import install_job  # noqa: E402  (beside this file)

WORKERS = 4
GLOO_PORT = 29500
# What this machine's simple_switch_grpc is (p4lang's docs/performance.md gives the
# optimized build's flags); printed beside the BMv2 figures.
BMV2_BUILD = ("BMv2's default build, as installed here (not p4lang's optimized build, "
              "configure 'CXXFLAGS=-g -O3' --disable-logging-macros --disable-elogger, "
              "which is not measured)")


def spread(values, fmt: str) -> str:
    """Median (min-max)."""
    values = list(values)
    return (f"{format(statistics.median(values), fmt)} "
            f"({format(min(values), fmt)}-{format(max(values), fmt)})")


def timings(fn, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls, after one to warm up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def pipeline(elements: int, batch: int, repeats: int) -> dict:
    """The host side of a 4-worker allreduce, all numpy, in batches of ``batch`` packets
    (a batch of packets stays in cache between its steps)."""
    fmt = protocol.packet_format()
    k = fmt.values_per_packet
    rng = np.random.default_rng(0)
    blocks_n = elements // k
    x = (rng.standard_normal(blocks_n * k)
         * 2.0 ** rng.integers(-20, 13, blocks_n).repeat(k)).astype(np.float32)
    out = np.empty_like(x)

    def send_side(lo: int, hi: int) -> np.ndarray:
        blocks = x[lo * k:hi * k].reshape(-1, k)
        own = quantize.block_exponents(blocks)
        n = hi - lo
        packets = fmt.pack(np.broadcast_to(np.int32(0), (n, k)),
                           msg_type=int(protocol.MsgType.CONTRIBUTION), job_id=1,
                           set=np.arange(lo, hi) & 1, slot=np.arange(lo, hi) % fmt.pool_size,
                           pkt_id=np.arange(lo, hi), exponent=own)
        quantize.quantize(blocks, own, own, WORKERS, out=packets["values"])
        return packets

    def receive_side(lo: int, hi: int, packets: np.ndarray) -> None:
        header = fmt.unpack(packets)
        quantize.dequantize(packets["values"], header["exponent"], WORKERS, average=True,
                            out=out[lo * k:hi * k].reshape(-1, k))

    def stages(lo: int, hi: int):
        return lambda: receive_side(lo, hi, send_side(lo, hi))

    batch = min(batch, blocks_n)
    batch_mb = batch * k * 4 / 1e6
    megabytes = x.nbytes / 1e6
    arrays = [x[:batch * k].copy() for _ in range(WORKERS)]
    # In turns, so the machine's other load (builds, tests) hits each alike.
    runs = {"pipeline": [], "copy": [], "sum": []}
    jobs = {"pipeline": stages(0, batch),
            "copy": lambda: np.copyto(out[:batch * k], arrays[0]),
            "sum": lambda: np.sum(arrays, axis=0, out=out[:batch * k])}
    for _ in range(repeats):
        for name, fn in jobs.items():
            runs[name] += timings(fn, 1)
    at_once = timings(stages(0, blocks_n), max(3, repeats // 20))
    rate = {name: [batch_mb / t for t in times] for name, times in runs.items()}
    print(f"host pipeline (exponents + quantize + pack + unpack + dequantize), float32, "
          f"{WORKERS} workers, {k} values per packet, one thread; MB/s, median (min-max) of "
          f"{repeats} runs:")
    print(f"  batches of {batch} packets ({batch_mb:.1f} MB)    {spread(rate['pipeline'], '.0f'):>22}"
          f"   per core (goal >= 1000)")
    print(f"  {len(x):,} elements at once ({megabytes:.0f} MB) "
          f"{spread([megabytes / t for t in at_once], '.0f'):>22}   ({len(at_once)} runs)")
    print(f"  baseline: copy                      {spread(rate['copy'], '.0f'):>22}   pipeline takes "
          f"{spread([p / c for p, c in zip(runs['pipeline'], runs['copy'])], '.1f')} x a copy's time")
    print(f"  baseline: np.sum of {WORKERS} arrays        {spread(rate['sum'], '.0f'):>22}   pipeline "
          f"takes {spread([p / s for p, s in zip(runs['pipeline'], runs['sum'])], '.2f')} x its time")
    return {"pipeline_mbps_per_core": record.spread(rate["pipeline"]),
            "pipeline_at_once_mbps": record.spread([megabytes / t for t in at_once]),
            "copy_mbps": record.spread(rate["copy"]), "sum_mbps": record.spread(rate["sum"]),
            "pipeline_over_copy": record.spread([p / c for p, c in zip(runs["pipeline"], runs["copy"])]),
            "pipeline_over_sum": record.spread([p / s for p, s in zip(runs["pipeline"], runs["sum"])])}


def worker_rate(window: int, seconds: float, repeats: int) -> dict:
    """Packets per second one worker sends and receives when nothing else binds."""
    from innet_aggregation.worker import AggregationSession

    fmt = protocol.packet_format()
    print(f"\nworker packet rate, one worker against a minimal reflector on loopback, "
          f"window {window}, {fmt.values_per_packet} values per packet, {repeats} runs of "
          f"{seconds:g} s each in turns:")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("  skipped: no C compiler for the reflector")
        return {}
    c_rates, rates, retrans, fast = [], [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "udp_reflector"
        subprocess.run([cc, "-O2", "-o", str(binary), str(REPO / "benchmarks/udp_reflector.c")],
                       check=True)
        port = _free_udp_port()
        env = dict(os.environ, AGG_TYPE_OFFSET=str(fmt.dtype.fields["msg_type"][1]),
                   AGG_COUNT_OFFSET=str(fmt.dtype.fields["contributions"][1]),
                   AGG_RESULT_TYPE=str(int(protocol.MsgType.RESULT)))
        reflector = subprocess.Popen(dies_with_parent([str(binary), "reflect", str(port)]),
                                     env=env)
        try:
            time.sleep(0.2)
            session = AggregationSession(0, 1, "127.0.0.1", 1, port, 0, window, "127.0.0.1",
                                         _free_udp_port(), packet_format=fmt)
            with session:
                tensor = np.ones(window * fmt.values_per_packet * 16, dtype=np.float32)
                session.allreduce(tensor)            # the first call of a shape probes
                for _ in range(repeats):
                    answers, took = subprocess.run(
                        [str(binary), "drive", str(port), str(window), str(seconds),
                         str(fmt.payload_bytes)], check=True, capture_output=True, text=True
                    ).stdout.split()
                    c_rates.append(int(answers) / float(took))
                    before, start = session.stats, time.perf_counter()
                    while time.perf_counter() - start < seconds:
                        session.allreduce(tensor)
                    took = time.perf_counter() - start
                    done = session.stats - before
                    rates.append(done.results_received / took)
                    retrans += done.retransmissions
                    fast += done.fast_retransmissions
        finally:
            reflector.terminate()
            reflector.wait()
    mbps = [r * fmt.values_per_packet * 4 / 1e6 for r in rates]
    print(f"  minimal C client:   {spread(c_rates, ',.0f'):>28} packets/s each way")
    print(f"  worker (allreduce): {spread(rates, ',.0f'):>28} packets/s each way "
          f"({spread(mbps, '.0f')} MB/s of float32; {retrans} retransmitted, {fast} of them "
          f"before a timer)")
    print(f"  worker / C:         {spread([w / c for w, c in zip(rates, c_rates)], '.2f'):>28}")
    return {"worker_pps": record.spread(rates), "worker_mbps": record.spread(mbps),
            "c_client_pps": record.spread(c_rates),
            "worker_of_c_client": record.spread([w / c for w, c in zip(rates, c_rates)]),
            "worker_retransmissions": retrans, "worker_fast_retransmissions": fast}


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def against_gloo(topo, target: str, values: int, elements: int, reps: int, slots: int,
                 port: int) -> list[dict] | None:
    """Switch and gloo calls in turns on one target: the workers' reports, or None."""
    from innet_aggregation.testbed.targets import SwitchProcess

    build = protocol.program(values)
    program, p4info, fmt = build.json, build.p4info, build.format
    with tempfile.TemporaryDirectory() as tmp, \
            SwitchProcess(target, topo.switch_ports, log_path=Path(tmp) / "switch.log") as switch:
        path = install_job(switch, topo, slots, Path(tmp), program, p4info, fmt.pool_size)
        env = dict(os.environ, PYTHONPATH=str(REPO), GLOO_SOCKET_IFNAME=topo.hosts[0].ifname)
        procs = [h.popen([sys.executable, str(REPO / "benchmarks/allreduce_worker.py"),
                          "--config", str(path), "--program", str(program),
                          "--worker-id", str(i), "--world", str(WORKERS),
                          "--master", f"{topo.hosts[0].ip}:{port}", "--elements", str(elements),
                          "--reps", str(reps)]
                         + (["--switch-pid", str(switch.process.pid)] if i == 0 else []),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=REPO) for i, h in enumerate(topo.hosts)]
        # Drained together: a worker blocked on a full pipe would stall the others.
        with ThreadPoolExecutor(len(procs)) as pool:
            try:
                outputs = list(pool.map(lambda p: p.communicate(timeout=900), procs))
            except BaseException:   # a stop signal: the pool would wait for the workers
                for proc in procs:
                    proc.kill()
                raise
        if switch.process.poll() is not None:
            print(f"  {target}: the switch exited ({switch.process.returncode}):\n{switch.log_tail()}")
            return None
    reports = [json.loads(line) for out, _ in outputs for line in out.splitlines()]
    if any(p.returncode for p in procs) or len(reports) != 2 * WORKERS * reps:
        failed = next((err for p, (_, err) in zip(procs, outputs) if p.returncode), "")
        print(f"  {target}, {values} values: failed ({len(reports)} of {2 * WORKERS * reps} "
              f"calls reported):\n{failed.strip()[-2000:]}")
        return None
    return reports


def summarize(label: str, reports: list[dict], elements: int) -> dict:
    """Per backend: MB/s per worker (each worker's each call), the rounds' switch/gloo
    ratios of the workers' median MB/s, CPU s per MB of the tensor."""
    mb = elements * 4 / 1e6
    out = {"label": label, "elements": elements}
    for backend in ("switch", "gloo"):
        mine = [r for r in reports if r["backend"] == backend]
        out[backend] = {"mbps": [mb / r["seconds"] for r in mine],
                        "worker_cpu": [1e3 * r["cpu"] / mb for r in mine],
                        "switch_cpu": [1e3 * r["switch_cpu"] / mb for r in mine if "switch_cpu" in r]}
    reps = sorted({r["rep"] for r in reports})
    out["ratio"] = [
        statistics.median(mb / r["seconds"] for r in reports
                          if r["rep"] == rep and r["backend"] == "switch")
        / statistics.median(mb / r["seconds"] for r in reports
                            if r["rep"] == rep and r["backend"] == "gloo") for rep in reps]
    counters = [r["counters"] for r in reports if r["backend"] == "switch"]
    out["counts"] = {name: sum(c[name] for c in counters)
                     for name in ("packets_sent", "redone", "retransmissions")}
    return out


def allreduce(blocks: list[tuple[str, int]], elements: int, bmv2_elements: int, reps: int,
              slots: int) -> list[dict]:
    """The record's rows, one per target and packet size that ran (none: skipped)."""
    from innet_aggregation.testbed.layout import link_mtu
    from innet_aggregation.testbed.netns import Namespaces

    print(f"\nallreduce, {WORKERS} workers in network namespaces behind one switch, float32, "
          f"switch and gloo's ring in turns on the same tensor, {reps} calls each after one "
          f"to warm up; medians (min-max):")
    if os.geteuid() != 0:
        print("  skipped: creating network namespaces needs root")
        return []
    if not blocks:
        print("  skipped: no switch target (softswitch package absent, BMv2 not installed)")
        return []
    # One set of links for every block: the MTU the largest packets need (gloo's too).
    mtu = max(link_mtu(protocol.program(values).format) for _, values in blocks)
    print(f"  load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"links' MTU {mtu} B")
    results = []
    with Namespaces(WORKERS, tag=f"bw{os.getpid() % 100000}", mtu=mtu) as topo:
        for i, (target, values) in enumerate(blocks):
            size = bmv2_elements if target == "bmv2" else elements
            window = min(16, slots) if target == "bmv2" else slots
            reports = against_gloo(topo, target, values, size, reps, window, GLOO_PORT + i)
            if reports is not None:
                results.append(summarize(f"{target}, {values} values", reports, size))
    print(f"  load average after: {os.getloadavg()[0]:.2f}")
    if not results:
        return []
    print(f"\n  {'target, values per packet':30s} {'MB':>5} {'switch MB/s per worker':>24} "
          f"{'gloo MB/s per worker':>24} {'switch / gloo':>18}")
    for r in results:
        print(f"  {r['label']:30s} {r['elements'] * 4 / 1e6:5.2f} "
              f"{spread(r['switch']['mbps'], '.2f'):>24} {spread(r['gloo']['mbps'], '.2f'):>24} "
              f"{spread(r['ratio'], '.2f'):>18}")
    print(f"\n  CPU milliseconds per MB of the tensor: a worker process's (time.process_time, all "
          f"threads), and the switch process's (utime + stime of all its threads, from its "
          f"CPU-time clock), during the switch's calls and during gloo's (whose TCP frames "
          f"the switch forwards):")
    print(f"  {'target, values per packet':30s} {'worker, switch':>20} {'worker, gloo':>20} "
          f"{'switch proc, switch':>20} {'switch proc, gloo':>20}")
    for r in results:
        print(f"  {r['label']:30s} {spread(r['switch']['worker_cpu'], '.1f'):>20} "
              f"{spread(r['gloo']['worker_cpu'], '.1f'):>20} "
              f"{spread(r['switch']['switch_cpu'], '.1f'):>20} "
              f"{spread(r['gloo']['switch_cpu'], '.1f'):>20}")
    print()
    for r in results:
        c = r["counts"]
        print(f"  {r['label']}: {c['packets_sent']} aggregation packets sent, {c['redone']} "
              f"redone, {c['retransmissions']} retransmitted")
    by = {r["label"]: r for r in results}
    for target in dict.fromkeys(label.split(",")[0] for label in by):
        sizes = sorted(int(label.split(", ")[1].split()[0]) for label in by
                       if label.startswith(target + ","))
        if len(sizes) > 1:
            lo, hi = by[f"{target}, {sizes[0]} values"], by[f"{target}, {sizes[-1]} values"]
            print(f"  {target}, {sizes[-1]} against {sizes[0]} values per packet: switch MB/s "
                  f"{statistics.median(hi['switch']['mbps']) / statistics.median(lo['switch']['mbps']):.2f}x "
                  f"(medians; the two builds run one after the other, gloo's MB/s beside each "
                  f"says how the machine's load moved between them)")
    if any(label.startswith("bmv2") for label in by):
        print(f"  bmv2: {BMV2_BUILD}")
    return [{"label": r["label"], "mtu": mtu, "elements": r["elements"],
             "ratio": record.spread(r["ratio"]),
             **{f"{b}_{k}": record.spread(v) if v else None
                for b in ("switch", "gloo") for k, v in r[b].items()}, **r["counts"]}
            for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 20, help="pipeline tensor size")
    parser.add_argument("--batch", type=int, default=512,
                        help="packets per pipeline batch (its working set fits the L2 cache)")
    parser.add_argument("--repeats", type=int, default=200, help="runs per pipeline figure")
    parser.add_argument("--window", type=int, default=256,
                        help="slots in flight for the worker packet rate")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="duration of each packet-rate measurement")
    parser.add_argument("--rate-repeats", type=int, default=3,
                        help="packet-rate measurements of the worker and of the C client each")
    parser.add_argument("--allreduce-elements", type=int, default=1 << 18,
                        help="float32 per allreduce call on the softswitch")
    parser.add_argument("--bmv2-elements", type=int, default=1 << 14,
                        help="float32 per allreduce call on BMv2 (it forwards a few k packets/s)")
    parser.add_argument("--allreduce-reps", type=int, default=5,
                        help="timed calls of each backend per target")
    parser.add_argument("--slots", type=int, default=128, help="the job's window (16 on BMv2)")
    parser.add_argument("--blocks", nargs="*", metavar="TARGET:VALUES",
                        help="switch targets and packet sizes for section 3 (default: every "
                             "installed target at 256 values, and softswitch at 64)")
    parser.add_argument("--sections", nargs="*", type=int, default=[1, 2, 3])
    args = parser.parse_args()
    stop_on_signals()       # a stop signal tears down as the end does
    load, figures = os.getloadavg()[0], {}
    if 1 in args.sections:
        figures.update(pipeline(args.elements, args.batch, args.repeats))
    if 2 in args.sections:
        figures.update(worker_rate(args.window, args.seconds, args.rate_repeats))
    if 3 in args.sections:
        figures["allreduce"] = allreduce(blocks(args.blocks), args.allreduce_elements,
                                         args.bmv2_elements, args.allreduce_reps, args.slots)
    record.write("bench-worker", figures, params=vars(args), load_before=load)


def blocks(asked: list[str] | None) -> list[tuple[str, int]]:
    """Section 3's (target, values per packet): those asked for, else every installed
    target at the software targets' size and the native backend at 64 too."""
    if asked is not None:
        return [(target, int(values)) for target, _, values in
                (block.partition(":") for block in asked)]
    from innet_aggregation.testbed.targets import bmv2_path
    k = protocol.packet_format().values_per_packet
    out = []
    if importlib.util.find_spec("innet_aggregation.softswitch") is not None:
        out += [("softswitch", k), ("softswitch", 64), ("softswitch-python", k)]
    if bmv2_path():
        out.append(("bmv2", k))
    return out


if __name__ == "__main__":
    main()
