"""One rank of the conservation tests (a deadline job on the ``cpu:ina`` backend, its
session's calls named, INA_FALLBACK=gloo):

    python -m tests.worker.conservation_calls [--config job.toml] --worker-id 0 \
        --master 10.0.0.1:29600 --world 4 --out DIR [--calls 8] [--size N] \
        [--sleep 0.4 --sleep-calls 2] [--pause-before 0,6 [--hold]] [--zeros 8] \
        [--back-on-switch]

Without ``--config`` the job comes from the manager (INA_MANAGER and the rest set by
the caller).

``--calls`` calls of ``run.make_inputs(size, SEED, call, rank)`` (any process can
recompute them), a rank given ``--sleep`` sleeping before the calls in
``--sleep-calls``; before each call C in ``--pause-before`` every rank writes
DIR/ready.C.RANK (its process id, for a test that stops it) and waits for DIR/go.C (the test injects or undoes a fault in
between; C may be the first zero call's number; ``--hold``: then also for DIR/go.C.RANK
and until a peer has said in the group's store that it left the switch path, as a
rank late for a fall to gloo hears it); then calls of zeros, which
only apply what is still carried, each after the ranks have summed through a gloo group
of their own how many values they still carry, until none are (at most ``--zeros``;
``--back-on-switch``: and every rank's last call went through the switch, one zero
call every 0.1 s);
what is still carried then, DIR/RANK.owed.npy, where it belongs in the input.
The sum is also a barrier: a late rank that trails the others in every round (their
quorum released each without it) starts the zero call with them. Per call DIR/RANK.CALL.npy holds the
result, and a JSON line in DIR/RANK.jsonl its path, error bound and the values still
carried after it.
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import innet_aggregation.worker.backend as backend
from innet_aggregation.worker.run import make_inputs

SEED = 23
NAME = "bucket"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--zeros", type=int, default=8)
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--sleep-calls", default="")
    parser.add_argument("--pause-before", default="")
    parser.add_argument("--switch-timeout", default="2")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--back-on-switch", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    os.environ.update(INA_FALLBACK="gloo", INA_SWITCH_TIMEOUT=args.switch_timeout)
    if args.config:
        os.environ["INA_JOB_CONFIG"] = args.config
    rank, out = args.worker_id, Path(args.out)
    sleeps = {int(c) for c in args.sleep_calls.split(",") if c}
    pauses = {int(c) for c in args.pause_before.split(",") if c}
    dist.init_process_group("cpu:ina", init_method=f"tcp://{args.master}", rank=rank,
                            world_size=args.world, timeout=timedelta(seconds=60))
    session = backend.session_of()
    fallback = session.fallback
    sync = dist.new_group(backend="gloo")
    via = "switch"
    with open(out / f"{rank}.jsonl", "w") as log:
        for call in range(args.calls + args.zeros):
            if call >= args.calls:
                left = torch.tensor([session.carry.values,
                                     args.back_on_switch and via != "switch"], dtype=torch.int64)
                dist.all_reduce(left, group=sync)
                if not left.any():
                    break
                if args.back_on_switch:      # a pace, while the ranks join the job again
                    time.sleep(0.1)
            if call in pauses:
                (out / f"ready.{call}.{rank}").write_text(str(os.getpid()))
                while not (out / f"go.{call}").exists():
                    time.sleep(0.05)
                while args.hold and not (out / f"go.{call}.{rank}").exists():
                    time.sleep(0.05)
                while args.hold and fallback.abort_reason() is None:
                    time.sleep(0.05)
            if call in sleeps:
                time.sleep(args.sleep)
            values = (make_inputs(args.size, SEED, call, rank, steady=True)
                      if call < args.calls else np.zeros(args.size, np.float32))
            before, taken = dict(fallback.counts), fallback.taken
            session.allreduce(values, name=NAME)
            np.save(out / f"{rank}.{call}.npy", values)
            via = next(p for p in before if fallback.counts[p] > before[p])
            mine = via == "switch" and fallback.taken == taken
            log.write(json.dumps({
                "call": call, "via": via, "taken": fallback.taken > taken,
                "carried": session.carry.values,
                # A call taken from a peer (a lead at the fallback) ran no switch call here.
                "bound": session.last_call.max_error_bound if mine else 0.0,
                "late": session.last_call.counters.late if mine else 0,
                "repairs_asked": session.stats.repairs_asked}) + "\n")
            log.flush()
    owed = np.zeros(args.size, np.float64)     # what is still carried, where it belongs
    for key in list(session.carry.store):
        session.carry.add_into(key, owed)
    np.save(out / f"{rank}.owed.npy", owed)
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
