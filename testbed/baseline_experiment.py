"""In-network aggregation against gloo's ring allreduce, same topology, same link rate.

    python -m testbed.baseline_experiment                   # n = 2,4,8; a few minutes
    python -m testbed.baseline_experiment --workers 2,4 --sizes 65536,262144 --bw 10,10
    python -m testbed.baseline_experiment --topo tree --leaves 2   # + a spine and 2 leaves

Why the ratio has a limit: a ring allreduce sends 2(n-1)/n times the tensor from
every worker; in-network aggregation sends it once (and receives it once). When
both are limited by the links, t_switch / t_gloo -> n / (2(n-1)): 1 for n = 2,
0.67 for n = 4, 0.57 for n = 8. The "with headers" limit adds each protocol's
per-packet overhead (312 B frames for 256 B of values, against 1514 B TCP frames
for 1448 B).

With a software switch the switch's packet rate, not the link, can be the
bottleneck: every aggregation packet is one pass through the pipeline, and gloo's
TCP frames carry 5.7x more data per packet. The experiment prints the switch's
measured packet rate beside the rate the links could carry, and marks each row
"links" or "switch", so the ratios can be read in that light. The default link
rates, 20 Mbit/s for n <= 4 and 10 Mbit/s for n = 8 (8.0 and 4.0 kpps of 312 B
frames per link), are what the embedded switch's native backend keeps up with on
2 cores; BMv2 (~2 kpps here) is switch-bound at any of them.

Each size starts with one unrecorded call per backend: the first switch call of a
shape probes its block exponents, as only the first step of a training run does.

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

from p4src import protocol

from .layout import add_topology_arguments, check_topology
from .loss_experiment import csv_list
from .targets import add_switch_arguments, default_target

ETH_IP_UDP = 14 + 20 + 8
TCP_FRAME, TCP_PAYLOAD = 1514, 1448
CSV_FIELDS = ["topo", "workers", "size", "bytes", "bw_mbit", "backend", "rep", "time_s", "switch_pps"]


def ingress_packets(counters: dict) -> int:
    """Aggregation packets the switches' ingress pipelines have handled, whatever the
    outcome (not the frames switched at L2 or refused as spoofs); in a tree, the
    leaves' partial sums count again at the spine."""
    other = ("ingress.forwarded_l2", "ingress.spoofed_source")
    return sum(c["packets"] for name, c in counters.items()
               if name.startswith("ingress.") and name not in other)


def agg_frame_bytes() -> int:
    return ETH_IP_UDP + protocol.packet_format().payload_bytes


def limits(n: int) -> tuple[float, float]:
    """(pure, with headers) limit of t_switch / t_gloo when both are link-bound."""
    pure = n / (2 * (n - 1))
    fmt = protocol.packet_format()
    switch_overhead = agg_frame_bytes() / (4 * fmt.values_per_packet)
    return pure, pure * switch_overhead / (TCP_FRAME / TCP_PAYLOAD)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--workers", type=csv_list(int), default=[2, 4, 8],
                        help="worker counts (default 2,4,8)")
    parser.add_argument("--sizes", type=csv_list(int), default=[16384, 65536],
                        help="tensor sizes in float32 values (default 16384,65536)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--bw", type=csv_list(float), default=None,
                        help="link rate in Mbit/s, one for all or one per worker count "
                             "(default 20 for n <= 4, 10 above: see above)")
    add_switch_arguments(parser)
    add_topology_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("results/baseline"),
                        help="results folder (default results/baseline)")
    return parser


def run(args) -> list[dict]:
    from .agents import HostAgents
    from .topology import Testbed

    target = args.target or default_target()
    # A tree is measured beside one switch, on the same n and link rate.
    topologies = ["star"] if args.topo == "star" else ["star", "tree"]
    rows = []
    for (n, bw), topo in itertools.product(zip(args.workers, link_rates(args)), topologies):
        shape = (f"one {target} switch" if topo == "star"
                 else f"a {target} spine and {args.leaves} leaves")
        print(f"[baseline] n = {n}: starting {n} hosts on {shape}, {bw:g} Mbit/s links",
              flush=True)
        with Testbed(n, bw=bw, target=target, num_slots=args.slots, topo=topo,
                     leaves=args.leaves, tls=args.tls, grpc_host=args.grpc_host) as testbed, \
                HostAgents(testbed) as agents:
            for size in args.sizes:
                for backend in ("switch", "gloo"):
                    agents.call({"op": "allreduce", "backend": backend, "size": size,
                                 "reps": 1, "seed": args.reps, "barrier": True}, timeout=1800)
                    before = ingress_packets(testbed.counters())
                    answers = agents.call({"op": "allreduce", "backend": backend, "size": size,
                                           "reps": args.reps, "seed": 0, "barrier": True},
                                          timeout=1800)
                    switched = ingress_packets(testbed.counters()) - before
                    if not all(all(a["exact"]) for a in answers):
                        raise RuntimeError(f"{backend} allreduce of {size} values on {n} "
                                           f"workers returned a wrong sum")
                    times = [max(a["times"][r] for a in answers) for r in range(args.reps)]
                    rows += [{"topo": topo, "workers": n, "size": size, "bytes": 4 * size,
                              "bw_mbit": bw, "backend": backend, "rep": r, "time_s": t,
                              "switch_pps": switched / sum(times)}
                             for r, t in enumerate(times)]
                    print(f"  n={n} size={size:>8} {topo:<5} {backend:<6} median "
                          f"{1000 * statistics.median(times):9.1f} ms", flush=True)
    return rows


