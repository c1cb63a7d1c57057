"""One rank of the fallback tests on a ``cpu:ina`` group (job file, no manager):

    python -m tests.worker.fallback_calls --config job.toml --worker-id 0 \
        --master 10.0.0.1:29600 --world 3 --out DIR [--fallback gloo|error]

WARMUP calls, then it writes DIR/ready.RANK and waits for DIR/go (the test injects
its fault in between), then CALLS more. Every call all-reduces SIZE float32 values
(--size) that each rank draws from (call, rank): any rank can compute the exact float64 sum
of all of them. Per call, a JSON line in DIR/RANK.jsonl: the result's hash (its
bytes), its largest difference from the float64 sum, the path it took,
and the calls taken from a peer so far; or the error, and then it stops.
"""

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import innet_aggregation.worker.backend as backend

WARMUP, CALLS = 5, 12


def values(call: int, rank: int, size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7919 * call + rank)
    return torch.randn(size, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fallback", default="gloo")
    parser.add_argument("--switch-timeout", default="2")
    parser.add_argument("--size", type=int, default=20000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    os.environ.update(INA_JOB_CONFIG=args.config, INA_FALLBACK=args.fallback,
                      INA_SWITCH_TIMEOUT=args.switch_timeout)
    rank, world, out = args.worker_id, args.world, Path(args.out)
    dist.init_process_group("cpu:ina", init_method=f"tcp://{args.master}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    fallback = backend.session_of().fallback
    with open(out / f"{rank}.jsonl", "w") as log:
        for call in range(WARMUP + CALLS):
            if call == WARMUP:
                (out / f"ready.{rank}").touch()
                while not (out / "go").exists():
                    time.sleep(0.05)
            t = values(call, rank, args.size).to(args.device)
            exact = sum(values(call, r, args.size).double() for r in range(world))
            started, before = time.monotonic(), dict(fallback.counts)
            try:
                dist.all_reduce(t)
            except Exception as exc:     # noqa: BLE001  reported, as the test asserts on it
                log.write(json.dumps({"call": call, "error": f"{type(exc).__name__}: {exc}",
                                      "seconds": time.monotonic() - started}) + "\n")
                log.flush()
                break
            log.write(json.dumps({
                "call": call, "hash": hashlib.blake2b(t.cpu().numpy().tobytes()).hexdigest(),
                "device": str(t.device),
                "error": None, "deviation": float((t.double().cpu() - exact).abs().max()),
                "scale": float(exact.abs().max()),
                "via": next(p for p in before if fallback.counts[p] > before[p]),
                "taken": fallback.taken, "counts": fallback.counts}) + "\n")
            log.flush()
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
