"""Allreduce under simulated packet loss: completion time, retransmissions, exactness.

    python -m innet_aggregation.experiments.loss                       # defaults: a few minutes
    python -m innet_aggregation.experiments.loss --sizes 4096,262144 --reps 10 --workers 4
    python -m innet_aggregation.experiments.loss --topo tree --workers 4 --loss-at spine

The switch's loss simulator drops aggregation packets with the given probability
on ingress (contributions lost before they are summed), egress (result copies
lost on the way back), or both, on every port of the switches --loss-at names (in
a tree, the spine's ports drop partial sums and the spine's results, the leaves'
the workers' packets and the partial sums or results on the uplink). For each point the workers allreduce
integer-valued tensors, so a result is ``exact`` when it equals the true sum, and
``identical`` when it is bit-identical to the no-loss run of the same inputs (the
no-loss point runs first). Completion time is the slowest worker's.

Each size starts with one unrecorded call: the first call of a shape probes its
block exponents (the worker's speculation has no history yet), as only the first
step of a training run does.

Writes <out>/loss.csv (one row per repetition), <out>/loss_time.png,
<out>/loss_slowdown.png (median time over the no-loss median, log scale, with the
1.1x and 2x marks) and <out>/loss_retransmissions.png (dotted: the retransmissions
the drops require, every worker's for a lost contribution and one for a lost
result; retransmissions above that line were spurious: timers or loss detection
firing on packets that were only late), and prints a summary table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from . import record
from .calls import csv_list
from ..testbed.layout import add_program_argument, add_topology_arguments, check_deadline
from .output import pyplot, write_csv
from .progress import Progress
from ..testbed.stopping import Stopped, stop_on_signals
from ..testbed.targets import add_switch_arguments, default_target

DIRECTIONS = {"ingress": (1, 0), "egress": (0, 1), "both": (1, 1)}
CSV_FIELDS = ["workers", "values", "size", "direction", "loss_pct", "rep", "time_s",
              "retransmissions", "exact", "identical", "dropped_ingress", "dropped_egress",
              "resent_by_switch", "duplicates_dropped", "released", "late", "carried_values"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--workers", type=int, default=None,
                        help="hosts (default 3; 4 in a tree, 2 per leaf)")
    parser.add_argument("--loss", type=csv_list(float), default=[0, 0.01, 0.1, 1, 5, 10],
                        help="loss rates in percent (default 0,0.01,0.1,1,5,10)")
    parser.add_argument("--directions", type=csv_list(str), default=list(DIRECTIONS),
                        help="ingress,egress,both (default all three)")
    parser.add_argument("--sizes", type=csv_list(int), default=[1024, 16384],
                        help="tensor sizes in float32 values (default 1024,16384)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per point (default 3)")
    parser.add_argument("--bw", type=float, default=50.0, help="link rate, Mbit/s (default 50)")
    add_switch_arguments(parser)
    add_topology_arguments(parser)
    add_program_argument(parser)
    parser.add_argument("--loss-at", default="all",
                        help="the switches whose ports drop, comma-separated: all (default), "
                             "or in a tree spine, leaf0, leaf1, ...")
    parser.add_argument("--out", type=Path, default=Path("results/loss"),
                        help="results folder (default results/loss)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one allreduce may take before the run is abandoned")
    parser.add_argument("--deadline-ms", type=float, default=0.0,
                        help="bounded-time aggregation: the job's deadline, the switch's and "
                             "every session's (default 0: none); the table adds what it released")
    return parser


def points(args) -> list[tuple[int, str, float]]:
    """(size, direction, loss %), no-loss first for each size (it is the reference)."""
    for d in args.directions:
        if d not in DIRECTIONS:
            raise ValueError(f"unknown direction {d!r}; choose from {', '.join(DIRECTIONS)}")
    for p in args.loss:
        if not 0 <= p <= 100:
            raise ValueError(f"loss {p} is not a percentage in 0..100")
    out = []
    for size in args.sizes:
        out.append((size, "none", 0.0))
        out += [(size, d, p) for d in args.directions for p in sorted(args.loss) if p > 0]
    return out


def _count(counters: dict, name: str) -> int:
    return counters.get(name, {}).get("packets", 0)


def _workers_total(answers: list[dict], name: str) -> int | None:
    """A session counter of the call summed over the workers; None where they lack it."""
    if not all(name in a for a in answers):
        return None
    return sum(a[name][0] for a in answers)


def run(args) -> list[dict]:
    from ..testbed.agents import HostAgents
    from ..testbed.topology import Testbed

    target = args.target or default_target()
    if args.workers is None:
        args.workers = 3 if args.topo == "star" else 2 * args.leaves
    todo = points(args)
    shape = "one switch" if args.topo == "star" else f"a spine and {args.leaves} leaves"
    print(f"[loss] {args.workers} workers, {target}, {shape}, loss at {args.loss_at}, "
          f"{len(todo)} points x {args.reps} repetitions", flush=True)
    rows, reference = [], {}
    progress = Progress(len(todo), "loss")
    with Testbed(args.workers, bw=args.bw, target=target, num_slots=args.slots, topo=args.topo,
                 leaves=args.leaves, tls=args.tls, grpc_host=args.grpc_host,
                 values_per_packet=args.values, deadline_ms=args.deadline_ms,
                 io_threads=args.io_threads) as testbed, \
            HostAgents(testbed, gloo=False) as agents:
        values = testbed.program.values_per_packet
        progress.say(f"[loss] {values} values per packet")
        lossy = None if args.loss_at == "all" else args.loss_at.split(",")
        for n, (size, direction, loss) in enumerate(todo, 1):
            ingress, egress = (f * loss / 100 for f in DIRECTIONS.get(direction, (0, 0)))
            testbed.set_loss(ingress, egress, lossy)
            started = time.monotonic()
            if direction == "none":      # warm-up: the shape's first call probes
                agents.call({"op": "allreduce", "backend": "switch", "size": size, "reps": 1,
                             "seed": args.reps, "barrier": False}, timeout=args.timeout)
            for rep in range(args.reps):
                before = testbed.counters()
                answers = agents.call({"op": "allreduce", "backend": "switch", "size": size,
                                       "reps": 1, "seed": rep, "barrier": False},
                                      timeout=args.timeout)
                after = testbed.counters()
                delta = {k: _count(after, k) - _count(before, k) for k in after}
                digests = {a["digests"][0] for a in answers}
                if direction == "none":
                    reference[(size, rep)] = digests.pop() if len(digests) == 1 else None
                    digests = {reference[(size, rep)]}
                rows.append({
                    "workers": args.workers, "values": values, "size": size,
                    "direction": direction,
                    "loss_pct": loss, "rep": rep,
                    "time_s": max(a["times"][0] for a in answers),
                    "retransmissions": sum(a["retransmissions"][0] for a in answers),
                    "exact": all(a["exact"][0] for a in answers),
                    "identical": digests == {reference.get((size, rep))},
                    "dropped_ingress": delta.get("ingress.simulated_drop", 0),
                    "dropped_egress": delta.get("egress.simulated_drop", 0),
                    "resent_by_switch": delta.get("ingress.resent", 0),
                    "duplicates_dropped": delta.get("ingress.duplicate_dropped", 0),
                    **{name: _workers_total(answers, name)
                       for name in ("released", "late", "carried_values")},
                })
            mine = rows[-args.reps:]
            progress.say(f"  [{n}/{len(todo)}] size {size:>8}  {direction:<7} loss {loss:>5g}%  "
                         f"median {1000 * statistics.median(r['time_s'] for r in mine):8.1f} ms  "
                         f"retransmissions {sum(r['retransmissions'] for r in mine):>5}  "
                         f"exact {sum(r['exact'] for r in mine)}/{len(mine)}  "
                         f"({time.monotonic() - started:.0f} s)")
            progress.advance(f"size {size}, {direction}, loss {loss:g} %")
        testbed.set_loss(0.0, 0.0)
    return rows


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["size"], r["direction"], r["loss_pct"]), []).append(r)
    return out


def slowdowns(rows: list[dict]) -> dict[tuple, float]:
    """Per point, the median time over the same size's no-loss median."""
    by = groups(rows)
    base = {k[0]: statistics.median(r["time_s"] for r in rs)
            for k, rs in by.items() if k[1] == "none"}
    return {k: statistics.median(r["time_s"] for r in rs) / base[k[0]]
            for k, rs in by.items() if base.get(k[0])}


