"""A training script as its users write it, launched by torchrun on each host:

    INA_MANAGER=198.18.0.1:7000 INA_SECRET=... torchrun --nnodes 2 --node-rank 0 \
        --nproc-per-node 1 --rdzv-endpoint 198.18.0.2:29500 tests/worker/torchrun_train.py OUT

It names neither a job file nor a switch: ``init_process_group("cpu:ina")`` finds
the job manager in the environment, and DDP averages its gradients through the
switch with no hook. It saves its parameters after the last step (``OUT.RANK.pt``)
and the switch's share of the work (packets the session sent).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4
BATCH = 16
LR = 0.1


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(BATCH, 32, generator=generator),
            torch.randn(BATCH, 8, generator=generator))


def main(out: str) -> int:
    import innet_aggregation.worker.backend as backend

    dist.init_process_group("cpu:ina")
    rank = dist.get_rank()
    net = DDP(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save([p.detach().clone() for p in net.module.parameters()], f"{out}.{rank}.pt")
    session = backend.session_of()
    t = session.transport
    print(json.dumps({"rank": rank, "job": t.job_id, "slots": [t.first_slot, t.num_slots],
                      "packets_sent": session.stats.packets_sent,
                      "results": session.stats.results_received}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
