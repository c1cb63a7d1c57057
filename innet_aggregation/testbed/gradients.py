"""Recorded DDP gradients: what `bench-allreduce --data recorded` sums.

    python -m innet_aggregation.testbed.gradients [--out FILE] [--steps 300]   # make record-gradients

Integer inputs give every block the same exponent call after call, so exponent
speculation never misses; real gradients move. This trains two models on
scikit-learn's digits with DDP (gloo over loopback, ``RANKS`` processes, DDP's
default buckets) and keeps each rank's bucket buffers, concatenated in bucket order,
as the comm hook sees them (before any averaging):

* ``mlp``: the demo's large model, 64-1024-1024-10 (1.13 M parameters), Adam 1e-3;
* ``cnn``: a small convolutional net (two 3x3 convolutions, 38 k parameters), Adam 1e-3.

To stay small (about 3 MB), the file keeps, of a ``--steps`` run, the last
``KEPT_STEPS`` consecutive steps, and of each gradient ``PIECES`` pieces of 1,024
consecutive values spread evenly over it (so every layer's kind is sampled). Values
are stored as float16 with a power-of-two shift per ``SHIFT_BLOCK`` values (the
mantissa truncated, never rounded up), so every block exponent of 64, 256 or 1,024
values is exactly the recorded one. The file starts with its format name and
version, which ``load`` checks.

A replayed call (``replay``): worker w at call c takes rank ``w % RANKS`` at step
``c + w // RANKS`` of the kept steps, played forwards then backwards (no jump back
to the first), both models' pieces one after the other, repeated to the call's size.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "innet-recorded-gradients"
VERSION = 1
RANKS = 4
KEPT_STEPS = 16
PIECES = 12
PIECE = 1024                  # values; a multiple of every packet size (64, 256, 1024)
SHIFT_BLOCK = 64              # values sharing one stored power-of-two shift
DEFAULT_FILE = Path(__file__).with_name("data") / "gradients.npz"
MODELS = ("mlp", "cnn")
DATA = ("recorded", "normal", "integers")     # what a benchmark's calls sum (testbed.train)


class GradientFileError(ValueError):
    """A recorded-gradient file this build cannot read."""


@dataclass(frozen=True)
class Recorded:
    """Per model, float32 gradients (kept steps, ranks, values), and the steps' numbers."""
    grads: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    total_steps: int

    @property
    def kept_steps(self) -> int:
        return len(next(iter(self.steps.values())))


def encode(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 (..., L) -> (float16 (..., L), int8 shifts (..., L / SHIFT_BLOCK)):
    every SHIFT_BLOCK values scaled by a power of two to below 2**15 and truncated to
    float16's mantissa, so decoding gives each block's largest magnitude's exponent
    back exactly."""
    from innet_aggregation.worker.quantize import block_exponents

    blocks = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, SHIFT_BLOCK)
    exponents = block_exponents(blocks).astype(np.int32)
    shifts = np.where(np.abs(blocks).max(axis=1) > 0, 15 - exponents, 0)
    if (shifts < -128).any() or (shifts > 127).any() or (exponents == 127).any():
        raise ValueError("gradients with NaN, Inf or magnitudes float16 cannot shift into")
    scaled = np.ldexp(blocks, shifts[:, None]).astype(np.float32)
    truncated = (scaled.view(np.int32) & np.int32(~0x1FFF)).view(np.float32)
    return (truncated.astype(np.float16).reshape(values.shape),
            shifts.astype(np.int8).reshape(*values.shape[:-1], -1))


def decode(halves: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    blocks = halves.astype(np.float32).reshape(-1, SHIFT_BLOCK)
    out = np.ldexp(blocks, -shifts.astype(np.int32).reshape(-1, 1)).astype(np.float32)
    return out.reshape(halves.shape)


def piece_offsets(parameters: int) -> np.ndarray:
    """Starts of ``PIECES`` pieces of ``PIECE`` values spread over a gradient."""
    starts = np.linspace(0, parameters // PIECE - 1, PIECES).round().astype(np.int64)
    if parameters < PIECE * PIECES:
        raise ValueError(f"a gradient of {parameters} values has fewer than {PIECES} pieces")
    return starts * PIECE


def save(path: Path, grads: dict[str, np.ndarray], steps: dict[str, np.ndarray],
         total_steps: int, parameters: dict[str, int]) -> None:
    arrays = {"format": np.array(FORMAT), "version": np.array(VERSION),
              "total_steps": np.array(total_steps)}
    for name, g in grads.items():
        halves, shifts = encode(g)
        arrays.update({f"{name}_values": halves, f"{name}_shifts": shifts,
                       f"{name}_steps": steps[name], f"{name}_parameters": np.array(parameters[name])})
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)


def load(path: Path = DEFAULT_FILE) -> Recorded:
    """The file's gradients; another format or version is refused naming both."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise GradientFileError(f"recorded gradients {path}: unreadable ({exc}); "
                                f"`make record-gradients` writes them") from None
    with data:
        fmt = str(data["format"]) if "format" in data.files else "no format"
        version = int(data["version"]) if "version" in data.files else None
        if (fmt, version) != (FORMAT, VERSION):
            raise GradientFileError(f"recorded gradients {path}: format {fmt!r} version "
                                    f"{version}, but this build reads {FORMAT!r} version "
                                    f"{VERSION}; rerun `make record-gradients`")
        grads = {m: decode(data[f"{m}_values"], data[f"{m}_shifts"]) for m in MODELS}
        steps = {m: data[f"{m}_steps"] for m in MODELS}
        return Recorded(grads, steps, int(data["total_steps"]))