def needed_retransmissions(row: dict) -> int:
    """What the simulator's drops make the workers resend: a lost contribution
    leaves its slot unfinished for every worker, and none knows whose was lost, so
    all of them resend; a lost result copy, only its worker."""
    return row["workers"] * row["dropped_ingress"] + row["dropped_egress"]


def figures(rows: list[dict]) -> list[dict]:
    """The record's figures: one per point, as the summary prints them."""
    slow = slowdowns(rows)
    return [{"workers": rs[0]["workers"], "values": rs[0]["values"], "size": size,
             "direction": direction, "loss_pct": loss,
             "time_ms": record.spread([r["time_s"] for r in rs], 1000),
             "slowdown": slow.get((size, direction, loss)),
             "retransmissions": statistics.mean(r["retransmissions"] for r in rs),
             "needed": statistics.mean(needed_retransmissions(r) for r in rs),
             "calls": len(rs), "exact": sum(r["exact"] for r in rs),
             "identical": sum(r["identical"] for r in rs),
             **{name: _mean(rs, name) for name in ("released", "late", "carried_values")}}
            for (size, direction, loss), rs in groups(rows).items()]


def _mean(rows: list[dict], name: str) -> float | None:
    """Per call, over the workers; None where they do not count it."""
    values = [r.get(name) for r in rows]
    return None if None in values else statistics.mean(values)


