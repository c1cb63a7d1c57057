"""Run allreduce calls from the command line, one process per worker host:

    python -m innet_aggregation.worker.run --config job.toml --worker-id 0 --size 100000 --reps 3
    python -m innet_aggregation.worker.run --config job.toml --worker-id 0 --call 1000:A --call 3000:B
    python -m innet_aggregation.worker.run --config job.toml --worker-id 0 --call 800 --call 3000 --steps 5

Inputs are pseudo-random float32 with block scales spread over many binades, a
function of (seed, rep, worker id, and with ``--steps`` the call's place in the
step) only (``make_inputs``), so any process can recompute every worker's inputs
and check a result. Prints one JSON line per call: its time, the process's CPU
time, goodput, transport counters and a digest of the result; ``--save DIR`` also writes the results as
.npy. Exits non-zero after the first failed call.
``--call``, ``--pause`` and ``--die-after`` make a rank disagree, dawdle or crash,
to show what the others see.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .quantize import NonFiniteError
from .session import AggregationSession
from .transport import RetransmitPolicy

DTYPES = ("float32", "float16", "bfloat16")


def make_inputs(size: int, seed: int, rep: int, worker_id: int, dtype: str = "float32",
                steady: bool = False, place: int | None = None):
    """Worker ``worker_id``'s input of call ``rep``: normal values whose scale changes
    every 64 elements (from 2**-20 to 2**12), as gradients' do across layers. The
    scales are drawn afresh for every call, or, ``steady``, once per worker (and
    ``place`` in a training step, if given), as a training step's gradients keep
    their layers' scales from step to step. A numpy array, or a torch tensor for
    bfloat16 (numpy has none)."""
    rng = np.random.default_rng([seed, rep, worker_id])
    places = [] if place is None else [place]
    scale_rng = np.random.default_rng([seed, worker_id, *places]) if steady else rng
    scales = 2.0 ** scale_rng.integers(-20, 13, size=-(-size // 64)).repeat(64)[:size]
    values = (rng.standard_normal(size) * scales).astype(np.float32)
    if dtype == "bfloat16":
        import torch
        return torch.from_numpy(values).to(torch.bfloat16)
    return values.astype(dtype)


def as_float32(values) -> np.ndarray:
    """A result as float32 numpy (bfloat16 widens exactly)."""
    return values.float().numpy() if hasattr(values, "float") else values.astype(np.float32)


def digest(values) -> str:
    """Hash of the result's bits, to compare workers."""
    return hashlib.sha256(as_float32(values).tobytes()).hexdigest()[:16]


def _call(text: str) -> tuple[int, str | None]:
    size, _, name = text.partition(":")
    return int(size), name or None


def _pause(text: str) -> tuple[int, float]:
    rep, _, seconds = text.partition(":")
    return int(rep), float(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m innet_aggregation.worker.run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the job's TOML file")
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--size", type=int, default=100_000, help="elements per call")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--steps", type=int, metavar="N",
                        help="make the calls N times over, as training steps: each call's "
                             "place in the step has scales of its own (with --steady)")
    parser.add_argument("--call", type=_call, action="append", metavar="SIZE[:NAME]",
                        help="one call of SIZE elements, named NAME if given; repeated, "
                             "the calls to make (instead of --size and --reps)")
    parser.add_argument("--pause", type=_pause, action="append", default=[],
                        metavar="REP:SECONDS", help="sleep SECONDS before call REP")
    parser.add_argument("--die-after", type=float, metavar="SECONDS",
                        help="end the process abruptly SECONDS after it starts, as a crash")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--average", action="store_true")
    parser.add_argument("--steady", action="store_true",
                        help="keep each block's scale from call to call, as training does")
    parser.add_argument("--save", type=Path, help="write result_<worker>_<rep>.npy here")
    parser.add_argument("--nonfinite-at", type=int, metavar="INDEX",
                        help="put Inf at INDEX of the first call's input (shows the NaN/Inf policy)")
    parser.add_argument("--python-path", action="store_true",
                        help="handle every result in Python, without the compiled fast path")
    defaults = RetransmitPolicy()
    timers = ("initial_rto", "min_rto", "max_rto", "peer_timeout", "progress_interval")
    for name in timers:
        parser.add_argument(f"--{name.replace('_', '-')}", type=float,
                            default=getattr(defaults, name), help="seconds")
    args = parser.parse_args(argv)
    policy = RetransmitPolicy(**{name: getattr(args, name) for name in timers})
    step = args.call or [(args.size, None)] * args.reps
    calls = step * (args.steps or 1)
    places = list(range(len(step))) * args.steps if args.steps else [None] * len(calls)
    pauses = dict(args.pause)
    if args.die_after is not None:
        threading.Timer(args.die_after, os._exit, (137,)).start()

    with AggregationSession.from_config(args.config, args.worker_id, policy=policy,
                                       fast_path=not args.python_path) as session:
        for rep, (size, name) in enumerate(calls):
            time.sleep(pauses.get(rep, 0.0))
            tensor = make_inputs(size, args.seed, rep, args.worker_id, args.dtype,
                                 args.steady, places[rep])
            if rep == 0 and args.nonfinite_at is not None:
                tensor[args.nonfinite_at] = float("inf")
            report = {"worker": args.worker_id, "rep": rep}
            start, cpu = time.perf_counter(), time.process_time()
            try:
                session.allreduce(tensor, average=args.average, name=name)
            except NonFiniteError as exc:       # every worker gets it; the session goes on
                report["error"] = f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                report.update(error=f"{type(exc).__name__}: {exc}",
                              seconds=time.perf_counter() - start)
                print(json.dumps(report), flush=True)
                return 1
            call = session.last_call
            report.update(seconds=call.seconds, cpu_seconds=time.process_time() - cpu,
                          goodput_mbps=call.goodput_mbps,
                          max_error_bound=call.max_error_bound, digest=digest(tensor),
                          counters=call.counters.as_dict(),
                          breakdown=session.last_breakdown.as_dict())
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                np.save(args.save / f"result_{args.worker_id}_{rep}.npy", as_float32(tensor))
            print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