def link_rates(args) -> list[float]:
    """One link rate per worker count."""
    if args.bw is None:
        return [20.0 if n <= 4 else 10.0 for n in args.workers]
    if len(args.bw) == 1:
        return args.bw * len(args.workers)
    if len(args.bw) != len(args.workers):
        raise ValueError(f"--bw gives {len(args.bw)} rates for {len(args.workers)} worker counts")
    return args.bw


def medians(rows: list[dict], topo: str) -> dict[tuple, float]:
    """(n, size, backend) -> median time, for one topology."""
    times: dict[tuple, list[float]] = {}
    for r in rows:
        if r["topo"] == topo:
            times.setdefault((r["workers"], r["size"], r["backend"]), []).append(r["time_s"])
    return {key: statistics.median(t) for key, t in times.items()}


def tree_table(rows: list[dict]) -> list[dict]:
    """One line per (n, size): the tree's time beside one switch's and gloo's."""
    star, tree = medians(rows, "star"), medians(rows, "tree")
    rate = {r["workers"]: r["bw_mbit"] for r in rows}
    return [{"n": n, "size": size, "bw_mbit": rate[n],
             "t_tree_ms": 1000 * t, "t_star_ms": 1000 * star[(n, size, "switch")],
             "t_gloo_ms": 1000 * star[(n, size, "gloo")],
             "t_gloo_tree_ms": 1000 * tree[(n, size, "gloo")],
             "tree_ratio": t / star[(n, size, "gloo")],
             "star_ratio": star[(n, size, "switch")] / star[(n, size, "gloo")],
             "limit": limits(n)[0], "limit_headers": limits(n)[1]}
            for (n, size, backend), t in tree.items() if backend == "switch"]


def print_tree_table(lines: list[dict]) -> None:
    header = (f"{'n':>2} {'Mbit/s':>6} {'values':>8} {'tree ms':>8} {'1 switch ms':>12} "
              f"{'gloo ms':>8} {'gloo/tree ms':>13} {'tree/gloo':>10} {'1 sw/gloo':>10} "
              f"{'limit':>6} {'w/ hdrs':>8}")
    print(header)
    print("-" * len(header))
    for l in lines:
        print(f"{l['n']:>2} {l['bw_mbit']:>6g} {l['size']:>8} {l['t_tree_ms']:>8.1f} "
              f"{l['t_star_ms']:>12.1f} {l['t_gloo_ms']:>8.1f} {l['t_gloo_tree_ms']:>13.1f} "
              f"{l['tree_ratio']:>10.2f} {l['star_ratio']:>10.2f} {l['limit']:>6.2f} "
              f"{l['limit_headers']:>8.2f}")


def table(rows: list[dict]) -> list[dict]:
    """One line per (n, size) on one switch: medians, ratio, limits, goodputs, switch
    packet rate."""
    med, pps, rate = {}, {}, {}
    for r in rows:
        if r["topo"] != "star":
            continue
        med.setdefault((r["workers"], r["size"], r["backend"]), []).append(r["time_s"])
        pps[(r["workers"], r["size"], r["backend"])] = r["switch_pps"]
        rate[r["workers"]] = r["bw_mbit"]
    out = []
    for (n, size, backend), times in med.items():
        if backend != "switch":
            continue
        t_sw = statistics.median(times)
        t_gloo = statistics.median(med[(n, size, "gloo")])
        bw = rate[n] * 1e6
        pure, with_headers = limits(n)
        out.append({
            "n": n, "size": size, "bw_mbit": bw / 1e6, "t_switch_ms": 1000 * t_sw, "t_gloo_ms": 1000 * t_gloo,
            "ratio": t_sw / t_gloo, "limit": pure, "limit_headers": with_headers,
            "goodput_switch": 32 * size / t_sw / bw, "goodput_gloo": 32 * size / t_gloo / bw,
            "switch_kpps": pps[(n, size, "switch")] / 1000,
            "link_kpps": n * bw / (8 * agg_frame_bytes()) / 1000,
        })
    return out


