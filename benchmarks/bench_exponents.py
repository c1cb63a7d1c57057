"""How well speculated block exponents predict DDP's gradients: the redone blocks.

    python -m benchmarks.bench_exponents [--model large|tests] [--workers 4] [--steps 40]
                                         [--save FILE.npz] [--load FILE.npz]
    python -m benchmarks.bench_exponents --recorded [--out results/exponents]

Trains the demo's large MLP (or the DDP tests' 64-32-10 one) with DDP on gloo
over loopback, no switch, and records per step and bucket the workers' agreed
block exponents (each block's maximum over the workers, as the switch returns
it). Then replays ``quantize.speculate``/``usable``/``remember`` on that sequence,
keyed by bucket as the DDP hook's calls are, and prints how many blocks would be
redone, which side missed (the maximum rose above the scale, or fell more than
``SLACK`` below it), the step-to-step changes of the exponents, and where the
misses are (first steps, buckets, small blocks).

``--recorded`` replays the committed recorded gradients instead (testbed.gradients:
the demo's large MLP and a small CNN, steps 284-299 of 300, 4 ranks), for 4, 8
and 16 workers and 64, 256 and 1,024 values per block, under several (depth,
headroom, slack) rules, the one before 2026-11-27 and the current one among them,
with each rule's cost: the blocks redone (a packet and, at a call's end, a round
trip each) against the precision given up (the bits a kept block's scale is above
its maximum, typically, and ``b - slack`` bits below it, the bound); the current
rule's worst error over every element, as a share of the bound; a JSON record of
the table.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from innet_aggregation.p4src import protocol
from innet_aggregation.p4src.protocol import EXPONENT_OF_ZERO
from innet_aggregation.worker import quantize
from innet_aggregation.worker.quantize import Blocks
from innet_aggregation.worker.transport import history_key, same_name

MODELS = {   # hidden widths, optimizer, learning rate, DDP bucket cap (MB), as trained
    "large": ((1024, 1024), "adam", 0.001, None),          # the demo's --model large
    "tests": ((32,), "sgd", 0.1, 0.001),                   # tests/worker/ddp_train.py
}


def _rank(rank: int, world: int, port: int, model_name: str, steps: int, queue) -> None:
    from innet_aggregation.testbed.gradients import ddp_group, train_ddp
    from innet_aggregation.testbed.model import mlp

    hidden, optimizer_name, lr, cap = MODELS[model_name]
    k = protocol.packet_format().values_per_packet
    records = []

    def record_exponents(step, bucket):
        # This rank's own; their maximum is taken after training, not by a collective
        # inside the hook beside DDP's own all-reduces.
        flat = bucket.buffer().detach().reshape(-1).numpy()
        exponents = quantize.block_exponents(np.vstack(Blocks(flat.copy(), k).parts))
        records.append((step, bucket.index(), flat.size, exponents))

    def optimizer(parameters):
        return (torch.optim.Adam(parameters, lr=lr) if optimizer_name == "adam"
                else torch.optim.SGD(parameters, lr=lr, momentum=0.9))

    with ddp_group(rank, world, port):
        torch.manual_seed(0)
        train_ddp(rank, world, mlp(list(hidden)), optimizer, steps, record_exponents, cap)
        queue.put((rank, records))


def record(model: str, workers: int, steps: int) -> list[tuple[int, int, int, np.ndarray]]:
    """(step, bucket index, elements, agreed exponents) of every bucket DDP reduced: each
    block's maximum over the ranks, as the switch returns it."""
    from innet_aggregation.testbed.gradients import run_ranks

    by_rank = run_ranks(_rank, workers, model, steps)
    calls = [r[:3] for r in by_rank[0]]
    if any([r[:3] for r in records] != calls for records in by_rank):
        raise RuntimeError("the ranks reduced different buckets")
    return [(*call, np.max([records[i][3] for records in by_rank], axis=0))
            for i, call in enumerate(calls)]


