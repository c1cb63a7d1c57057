"""One rank of the profiler test: two DDP steps of a small model under torch.profiler,
through the ``ina`` backend (DDP with no hook), then through the switch's comm hook
(DDP over a gloo group), each trace written as Chrome JSON.

    python -m tests.worker.profile_steps --config job.toml --worker-id 0 \
        --master 10.0.0.1:29600 --out DIR

Prints one JSON line per trace: {"mode": ..., "trace": path}; then one for an async
all_reduce: its Work's breakdown.
"""

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

from innet_aggregation.worker.backend import session_of
from innet_aggregation.worker.ddp_hook import SwitchHookState, switch_allreduce_hook


def steps(model, rank: int, trace: Path) -> None:
    """A step unprofiled (DDP rebuilds its buckets after the first), then two profiled."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))

    def step():
        optimizer.zero_grad()
        model(data).square().mean().backward()
        optimizer.step()
    step()
    with profile(activities=[ProfilerActivity.CPU],
                 experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        for _ in range(2):
            step()
    prof.export_chrome_trace(str(trace))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    os.environ["INA_JOB_CONFIG"] = args.config
    rank = args.worker_id
    dist.init_process_group("cpu:ina", init_method=f"tcp://{args.master}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    args.out.mkdir(parents=True, exist_ok=True)
    backend = args.out / f"backend-{rank}.json"
    steps(DDP(model), rank, backend)
    print(json.dumps({"mode": "backend", "trace": str(backend)}), flush=True)
    hooked = DDP(model, process_group=dist.new_group(backend="gloo"))
    hooked.register_comm_hook(SwitchHookState(session_of()), switch_allreduce_hook)
    hook = args.out / f"hook-{rank}.json"
    steps(hooked, rank, hook)
    print(json.dumps({"mode": "hook", "trace": str(hook)}), flush=True)
    work = dist.all_reduce(torch.ones(5000), async_op=True)
    work.wait()
    print(json.dumps({"mode": "work", "breakdown": work.breakdown.as_dict()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