def bound(line: dict) -> str:
    """What limited the switch run: the links if the switch kept up with them (within 20 %)."""
    return "links" if line["switch_kpps"] >= 0.8 * line["link_kpps"] else "switch"


def print_table(lines: list[dict]) -> None:
    header = (f"{'n':>2} {'Mbit/s':>6} {'values':>8} {'switch ms':>10} {'gloo ms':>9} {'t_sw/t_gloo':>12} "
              f"{'limit':>6} {'w/ hdrs':>8} {'goodput sw':>11} {'goodput gloo':>13} "
              f"{'switch kpps':>12} {'links kpps':>11}  bound by")
    print(header)
    print("-" * len(header))
    for l in lines:
        print(f"{l['n']:>2} {l['bw_mbit']:>6g} {l['size']:>8} {l['t_switch_ms']:>10.1f} {l['t_gloo_ms']:>9.1f} "
              f"{l['ratio']:>12.2f} {l['limit']:>6.2f} {l['limit_headers']:>8.2f} "
              f"{l['goodput_switch']:>11.1%} {l['goodput_gloo']:>13.1%} "
              f"{l['switch_kpps']:>12.1f} {l['link_kpps']:>11.1f}  {bound(l)}")


def plot(lines: list[dict], path: Path, target: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({l["size"] for l in lines})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for size in sizes:
        mine = sorted((l for l in lines if l["size"] == size), key=lambda l: l["n"])
        ns = [l["n"] for l in mine]
        left.plot(ns, [l["ratio"] for l in mine], "o-", label=f"measured, {size} values")
        capped = [l for l in mine if bound(l) == "switch"]
        left.scatter([l["n"] for l in capped], [l["ratio"] for l in capped], s=160,
                     facecolors="none", edgecolors="red", zorder=3,
                     label="switch-bound" if size == sizes[0] else None)
        right.plot(ns, [l["goodput_switch"] for l in mine], "o-", label=f"switch, {size}")
        right.plot(ns, [l["goodput_gloo"] for l in mine], "s--", label=f"gloo, {size}")
    ns = sorted({l["n"] for l in lines})
    left.plot(ns, [limits(n)[0] for n in ns], "k:", label="limit n/(2(n-1))")
    left.plot(ns, [limits(n)[1] for n in ns], "k-.", label="limit with headers")
    left.set_xlabel("workers n")
    left.set_ylabel("t_switch / t_gloo (lower: in-network faster)")
    left.set_xticks(ns)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    right.set_xlabel("workers n")
    right.set_ylabel("goodput (tensor bits / time) / link rate")
    right.set_xticks(ns)
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    rates = ", ".join(f"n={n}: {r:g}" for n, r in sorted({(l["n"], l["bw_mbit"]) for l in lines}))
    fig.suptitle(f"in-network aggregation ({target}) vs gloo allreduce, links in Mbit/s "
                 f"{rates} (red rings: the switch, not the links, was the bottleneck)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("baseline_experiment: needs root (Mininet)", file=sys.stderr)
        return 1
    if any(n < 2 for n in args.workers):
        print("baseline_experiment: every worker count must be at least 2", file=sys.stderr)
        return 1
    started = time.monotonic()
    try:
        link_rates(args)
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
    except KeyboardInterrupt:
        print("baseline_experiment: interrupted; the topology was torn down", file=sys.stderr)
        return 130
    print()
    print_table(lines)
    print(f"\nt_sw/t_gloo below 1: in-network aggregation finished first. limit: the ratio if "
          f"both were link-bound;\ngoodput: tensor bits per second over the link rate (ring's "
          f"ceiling is n/(2(n-1)), the switch's 1).\nswitch kpps: aggregation packets "
          f"(contributions, redone blocks, retransmissions) the switch took in per second; "
          f"links kpps: what the n links "
          f"could deliver at that frame size.\nbound by 'switch': the software switch, not the link, set "
          f"the time; only 'links' rows measure the protocol.\nwrote {args.out / 'baseline.csv'}, "
          f"{args.out / 'baseline.png'}")
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