def step_index(call: int, kept: int) -> int:
    """Call ``call``'s kept step: forwards, then backwards, and again."""
    period = 2 * kept - 2
    at = call % period
    return at if at < kept else period - at


def replay(recorded: Recorded, size: int, call: int, worker: int) -> np.ndarray:
    """Worker ``worker``'s float32 tensor of ``size`` values at call ``call``."""
    ranks = next(iter(recorded.grads.values())).shape[1]
    step = step_index(call + worker // ranks, recorded.kept_steps)
    one = np.concatenate([recorded.grads[m][step, worker % ranks] for m in MODELS])
    return np.resize(one, size)


def agreed_exponents(recorded: Recorded, workers: int, values: int, calls: int) -> list:
    """Per replayed call, each block's exponent maximum over ``workers`` (what the
    switch returns), blocks of ``values``, over one copy of the recorded pieces."""
    from innet_aggregation.worker.quantize import block_exponents
    length = len(MODELS) * PIECES * PIECE
    return [np.max([block_exponents(replay(recorded, length, c, w).reshape(-1, values))
                    for w in range(workers)], axis=0) for c in range(calls)]


def redone_share(agreed: list, depth: int, headroom: int, slack: int) -> dict:
    """Speculation replayed on ``agreed`` (quantize.speculate, usable, remember) with
    this depth, headroom and slack: the share of blocks redone after the first call's
    probes, which side missed (rose above the scale, fell more than ``slack`` below),
    and the kept blocks' mean scale above their maximum (``waste``, bits)."""
    from innet_aggregation.worker import quantize
    redone = rose = total = 0
    waste = []
    history = quantize.remember(agreed[0], None, depth)
    for now in agreed[1:]:
        scale = quantize.speculate(history, len(now), headroom)
        keep = quantize.usable(scale, now, slack)
        redone += int((~keep).sum())
        rose += int((~keep & (now > scale)).sum())
        total += len(keep)
        waste.append((scale - now)[keep & (now != quantize.EXPONENT_OF_ZERO)])
        history = quantize.remember(now, history, depth)
    return {"redone": redone / total, "rose": rose / total, "fell": (redone - rose) / total,
            "waste": float(np.concatenate(waste).mean()), "blocks": total}


# Recording --------------------------------------------------------------------------


def cnn():
    """A small convolutional net for digits' 8x8 images."""
    import torch
    nn = torch.nn
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)),
                         nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


