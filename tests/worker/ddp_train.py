"""One rank of the DDP test: a 64-32-10 MLP on scikit-learn's digits.

    python -m tests.worker.ddp_train --config job.toml --worker-id 0 \
        --backend switch|gloo --master 10.0.0.1:29600 --save DIR

gloo starts DDP either way; with ``--backend switch`` the gradient buckets go
through ``switch_allreduce_hook``, and every bucket is also averaged by gloo, on
the same values, to measure the hook's per-step error. Small buckets make DDP use
several, whose layout it rebuilds after the first iteration. Prints one JSON line
and saves the first step's gradients, for comparing the two backends from the same
starting point. ``--extra-call N`` (on every rank: the plain hook, without gloo's
comparison) makes the ranks with N > 0 one call ahead of the others (an allreduce
of N values of their own first): the switch hook's error must come out of
``backward()`` on every rank (the JSON line then holds it, and the exit status is 1).
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
from torch.nn.parallel import DistributedDataParallel as DDP


from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.worker import AggregationSession, SwitchHookState, switch_allreduce_hook

BATCH = 32
BUCKET_CAP_MB = 0.001   # one bucket of 2410 floats at first, rebuilt into two (330, 2080)


def measured_hook(records: list):
    """The switch hook, plus gloo's exact average of the same bucket for comparison."""
    def hook(state: SwitchHookState, bucket: dist.GradBucket):
        exact = bucket.buffer().clone()
        dist.all_reduce(exact)
        exact /= dist.get_world_size()
        scale = bucket.buffer().abs().max()
        dist.all_reduce(scale, op=dist.ReduceOp.MAX)

        def compare(fut):
            averaged = fut.value()
            records.append(((averaged - exact).abs().max() / scale).item() if scale else 0.0)
            return averaged

        return switch_allreduce_hook(state, bucket).then(compare)
    return hook


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--backend", choices=("switch", "gloo"), required=True)
    parser.add_argument("--master", required=True, help="host:port of rank 0, for gloo")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--save", type=Path, required=True)
    parser.add_argument("--extra-call", type=int, metavar="N",
                        help="the plain hook, and first, if N > 0, an allreduce of N values "
                             "on this rank alone (not waited for)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    config = jobfile.load(args.config)
    rank, world = args.worker_id, config.job.num_workers
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    test, train = order[:360], order[360:]
    shard = train[rank::world]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    records: list[float] = []
    session = None
    if args.backend == "switch":
        session = AggregationSession.from_config(config, rank)
        # The ranks' calls differ then: gloo's allreduce of the buckets would not meet.
        hook = measured_hook(records) if args.extra_call is None else switch_allreduce_hook
        ddp.register_comm_hook(SwitchHookState(session), hook)
        if args.extra_call:
            session.allreduce_async(torch.zeros(args.extra_call))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    steps = 0
    first_grads = None
    try:
        for epoch in range(args.epochs):
            perm = shard[torch.randperm(len(shard),
                                        generator=torch.Generator().manual_seed(epoch))]
            for start in range(0, len(perm) - BATCH + 1, BATCH):
                idx = perm[start:start + BATCH]
                optimizer.zero_grad()
                loss_fn(ddp(x[idx]), y[idx]).backward()
                if first_grads is None:
                    first_grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                optimizer.step()
                steps += 1
    except Exception as exc:      # the hook's error, raised by backward()
        print(json.dumps({"rank": rank, "steps": steps, "error": f"{type(exc).__name__}: {exc}"}),
              flush=True)
        os._exit(1)
    with torch.no_grad():
        accuracy = (model(x[test]).argmax(1) == y[test]).float().mean().item() * 100
    args.save.mkdir(parents=True, exist_ok=True)
    np.save(args.save / f"{args.backend}_grads_{rank}.npy", first_grads.numpy())
    report = {"rank": rank, "backend": args.backend, "accuracy": accuracy, "steps": steps,
              "buckets": len(records), "max_relative_error": max(records, default=0.0)}
    if session is not None:
        report["retransmissions"] = session.stats.retransmissions
        session.close()
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)
    sys.stderr.flush()
    # No interpreter finalization: DDP keeps the gloo group alive, and its worker
    # thread may drop the last collective's work (whose saved thread-local state
    # holds a Python object) after finalization began; taking the GIL then ends
    # that thread inside a destructor: "terminate called without an active
    # exception", SIGABRT, about one exit in 60 here.
    os._exit(0)


if __name__ == "__main__":
    main()
