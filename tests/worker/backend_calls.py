"""One rank of the backend's collective tests, on a ``cpu:ina`` group with a gloo
group of the same ranks beside it.

    python -m tests.worker.backend_calls --config job.toml --worker-id 0 \
        --master 10.0.0.1:29600 --case dtypes|fallback|mismatch

Prints one JSON line per check:
- ``dtypes``: all_reduce SUM and AVG of integer-valued float16, bfloat16, float32 and
  float64 tensors (rank r holds (i mod 61 - 30) * (r + 1)), as lists of values,
  then a NaN on rank 0: the error that ``Work.wait()`` raised, then one more exact
  call (the session goes on after a NonFiniteError).
- ``fallback``: broadcast, all_gather, all_gather_single, MAX and int all_reduce,
  reduce_scatter, barrier, all_reduce_coalesced of ints, on both groups.
- ``mismatch``: rank r all-reduces 100 * (r + 1) values (async): the error that
  ``Work.wait()`` raised.
- ``shape``, ``dtype``: rank 0 all-reduces a float32 tensor of shape (4, 8), rank 1
  one of (8, 4) (``shape``) or a bfloat16 one of (4, 8) (``dtype``): the error.
- ``layouts``: every dtype in every layout (``LAYOUTS``) through ``dist.all_reduce``
  on both groups and (floats) through the session; per tensor its logical values
  after the call, whether it kept its storage and strides, and whether the memory
  around a view kept its values; an expanded tensor's error; then one DDP step with
  the switch's hook, per parameter (every float dtype, several layouts) its
  gradient, and whether the hook's futures held the buckets' own buffers.
- ``cuda``: as ``dtypes`` (SUM, float32, float16, bfloat16) with CUDA tensors, and
  the device the result is on; as ``layouts`` for CUDA tensors in ``CUDA_LAYOUTS``
  (through the backend and the session, where strided tensors are copied); then one DDP step of a CUDA model with the switch's
  comm hook (DDP over the gloo group: one GPU holds both ranks, which NCCL refuses):
  the bucket's device, and its largest difference from the mean of every rank's
  own gradient, each computed here in float64 without communication.
"""

import argparse
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import innet_aggregation.worker.backend  # noqa: F401  registers "ina"

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
SIZE = 3000
# torch 2.13's names; before it (the package takes torch>=2.1) the same collectives
# went by their older names.
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_SINGLE = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)


def integers(rank: int, dtype) -> torch.Tensor:
    return ((torch.arange(SIZE) % 61 - 30) * (rank + 1)).to(dtype)


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def error(work) -> str | None:
    try:
        work.wait()
    except Exception as exc:    # what the caller of Work.wait() gets
        return f"{type(exc).__name__}: {exc}"
    return None


def dtypes(rank: int) -> None:
    for name, dtype in DTYPES.items():
        for op in ("SUM", "AVG"):
            t = integers(rank, dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            emit(check="dtype", dtype=name, op=op, values=t.double().tolist())
    poisoned = torch.ones(SIZE)
    if rank == 0:
        poisoned[5] = float("nan")
    emit(check="nonfinite", error=error(dist.all_reduce(poisoned, async_op=True)))
    t = integers(rank, torch.float32)
    dist.all_reduce(t)
    emit(check="after", values=t.double().tolist())


def cuda(rank: int) -> None:
    for name in ("float32", "float16", "bfloat16"):
        t = integers(rank, DTYPES[name]).cuda()
        dist.all_reduce(t)
        emit(check="cuda", dtype=name, device=str(t.device), values=t.double().tolist())
    from innet_aggregation.worker.backend import session_of

    paths = {"ina": lambda t: dist.all_reduce(t), "session": session_of().allreduce}
    for name in ("float32", "float16", "bfloat16"):
        for layout in CUDA_LAYOUTS:
            for path, reduce in paths.items():
                emit(check="cuda_layout", dtype=name, layout=layout, path=path,
                     **run_in_layout(rank, DTYPES[name], layout, reduce, device="cuda"))


def cuda_ddp(rank: int, world: int, gloo) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from innet_aggregation.worker import SwitchHookState, switch_allreduce_hook
    from innet_aggregation.worker.backend import session_of

    from .backend_train import flat

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(),
                                torch.nn.Linear(300, 10)).cuda()
    batches = [(torch.randn(32, 64, generator=torch.Generator().manual_seed(r)).cuda(),
                torch.arange(32).remainder(10).roll(r).cuda()) for r in range(world)]
    loss = torch.nn.CrossEntropyLoss()
    own = []
    for x, y in batches:
        model.zero_grad()
        loss(model(x), y).backward()
        own.append(flat(p.grad for p in model.parameters()).double().cpu())
    want = sum(own) / world
    model.zero_grad()
    ddp = DistributedDataParallel(model, process_group=gloo)
    devices = []
    state = SwitchHookState(session_of())

    def hook(state, bucket):
        devices.append(str(bucket.buffer().device))
        return switch_allreduce_hook(state, bucket)

    ddp.register_comm_hook(state, hook)
    x, y = batches[rank]
    loss(ddp(x), y).backward()
    got = flat(p.grad for p in model.parameters()).double().cpu()
    emit(check="cuda_ddp", buckets=state.buckets, devices=sorted(set(devices)),
         grad_device=str(model[0].weight.grad.device),
         max_error=float((got - want).abs().max()), gmax=float(want.abs().max()))