def summary(rows: list[dict], deadline: bool = False) -> str:
    """The table; with ``deadline``, what the deadline released a call (every worker's
    results released early, their blocks that missed a release, values carried)."""
    header = (f"{'size':>8} {'direction':<9} {'loss %':>7} {'median ms':>10} {'slowdown':>9} "
              f"{'max ms':>9} {'retrans/run':>12} {'needed/run':>11} {'switch drops':>13} "
              f"{'exact':>6} {'identical':>10}"
              + (f" {'released':>9} {'late':>6} {'carried':>9}" if deadline else ""))
    lines = [header, "-" * len(header)]
    slow = slowdowns(rows)
    for (size, direction, loss), rs in groups(rows).items():
        times = [1000 * r["time_s"] for r in rs]
        drops = sum(r["dropped_ingress"] + r["dropped_egress"] for r in rs) / len(rs)
        needed = sum(needed_retransmissions(r) for r in rs) / len(rs)
        lines.append(f"{size:>8} {direction:<9} {loss:>7g} {statistics.median(times):>10.1f} "
                     f"{slow[(size, direction, loss)]:>8.2f}x "
                     f"{max(times):>9.1f} {statistics.mean(r['retransmissions'] for r in rs):>12.1f} "
                     f"{needed:>11.1f} {drops:>13.1f} {sum(r['exact'] for r in rs):>3}/{len(rs):<2} "
                     f"{sum(r['identical'] for r in rs):>7}/{len(rs):<2}"
                     + ("".join(f" {'-' if v is None else f'{v:.1f}':>{w}}" for v, w in (
                         (_mean(rs, "released"), 9), (_mean(rs, "late"), 6),
                         (_mean(rs, "carried_values"), 9))) if deadline else ""))
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> list[Path]:
    """Median (bars: min..max) against loss, one panel per size, one line per direction.

    The x axis is categorical: the loss rates span three decades and include 0."""
    plt = pyplot()

    by = groups(rows)
    sizes = sorted({r["size"] for r in rows})
    losses = sorted({r["loss_pct"] for r in rows})
    directions = [d for d in DIRECTIONS if any(r["direction"] == d for r in rows)]
    paths = []
    for metric, ylabel, name in (("time_s", "allreduce completion time (ms)", "loss_time.png"),
                                 ("retransmissions", "retransmitted packets (all workers)",
                                  "loss_retransmissions.png")):
        fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
        for ax, size in zip(axes[0], sizes):
            for direction in directions:
                xs, med, lo, hi = [], [], [], []
                for i, loss in enumerate(losses):
                    rs = by.get((size, "none" if loss == 0 else direction, loss))
                    if not rs:
                        continue
                    scale = 1000 if metric == "time_s" else 1
                    values = [scale * r[metric] for r in rs]
                    m = statistics.median(values)
                    xs.append(i)
                    med.append(m)
                    lo.append(m - min(values))
                    hi.append(max(values) - m)
                line = ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3,
                                   label=direction)
                if metric == "retransmissions":
                    # What the drops require: retransmissions above it were spurious.
                    needed = [statistics.median(needed_retransmissions(r)
                                                for r in by[(size, "none" if loss == 0
                                                             else direction, loss)])
                              for loss in losses if by.get((size, "none" if loss == 0
                                                             else direction, loss))]
                    ax.plot(xs, needed, ":", color=line[0].get_color(),
                            label=f"{direction}: needed by the drops")
            inexact = [losses.index(k[2]) for k, rs in by.items()
                       if k[0] == size and not all(r["exact"] and r["identical"] for r in rs)]
            for i in inexact:
                ax.axvline(i, color="red", alpha=0.3)
            ax.set_xticks(range(len(losses)), [f"{p:g}" for p in losses])
            ax.set_xlabel("simulated loss (%)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{size} values ({rows[0]['workers']} workers)")
            ax.grid(alpha=0.3)
            ax.legend(title="loss on", fontsize=8)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    paths.append(plot_slowdown(rows, out, sizes, losses, directions, plt))
    return paths


