"""Time per allreduce as workers are added: in-network aggregation against gloo's ring.

    python -m innet_aggregation.experiments.scaling      # n = 2,4,8,12,16 at 50 Mbit/s
    python -m innet_aggregation.experiments.scaling --workers 2,4 --bw 100 --reps 15

SwitchML's central claim: a worker sends and receives the tensor once whatever the
number of workers, so the time per allreduce stays flat as n grows, while a ring
sends 2(n-1)/n of it (1 at n = 2, 1.875 at n = 16). Both are measured here on the
same links, one testbed per n (one switch, every link shaped to --bw, a rate at
which the links, not the hosts, should bind), with the machinery of
`bench-allreduce` (experiments.baseline): the links' delivered rate measured
by a bulk transfer in each testbed, warm-up calls, then --reps timed calls of
--data, medians with 95 % bootstrap intervals. The plot gives ms per MiB of tensor
against n, each path's limit from the bytes it put on the wire at the delivered
rate (dashed), and the nominal ones from the rate and the headers (dotted).

On one machine every worker is a process on the same cores: past some n the hosts
bind, not the links, and the table's "sw link" column (the switch path's link time
over its time) says where. A rate the links cannot be shaped to, unshaped links,
or more workers than the machine holds are refused before anything starts.

Writes <out>/scaling.csv, <out>/scaling.png and a JSON record (experiments.record).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..testbed.layout import default_values_per_packet
from ..testbed.stopping import Stopped, stop_on_signals
from ..testbed.targets import add_switch_arguments, default_target
from . import record
from .calls import (CSV_FIELDS, WARMUP, add_measure_arguments, check_arguments, csv_list,
                    measure, measure_capacity, ms, path_figures)
from .link_model import IP_TCP, agg_frame_bytes, mtu_for
from .output import pyplot, write_csv
from .progress import Progress

MIB = 2**20


def nominal_ms_per_mib(n: int, values: int, mbit: float) -> tuple[float, float]:
    """(switch path, ring) ms per MiB of tensor if each moved its bytes, headers
    included, at the nominal rate: the switch path's frames carry 4 * values bytes
    each, the ring's TCP segments MTU - 52, 2(n-1)/n of the tensor."""
    per_byte_ms = 8 / (mbit * 1e6) * 1000
    switch = MIB * agg_frame_bytes(values) / (4 * values)
    mtu = mtu_for(values)
    ring = MIB * 2 * (n - 1) / n * (mtu + 14) / (mtu - IP_TCP)
    return switch * per_byte_ms, ring * per_byte_ms


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--workers", type=csv_list(int), default=[2, 4, 8, 12, 16],
                        help="worker counts (default 2,4,8,12,16)")
    parser.add_argument("--bw", type=float, default=50.0,
                        help="every link's rate, Mbit/s (default 50)")
    parser.add_argument("--size", type=int, default=262144,
                        help="tensor size in float32 values (default 262144: 1 MiB)")
    parser.add_argument("--values", type=int, default=None,
                        help="values per packet (default: the target's, 1024 on the softswitch)")
    add_measure_arguments(parser)
    add_switch_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("results/scaling"),
                        help="results folder (default results/scaling)")
    return parser


def run(args) -> list[dict]:
    from ..testbed.agents import HostAgents
    from ..testbed.topology import Testbed

    rows = []
    progress = Progress(2 * len(args.workers), "scaling")
    for n in args.workers:
        progress.say(f"[scaling] n = {n}: {args.bw:g} Mbit/s links, {args.values} values per "
                     f"packet, {args.data} data")
        with Testbed(n, bw=args.bw, target=args.target, num_slots=args.slots, tls=args.tls,
                     grpc_host=args.grpc_host, values_per_packet=args.values,
                     io_threads=args.io_threads) as testbed, \
                HostAgents(testbed) as agents:
            capacity = measure_capacity(agents, 4 * args.size, args.reps)
            for backend in ("switch", "gloo"):
                rows += [dict(r, topo="star", workers=n, values=args.values,
                              mtu=mtu_for(args.values), bw_mbit=args.bw,
                              capacity_mbit=capacity["median"])
                         for r in measure(testbed, agents, backend, args.size, args.reps,
                                          data=args.data, min_timed_s=args.min_timed_s)]
                progress.advance(f"n = {n}, {backend}")
    return rows


