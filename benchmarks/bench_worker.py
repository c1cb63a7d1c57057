"""make bench-worker: the worker's host pipeline, and allreduce goodput through a switch.

1. Host pipeline, one thread, float32: block exponents + quantize + pack (headers
   and values into the packets' structured array), then unpack (headers and the
   values view of result packets) + dequantize, for 4 workers; on a cache-sized
   batch of packets, and on a whole 4 MB tensor at once. Reported in MB/s of
   float32 gradient, next to two baselines measured in the same run on the same
   batch: a plain copy, and numpy's sum of 4 arrays (what a CPU reduction must at
   least do). Each figure is the best of many runs, as timeit advises.
2. The worker's own packet rate: one worker (AggregationSession, the whole
   pipeline) against a minimal C reflector on loopback that answers each packet as
   a one-worker switch would, next to a minimal C client driving the same
   reflector with the same window in the same run (``udp_reflector.c``, compiled
   here with the system C compiler).
3. Allreduce goodput: 4 worker processes in network namespaces, each reducing a
   float32 tensor through each switch target installed (the embedded softswitch's
   native and Python backends; BMv2 where simple_switch_grpc is on PATH), with
   block scales steady from call to call as a training loop's are, and each
   worker's CPU time per MB (the process's, around its calls). Needs root;
   skipped otherwise.
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
import tomli_w

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from p4src import protocol  # noqa: E402
from worker import quantize  # noqa: E402

WORKERS = 4
# Goodput per worker of the worker this fast path replaced (one packet per Python
# call, a bootstrap round per call, 16 slots), through the Python softswitch on this
# machine: the baseline, which no longer exists to run beside.
BASELINE_MBPS = 2.0


def best_of(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def pipeline(elements: int, batch: int, repeats: int) -> None:
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

    # timeit's rule: the minimum over repeats is the machine's capability; the rest
    # is other processes (this machine is shared with builds and other tests).
    batch = min(batch, blocks_n)
    batch_mb = batch * k * 4 / 1e6
    batched = best_of(stages(0, batch), repeats)
    megabytes = x.nbytes / 1e6
    at_once = best_of(stages(0, blocks_n), max(3, repeats // 20))
    arrays = [x[:batch * k].copy() for _ in range(WORKERS)]
    copy = best_of(lambda: np.copyto(out[:batch * k], arrays[0]), repeats)
    summed = best_of(lambda: np.sum(arrays, axis=0, out=out[:batch * k]), repeats)
    print(f"host pipeline (exponents + quantize + pack + unpack + dequantize), float32, "
          f"{WORKERS} workers, one thread:")
    print(f"  batches of {batch} packets ({batch_mb:.1f} MB)  {batch_mb / batched:8.0f} MB/s per core"
          f"   (goal >= 1000; best of {repeats})")
    print(f"  {len(x):,} elements at once ({megabytes:.0f} MB)  {megabytes / at_once:8.0f} MB/s")
    print(f"  baseline: copy                    {batch_mb / copy:8.0f} MB/s"
          f"   pipeline takes {batched / copy:.1f} x a copy's time")
    print(f"  baseline: np.sum of {WORKERS} arrays      {batch_mb / summed:8.0f} MB/s"
          f"   pipeline takes {batched / summed:.2f} x its time")


def worker_rate(window: int, seconds: float) -> None:
    """Packets per second one worker sends and receives when nothing else binds."""
    from worker import AggregationSession

    fmt = protocol.packet_format()
    print(f"\nworker packet rate, one worker against a minimal reflector on loopback, "
          f"window {window}:")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("  skipped: no C compiler for the reflector")
        return
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "udp_reflector"
        subprocess.run([cc, "-O2", "-o", str(binary), str(REPO / "benchmarks/udp_reflector.c")],
                       check=True)
        port = _free_udp_port()
        env = dict(os.environ, AGG_TYPE_OFFSET=str(fmt.dtype.fields["msg_type"][1]),
                   AGG_COUNT_OFFSET=str(fmt.dtype.fields["contributions"][1]),
                   AGG_RESULT_TYPE=str(int(protocol.MsgType.RESULT)))
        reflector = subprocess.Popen([str(binary), "reflect", str(port)], env=env)
        try:
            time.sleep(0.2)
            answers, took = subprocess.run(
                [str(binary), "drive", str(port), str(window), str(seconds),
                 str(fmt.payload_bytes)], check=True, capture_output=True, text=True
            ).stdout.split()
            c_rate = int(answers) / float(took)
            session = AggregationSession(0, 1, "127.0.0.1", 1, port, 0, window, "127.0.0.1",
                                         _free_udp_port(), packet_format=fmt)
            with session:
                tensor = np.ones(window * fmt.values_per_packet * 16, dtype=np.float32)
                session.allreduce(tensor)            # the first call of a shape probes
                before, start = session.stats, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    session.allreduce(tensor)
                took = time.perf_counter() - start
                done = session.stats - before
        finally:
            reflector.terminate()
            reflector.wait()
    rate = done.results_received / took
    print(f"  minimal C client:  {c_rate:10,.0f} packets/s each way")
    print(f"  worker (allreduce): {rate:10,.0f} packets/s each way "
          f"({rate * fmt.values_per_packet * 4 / 1e6:.1f} MB/s of float32; "
          f"{done.retransmissions} retransmitted, {done.fast_retransmissions} of them before a timer)   worker / C = {rate / c_rate:.2f}")


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def goodput(target: str, elements: int, reps: int, slots: int) -> None:
    from switch_ctl import config as config_mod
    from switch_ctl.client import SwitchConnection
    from switch_ctl.controller import Controller
    from testbed.netns import Topology
    from testbed.targets import SwitchProcess

    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp, Topology(WORKERS, tag=f"bw{os.getpid() % 100000}") as topo, \
            SwitchProcess(target, topo.switch_ports, log_path=Path(tmp) / "switch.log") as switch:
        raw = {"switch": {"grpc_addr": switch.grpc_addr, "device_id": 0,
                          "ports": [h.switch_port for h in topo.hosts]},
               "job": {"id": 1, "udp_port": protocol.AGG_UDP_PORT_BASE,
                       "service_ip": "10.0.0.254", "service_mac": "02:00:00:00:00:fe",
                       "first_slot": 0, "num_slots": slots,
                       "workers": [{"id": i, "mac": h.mac, "ip": h.ip, "udp_port": 41000,
                                    "switch_port": h.switch_port}
                                   for i, h in enumerate(topo.hosts)]}}
        path = Path(tmp) / "job.toml"
        path.write_text(tomli_w.dumps(raw))
        config = config_mod.load(path)
        with SwitchConnection(switch.grpc_addr, 0, (0, 1)) as conn:
            controller = Controller(conn)
            controller.push()
            controller.apply(config)
            procs = [h.popen([sys.executable, "-m", "worker.run", "--config", str(path),
                              "--worker-id", str(i), "--size", str(elements),
                              "--reps", str(reps), "--steady"], stdout=subprocess.PIPE,
                             text=True,
                             env=env, cwd=REPO) for i, h in enumerate(topo.hosts)]
            # Drained together: a worker blocked on a full pipe would stall the others.
            with ThreadPoolExecutor(len(procs)) as pool:
                outputs = list(pool.map(lambda p: p.communicate(timeout=600)[0], procs))
    reports = [json.loads(line) for out in outputs for line in out.splitlines()]
    failed = [r for r in reports if "error" in r]
    if failed or len(reports) != WORKERS * reps:
        print(f"  {target}: failed: {failed[:1] or 'missing reports'}")
        return
    # The first call includes the workers' start-up skew and probes the exponents;
    # report the others.
    steady = [r for r in reports if r["rep"] > 0] or reports
    rates = [r["goodput_mbps"] for r in steady]
    retrans = sum(r["counters"]["retransmissions"] for r in steady)
    redone = sum(r["counters"]["redone"] for r in steady)
    sent = sum(r["counters"]["packets_sent"] for r in steady)
    median = statistics.median(rates)
    print(f"  {target:18s} {median:8.3f} MB/s per worker ({median / BASELINE_MBPS:5.1f}x the "
          f"{BASELINE_MBPS} MB/s of the per-packet worker; median of {len(rates)} calls, min "
          f"{min(rates):.3f}, max {max(rates):.3f}); {sent} packets sent, {redone} redone, "
          f"{retrans} retransmitted")
    cpu = [r["cpu_seconds"] * 1e3 / (elements * 4 / 1e6) for r in steady]
    print(f"  {'':18s} {statistics.median(cpu):8.2f} ms of a worker's CPU per MB (min "
          f"{min(cpu):.2f}, max {max(cpu):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 20, help="pipeline tensor size")
    parser.add_argument("--batch", type=int, default=2048,
                        help="packets per pipeline batch (its working set fits the L2 cache)")
    parser.add_argument("--repeats", type=int, default=200,
                        help="runs per figure; the best is reported (the machine is shared)")
    parser.add_argument("--window", type=int, default=256,
                        help="slots in flight for the worker packet rate")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="duration of each packet-rate measurement")
    parser.add_argument("--allreduce-elements", type=int, default=1 << 16)
    parser.add_argument("--allreduce-reps", type=int, default=6)
    parser.add_argument("--slots", type=int, default=128, help="the job's window")
    args = parser.parse_args()
    pipeline(args.elements, args.batch, args.repeats)
    worker_rate(args.window, args.seconds)

    targets = []
    if importlib.util.find_spec("softswitch") is not None:
        targets += ["softswitch", "softswitch-python"]
    from testbed.targets import bmv2_path
    if bmv2_path():
        targets.append("bmv2")
    print(f"\nallreduce goodput, {WORKERS} workers, float32, "
          f"{args.allreduce_elements:,} elements ({args.allreduce_elements * 4 / 1e6:.2f} MB) "
          f"per call, {args.slots} slots (softswitch: its native backend):")
    if os.geteuid() != 0:
        print("  skipped: creating network namespaces needs root")
        return
    if not targets:
        print("  skipped: no switch target (softswitch package absent, BMv2 not installed)")
    for target in targets:
        goodput(target, args.allreduce_elements, args.allreduce_reps,
                16 if target == "bmv2" else args.slots)


if __name__ == "__main__":
    main()