def fallback(rank: int, world: int, gloo) -> None:
    for label, group in (("ina", None), ("gloo", gloo)):
        out = {}
        t = torch.arange(4.0) + rank
        dist.broadcast(t, src=1, group=group)
        out["broadcast"] = t.tolist()
        gathered = [torch.zeros(3) for _ in range(world)]
        dist.all_gather(gathered, torch.full((3,), float(rank)), group=group)
        out["all_gather"] = [g.tolist() for g in gathered]
        single = torch.zeros(2 * world)
        ALL_GATHER_SINGLE(single, torch.tensor([rank, -rank], dtype=torch.float32),
                          group=group)
        out["all_gather_single"] = single.tolist()
        t = torch.tensor([float(rank), -float(rank), 2.5 * rank])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out["max"] = t.tolist()
        t = torch.tensor([rank + 1, 2**40 + rank], dtype=torch.int64)
        dist.all_reduce(t, group=group)
        out["int_sum"] = t.tolist()
        t = torch.zeros(2)
        REDUCE_SCATTER_SINGLE(t, torch.arange(2.0 * world) * (rank + 1), group=group)
        out["reduce_scatter"] = t.tolist()
        ints = [torch.tensor([rank, 1]), torch.tensor([7 * rank])]
        dist.all_reduce_coalesced(ints, group=group)
        out["coalesced_ints"] = [i.tolist() for i in ints]
        dist.barrier(group=group)
        emit(check="fallback", group=label, **out)
    floats = [integers(rank, torch.float32)[:700], integers(rank, torch.float32)[:1300]]
    dist.all_reduce_coalesced(floats)
    emit(check="coalesced_floats", values=[f.tolist() for f in floats])


LAYOUT_DTYPES = {**DTYPES, "int32": torch.int32, "int64": torch.int64}
PAD = 3      # elements of a view's buffer outside it, which must keep their values


def logical(rank: int, shape, dtype) -> torch.Tensor:
    """Rank r's values of a tensor of ``shape``: integers, so every sum is exact."""
    n = int(torch.tensor(shape).prod()) if shape else 1
    return ((torch.arange(n) % 61 - 30) * (rank + 1)).reshape(shape).to(dtype)


