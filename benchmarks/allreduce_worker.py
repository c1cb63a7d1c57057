"""One worker of bench_worker's section 3: the same tensor through the switch and through gloo.

    python benchmarks/allreduce_worker.py --config job.toml --program innet_aggregation/p4src/build/aggregation.json \
        --worker-id 0 --world 4 --master 10.0.0.1:29500 --elements 262144 --reps 5 \
        [--switch-pid PID]

Started by bench_worker in the worker's network namespace. Makes one gloo process
group (torch.distributed, CPU) and one AggregationSession on the packet format of
``--program``, warms both up, then makes ``--reps`` rounds of one call each,
switch and gloo in turns (the first of the pair alternating), between barriers,
on the same float32 tensor. Prints one JSON line per call: backend, seconds,
this process's CPU seconds (time.process_time: every thread, the transport's and
gloo's included) and, on the worker given ``--switch-pid``, the switch process's
CPU seconds between the barriers around the call: its CPU-time clock
(clock_getcpuclockid), the utime + stime of all its threads that /proc/PID/stat
gives in 10 ms ticks, to the nanosecond.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from innet_aggregation.p4src import protocol  # noqa: E402
from innet_aggregation.worker import AggregationSession  # noqa: E402
from innet_aggregation.testbed.targets import cpu_seconds  # noqa: E402
from innet_aggregation.worker.run import make_inputs  # noqa: E402

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--program", type=Path, required=True, help="the switch's BMv2 JSON")
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="host:port of rank 0's gloo store")
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--reps", type=int, required=True)
    parser.add_argument("--switch-pid", type=int, help="read this process's CPU time")
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.worker_id,
                            world_size=args.world, timeout=timedelta(minutes=5))
    fmt = protocol.PacketFormat.load(args.program)
    # Block scales steady from call to call, as a training step's gradients keep theirs.
    values = make_inputs(args.elements, 0, 0, args.worker_id, steady=True)
    with AggregationSession.from_config(args.config, args.worker_id, packet_format=fmt) as session:
        calls = {"switch": lambda t: session.allreduce(t.numpy()),
                 "gloo": lambda t: dist.all_reduce(t)}
        for backend in calls:            # the first switch call of a shape probes the exponents
            calls[backend](torch.from_numpy(values.copy()))
        for rep in range(args.reps):
            for backend in ("switch", "gloo") if rep % 2 == 0 else ("gloo", "switch"):
                tensor = torch.from_numpy(values.copy())
                dist.barrier()
                switch_cpu = cpu_seconds(args.switch_pid) if args.switch_pid else None
                cpu, start = time.process_time(), time.perf_counter()
                calls[backend](tensor)
                seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
                dist.barrier()
                report = {"worker": args.worker_id, "rep": rep, "backend": backend,
                          "seconds": seconds, "cpu": cpu}
                if switch_cpu is not None:
                    report["switch_cpu"] = cpu_seconds(args.switch_pid) - switch_cpu
                if backend == "switch":
                    report["counters"] = session.last_call.counters.as_dict()
                print(json.dumps(report), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