def plot_slowdown(rows, out: Path, sizes, losses, directions, plt) -> Path:
    """Median time over the no-loss median, log scale: the factor loss costs."""
    from matplotlib.ticker import FuncFormatter

    slow = slowdowns(rows)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for direction in directions:
            xs = [i for i, loss in enumerate(losses)
                  if (size, "none" if loss == 0 else direction, loss) in slow]
            ys = [slow[(size, "none" if losses[i] == 0 else direction, losses[i])] for i in xs]
            ax.plot(xs, ys, marker="o", label=direction)
        for goal in (1.1, 2.0):
            ax.axhline(goal, color="grey", linestyle="--", linewidth=0.8)
            ax.text(0, goal, f" {goal:g}x", va="bottom", fontsize=8, color="grey")
        ax.set_yscale("log")
        times = FuncFormatter(lambda v, _: f"{v:g}x")
        ax.yaxis.set_major_formatter(times)
        ax.yaxis.set_minor_formatter(times)
        ax.set_xticks(range(len(losses)), [f"{p:g}" for p in losses])
        ax.set_xlabel("simulated loss (%)")
        ax.set_ylabel("slowdown (time / no-loss time)")
        ax.set_title(f"{size} values ({rows[0]['workers']} workers)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(title="loss on", fontsize=8)
    fig.tight_layout()
    path = out / "loss_slowdown.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("loss_experiment: needs root (Mininet)", file=sys.stderr)
        return 1
    started, load = time.monotonic(), os.getloadavg()[0]
    stop_on_signals()
    try:
        check_deadline(args.deadline_ms)
        points(args)
        args.out.mkdir(parents=True, exist_ok=True)
        rows = run(args)
        write_csv(args.out / "loss.csv", CSV_FIELDS, rows)
        paths = plot(rows, args.out)
        record.write("loss-experiment", {"points": figures(rows)}, params=vars(args),
                     load_before=load, out=args.out)
    except Exception as exc:
        print(f"loss_experiment: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"loss_experiment: stopped by {stop.name}; the topology was torn down", file=sys.stderr)
        return stop.code
    print("\n" + summary(rows, deadline=bool(args.deadline_ms)))
    print(f"\nneeded: the retransmissions the drops require (every worker's for a lost "
          f"contribution, one for a lost result).\nexact: result equals the true integer sum on "
          f"every worker; identical: bit-identical to the no-loss run.\nwrote {args.out / 'loss.csv'}, " + ", ".join(map(str, paths)))
    if args.deadline_ms:
        print(f"released, late, carried (deadline {args.deadline_ms:g} ms): per call, summed over "
              f"the workers, results the switch released early, blocks whose contribution "
              f"missed a release,\nvalues carried into the next call (-: workers without these "
              f"counters).")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
