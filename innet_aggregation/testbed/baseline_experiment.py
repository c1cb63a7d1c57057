"""In-network aggregation against gloo's ring allreduce, same topology, same link rate.

    python -m innet_aggregation.testbed.baseline_experiment          # n = 4, 8; 20 Mbit/s to unshaped; 1024, 256 and 64 values
    python -m innet_aggregation.testbed.baseline_experiment --workers 4 --bw 100,0 --values 256 --sizes 65536,262144
    python -m innet_aggregation.testbed.baseline_experiment --topo tree --leaves 2   # + a spine and 2 leaves

Why the ratio has a limit: a ring allreduce sends 2(n-1)/n times the tensor from
every worker; in-network aggregation sends it once (and receives it once). When
both are limited by the links, t_switch / t_gloo -> n / (2(n-1)): 0.67 for n = 4,
0.57 for n = 8. The "with headers" limit adds each protocol's per-packet overhead
(Ethernet, IPv4, UDP and the 14 B aggregation header: 1,080 B frames for 1 KiB of
values at 256 values per packet, 312 B for 256 B at 64, against 1514 B TCP frames
for 1448 B; at 1024 values 4,152 B frames for 4 KiB, against TCP's on the same
jumbo MTU, 4,152 B for 4,086 B).

The sweep: for each worker count, link rate (0: unshaped) and packet size (a
program of that many values per packet, make p4), one testbed, its links' MTU the
one the program needs (layout.link_mtu: 1500 B, 4,138 B at 1024 values). gloo is
measured in the first testbed of each MTU and is the baseline of every size with
that MTU at that rate: the same links, so the same segments for its TCP.
Each size starts with one unrecorded call per backend: the first switch call of a
shape probes its block exponents, as only the first step of a training run does.

Every figure is a median with its min-max over the repetitions. "bound by" says
what set the switch path's time: "links" if the workers' first transmissions
(retransmissions do not count) went out at 80 % or more of what the link carries at
that frame size, else "hosts" (the workers' and the switch's CPU: on one machine
they share its cores); unshaped links are never the bound. CPU is given in ms per
MB of tensor: a worker's (its process, all threads) and the switch process's, for
the switch path and for gloo (whose TCP frames the switch forwards at L2).

Writes <out>/baseline.csv and <out>/baseline.png.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

from innet_aggregation.p4src import protocol

from .layout import add_topology_arguments, check_topology, link_mtu
from .loss_experiment import csv_list
from .stopping import Stopped, stop_on_signals
from .targets import add_switch_arguments, default_target

ETH = 14
IP_TCP = 20 + 32                # TCP with timestamps, as Linux sends it
LINK_BOUND = 0.8        # first transmissions at this share of the link's packet rate
CSV_FIELDS = ["topo", "workers", "values", "mtu", "size", "bytes", "bw_mbit", "backend", "rep",
              "time_s", "cpu_worker_s", "cpu_switch_s", "first_tx", "retransmissions"]


def agg_frame_bytes(values: int) -> int:
    return ETH + protocol.packet_format(values).ip_bytes


def mtu_for(values: int) -> int:
    return link_mtu(protocol.packet_format(values))


def limits(n: int, values: int) -> tuple[float, float]:
    """(pure, with headers) limit of t_switch / t_gloo when both are link-bound, gloo's
    TCP on links of the MTU that the packet size's testbed has."""
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
    parser.add_argument("--reps", type=int, default=5,
                        help="repetitions (default 5: gloo's time moves by up to a quarter "
                             "from call to call here)")
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


def measure(testbed, agents, backend: str, size: int, reps: int, ina: bool = False) -> list[dict]:
    """One warm-up call, then ``reps`` timed ones: per rep the slowest worker's time,
    the workers' mean CPU and first transmissions, the switch's CPU per call. With
    ``ina`` the switch's calls go through the torch backend (recorded as "switch")."""
    wire = "ina" if ina and backend == "switch" else backend
    agents.call({"op": "allreduce", "backend": wire, "size": size, "reps": 1,
                 "seed": reps, "barrier": True}, timeout=1800)
    cpu = testbed.switch_cpu_seconds()
    answers = agents.call({"op": "allreduce", "backend": wire, "size": size, "reps": reps,
                           "seed": 0, "barrier": True}, timeout=1800)
    switch_cpu = (testbed.switch_cpu_seconds() - cpu) / reps
    if not all(all(a["exact"]) for a in answers):
        raise RuntimeError(f"{backend} allreduce of {size} values on {len(answers)} workers "
                           f"returned a wrong sum")
    return [{"backend": backend, "size": size, "bytes": 4 * size, "rep": r,
             "time_s": max(a["times"][r] for a in answers),
             "cpu_worker_s": statistics.mean(a["cpu"][r] for a in answers),
             "cpu_switch_s": switch_cpu,
             "first_tx": statistics.mean(a["packets"][r] - a["retransmissions"][r]
                                         for a in answers),
             "retransmissions": sum(a["retransmissions"][r] for a in answers)}
            for r in range(reps)]


