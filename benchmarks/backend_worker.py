"""One worker of bench_backend: the same tensors through the session and through
``dist.all_reduce`` on the ``ina`` group of that session, in turns.

    python benchmarks/backend_worker.py --config job.toml --worker-id 0 --world 4 \
        --master 10.0.0.1:29500 --sizes 2410 65536 --reps 15

Started by bench_backend in the worker's network namespace. Initializes
``cpu:ina`` from ``INA_JOB_CONFIG`` (the job file), takes the group's session
(``session_of``), warms both paths up per size, then makes ``--reps`` rounds per
size, one call of each path, the first of the pair alternating, between barriers
(gloo's, inside the group). Prints one JSON line per call: size, path, seconds,
and the session's own time for the call's aggregation (``last_call.seconds``,
from its background thread's start of the call to the result), so that what
each path adds around the same work can be told apart from the network's noise.
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

from innet_aggregation.worker.backend import session_of  # noqa: E402
from innet_aggregation.worker.run import make_inputs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", required=True, help="host:port of rank 0's store")
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--reps", type=int, required=True)
    args = parser.parse_args()
    os.environ["INA_JOB_CONFIG"] = args.config
    dist.init_process_group("cpu:ina", init_method=f"tcp://{args.master}", rank=args.worker_id,
                            world_size=args.world, timeout=timedelta(minutes=5))
    session = session_of()
    paths = {"session": lambda t: session.allreduce(t),
             "backend": lambda t: dist.all_reduce(t)}
    for size in args.sizes:
        # Block scales steady from call to call, as a training step's gradients keep theirs.
        values = torch.from_numpy(make_inputs(size, 0, 0, args.worker_id, steady=True))
        for path in paths.values():      # a shape's first call probes its exponents
            path(values.clone())
        for rep in range(args.reps):
            for path in ("session", "backend") if rep % 2 == 0 else ("backend", "session"):
                tensor = values.clone()
                dist.barrier()
                start = time.perf_counter()
                paths[path](tensor)
                seconds = time.perf_counter() - start
                print(json.dumps({"worker": args.worker_id, "size": size, "rep": rep,
                                  "path": path, "seconds": seconds,
                                  "inner": session.last_call.seconds}), flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)   # no finalization with gloo's threads about (tests/worker/ddp_train.py)


if __name__ == "__main__":
    main()
