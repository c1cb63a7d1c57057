"""torchrun_train.py's model and data for STEPS steps on three ranks, one step every
PAUSE seconds, so that a test can fault the switch's side during the run:

    torchrun ... tests/worker/torchrun_chaos.py OUT

Per step, a JSON line in OUT.RANK.jsonl: a hash of the parameters' bytes after the
step, the step's seconds and its end (time.time()), and how many of its calls went through the switch and
through gloo; at the end the parameters (OUT.RANK.pt). CHAOS_STEPS sets the steps
(default STEPS); CHAOS_SLEEP=RANK:STEP:SECONDS makes that rank sleep before that step,
as a checkpoint would.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.worker.torchrun_train import LR, batch, model

STEPS = 60
PAUSE = 0.3


def main(out: str) -> int:
    import innet_aggregation.worker.backend as backend

    dist.init_process_group("cpu:ina")
    rank = dist.get_rank()
    net = DDP(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    fallback = backend.session_of().fallback
    sleeper, sleep_step, sleep_s = map(float, os.environ.get("CHAOS_SLEEP", "-1:-1:0").split(":"))
    with open(f"{out}.{rank}.jsonl", "w") as log:
        for step in range(int(os.environ.get("CHAOS_STEPS", STEPS))):
            if (rank, step) == (sleeper, sleep_step):
                time.sleep(sleep_s)
            before, started = dict(fallback.counts), time.monotonic()
            x, y = batch(step, rank)
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            flat = torch.cat([p.detach().reshape(-1) for p in net.module.parameters()])
            log.write(json.dumps({
                "step": step, "hash": hashlib.blake2b(flat.numpy().tobytes()).hexdigest(),
                "seconds": time.monotonic() - started, "at": time.time(),
                **{path: fallback.counts[path] - before[path] for path in before}}) + "\n")
            log.flush()
            time.sleep(PAUSE)
    torch.save([p.detach().clone() for p in net.module.parameters()], f"{out}.{rank}.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