@contextlib.contextmanager
def ddp_group(rank: int, world: int, port: int):
    """A gloo process group over loopback for the block, left together: every rank
    waits at a barrier before tearing it down, so that none closes its connections
    while another still uses them."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    yield
    dist.barrier()
    dist.destroy_process_group()


def train_ddp(rank: int, world: int, model, optimizer, steps: int, record,
              bucket_cap_mb: float | None = None) -> None:
    """Train ``model`` (built alike on every rank) with DDP on scikit-learn's digits,
    32 samples a rank a step, in a ``ddp_group``. Every bucket DDP reduces is shown
    to ``record(step, bucket)`` first (the ranks' own gradients; the hook then takes
    their mean through gloo). ``optimizer`` makes the optimizer from the parameters."""
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)[len(x) // 5:][rank::world]
    y = torch.tensor(y[order], dtype=torch.long)[len(y) // 5:][rank::world]
    ddp = DDP(model) if bucket_cap_mb is None else DDP(model, bucket_cap_mb=bucket_cap_mb)
    step = 0

    def hook(_, bucket):
        record(step, bucket)
        bucket.buffer().div_(world)
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
            lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    optimize = optimizer(ddp.parameters())
    batch, per_epoch = 32, len(x) // 32
    while step < steps:
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(step // per_epoch))
        for i in range(per_epoch):
            if step == steps:
                break
            idx = perm[i * batch:(i + 1) * batch]
            optimize.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx]).backward()
            optimize.step()
            step += 1


def _rank(rank: int, world: int, port: int, model_name: str, steps: int, queue) -> None:
    import torch

    from .model import mlp

    kept: dict[int, dict[int, np.ndarray]] = {}

    def record(step, bucket):
        if step >= steps - KEPT_STEPS:
            kept.setdefault(step, {})[bucket.index()] = bucket.buffer().detach().numpy().copy()

    with ddp_group(rank, world, port):
        torch.manual_seed(0)
        model = mlp([1024, 1024]) if model_name == "mlp" else cnn()
        train_ddp(rank, world, model, lambda p: torch.optim.Adam(p, lr=0.001), steps, record)
        flat = {s: np.concatenate([b[i] for i in sorted(b)]) for s, b in kept.items()}
        queue.put((rank, flat))


def run_ranks(target, world: int, *args) -> list:
    """Each rank's result, in rank order: ``target(rank, world, port, *args, queue)`` in
    ``world`` spawned processes, each putting ``(rank, result)`` on the queue. A rank
    that dies ends the wait with its exit (torch's ProcessExitedException)."""
    import queue as queues

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").Queue()
    ctx = mp.start_processes(target, args=(world, port, *args, queue), nprocs=world,
                             join=False, start_method="spawn")
    results: dict = {}
    while len(results) < world:
        try:
            rank, result = queue.get(timeout=1)
            results[rank] = result
        except queues.Empty:
            ctx.join(timeout=0)
    ctx.join()
    return [results[rank] for rank in range(world)]


def record(model: str, steps: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(kept steps, RANKS, PIECES * PIECE) float32 gradients, the steps, the parameters."""
    by_rank = run_ranks(_rank, RANKS, model, steps)
    kept = sorted(by_rank[0])
    parameters = len(by_rank[0][kept[0]])
    offsets = piece_offsets(parameters)
    take = (offsets[:, None] + np.arange(PIECE)).reshape(-1)
    grads = np.stack([np.stack([by_rank[r][s][take] for r in range(RANKS)]) for s in kept])
    return grads.astype(np.float32), np.array(kept), parameters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--steps", type=int, default=300,
                        help=f"training steps (default 300; the last {KEPT_STEPS} are kept)")
    args = parser.parse_args(argv)
    if args.steps < KEPT_STEPS:
        print(f"gradients: --steps must be at least {KEPT_STEPS}", file=sys.stderr)
        return 1
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    grads, steps, parameters = {}, {}, {}
    for model in MODELS:
        grads[model], steps[model], parameters[model] = record(model, args.steps)
        print(f"{model}: {parameters[model]} parameters, steps {steps[model][0]}-"
              f"{steps[model][-1]} of {args.steps} kept, {grads[model].shape[2]} values of "
              f"{RANKS} ranks each", flush=True)
    save(args.out, grads, steps, args.steps, parameters)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