def run(args) -> list[dict]:
    from .agents import HostAgents
    from .topology import Testbed

    target = args.target or default_target()
    # A tree is measured beside one switch, on the same n and link rate.
    topologies = ["star"] if args.topo == "star" else ["star", "tree"]
    rows, gloo_measured = [], set()
    for n, bw, values, topo in itertools.product(args.workers, args.bw, args.values, topologies):
        shape = (f"one {target} switch" if topo == "star"
                 else f"a {target} spine and {args.leaves} leaves")
        link = f"{bw:g} Mbit/s links" if bw else "unshaped links"
        mtu = mtu_for(values)
        links = (n, bw, topo, mtu)
        print(f"[baseline] n = {n}: {n} hosts on {shape}, {link} (MTU {mtu} B), {values} values "
              f"per packet", flush=True)
        with Testbed(n, bw=bw or None, target=target, num_slots=args.slots, topo=topo,
                     leaves=args.leaves, tls=args.tls, grpc_host=args.grpc_host,
                     values_per_packet=values) as testbed, HostAgents(testbed) as agents:
            for size in args.sizes:
                for backend in ("switch",) if links in gloo_measured else ("switch", "gloo"):
                    measured = measure(testbed, agents, backend, size, args.reps, args.ina)
                    rows += [dict(r, topo=topo, workers=n, values=values, mtu=mtu, bw_mbit=bw)
                             for r in measured]
                    times = [r["time_s"] for r in measured]
                    print(f"  n={n} size={size:>8} {topo:<5} {backend:<6} median "
                          f"{1000 * statistics.median(times):9.1f} ms "
                          f"({1000 * min(times):.1f}-{1000 * max(times):.1f})", flush=True)
        gloo_measured.add(links)
    return rows


def spread(values: list[float], scale: float = 1.0) -> dict:
    return {"median": scale * statistics.median(values), "min": scale * min(values),
            "max": scale * max(values)}


def table(rows: list[dict], topo: str = "star") -> list[dict]:
    """One line per (n, packet size, link rate, tensor size) on ``topo``: the switch
    path's and gloo's times, their ratio against the limit, what bound the switch
    path, and CPU per MB."""
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
        t_sw, t_gl = spread([r["time_s"] for r in sw], 1000), spread([r["time_s"] for r in gl], 1000)
        pure, with_headers = limits(n, values)
        mb = 4 * size / 1e6
        first_tx_rate = statistics.median(r["first_tx"] / r["time_s"] for r in sw)
        link_pps = bw * 1e6 / (8 * agg_frame_bytes(values)) if bw else None
        out.append({
            "n": n, "values": values, "bw_mbit": bw, "size": size, "t_switch_ms": t_sw,
            "t_gloo_ms": t_gl, "ratio": t_sw["median"] / t_gl["median"], "limit": pure,
            "limit_headers": with_headers,
            "bound": "links" if link_pps and first_tx_rate >= LINK_BOUND * link_pps else "hosts",
            "first_tx_share": first_tx_rate / link_pps if link_pps else None,
            "retransmissions": sum(r["retransmissions"] for r in sw),
            "cpu_worker_ms_per_mb": 1000 * statistics.median(r["cpu_worker_s"] for r in sw) / mb,
            "cpu_switch_ms_per_mb": 1000 * statistics.median(r["cpu_switch_s"] for r in sw) / mb,
            "gloo_cpu_worker_ms_per_mb": 1000 * statistics.median(r["cpu_worker_s"] for r in gl) / mb,
            "gloo_cpu_switch_ms_per_mb": 1000 * statistics.median(r["cpu_switch_s"] for r in gl) / mb,
        })
    return sorted(out, key=lambda l: (l["n"], l["values"], l["size"], l["bw_mbit"] or 1e9))