def replay(records, speculate=quantize.speculate, usable=quantize.usable,
           remember=quantize.remember):
    """Per record: the scales speculated, and which blocks would be kept; keyed as
    the transport keys the DDP hook's named calls (``transport.history_key``, and
    ``same_name`` for a bucket of a new size)."""
    history: dict = {}
    out = []
    for step, index, elements, agreed in records:
        name = f"bucket {index}"
        key = history_key(name, elements, 0)
        previous = history.get(key)
        if previous is None:
            previous = same_name(history, name, len(agreed))
        scale = speculate(previous, len(agreed))
        out.append((scale, usable(scale, agreed)))
        history[key] = remember(agreed, history.pop(key, None))
    return out


def report(records) -> None:
    replayed = replay(records)
    total = sum(len(r[3]) for r in records)
    redone = sum(int((~keep).sum()) for _, keep in replayed)
    probed = sum(int(((s == quantize.PROBE_EXPONENT) & ~keep).sum()) for s, keep in replayed)
    rose = fell = 0
    by_step: Counter = Counter()
    by_bucket: Counter = Counter()
    blocks_of_bucket: Counter = Counter()
    deltas: Counter = Counter()
    rel_missed: Counter = Counter()
    rel_all: Counter = Counter()
    last: dict = {}
    for (step, index, elements, agreed), (scale, keep) in zip(records, replayed):
        blocks_of_bucket[(index, elements)] += len(agreed)
        prev = last.get((index, elements))
        last[(index, elements)] = agreed
        missed = ~keep & (scale != quantize.PROBE_EXPONENT)
        a = agreed.astype(int)
        rose += int((missed & (a > scale)).sum())
        fell += int((missed & (a < scale - quantize.SLACK)).sum())
        by_step[step] += int(missed.sum())
        by_bucket[(index, elements)] += int(missed.sum())
        if prev is None:
            continue
        live = (agreed != EXPONENT_OF_ZERO) & (prev != EXPONENT_OF_ZERO)
        deltas.update((agreed[live].astype(int) - prev[live]).tolist())
        # How far below the bucket's largest block: small blocks drift more?
        rel = np.minimum((a.max() - a) // 4 * 4, 24)
        rel_all.update(rel[live].tolist())
        rel_missed.update(rel[live & missed].tolist())
    print(f"{len(records)} calls, {total} blocks; redone {redone} ({redone / total:.1%}), of "
          f"which {probed} probes (blocks without history); the others: rose above the "
          f"scale {rose}, fell more than SLACK below the scale {fell}")
    n = sum(deltas.values())
    print("change of the agreed exponent from a bucket's last call (non-zero blocks): "
          + ", ".join(f"{d:+d}: {c / n:.1%}" for d, c in sorted(deltas.items()) if c / n >= 0.001))
    print("misses by step: " + ", ".join(f"{s}: {c}" for s, c in sorted(by_step.items())))
    print("misses by bucket (index, elements): " + ", ".join(
        f"{b}: {c}/{blocks_of_bucket[b]}" for b, c in sorted(by_bucket.items())))
    print("miss rate by distance below the call's largest exponent: " + ", ".join(
        f"{d}-{d + 3}: {rel_missed[d] / rel_all[d]:.1%} of {rel_all[d]}"
        for d in sorted(rel_all)))


# (depth, headroom, slack) replayed by --recorded: the rule before 2026-11-27 and others
RULES = ((1, 2, 4), (1, 2, 5), (1, 3, 6), (1, 4, 8), (3, 2, 6), (4, 2, 7),
         (quantize.DEPTH, quantize.HEADROOM, quantize.SLACK))
BEFORE = (1, 2, 5)


def measured_error(data, workers: int, values: int, calls: int) -> float:
    """The current rule's largest error, over every element of ``calls`` replayed calls,
    as a share of its bound in terms of the block's maximum (n * 2**(E_max + SLACK -
    b - 1)): the worker's own quantize/settle/dequantize against a float64 sum."""
    from innet_aggregation.testbed import gradients

    length = len(gradients.MODELS) * gradients.PIECES * gradients.PIECE
    history, worst = None, 0.0
    for c in range(calls):
        inputs = [gradients.replay(data, length, c, w).reshape(-1, values)
                  for w in range(workers)]
        own = [quantize.block_exponents(x) for x in inputs]
        agreed = np.max(own, axis=0).astype(np.int64)
        _, scale = quantize.settle(quantize.speculate(history, len(agreed)), agreed)
        total = np.sum([quantize.quantize(x, e, scale, workers).astype(np.int64)
                        for x, e in zip(inputs, own)], axis=0)
        result = quantize.dequantize(total, scale, workers, average=False, dtype=np.float64)
        exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
        bound = quantize.error_bound(agreed + quantize.SLACK, workers, average=False)
        live = agreed != EXPONENT_OF_ZERO
        worst = max(worst, float((np.abs(result - exact)[live] / bound[live, None]).max()))
        history = quantize.remember(agreed, history)
    return worst


def recorded(out) -> None:
    from innet_aggregation.testbed import gradients
    from innet_aggregation.experiments import record

    data = gradients.load()
    rows = []
    calls = 2 * data.kept_steps - 1
    print(f"recorded gradients, steps {data.steps['mlp'][0]}-{data.steps['mlp'][-1]} of "
          f"{data.total_steps}, played forwards and back; blocks redone after the first "
          f"call's probes (rose above the scale / fell more than slack below it). A rule: "
          f"the largest agreed maximum of the last `depth` calls + headroom; kept if at "
          f"most `slack` above the maximum")
    now = (quantize.DEPTH, quantize.HEADROOM, quantize.SLACK)
    names = ["{}/+{}/{}".format(*rule)
             + (" before" if rule == BEFORE else " now" if rule == now else "") for rule in RULES]
    print("rules as depth/+headroom/slack")
    print(f"{'n':>3} {'values':>6} " + " ".join(f"{name:>18}" for name in names)
          + "   worst error / bound now")
    for n in (4, 8, 16):
        for k in (64, 256, 1024):
            agreed = gradients.agreed_exponents(data, n, k, calls)
            shares = [gradients.redone_share(agreed, *rule) for rule in RULES]
            error = measured_error(data, n, k, calls)
            rows += [dict(r, workers=n, values=k, **dict(zip(("depth", "headroom", "slack"), rule)),
                          precision_bits=quantize.scale_bits(n) - rule[2], now=rule == now,
                          before=rule == BEFORE)
                     for r, rule in zip(shares, RULES)]
            rows[-1]["error_of_bound"] = error
            print(f"{n:>3} {k:>6} " + " ".join(
                f"{r['redone']:>6.2%} ({r['rose']:.1%}/{r['fell']:.1%})".rjust(18)
                for r in shares) + f"   {error:.3f}")
    print("mean bits a kept block's scale is above its maximum (the typical precision "
          "given up), n = 4, 8, 16: " + "; ".join(
              f"{name.split()[0]}: " + ", ".join(
                  f"{np.mean([r['waste'] for r in rows[i::len(RULES)] if r['workers'] == n]):.2f}"
                  for n in (4, 8, 16)) for i, name in enumerate(names)))
    print("precision kept (b - slack bits below a block's maximum), n = 4, 8, 16: " + "; ".join(
        f"slack {s}: " + ", ".join(str(quantize.scale_bits(n) - s) for n in (4, 8, 16))
        for s in sorted({s for _, _, s in RULES})))
    print("workers beyond the 4 recorded ranks replay them a step later (testbed.gradients): "
          "their maximum moves less than 16 real ranks' might")
    print(f"wrote {record.write('bench-exponents', {'rules': rows}, out=out)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="large")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save", help="write the recorded exponents here (.npz)")
    parser.add_argument("--load", help="replay exponents recorded before instead of training")
    parser.add_argument("--recorded", action="store_true",
                        help="replay the committed recorded gradients under several rules")
    parser.add_argument("--out", type=Path, default=Path("results/exponents"),
                        help="--recorded's JSON record")
    args = parser.parse_args()
    if args.recorded:
        return recorded(args.out)
    if args.load:
        data = np.load(args.load)
        records = [(int(s), int(i), int(e), a) for s, i, e, a in
                   zip(data["step"], data["index"], data["elements"],
                       np.split(data["agreed"], np.cumsum(data["blocks"])[:-1]))]
    else:
        records = record(args.model, args.workers, args.steps)
    if args.save:
        np.savez_compressed(args.save, step=[r[0] for r in records],
                            index=[r[1] for r in records], elements=[r[2] for r in records],
                            blocks=[len(r[3]) for r in records],
                            agreed=np.concatenate([r[3] for r in records]))
    report(records)


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
