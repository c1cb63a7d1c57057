"""One rank of one job of the sharing experiment (sharing.py), in its host's
namespace: ``init_process_group("cpu:ina")`` through the job manager (INA_*), then
STEPS steps of a pause (the step's compute) and one allreduce of integer-valued
float32, checked against its exact sum. One JSON line per step on stdout: its end
(time.time()), the path its call took, and whether the sum was exact.

    python -m innet_aggregation.experiments.sharing_rank --steps 40 --size 65536 --compute 0.2
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def inputs(size: int, step: int, rank: int) -> np.ndarray:
    return np.random.default_rng([step, rank]).integers(-1000, 1001, size).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--compute", type=float, required=True)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    import innet_aggregation.worker.backend as backend

    dist.init_process_group("cpu:ina")
    rank, world = dist.get_rank(), dist.get_world_size()
    fallback = backend.session_of().fallback
    print(json.dumps({"event": "started", "at": time.time()}), flush=True)
    for step in range(args.steps):
        time.sleep(args.compute)
        before = dict(fallback.counts)
        tensor = torch.from_numpy(inputs(args.size, step, rank))
        dist.all_reduce(tensor)
        exact = sum(inputs(args.size, step, r).astype(np.float64) for r in range(world))
        path = next(p for p in before if fallback.counts[p] > before[p])
        print(json.dumps({"event": "step", "step": step, "at": time.time(), "path": path,
                          "exact": bool((tensor.numpy() == exact).all())}), flush=True)
    dist.destroy_process_group()
    print(json.dumps({"event": "done", "at": time.time()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
