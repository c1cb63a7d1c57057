"""One rank of the backend's training test: a 64-32-10 MLP on scikit-learn's digits,
trained with DDP, then DDP with the switch's comm hook on the group's session,
then FSDP2 sharded, then FSDP2 replicated (HSDP on a 2 x 1 mesh: the gradients are
all-reduced across the replicas).

    python -m tests.worker.backend_train --config job.toml --worker-id 0 \
        --backend ina|gloo --master 10.0.0.1:29600 --steps 20 --save DIR

``--backend ina`` initializes the process group with ``cpu:ina`` (the job file
through ``INA_JOB_CONFIG``, as a launcher would set it), ``gloo`` with plain gloo;
same seed, data and steps. Saves, per mode, the parameters after every step
(``{backend}_{mode}_{rank}.npy``, steps x parameters, float32) and the largest
averaged gradient of every step (``..._gmax_{rank}.npy``), and prints one JSON line
with the switch's results received per mode.
"""

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

BATCH = 32
LR, MOMENTUM = 0.1, 0.9
BUCKET_CAP_MB = 0.001   # DDP: one bucket of 2410 floats at first, rebuilt into two
MODES = ("ddp", "hook", "fsdp", "hsdp")


def build(mode: str, backend: str, world: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the module to call, the one whose parameters are the model's). ``hook``: DDP
    with the switch's comm hook on the group's own session (plain DDP on gloo)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    if mode in ("ddp", "hook"):
        ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
        if mode == "hook" and backend == "ina":
            from innet_aggregation.worker import SwitchHookState, switch_allreduce_hook
            from innet_aggregation.worker.backend import session_of
            ddp.register_comm_hook(SwitchHookState(session_of()), switch_allreduce_hook)
        return ddp, model
    mesh = (init_device_mesh("cpu", (world,)) if mode == "fsdp" else
            init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard")))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, model


def flat(tensors) -> torch.Tensor:
    return torch.cat([(t.full_tensor() if isinstance(t, DTensor) else t).detach().reshape(-1)
                      for t in tensors])


def train(mode: str, backend: str, steps: int, world: int, x, y,
          shard) -> tuple[np.ndarray, np.ndarray]:
    call, model = build(mode, backend, world)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    params, gmax = [], []
    for step in range(steps):
        first = step * BATCH % (len(shard) - BATCH)
        idx = shard[first:first + BATCH]
        optimizer.zero_grad()
        loss_fn(call(x[idx]), y[idx]).backward()
        gmax.append(flat(p.grad for p in model.parameters()).abs().max().item())
        optimizer.step()
        params.append(flat(model.parameters()).numpy().copy())
    return np.stack(params), np.array(gmax)


def results(backend: str) -> int:
    """Results the switch has sent this rank so far."""
    if backend != "ina":
        return 0
    from innet_aggregation.worker.backend import session_of
    return session_of().stats.results_received


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--backend", choices=("ina", "gloo"), required=True)
    parser.add_argument("--master", required=True, help="host:port of rank 0")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    rank, world = args.worker_id, args.world
    if args.backend == "ina":
        import innet_aggregation.worker.backend  # noqa: F401  registers "ina"
        os.environ["INA_JOB_CONFIG"] = args.config
    dist.init_process_group("cpu:ina" if args.backend == "ina" else "gloo",
                            init_method=f"tcp://{args.master}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    shard = order[360:][rank::world]

    args.save.mkdir(parents=True, exist_ok=True)
    report = {"rank": rank, "backend": args.backend, "results": {}}
    for mode in MODES:
        before = results(args.backend)
        params, gmax = train(mode, args.backend, args.steps, world, x, y, shard)
        report["results"][mode] = results(args.backend) - before
        np.save(args.save / f"{args.backend}_{mode}_{rank}.npy", params)
        np.save(args.save / f"{args.backend}_{mode}_gmax_{rank}.npy", gmax)
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)
    sys.stderr.flush()
    os._exit(0)   # as ddp_train.py: no interpreter finalization with gloo's threads about


if __name__ == "__main__":
    main()
