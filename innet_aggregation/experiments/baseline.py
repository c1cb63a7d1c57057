"""In-network aggregation against gloo's ring allreduce, same topology, same link rate.

    python -m innet_aggregation.experiments.baseline          # n = 4, 8; 20 Mbit/s to unshaped; 1024, 256 and 64 values
    python -m innet_aggregation.experiments.baseline --workers 4 --bw 100,0 --values 256 --sizes 65536,262144
    python -m innet_aggregation.experiments.baseline --topo tree --leaves 2   # + a spine and 2 leaves

Why the ratio has a limit: a ring allreduce sends 2(n-1)/n times the tensor from
every worker; in-network aggregation sends it once (and receives it once). When
both are limited by the links, t_switch / t_gloo -> n / (2(n-1)): 0.67 for n = 4,
0.57 for n = 8, before each protocol's headers. The limit used here is measured,
not assumed (experiments.link_model): each testbed first times a TCP transfer of the
tensor's bytes from one host to another after the same pause as a call (the rate
the links deliver, HTB's refilled bucket included), and each path's link time is
the bytes it put on the wire (every worker's /proc/net/dev, the largest) at that
rate; the limit is their quotient. The nominal one (the rate, each protocol's
headers) is printed beside it.

The sweep: for each worker count, link rate (0: unshaped) and packet size (a
program of that many values per packet, make p4), one testbed, its links' MTU the
one the program needs (layout.link_mtu: 1500 B, 4,138 B at 1024 values). gloo is
measured in the first testbed of each MTU and is the baseline of every size with
that MTU at that rate: the same links, so the same segments for its TCP.
Each size starts with WARMUP unrecorded calls per backend (the first switch call
of a shape probes its block exponents, as only a training run's first step does),
then --reps timed calls (at least MIN_CALLS = 15 to be judged), more where a call is
short, so that a point's calls last at least --min-timed-s (short calls vary most), of --data: recorded
DDP gradients by default (testbed.gradients), whose exponents move from call to
call, so some blocks are redone, as in training; integers never miss.

Every figure is a median with its 95 % bootstrap interval (experiments.stats); the
goal (t_switch / t_gloo within 10 % of the limit; on unshaped links, where the hosts
bind, the ratio itself against UNSHAPED_GOALS) is judged on the interval of the
ratio. "bound" says what set the switch path's time from the workers' first
transmissions (retransmissions do not count) against the nominal link: "links" at
80-100 %, "burst" above 100 % (HTB's bucket, not the link: flagged, never counted
as link-bound), else "hosts" (the workers' and the switch's CPU: on one machine
they share its cores); unshaped links are never the bound. CPU is given in ms per
MB of tensor: a worker's (its process, all threads) and the switch process's, for
the switch path and for gloo (whose TCP frames the switch forwards at L2). Rates
the links cannot be shaped to and more workers than the machine holds are refused
before anything starts (testbed.links).

Writes <out>/baseline.csv, <out>/baseline.png and a JSON record of every figure
(experiments.record).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

from innet_aggregation.p4src import protocol

from ..testbed.layout import add_topology_arguments, check_topology
from ..testbed.links import burst_bytes
from ..testbed.stopping import Stopped, stop_on_signals
from ..testbed.targets import add_switch_arguments, default_target
from . import record
from .calls import (CSV_FIELDS, WARMUP, add_measure_arguments, breakdown_line, breakdown_ms,
                    check_arguments, csv_list, measure, measure_capacity, ms, path_figures)
from .link_model import IP_TCP, agg_frame_bytes, bound, mtu_for
from .output import pyplot, write_csv
from .progress import Progress
from .stats import MIN_CALLS, judge, median_interval, ratio_interval

GOAL = 1.10                     # t_switch / t_gloo within 10 % of the links' limit
# On unshaped links the hosts bind, not a limit: the ratio itself, by worker count.
UNSHAPED_GOALS = {4: 0.85, 8: 0.70}
def limits(n: int, values: int) -> tuple[float, float]:
    """(pure, with headers) limit of t_switch / t_gloo when both are link-bound, gloo's
    TCP on links of the MTU that the packet size's testbed has: the nominal model,
    shown beside the measured one (``table``)."""
    pure = n / (2 * (n - 1))
    switch_overhead = agg_frame_bytes(values) / (4 * values)
    mtu = mtu_for(values)
    return pure, pure * switch_overhead / ((mtu + 14) / (mtu - IP_TCP))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--workers", type=csv_list(int), default=[4, 8],
                        help="worker counts (default 4,8)")
    parser.add_argument("--sizes", type=csv_list(int), default=[262144],
                        help="tensor sizes in float32 values (default 262144: 1 MiB)")
    add_measure_arguments(parser)
    parser.add_argument("--bw", type=csv_list(float), default=[20, 50, 100, 200, 500, 0],
                        help="link rates in Mbit/s, 0 for unshaped links "
                             "(default 20,50,100,200,500,0)")
    parser.add_argument("--values", type=csv_list(int), default=[1024, 256, 64],
                        help="packet sizes, values per packet: each a compiled program "
                             "(default 1024,256,64)")
    add_switch_arguments(parser)
    add_topology_arguments(parser)
    parser.add_argument("--ina", action="store_true",
                        help="the switch's calls through torch.distributed on an ina process "
                             "group (dist.all_reduce), not the session's allreduce")
    parser.add_argument("--out", type=Path, default=Path("results/baseline"),
                        help="results folder (default results/baseline)")
    return parser


def run(args) -> list[dict]:
    from ..testbed.agents import HostAgents
    from ..testbed.topology import Testbed

    target = args.target or default_target()
    # A tree is measured beside one switch, on the same n and link rate.
    topologies = ["star"] if args.topo == "star" else ["star", "tree"]
    rows, gloo_measured = [], set()
    shapes = list(itertools.product(args.workers, args.bw, args.values, topologies))
    # Each shape's sizes on the switch, and once per set of links on gloo.
    distinct_links = {(n, bw, topo, mtu_for(values)) for n, bw, values, topo in shapes}
    progress = Progress(len(args.sizes) * (len(shapes) + len(distinct_links)), "baseline")
    for n, bw, values, topo in shapes:
        shape = (f"one {target} switch" if topo == "star"
                 else f"a {target} spine and {args.leaves} leaves")
        link = f"{bw:g} Mbit/s links" if bw else "unshaped links"
        mtu = mtu_for(values)
        links = (n, bw, topo, mtu)
        progress.say(f"[baseline] n = {n}: {n} hosts on {shape}, {link} (MTU {mtu} B), "
                     f"{values} values per packet, {args.data} data")
        with Testbed(n, bw=bw or None, target=target, num_slots=args.slots, topo=topo,
                     leaves=args.leaves, tls=args.tls, grpc_host=args.grpc_host,
                     values_per_packet=values, io_threads=args.io_threads) as testbed, \
                HostAgents(testbed) as agents:
            for size in args.sizes:
                capacity = measure_capacity(agents, 4 * size, args.reps)
                progress.say(f"  links deliver {capacity['median']:.1f} Mbit/s "
                             f"({capacity['lo']:.1f}-{capacity['hi']:.1f}) to a {4 * size} B "
                             "transfer")
                for backend in ("switch",) if links in gloo_measured else ("switch", "gloo"):
                    measured = measure(testbed, agents, backend, size, args.reps, args.ina,
                                       args.data, args.min_timed_s)
                    rows += [dict(r, topo=topo, workers=n, values=values, mtu=mtu, bw_mbit=bw,
                                  capacity_mbit=capacity["median"]) for r in measured]
                    t = median_interval([r["time_s"] for r in measured])
                    progress.say(f"  n={n} size={size:>8} {topo:<5} {backend:<6} median "
                                 f"{1000 * t['median']:9.1f} ms ({1000 * t['lo']:.1f}-"
                                 f"{1000 * t['hi']:.1f}, 95 %), redone "
                                 f"{statistics.mean(r['redone'] for r in measured):.1f} "
                                 "blocks a call")
                    progress.advance(f"n = {n}, {link}, {size} values, {backend}")
                mine = [r for r in rows if (r["workers"], r["bw_mbit"], r["topo"], r["mtu"],
                                            r["size"]) == (n, bw, topo, mtu, size)]
                switch = [r for r in mine if r["backend"] == "switch" and r["values"] == values]
                gloo = [r for r in mine if r["backend"] == "gloo"]
                if breakdown_ms(switch) is not None and gloo:
                    progress.say(breakdown_line(switch, gloo))
        gloo_measured.add(links)
    return rows


def table(rows: list[dict], topo: str = "star") -> list[dict]:
    """One line per (n, packet size, link rate, tensor size) on ``topo``: each path's
    figures, t_switch / t_gloo with its interval, the limit of that ratio from the
    bytes each path put on the wire and the capacity the links delivered (and the
    nominal one beside it), the goal judged on the interval, and what bound the
    switch path."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["topo"] == topo:
            groups.setdefault((r["workers"], r["values"], r["bw_mbit"], r["size"],
                               r["backend"]), []).append(r)
    gloo = {(n, bw, size, g[0]["mtu"]): g for (n, _, bw, size, backend), g in groups.items()
            if backend == "gloo"}
    out = []
    for (n, values, bw, size, backend), sw in groups.items():
        if backend != "switch":
            continue
        gl = gloo[(n, bw, size, sw[0]["mtu"])]
        switch, ring = path_figures(sw, bw, values), path_figures(gl, bw, values)
        ratio = ratio_interval([r["time_s"] for r in sw], [r["time_s"] for r in gl])
        limit = switch["link_ms"] / ring["link_ms"]
        over = {"median": ratio["median"] / limit, "lo": ratio["lo"] / limit,
                "hi": ratio["hi"] / limit}
        judged = min(len(sw), len(gl)) >= MIN_CALLS
        out.append({
            "n": n, "values": values, "bw_mbit": bw, "size": size, "data": sw[0]["data"],
            "switch": switch, "gloo": ring, "ratio": ratio, "limit": limit,
            "limit_nominal": limits(n, values)[1], "over_limit": over,
            "goal": (judge(over, GOAL) if judged else "too few calls") if bw else
                    (judge(ratio, UNSHAPED_GOALS[n]) if judged else "too few calls")
                    if n in UNSHAPED_GOALS else "-",
            "unshaped_goal": None if bw else UNSHAPED_GOALS.get(n),
            "bound": bound(switch["first_tx_share"]),
            "burst_share": burst_bytes(bw) / switch["wire_bytes"] if bw else None})
    return sorted(out, key=lambda l: (l["n"], l["values"], l["size"], l["bw_mbit"] or 1e9))