def table(rows: list[dict], values: int, mbit: float) -> list[dict]:
    """One line per n: each path's figures (baseline_experiment.path_figures) and ms
    per MiB, measured and at both limits."""
    out = []
    for n in sorted({r["workers"] for r in rows}):
        line = {"n": n}
        nominal = dict(zip(("switch", "gloo"), nominal_ms_per_mib(n, values, mbit)))
        for backend in ("switch", "gloo"):
            mine = [r for r in rows if r["workers"] == n and r["backend"] == backend]
            figures = path_figures(mine, mbit, values)
            per_mib = MIB / (4 * mine[0]["size"])
            figures["ms_per_mib"] = {k: v * per_mib if k != "n" else v
                                     for k, v in figures["time_ms"].items()}
            figures["limit_ms_per_mib"] = figures["link_ms"] * per_mib
            figures["nominal_ms_per_mib"] = nominal[backend]
            line[backend] = figures
        out.append(line)
    return out


def print_table(lines: list[dict]) -> None:
    header = (f"{'n':>3} {'deliv.':>6} {'switch ms/MiB (95 %)':>22} {'limit':>6} {'nom.':>6} "
              f"{'sw link':>7} {'redone':>10} {'gloo ms/MiB (95 %)':>22} {'limit':>6} {'nom.':>6} "
              f"{'gloo link':>9}")
    print(header)
    print("-" * len(header))
    for l in lines:
        sw, gl = l["switch"], l["gloo"]
        print(f"{l['n']:>3} {sw['capacity_mbit']:>6.0f} {ms(sw['ms_per_mib']):>22} "
              f"{sw['limit_ms_per_mib']:>6.1f} {sw['nominal_ms_per_mib']:>6.1f} "
              f"{sw['link_share']:>7.0%} {sw['redone_per_call']:>4.1f}/{sw['blocks_per_call']:<4} "
              f"{ms(gl['ms_per_mib']):>22} {gl['limit_ms_per_mib']:>6.1f} "
              f"{gl['nominal_ms_per_mib']:>6.1f} {gl['link_share']:>9.0%}")


def plot(lines: list[dict], path: Path, title: str) -> None:
    plt = pyplot()

    ns = [l["n"] for l in lines]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend, label in (("switch", "in-network aggregation"), ("gloo", "gloo ring")):
        t = [l[backend]["ms_per_mib"] for l in lines]
        mid = [x["median"] for x in t]
        line = ax.errorbar(ns, mid, yerr=[[m - x["lo"] for m, x in zip(mid, t)],
                                          [x["hi"] - m for m, x in zip(mid, t)]],
                           fmt="o-", capsize=3, label=label)
        color = line[0].get_color()
        ax.plot(ns, [l[backend]["limit_ms_per_mib"] for l in lines], ls="--", marker="x",
                color=color, lw=1, label=f"{label}: bytes sent / delivered rate")
        ax.plot(ns, [l[backend]["nominal_ms_per_mib"] for l in lines], ls=":", color=color,
                lw=1, label=f"{label}: nominal rate, headers")
    ax.set_xticks(ns)
    ax.set_xlabel("workers n")
    ax.set_ylabel("ms per MiB of tensor")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.monotonic()
    stop_on_signals()
    try:
        if args.bw <= 0:
            raise ValueError("scaling needs shaped links (a rate above 0 Mbit/s): on unshaped "
                             "links the hosts, not the links, set the time")
        args.target = args.target or default_target()
        args.values = args.values or default_values_per_packet(args.target)
        check_arguments(argparse.Namespace(**dict(vars(args), bw=[args.bw])))
        if os.geteuid() != 0:
            raise PermissionError("needs root (Mininet)")
        args.out.mkdir(parents=True, exist_ok=True)
        rows = run(args)
        write_csv(args.out / "scaling.csv", CSV_FIELDS, rows, extra="ignore")
        lines = table(rows, args.values, args.bw)
        plot(lines, args.out / "scaling.png",
             f"1 MiB allreduce, {args.bw:g} Mbit/s links, {args.target}, {args.values} values "
             f"per packet, {args.data} data\nmedians of {args.reps} calls, 95 % bootstrap "
             f"intervals")
        written = record.write("bench-scaling", {"warmup_calls": WARMUP, "points": lines},
                               params=vars(args), out=args.out)
    except Exception as exc:
        print(f"scaling_experiment: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"scaling_experiment: stopped by {stop.name}; the topology was torn down",
              file=sys.stderr)
        return stop.code
    print()
    print_table(lines)
    print(f"\nms per MiB: medians of {args.reps} calls after {WARMUP} warm-up calls (95 % "
          f"bootstrap interval). deliv.: the links'\ndelivered rate, Mbit/s (a TCP transfer of "
          f"the tensor's bytes). limit: the bytes the path put on the wire\nat that rate; nom.: "
          f"at the nominal rate with headers. link: limit over the measured time (100 %: as\n"
          f"fast as the links deliver). redone: blocks redone a call of the call's blocks.")
    print(f"wrote {args.out / 'scaling.csv'}, {args.out / 'scaling.png'}, {written}")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