def rate(bw: float) -> str:
    return f"{bw:g}" if bw else "unshaped"


def ms(s: dict) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def print_table(lines: list[dict]) -> None:
    header = (f"{'n':>2} {'values':>6} {'Mbit/s':>8} {'tensor':>7} {'switch ms (min-max)':>22} "
              f"{'gloo ms (min-max)':>22} {'t_sw/t_gloo':>11} {'w/ hdrs':>7} {'/limit':>6} "
              f"{'bound by':>8} {'1st tx':>6} {'retx':>5}  {'CPU ms/MB: worker, switch':>26}  "
              f"{'gloo worker, switch':>19}")
    print(header)
    print("-" * len(header))
    for l in lines:
        share = f"{l['first_tx_share']:.0%}" if l["first_tx_share"] is not None else "-"
        print(f"{l['n']:>2} {l['values']:>6} {rate(l['bw_mbit']):>8} {l['size']:>7} "
              f"{ms(l['t_switch_ms']):>22} {ms(l['t_gloo_ms']):>22} {l['ratio']:>11.2f} "
              f"{l['limit_headers']:>7.2f} {l['ratio'] / l['limit_headers']:>6.2f} "
              f"{l['bound']:>8} {share:>6} {l['retransmissions']:>5}  "
              f"{l['cpu_worker_ms_per_mb']:>15.1f}, {l['cpu_switch_ms_per_mb']:>8.1f}  "
              f"{l['gloo_cpu_worker_ms_per_mb']:>11.1f}, {l['gloo_cpu_switch_ms_per_mb']:>5.1f}")


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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
            ratio = [l["ratio"] for l in group]
            lo = [l["ratio"] - l["t_switch_ms"]["min"] / l["t_gloo_ms"]["median"] for l in group]
            hi = [l["t_switch_ms"]["max"] / l["t_gloo_ms"]["median"] - l["ratio"] for l in group]
            line = ax.errorbar(xs, ratio, yerr=[lo, hi], fmt="o-", capsize=3,
                               label=f"{values} values/packet, {4 * size / 2**20:g} MiB")
            ax.axhline(limits(n, values)[1], color=line[0].get_color(), ls="-.", lw=1,
                       label=f"limit with headers, {values} values")
            hosts = [l for l in group if l["bound"] != "links"]
            ax.scatter([x(l["bw_mbit"]) for l in hosts], [l["ratio"] for l in hosts], s=150,
                       facecolors="none", edgecolors="red", zorder=3)
        ax.axhline(limits(n, 256)[0], color="k", ls=":", lw=1, label="limit n/(2(n-1))")
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
    fig.suptitle(f"in-network aggregation ({target}) vs gloo's ring allreduce\nbars: min-max; "
                 f"red rings: bound by the hosts' CPU, not the links", fontsize=10)
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
    started = time.monotonic()
    stop_on_signals()
    try:
        for values in args.values:
            protocol.program(values)              # a compiled program of each size
        if args.topo == "tree":
            for n in args.workers:
                check_topology("tree", n, args.leaves)
        args.out.mkdir(parents=True, exist_ok=True)
        rows = run(args)
        with open(args.out / "baseline.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        lines = table(rows)
        plot(lines, args.out / "baseline.png", args.target or default_target())
    except Exception as exc:
        print(f"baseline_experiment: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"baseline_experiment: stopped by {stop.name}; the topology was torn down", file=sys.stderr)
        return stop.code
    print()
    print_table(lines)
    print(f"\nt_sw/t_gloo below 1: in-network aggregation finished first. w/ hdrs: the ratio "
          f"if both were link-bound, with\neach protocol's headers; /limit: the ratio over it "
          f"(1.00: as fast as the links allow). bound by:\n'links' when the workers' first "
          f"transmissions (1st tx, share of the link's packet rate) reached "
          f"{LINK_BOUND:.0%},\nelse 'hosts' (the CPU the workers and the switch share); retx: "
          f"retransmissions. CPU: ms per MB of\ntensor, a worker's process and the switch's, "
          f"for the switch path and for gloo.")
    for (n, values, size), best in highest_link_bound(lines).items():
        print(f"n={n}, {values} values per packet, {size} values: bound by the links "
              + (f"up to {best:g} Mbit/s" if best else "at no rate measured"))
    print(f"wrote {args.out / 'baseline.csv'}, {args.out / 'baseline.png'}")
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