def rate(bw: float) -> str:
    return f"{bw:g}" if bw else "unshaped"


def print_table(lines: list[dict]) -> None:
    header = (f"{'n':>2} {'values':>6} {'Mbit/s':>8} {'deliv.':>6} {'tensor':>7} "
              f"{'switch ms (95 %)':>20} {'gloo ms (95 %)':>20} {'t_sw/t_gloo (95 %)':>18} "
              f"{'limit':>5} {'nom.':>5} {'/limit':>6} {'goal':>9} {'sw link':>7} "
              f"{'gl link':>7} {'1st tx':>6} {'bound':>6} {'redone':>10} {'retx':>5}  "
              f"{'CPU ms/MB worker, switch':>24}  {'gloo':>11}")
    print(header)
    print("-" * len(header))
    for l in lines:
        sw, gl, r = l["switch"], l["gloo"], l["ratio"]
        share = f"{sw['first_tx_share']:.0%}" if sw["first_tx_share"] is not None else "-"
        print(f"{l['n']:>2} {l['values']:>6} {rate(l['bw_mbit']):>8} {sw['capacity_mbit']:>6.0f} "
              f"{l['size']:>7} {ms(sw['time_ms']):>20} {ms(gl['time_ms']):>20} "
              f"{r['median']:>5.2f} ({r['lo']:.2f}-{r['hi']:.2f}) {l['limit']:>5.2f} "
              f"{l['limit_nominal']:>5.2f} {l['over_limit']['median']:>6.2f} {l['goal']:>9} "
              f"{sw['link_share']:>7.0%} {gl['link_share']:>7.0%} {share:>6} {l['bound']:>6} "
              f"{sw['redone_per_call']:>4.1f}/{sw['blocks_per_call']:<4} "
              f"{sw['retransmissions']:>5}  {sw['cpu_worker_ms_per_mb']:>13.1f}, "
              f"{sw['cpu_switch_ms_per_mb']:>8.1f}  {gl['cpu_worker_ms_per_mb']:>5.1f}, "
              f"{gl['cpu_switch_ms_per_mb']:>4.1f}")