def in_layout(values: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``values`` in ``layout``, and the buffer a view lives in (None if its own)."""
    if layout == "transposed":      # the same logical tensor, memory in column order
        return values.t().contiguous().t(), None
    if layout == "channels_last":
        return values.contiguous(memory_format=torch.channels_last), None
    if layout == "offset":          # a contiguous view at a storage offset
        buffer = torch.full((PAD + values.numel(),), 7, dtype=values.dtype, device=values.device)
        view = buffer[PAD:].view(values.shape)
        view.copy_(values)
        return view, buffer
    if layout == "columns":         # a slice of columns: an offset and gaps between rows
        rows, cols = values.shape
        buffer = torch.full((rows, cols + PAD), 7, dtype=values.dtype, device=values.device)
        view = buffer[:, 1:1 + cols]
        view.copy_(values)
        return view, buffer
    return values.clone(), None


LAYOUTS = {"contiguous": (5, 7), "transposed": (5, 7), "channels_last": (2, 3, 4, 5),
           "offset": (6, 5), "columns": (6, 5), "zero_size": (0, 3), "zero_d": ()}
CUDA_LAYOUTS = ("contiguous", "transposed", "channels_last", "offset", "columns")


def run_in_layout(rank: int, dtype, layout: str, reduce, device: str = "cpu") -> dict:
    """``reduce`` on rank ``rank``'s tensor in ``layout``: what the check needs."""
    t, buffer = in_layout(logical(rank, LAYOUTS[layout], dtype).to(device), "contiguous"
                          if layout in ("zero_size", "zero_d") else layout)
    ptr, strides, offset = t.data_ptr(), t.stride(), t.storage_offset()
    outside = None if buffer is None else buffer.clone()
    reduce(t)
    if buffer is not None:          # the view's own elements aside, the buffer is as it was
        inside = torch.zeros_like(buffer, dtype=torch.bool)
        (inside[PAD:] if layout == "offset" else inside[:, 1:1 + t.shape[1]]).fill_(True)
        outside = bool((buffer[~inside] == outside[~inside]).all())
    return {"values": t.double().reshape(-1).tolist(), "shape": list(t.shape),
            "device": str(t.device),
            "kept": [t.data_ptr() == ptr, t.stride() == strides, t.storage_offset() == offset],
            "outside_kept": outside}


def layouts(rank: int, world: int, gloo) -> None:
    from innet_aggregation.worker.backend import session_of

    session = session_of()
    paths = {"ina": lambda t: dist.all_reduce(t), "gloo": lambda t: dist.all_reduce(t, group=gloo),
             "session": session.allreduce}
    for dname, dtype in LAYOUT_DTYPES.items():
        for layout in LAYOUTS:
            for path, reduce in paths.items():
                if path == "session" and dname not in DTYPES:
                    continue
                emit(check="layout", dtype=dname, layout=layout, path=path,
                     **run_in_layout(rank, dtype, layout, reduce))
    # Ranks that hold the same logical tensor in different layouts: summed by index.
    emit(check="mixed", **run_in_layout(rank, torch.bfloat16, ("contiguous", "transposed")[rank],
                                        lambda t: dist.all_reduce(t)))
    # gloo's sums of a slice copied back through the Work's future, as DDP reads it.
    emit(check="future", **run_in_layout(
        rank, torch.int64, "columns",
        lambda t: dist.all_reduce(t, async_op=True).get_future().wait()))
    sparse = logical(rank, (5, 7), torch.float32).to_sparse()
    dist.all_reduce(sparse)
    emit(check="sparse", layout=str(sparse.layout),
         values=sparse.to_dense().double().reshape(-1).tolist())
    for path, reduce in (("ina", paths["ina"]), ("session", session.allreduce)):
        try:
            reduce(torch.ones(3).expand(4, 3))
            emit(check="expanded", path=path, error=None)
        except Exception as exc:     # refused on the caller's thread, before any packet
            emit(check="expanded", path=path, error=f"{type(exc).__name__}: {exc}")
    ddp_layouts(rank, world, gloo)


class Parameters(torch.nn.Module):
    """Parameters of every float dtype in several layouts; the loss sum(p * x) makes
    each gradient exactly x, the rank's own integers."""

    SHAPES = {"contiguous": (5, 7), "transposed": (5, 7), "channels_last": (2, 3, 4, 5),
              "zero_d": ()}

    def __init__(self):
        super().__init__()
        self.names = []
        for dname, dtype in DTYPES.items():
            for layout, shape in self.SHAPES.items():
                value, _ = in_layout(torch.zeros(shape, dtype=dtype), layout)
                self.register_parameter(f"{dname}_{layout}", torch.nn.Parameter(value))
                self.names.append((dname, layout))

    def forward(self, rank: int):
        return sum((p * logical(rank, p.shape, p.dtype)).sum().double()
                   for p in self.parameters())


def ddp_layouts(rank: int, world: int, gloo) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from innet_aggregation.worker import SwitchHookState, switch_allreduce_hook
    from innet_aggregation.worker.backend import session_of

    for label in ("hook", "gloo"):
        model = Parameters()
        ddp = DistributedDataParallel(model, process_group=gloo)
        own = []
        if label == "hook":
            def hook(state, bucket):
                buffer = bucket.buffer()
                return switch_allreduce_hook(state, bucket).then(
                    lambda done: own.append(done.value().data_ptr() == buffer.data_ptr())
                    or done.value())

            ddp.register_comm_hook(SwitchHookState(session_of()), hook)
        ddp(rank).backward()
        for (dname, layout), p in zip(model.names, model.parameters()):
            emit(check="ddp", path=label, dtype=dname, layout=layout,
                 values=p.grad.double().reshape(-1).tolist(),
                 strides=[list(p.grad.stride()), list(p.stride())])
        if label == "hook":
            emit(check="ddp_buffers", own=own)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--master", required=True, help="host:port of rank 0")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--case", required=True, choices=(
        "dtypes", "fallback", "mismatch", "shape", "dtype", "layouts", "cuda"))
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    os.environ["INA_JOB_CONFIG"] = args.config
    rank, world = args.worker_id, args.world
    dist.init_process_group("cpu:ina", init_method=f"tcp://{args.master}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    if args.case == "dtypes":
        dtypes(rank)
    elif args.case == "cuda":
        cuda(rank)
        cuda_ddp(rank, world, dist.new_group(backend="gloo"))
    elif args.case == "fallback":
        fallback(rank, world, dist.new_group(backend="gloo"))
    elif args.case == "layouts":
        layouts(rank, world, dist.new_group(backend="gloo"))
    elif args.case in ("shape", "dtype"):
        other = rank == 1
        t = torch.ones((8, 4) if other and args.case == "shape" else (4, 8),
                       dtype=torch.bfloat16 if other and args.case == "dtype" else torch.float32)
        emit(check=args.case, error=error(dist.all_reduce(t, async_op=True)))
    else:
        emit(check="mismatch",
             error=error(dist.all_reduce(torch.ones(100 * (rank + 1)), async_op=True)))
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)   # as ddp_train.py: no interpreter finalization with gloo's threads about


if __name__ == "__main__":
    main()