def highest_link_bound(lines: list[dict]) -> dict[tuple, float | None]:
    """Per (n, packet size, tensor size): the highest link rate up to which every
    shaped rate left the switch path bound by the links (None: not even the lowest)."""
    out = {}
    for key, group in itertools.groupby(lines, key=lambda l: (l["n"], l["values"], l["size"])):
        best = None
        for l in sorted((l for l in group if l["bw_mbit"]), key=lambda l: l["bw_mbit"]):
            if l["bound"] != "links":
                break
            best = l["bw_mbit"]
        out[key] = best
    return out


def plot(lines: list[dict], path: Path, target: str) -> None:
    plt = pyplot()

    ns = sorted({l["n"] for l in lines})
    shaped = sorted({l["bw_mbit"] for l in lines if l["bw_mbit"]})
    unshaped_x = 2 * shaped[-1] if shaped else 1000.0

    def x(bw):
        return bw or unshaped_x

    fig, axes = plt.subplots(1, len(ns), figsize=(6 * len(ns), 4.5), squeeze=False)
    for ax, n in zip(axes[0], ns):
        mine = [l for l in lines if l["n"] == n]
        for (values, size), group in itertools.groupby(
                sorted(mine, key=lambda l: (l["values"], l["size"], x(l["bw_mbit"]))),
                key=lambda l: (l["values"], l["size"])):
            group = list(group)
            xs = [x(l["bw_mbit"]) for l in group]
            ratio = [l["ratio"]["median"] for l in group]
            lo = [l["ratio"]["median"] - l["ratio"]["lo"] for l in group]
            hi = [l["ratio"]["hi"] - l["ratio"]["median"] for l in group]
            line = ax.errorbar(xs, ratio, yerr=[lo, hi], fmt="o-", capsize=3,
                               label=f"{values} values/packet, {4 * size / 2**20:g} MiB")
            ax.plot(xs, [l["limit"] for l in group], color=line[0].get_color(), ls="-.",
                    marker="x", lw=1, label=f"limit: bytes sent / delivered rate, {values} values")
            off = [l for l in group if l["bound"] != "links"]
            ax.scatter([x(l["bw_mbit"]) for l in off], [l["ratio"]["median"] for l in off],
                       s=150, facecolors="none", edgecolors="red", zorder=3)
        ax.axhline(limits(n, 256)[0], color="k", ls=":", lw=1, label="n/(2(n-1))")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xscale("log")
        ticks = shaped + [unshaped_x]
        ax.set_xticks(ticks, [f"{t:g}" for t in shaped] + ["unshaped"])
        ax.minorticks_off()
        ax.set_xlabel("link rate, Mbit/s")
        ax.set_ylabel("t_switch / t_gloo (lower: in-network faster)")
        ax.set_title(f"n = {n}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"in-network aggregation ({target}) vs gloo's ring allreduce\nbars: 95 % "
                 f"bootstrap interval of the median ratio\nred rings: not link-bound (hosts, "
                 f"or a burst above the link)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def medians(rows: list[dict], topo: str) -> dict[tuple, float]:
    """(n, values, rate, size, backend) -> median time, for one topology."""
    times: dict[tuple, list[float]] = {}
    for r in rows:
        if r["topo"] == topo:
            times.setdefault((r["workers"], r["values"], r["bw_mbit"], r["size"], r["backend"]),
                             []).append(r["time_s"])
    return {key: statistics.median(t) for key, t in times.items()}


def tree_table(rows: list[dict]) -> list[dict]:
    """One line per (n, packet size, rate, size): the tree's time beside one switch's and
    gloo's (gloo's on one switch, and over the tree's links)."""
    star, tree = medians(rows, "star"), medians(rows, "tree")
    out = []
    for (n, values, bw, size, backend), t in tree.items():
        if backend != "switch":
            continue
        same_links = (n, bw, size, "gloo", mtu_for(values))
        gloo = next(v for (n2, v2, bw2, s2, b), v in star.items()
                    if (n2, bw2, s2, b, mtu_for(v2)) == same_links)
        gloo_tree = next(v for (n2, v2, bw2, s2, b), v in tree.items()
                         if (n2, bw2, s2, b, mtu_for(v2)) == same_links)
        out.append({"n": n, "values": values, "size": size, "bw_mbit": bw, "t_tree_ms": 1000 * t,
                    "t_star_ms": 1000 * star[(n, values, bw, size, "switch")],
                    "t_gloo_ms": 1000 * gloo, "t_gloo_tree_ms": 1000 * gloo_tree,
                    "tree_ratio": t / gloo,
                    "star_ratio": star[(n, values, bw, size, "switch")] / gloo,
                    "limit": limits(n, values)[0], "limit_headers": limits(n, values)[1]})
    return out


def print_tree_table(lines: list[dict]) -> None:
    header = (f"{'n':>2} {'values':>6} {'Mbit/s':>8} {'tensor':>8} {'tree ms':>8} "
              f"{'1 switch ms':>12} {'gloo ms':>8} {'gloo/tree ms':>13} {'tree/gloo':>10} "
              f"{'1 sw/gloo':>10} {'limit':>6} {'w/ hdrs':>8}")
    print(header)
    print("-" * len(header))
    for l in lines:
        print(f"{l['n']:>2} {l['values']:>6} {rate(l['bw_mbit']):>8} {l['size']:>8} "
              f"{l['t_tree_ms']:>8.1f} {l['t_star_ms']:>12.1f} {l['t_gloo_ms']:>8.1f} "
              f"{l['t_gloo_tree_ms']:>13.1f} {l['tree_ratio']:>10.2f} {l['star_ratio']:>10.2f} "
              f"{l['limit']:>6.2f} {l['limit_headers']:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("baseline_experiment: needs root (Mininet)", file=sys.stderr)
        return 1
    if any(n < 2 for n in args.workers):
        print("baseline_experiment: every worker count must be at least 2", file=sys.stderr)
        return 1
    started, load = time.monotonic(), os.getloadavg()[0]
    stop_on_signals()
    try:
        check_arguments(args)
        for values in args.values:
            protocol.program(values)              # a compiled program of each size
        if args.topo == "tree":
            for n in args.workers:
                check_topology("tree", n, args.leaves)
        if os.geteuid() != 0:
            raise PermissionError("needs root (Mininet)")
        args.out.mkdir(parents=True, exist_ok=True)
        rows = run(args)
        write_csv(args.out / "baseline.csv", CSV_FIELDS, rows, extra="ignore")
        lines = table(rows)
        plot(lines, args.out / "baseline.png", args.target or default_target())
        figures = {"arguments": {k: (str(v) if isinstance(v, Path) else v)
                                 for k, v in vars(args).items()},
                   "warmup_calls": WARMUP, "goal": GOAL, "points": lines,
                   "tree": tree_table(rows) if args.topo == "tree" else None}
        path = record.write("bench-allreduce", figures, params=vars(args), load_before=load,
                            out=args.out)
    except Exception as exc:
        print(f"baseline_experiment: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"baseline_experiment: stopped by {stop.name}; the topology was torn down", file=sys.stderr)
        return stop.code
    print()
    print_table(lines)
    print(f"""
Times: medians of at least {args.reps} calls (and at least {args.min_timed_s:g} s of calls) after
{WARMUP} warm-up calls, (95 % bootstrap interval).
deliv.: what a TCP transfer of the tensor's bytes got through the links, Mbit/s of frames
(testbed.links: the HTB bucket, 1 ms at the rate, refills before each call).
limit: t_switch / t_gloo if both paths moved the bytes they put on the wire at that rate;
nom.: the same from the nominal rate and each protocol's headers. /limit: the ratio over
the limit; goal: "met" when its interval is within {GOAL:.2f}, "missed" when all of it is
above, else "undecided"; unshaped, t_sw/t_gloo itself against {UNSHAPED_GOALS} by n. sw link, gl link: each path's link time over its time (100 %:
as fast as the links deliver). 1st tx: first transmissions against the nominal rate; bound: links
(80-100 %), burst (above 100 %: the bucket, not the link), hosts (below). redone: blocks
redone a call (exponent misses) of the call's blocks. CPU: ms per MB of tensor.""")
    for (n, values, size), best in highest_link_bound(lines).items():
        print(f"n={n}, {values} values per packet, {size} values: bound by the links "
              + (f"up to {best:g} Mbit/s" if best else "at no rate measured"))
    print(f"wrote {args.out / 'baseline.csv'}, {args.out / 'baseline.png'}, {path}")
    if args.topo == "tree":
        print(f"\nA spine and {args.leaves} leaves (every link at the same rate) beside one "
              f"switch and gloo:\n")
        print_tree_table(tree_table(rows))
        print("\ntree/gloo and 1 sw/gloo: the tree's and one switch's time over gloo's ring on one "
              "switch (gloo/tree: the ring\nover the tree's links). The limits are one switch's; "
              "a tree adds a hop and a second pipeline pass\nper block, not bytes on any worker's "
              "link.")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
