"""Render the figures the documentation shows from the records in docs/results/.

Every table, plot and sentence with a measured figure in the docs (and the README's
one figure) is written here from a record (innet_aggregation/experiments/record.py
writes them; docs/results/ holds the ones the docs quote) or from the build output
it comes from (the Tofino resource summary), so no figure is typed by hand:
tests/docs/test_docs.py renders again and fails when the committed output differs.
A figure inside a page's prose is a named one between markers, rewritten in place:

    <!-- fig:demo-redone-share -->1.5%<!-- /fig -->

    python tools/render_results.py            # rewrite docs/generated/ and README's block
    python tools/render_results.py --check    # exit 1, naming what differs
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from innet_aggregation.experiments.demo import redone_after_warmup
from innet_aggregation.experiments.link_model import LINK_BOUND
from innet_aggregation.experiments.sharing import plot as plot_sharing

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "docs" / "results"
OUT = REPO / "docs" / "generated"
README = REPO / "README.md"
BEGIN, END = "<!-- results:switch-vs-ring:begin -->", "<!-- results:switch-vs-ring:end -->"
FIGURE = re.compile(r"<!-- fig:([a-z0-9-]+) -->(.*?)<!-- /fig -->", re.S)
TOFINO = REPO / "innet_aggregation" / "p4src" / "tna" / "build" / "aggregation.resources.txt"
README_VALUES = 1024   # the packet size the README's figure shows: the testbeds' default
README_SIZE = 262144   # and the tensor, in float32 values: 1 MiB, the sweep's default


def load(name: str) -> dict:
    return json.loads((RECORDS / f"{name}.json").read_text())


def load_if(name: str) -> dict | None:
    """A record not committed yet renders as such."""
    return load(name) if (RECORDS / f"{name}.json").exists() else None


def spread(s, fmt: str = ".2f") -> str:
    """A figure as the records hold it: a number, or a median with its range where known."""
    if s is None:
        return "-"
    if not isinstance(s, dict):
        return format(s, fmt)
    if s.get("min") is None:
        return format(s["median"], fmt)
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def median(s):
    return s["median"] if isinstance(s, dict) else s


def rate(bw: float) -> str:
    return f"{bw:g}" if bw else "unshaped"


def provenance(r: dict) -> str:
    load = r.get("load")
    load = (f", load {load[0]:g}-{load[1]:g}" if load and None not in load and load[0] != load[1]
            else f", load about {load[1]:g}" if load and load[1] is not None else "")
    return (f"*Record `docs/results/{r['experiment']}.json`: commit `{r['commit']}`, {r['date']}, "
            f"{r['machine'].get('cpus')} CPUs{load}; {r['source']}.*\n")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- bench-allreduce --------------------------------------------------------------
# experiments.baseline's records: medians with 95 % bootstrap intervals, the
# limit from the links' delivered rate, the goal judged on the interval.

def interval(s: dict, fmt: str = ".1f") -> str:
    """A median with its 95 % interval, as experiments.stats gives it."""
    return f"{s['median']:{fmt}} ({s['lo']:{fmt}}-{s['hi']:{fmt}})"


def span(xs: list[float], fmt: str = ".2f") -> str:
    lo, hi = format(min(xs), fmt), format(max(xs), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def mib(size: int) -> str:
    return f"{4 * size / 2**20:g} MiB"


def sweep_points(r: dict, values: int | None = None, size: int | None = None) -> list[dict]:
    """The record's points, at one packet size and tensor size if given."""
    return [x for x in r["figures"]["points"]
            if (values is None or x["values"] == values) and (size is None or x["size"] == size)]


def met(point: dict) -> bool:
    """The goal of the sweep, on the interval; on unshaped links without a goal of
    their own, the whole interval at most 1.0 (faster than the ring)."""
    if point["bw_mbit"] or point.get("unshaped_goal"):
        return point["goal"] == "met"
    return point["ratio"]["hi"] <= 1.0


def calls_text(points: list[dict], warmup: int, min_timed_s: float | None) -> str:
    """How many timed calls the points took: at least --reps, more where calls are short."""
    ns = [x[b]["time_ms"]["n"] for x in points for b in ("switch", "gloo")]
    more = f" (more where calls are short: at least {min_timed_s:g} s of them)" if min_timed_s else ""
    return f"{span(ns, 'd')} timed calls a point{more} after {warmup} warm-up calls"


def goal_met_up_to(points: list[dict], n: int, values: int, size: int) -> tuple[float | None, dict | None]:
    """The highest shaped rate up to which the goal was met at every rate, and the
    first point past it (None: met everywhere)."""
    best = None
    for x in sorted((x for x in points if (x["n"], x["values"], x["size"]) == (n, values, size)
                     and x["bw_mbit"]), key=lambda x: x["bw_mbit"]):
        if x["goal"] != "met":
            return best, x
        best = x["bw_mbit"]
    return best, None


def bound_cell(sw: dict, bound: str) -> str:
    share = sw["first_tx_share"]
    return bound if share is None else f"{bound} ({share:.0%})"


def bench_allreduce(r: dict) -> dict[str, str]:
    f = r["figures"]
    points = f["points"]
    body = []
    for x in points:
        sw, gl = x["switch"], x["gloo"]
        ratio = interval(x["ratio"], ".2f")
        body.append([x["n"], x["values"], f"{rate(x['bw_mbit'])} ({sw['capacity_mbit']:.0f})",
                     mib(x["size"]), interval(sw["time_ms"]), interval(gl["time_ms"]),
                     f"**{ratio}**" if met(x) else ratio,
                     f"{x['limit']:.2f} ({x['limit_nominal']:.2f})",
                     interval(x["over_limit"], ".2f"), x["goal"], bound_cell(sw, x["bound"]),
                     f"{sw['link_share']:.0%}, {gl['link_share']:.0%}",
                     f"{sw['redone_per_call']:.1f} / {sw['blocks_per_call']}", sw["retransmissions"],
                     f"{sw['cpu_worker_ms_per_mb']:.0f}, {sw['cpu_switch_ms_per_mb']:.0f} "
                     f"({gl['cpu_worker_ms_per_mb']:.0f}, {gl['cpu_switch_ms_per_mb']:.0f})"])
    sizes = sorted({x["values"] for x in points}, reverse=True)
    data = ", ".join(sorted({x["data"] for x in points}))
    free_goals = ", ".join(sorted({f"{x['unshaped_goal']:g} for n = {x['n']}" for x in points
                                   if not x["bw_mbit"] and x.get("unshaped_goal")}))
    md = provenance(r) + "\n" + "".join(
        f"![t_switch / t_gloo against the link rate, {v} values per packet](generated/"
        f"bench_allreduce_{v}.png)\n" for v in sizes) + (
        f"\n{calls_text(points, f['warmup_calls'], r['params'].get('min_timed_s'))}, {data} data; "
        f"times are medians with their 95 % bootstrap interval.\n\n") + table(
        ["n", "values/packet", "link Mbit/s (delivered)", "tensor", "switch ms (95 %)",
         "gloo ms (95 %)", "t_sw/t_gloo (95 %)", "limit (nominal)", "ratio / limit (95 %)",
         "goal", "bound (1st tx)", "link used, switch and gloo", "blocks redone a call", "retx",
         "CPU ms/MB worker, switch (gloo's)"], body)
    md += ("\nLimit: the ratio if both paths moved the bytes they put on the wire at the "
           "delivered rate; nominal: from the link rate and each protocol's headers. "
           f"Goal: ratio / limit at most {f['goal']:g}, judged on its interval. "
           + (f"Unshaped: t_sw/t_gloo itself, judged on its interval against {free_goals}. "
              if free_goals else "")
           + "Bold: the goal met (unshaped with no goal: the whole interval at most 1.0). "
           "Bound: burst when first transmissions passed the nominal rate (the HTB bucket, "
           "not the link). Link used: each path's link time at the delivered rate over its "
           "measured time (above 100 %: faster than the links delivered to a bulk transfer; "
           "well below: the hosts bound that path).\n\n")
    for n, values, size in sorted({(x["n"], x["values"], x["size"]) for x in points},
                                  key=lambda k: (k[0], -k[1], k[2])):
        best, past = goal_met_up_to(points, n, values, size)
        md += (f"- n = {n}, {values} values per packet, {mib(size)}: within 10 % of the limit "
               + (f"at every rate up to {best:g} Mbit/s" if best else "at no shaped rate")
               + (f"; {past['goal']} at {past['bw_mbit']:g}" if past else ""))
        free = next((x for x in points if (x["n"], x["values"], x["size"]) == (n, values, size)
                     and not x["bw_mbit"] and x.get("unshaped_goal")), None)
        md += (f"; unshaped, t_sw/t_gloo at most {free['unshaped_goal']:g}: {free['goal']}\n"
               if free else "\n")
    return {"bench_allreduce.md": md, "switch_vs_ring.md": switch_vs_ring_text(r, "generated/")}


def switch_vs_ring_text(r: dict, image_dir: str) -> str:
    """The README's sentences on the sweep."""
    points = sweep_points(r, README_VALUES, README_SIZE)
    if not points:
        raise SystemExit(f"docs/results/{r['experiment']}.json: no point at {README_VALUES} "
                         f"values per packet and {README_SIZE} values, the README's figure")
    ns = sorted({x["n"] for x in points})
    shaped = {n: [x for x in points if x["n"] == n and x["bw_mbit"]] for n in ns}
    unshaped = {n: next((x for x in points if x["n"] == n and not x["bw_mbit"]), None) for n in ns}
    rates = span([x["bw_mbit"] for n in ns for x in shaped[n]], "g")
    ratios = ", ".join(
        f"{span([x['ratio']['median'] for x in shaped[n]])} for n = {n} (limit "
        f"{span([x['limit'] for x in shaped[n]])})" for n in ns if shaped[n])
    best = {n: goal_met_up_to(points, n, README_VALUES, README_SIZE)[0] for n in ns}
    within = (f"{best[ns[0]]:g} Mbit/s for every n" if len(set(best.values())) == 1 and best[ns[0]]
              else " and ".join(f"{b:g} Mbit/s for n = {n}" for n, b in best.items() if b)
              or "no shaped rate")
    burst = ", ".join(f"n = {x['n']} at {x['bw_mbit']:g} Mbit/s" for n in ns for x in shaped[n]
                      if x["bound"] == "burst")
    slow_ring = ", ".join(f"n = {x['n']} at {x['bw_mbit']:g} Mbit/s ({x['gloo']['link_share']:.0%})"
                          for n in ns for x in shaped[n] if x["gloo"]["link_share"] < LINK_BOUND)
    unsh = ", ".join(f"{interval(unshaped[n]['ratio'], '.2f')} for n = {n}"
                     for n in ns if unshaped[n])
    calls = span([x[b]["time_ms"]["n"] for x in points for b in ("switch", "gloo")], "d")
    docs = image_dir.removesuffix("generated/")   # the pages' folder, from where the text goes
    return (f"![The switch path's time over the ring's, against the link rate]"
            f"({image_dir}switch_vs_ring.png)\n\n"
            f"Summing a {mib(README_SIZE)} tensor in the switch took {ratios} of gloo's ring "
            f"allreduce time at shaped link rates of {rates} Mbit/s ({README_VALUES} values per "
            f"packet, medians; the limit: the ratio if both paths moved the bytes they sent at "
            f"the rate the links delivered). "
            f"It kept within 10 % of that limit, judged on the 95 % interval, at every rate up to "
            f"{within}" + (f" (first transmissions above the link's rate, the HTB bucket's "
                           f"burst: {burst})" if burst else "")
            + (f"; where the ring used under {LINK_BOUND:.0%} of its link time, the hosts, "
               f"not the links, bound it: {slow_ring}" if slow_ring else "")
            + (f"; on unshaped links, where the hosts' CPU binds, it took {unsh} of the ring's "
               f"time with {r['machine'].get('cpus')} CPUs (on a 16-CPU host the ring was "
               f"faster there: the embedded switch bound the switch path, "
               f"[History]({docs}history.md#a-16-cpu-host))"
               if unsh else "") + ". "
            f"Measured on {r['date']} at `{r['commit']}` on a {r['machine'].get('cpus')}-CPU VM, "
            f"{calls} calls a point of {points[0]['data']} data "
            f"(`docs/results/{r['experiment']}.json`, {r['source']}).\n")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_switch_vs_ring(r: dict, path: Path, values: int = README_VALUES) -> None:
    """t_switch / t_gloo (95 % interval) against the link rate at one packet size, one
    line per n, each with its measured limit (dashed) and nominal one (dotted)."""
    plt = _pyplot()
    points = sweep_points(r, values, README_SIZE)
    rates = sorted({x["bw_mbit"] for x in points}, key=lambda b: b or 1e9)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for n, color in zip(sorted({x["n"] for x in points}), ("tab:blue", "tab:orange", "tab:green")):
        mine = {x["bw_mbit"]: x for x in points if x["n"] == n}
        xs = [i for i, b in enumerate(rates) if b in mine]
        mid = [mine[rates[i]]["ratio"]["median"] for i in xs]
        ax.errorbar(xs, mid, yerr=[[m - mine[rates[i]]["ratio"]["lo"] for m, i in zip(mid, xs)],
                                   [mine[rates[i]]["ratio"]["hi"] - m for m, i in zip(mid, xs)]],
                    fmt="o-", color=color, capsize=3, label=f"n = {n}")
        ax.plot(xs, [mine[rates[i]]["limit"] for i in xs], "x--", color=color, lw=1)
        ax.axhline(next(iter(mine.values()))["limit_nominal"], color=color, ls=":", lw=1)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(rates)), [rate(b) for b in rates])
    ax.set_xlabel("link rate, Mbit/s")
    ax.set_ylabel("switch time / ring time")
    ax.set_ylim(0, max(1.1, max(x["ratio"]["hi"] for x in points) * 1.1))
    ax.set_title(f"{mib(README_SIZE)} allreduce, {values} values per packet, 95 % intervals\n"
                 f"dashed: the limit at the delivered rate; dotted: the nominal one", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def plot_loss(r: dict, path: Path) -> None:
    """The slowdown over the no-loss time against the loss rate, one line per size."""
    plt = _pyplot()
    pts = r["figures"]["points"]
    losses = sorted({x["loss_pct"] for x in pts})
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for (size, direction) in sorted({(x["size"], x["direction"]) for x in pts if x["loss_pct"]}):
        mine = {x["loss_pct"]: x["slowdown"] for x in pts
                if x["size"] == size and (x["direction"] == direction or not x["loss_pct"])}
        xs = [i for i, loss in enumerate(losses) if mine.get(loss) is not None]
        ax.plot(xs, [mine[losses[i]] for i in xs], "o-", label=f"{size:,} values, loss on {direction}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(losses)), [f"{loss:g}" for loss in losses])
    ax.set_xlabel("simulated loss, %")
    ax.set_ylabel("time / time without loss")
    ax.set_ylim(0, None)
    ax.set_title("allreduce with loss: every call exact and bit-identical" if all(
        x["exact"] == x["identical"] == x["calls"] for x in pts) else "allreduce with loss", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


# -- bench-scaling ----------------------------------------------------------------

def bench_scaling(r: dict | None) -> dict[str, str]:
    """Time per MiB against n (experiments.scaling), or a line saying that no
    record is committed yet."""
    if r is None:
        return {"bench_scaling.md": "*Not measured yet: no record in "
                                    "`docs/results/bench-scaling.json`.*\n"}
    f, p = r["figures"], r["params"]
    body = [[x["n"], f"{x['switch']['capacity_mbit']:.0f}",
             *(c for b in ("switch", "gloo") for c in (
                 interval(x[b]["ms_per_mib"]), f"{x[b]['limit_ms_per_mib']:.1f}",
                 f"{x[b]['nominal_ms_per_mib']:.1f}", f"{x[b]['link_share']:.0%}")),
             f"{x['switch']['redone_per_call']:.1f} / {x['switch']['blocks_per_call']}"]
            for x in f["points"]]
    calls = span([x[b]["time_ms"]["n"] for x in f["points"] for b in ("switch", "gloo")], "d")
    md = (provenance(r) + f"\n![ms per MiB against the number of workers](generated/"
          f"bench_scaling.png)\n\n{p.get('bw'):g} Mbit/s links, {p.get('values')} values per "
          f"packet, {p.get('target')}; {calls} timed calls a point after {f['warmup_calls']} "
          f"warm-up calls, {p.get('data')} data; medians with their 95 % bootstrap interval.\n\n"
          + table(["n", "delivered Mbit/s", "switch ms/MiB (95 %)", "limit", "nominal",
                   "switch link", "gloo ms/MiB (95 %)", "limit", "nominal", "gloo link",
                   "blocks redone a call"], body)
          + "\nLimit: the bytes the path put on the wire at the delivered rate; nominal: at the "
            "link rate with headers; link: the limit over the measured time (100 %: as fast as "
            "the links deliver).\n")
    return {"bench_scaling.md": md}


def plot_scaling(r: dict, path: Path) -> None:
    """ms per MiB (95 % interval) against n for both paths, each with its limit at the
    delivered rate (dashed) and at the nominal one (dotted)."""
    plt = _pyplot()
    points = r["figures"]["points"]
    ns = [x["n"] for x in points]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for backend, label, color in (("switch", "in-network aggregation", "tab:blue"),
                                  ("gloo", "gloo ring", "tab:orange")):
        t = [x[backend]["ms_per_mib"] for x in points]
        mid = [s["median"] for s in t]
        ax.errorbar(ns, mid, yerr=[[m - s["lo"] for m, s in zip(mid, t)],
                                   [s["hi"] - m for m, s in zip(mid, t)]],
                    fmt="o-", color=color, capsize=3, label=label)
        ax.plot(ns, [x[backend]["limit_ms_per_mib"] for x in points], "x--", color=color, lw=1)
        ax.plot(ns, [x[backend]["nominal_ms_per_mib"] for x in points], ":", color=color, lw=1)
    ax.set_xticks(ns)
    ax.set_xlabel("workers n")
    ax.set_ylabel("ms per MiB of tensor")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{r['params'].get('bw'):g} Mbit/s links, 95 % intervals\ndashed: the limit at "
                 f"the delivered rate; dotted: the nominal one", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


# -- the other benchmarks and experiments ----------------------------------------

def bench_switch(r: dict) -> dict[str, str]:
    rows = r["figures"]
    smallest = min(x["values"] for x in rows)
    body = [[x["values"], x["target"], spread(x["pps"], ",.0f"), spread(x["gbits"], ".2f"),
             spread(x["of_ceiling"]), spread(x["native_over"], ".3g"), spread(x["cpu_us"]),
             spread(x["cpu_of_ceiling"]), spread(x["gbits_over_smallest"])] for x in rows]
    return {"bench_switch.md": provenance(r) + "\n" + table(
        ["values", "target", "packets/s", "payload Gbit/s", "of the ceiling",
         "native's rate over it (x)", "CPU µs per contribution", "native's CPU over the ceiling's",
         f"payload Gbit/s over {smallest} values'"], body)
        + "\nMedians (min-max) of the runs; each ratio the median (min-max) of the rounds' ratios.\n"}


def bench_worker(r: dict) -> dict[str, str]:
    f = r["figures"]
    md = provenance(r) + "\n"
    if "pipeline_mbps_per_core" in f:
        md += (f"- host pipeline, batches that stay in cache: {spread(f['pipeline_mbps_per_core'], ',.0f')} "
               f"MB/s per core; a whole tensor at once: {spread(f['pipeline_at_once_mbps'], ',.0f')}\n"
               f"- baselines: a copy {spread(f['copy_mbps'], ',.0f')} MB/s (the pipeline takes "
               f"{spread(f['pipeline_over_copy'], '.1f')} times its time), numpy's sum of 4 arrays "
               f"{spread(f['sum_mbps'], ',.0f')} MB/s ({spread(f['pipeline_over_sum'])} times)\n")
    if "worker_pps" in f:
        md += (f"- one worker: {spread(f['worker_pps'], ',.0f')} packets/s each way "
               f"({spread(f['worker_mbps'], ',.0f')} MB/s of float32; "
               f"{f['worker_retransmissions']} retransmitted), {spread(f['worker_of_c_client'])} of "
               f"a minimal C client's {spread(f['c_client_pps'], ',.0f')}\n")
    if f.get("allreduce"):
        md += "\n" + table(
            ["target, values per packet", "MTU", "float32", "switch MB/s per worker",
             "gloo MB/s per worker", "switch / gloo", "worker CPU ms/MB (gloo)",
             "switch process CPU ms/MB (gloo)", "packets sent, redone, retransmitted"],
            [[x["label"], x["mtu"], f"{x['elements']:,}", spread(x["switch_mbps"], ".1f"),
              spread(x["gloo_mbps"], ".1f"), spread(x["ratio"]),
              f"{spread(x['switch_worker_cpu'], '.1f')} ({spread(x['gloo_worker_cpu'], '.1f')})",
              f"{spread(x['switch_switch_cpu'], '.1f')} ({spread(x['gloo_switch_cpu'], '.1f')})",
              f"{x['packets_sent']:,}, {x['redone']:,}, {x['retransmissions']:,}"]
             for x in f["allreduce"]])
    return {"bench_worker.md": md}


def bench_backend(r: dict) -> dict[str, str]:
    return {"bench_backend.md": provenance(r) + "\n" + table(
        ["float32 per call", "session ms", "backend ms", "backend / session (medians)",
         "rounds' ratios", "around the work, µs: session, backend",
         "backend's extra time around the work"],
        [[f"{x['size']:,}", spread(x["session_ms"]), spread(x["backend_ms"]), f"{x['ratio']:.3f}",
          spread(x["rounds_ratio"], ".3f"),
          f"{x['around_us']['session']:.0f}, {x['around_us']['backend']:.0f}",
          f"{100 * x['extra']:+.1f} %"] for x in r["figures"]])}


def bench_observe(r: dict | None) -> dict[str, str]:
    """What INA_DEBUG=INFO and a rank's metrics cost a call (benchmarks/bench_observe.py),
    or a line saying that no record is committed yet."""
    if r is None:
        return {"bench_observe.md": "*Not measured yet: no record in "
                                    "`docs/results/bench-observe.json`.*\n"}
    f = r["figures"]
    conditions = [c for c in ("off", "on", "before") if c in f]
    on = f["on"]["over_off"]["median"]
    return {"bench_observe.md": provenance(r) + "\n" + table(
        ["condition", "ms a call", "over off (the rounds' ratios)"],
        [[c, spread(f[c]["ms"]), spread(f[c]["over_off"], ".3f")] for c in conditions])
        + f"\non / off {on:.3f}: the goal, at most {f['goal']:g}, "
          f"{'met' if on <= f['goal'] else 'missed'}.\n"}


def demo_figures(r: dict) -> dict:
    """A demo record's figures from each worker's answers: the slowest worker's times,
    the switch run's packets."""
    f = r["figures"]
    b = f["backends"]
    def slowest(key):
        return {k: max(a[key] for a in v) for k, v in b.items()}
    packets = sum(a["aggregation_packets"] for a in b["switch"])
    out = {"step_ratio": f["step_ratio"], "accuracy": {k: v[0]["accuracy"] for k, v in b.items()},
           "step_ms": slowest("step_time_ms"), "allreduce_ms": slowest("allreduce_ms"),
           "kb_sent_per_worker": {k: sum(a["tx_bytes"] for a in v) / len(v) / 1000 for k, v in b.items()},
           "retransmissions": sum(a["retransmissions"] for a in b["switch"]),
           "redone_share": sum(a["redone"] for a in b["switch"]) / max(packets, 1),
           "after_warmup": redone_after_warmup(b["switch"])}
    if all(v[0].get("target_steps") for v in b.values()):
        out["seconds"] = {k: max(a["time_to_target_s"] for a in v) for k, v in b.items()}
        out["steps"] = {k: v[0]["target_steps"] for k, v in b.items()}
        out["time_ratio"] = out["seconds"]["switch"] / out["seconds"]["gloo"]
    return out


DEMO_GOAL = 0.9            # switch / gloo step time every run of make bench-demo should stay under
DEMO_UNSHAPED_GOAL = 0.8   # and the small model's on unshaped links


def redone_text(figures: dict) -> str:
    """Redone blocks, of all aggregation packets and after the steps whose calls were new."""
    text = f"{figures['redone_share']:.1%} of the aggregation packets"
    if figures["after_warmup"] is None:
        return text
    share, steps = figures["after_warmup"]
    return (f"{text}, {share:.2%} after the first {steps} steps (their calls were new to the "
            f"session: the first probes every block, and in the second DDP rebuilds its buckets)")


def demo_runs(r: dict, setting: str, goal: float = DEMO_GOAL) -> str:
    """A repeated demo's every run: a single run on a shared machine says little."""
    runs = r["figures"].get("runs", [])
    if len(runs) < 2:
        return ""
    ratios = [x["step_ratio"] for x in runs]
    mid = {b: statistics.median(x["cpu_ms_per_mb"][b] for x in runs) for b in ("switch", "gloo")}
    return (f"{setting}, {len(runs)} runs (every other one gloo first): switch / gloo step time "
            f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}); "
            f"{sum(x <= goal for x in ratios)} of {len(runs)} at most {goal}. Worker CPU per MB of gradient (median of the runs): "
            f"switch {mid['switch']:.0f} ms, gloo {mid['gloo']:.0f} ms "
            f"({mid['switch'] / mid['gloo']:.2f}).\n")


def demo(small: dict, large: dict, others: list[tuple[dict, str, float]],
         large_unshaped: dict | None) -> dict[str, str]:
    """The demo's pages; ``others``: the small model's repeated runs in other settings."""
    s, l = demo_figures(small), demo_figures(large)
    md = provenance(small) + "\n"
    md += table(["", "switch", "gloo"], [
        ["test accuracy", f"{s['accuracy']['switch']:.3f}", f"{s['accuracy']['gloo']:.3f}"],
        ["ms per step (slowest worker)", f"{s['step_ms']['switch']:.1f}", f"{s['step_ms']['gloo']:.1f}"],
        ["allreduce ms", f"{s['allreduce_ms']['switch']:.1f}", f"{s['allreduce_ms']['gloo']:.1f}"],
        ["kB sent per worker", f"{s['kb_sent_per_worker']['switch']:,.0f}",
         f"{s['kb_sent_per_worker']['gloo']:,.0f}"]])
    md += (f"\nSwitch / gloo step time {spread(s['step_ratio'])}. Redone blocks: "
           f"{redone_text(s)}; retransmissions: {s['retransmissions']}.\n")
    if demo_runs(small, "Quiet machine"):
        md += "\n" + demo_runs(small, "Quiet machine (the table is the first run)")
    for r, setting, goal in others:
        md += "\n" + provenance(r) + "\n" + demo_runs(r, setting, goal)
    md_large = provenance(large) + "\n" + table(
        ["", "switch", "gloo", "switch / gloo"], [
            [f"seconds to {large['params']['accuracy']:.0%} accuracy", f"{l['seconds']['switch']:.1f}",
             f"{l['seconds']['gloo']:.1f}", f"{l['time_ratio']:.2f}"],
            ["steps to it", l["steps"]["switch"], l["steps"]["gloo"], ""],
            ["ms per step (slowest worker)", f"{l['step_ms']['switch']:.0f}",
             f"{l['step_ms']['gloo']:.0f}", f"{median(l['step_ratio']):.2f}"],
            ["allreduce ms", f"{l['allreduce_ms']['switch']:.0f}", f"{l['allreduce_ms']['gloo']:.0f}", ""],
            ["final test accuracy", f"{l['accuracy']['switch']:.3f}", f"{l['accuracy']['gloo']:.3f}", ""],
            ["kB sent per worker", f"{l['kb_sent_per_worker']['switch']:,.0f}",
             f"{l['kb_sent_per_worker']['gloo']:,.0f}", ""]])
    md_large += (f"\n{large['params']['epochs']} epochs on {large['params']['bw']:g} Mbit/s links. "
                 f"Redone blocks: {redone_text(l)}; retransmissions: {l['retransmissions']}.\n")
    if large_unshaped is not None:
        u = demo_figures(large_unshaped)
        md_large += ("\n" + provenance(large_unshaped) + "\nUnshaped links (`BW=0`): switch / "
                     f"gloo step time {spread(u['step_ratio'])}, time to "
                     f"{large_unshaped['params']['accuracy']:.0%} accuracy "
                     + (f"{u['time_ratio']:.2f}" if "time_ratio" in u else "not reached")
                     + f"; redone blocks {redone_text(u)}.\n")
    return {"demo.md": md, "demo_large.md": md_large}


def loss(r: dict) -> dict[str, str]:
    pts = r["figures"]["points"]
    body = [[f"{x['size']:,}", x["direction"], f"{x['loss_pct']:g}", spread(x["time_ms"], ".1f"),
             "-" if x["slowdown"] is None else f"{x['slowdown']:.2f}x",
             f"{x['retransmissions']:.1f}", f"{x['needed']:.1f}",
             f"{x['exact']}/{x['calls']}", f"{x['identical']}/{x['calls']}"] for x in pts]
    p = r["params"]
    shape = "one switch" if p["topo"] == "star" else f"a spine and {p['leaves']} leaves"
    md = (provenance(r) + f"\n{pts[0]['workers']} workers, {shape} (loss at {p['loss_at']}), "
          f"{pts[0]['values']} values per packet, {rate(p['bw'])}{' Mbit/s' if p['bw'] else ''} links, "
          f"{p['reps']} calls per point.\n\n![The slowdown against the loss rate](generated/loss.png)"
          f"\n\n" + table(
              ["values", "loss on", "loss %", "median ms (min-max)", "slowdown",
               "retransmissions per call", "needed", "exact", "identical"], body))
    return {"loss.md": md}


STRAGGLER_ORDER = (("reference", "straggler", "loss"), ("ina", "ina+deadline", "gloo"))


def straggler(r: dict | None) -> dict[str, str]:
    """The straggler experiment's runs, every seed's (experiments.straggler),
    and its ratios per seed with their median, or a line saying that no record is
    committed yet."""
    if r is None:
        return {"straggler.md": "*Not measured yet: no record in "
                                "`docs/results/straggler-experiment.json`.*\n"}
    f, p = r["figures"], r["params"]
    seeds, (scenarios, modes) = f["seeds"], STRAGGLER_ORDER

    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)

    def pct(value):
        return "-" if value is None else f"{value:.2f} %"
    runs = sorted(f["runs"], key=lambda x: (seeds.index(x["seed"]), scenarios.index(x["scenario"]),
                                            modes.index(x["mode"])))
    body = [[x["seed"], x["scenario"], x["mode"], x["steps"], x["slept"],
             "not held" if x["time_to_target_s"] is None else f"{x['time_to_target_s']:.1f}",
             cell(x["first_crossing_s"], ".1f"), f"{x['steps_time_s']:.1f}",
             f"{x['accuracy']:.3f}", f"{x['step_p50_ms']:.0f}", f"{x['step_p90_ms']:.0f}",
             f"{x['step_p99_ms']:.0f}", pct(x["released_pct"]), pct(x["late_pct"]),
             pct(x["carried_pct"]), x["switch_drops"],
             "-" if "load_before" not in x else  # the record at b6a6119 has no per-run load
             f"{x['load_before']:.1f}-{x['load_after']:.1f}"] for x in runs]
    target = f"{p['accuracy']:.0%}"
    steps = sorted({x["steps"] for x in f["runs"]})
    names = {"straggler_time_ratio": f"time to {target} held, with the deadline over without",
             "straggler_steps_ratio": f"time for the same {', '.join(map(str, steps))} steps, "
                                      "with the deadline over without",
             "straggler_accuracy_points": "final accuracy with the deadline minus the "
                                          "reference's, points (goal: within 0.5)",
             "loss_p99_ratio": "step p99 with loss and the deadline over the reference's "
                               "(goal: at most 1.2)"}
    ratios = [[names[k], *(cell(v, ".2f") for v in x["per_seed"]), cell(x["median"], ".2f")]
              for k, x in f["ratios"].items()]
    deadline = f"{f['deadline_ms']:.0f} ms deadline" if f["deadline_ms"] else "no deadline runs"
    md = (provenance(r) + f"\n{p.get('workers')} workers, {p.get('model')} model, "
          f"{p.get('epochs')} epochs, {rate(p.get('bw'))}{' Mbit/s' if p.get('bw') else ''} links, "
          f"{f['values_per_packet']} values per packet; median "
          f"warm-up step {f['warmup_step_ms']:.0f} ms; rank {f['straggler_rank']} sleeps "
          f"{f['sleep_ms']:.0f} ms in {p.get('p'):.0%} of its steps; {p.get('loss_pct'):g} % "
          f"loss on its port; {deadline}; seeds {', '.join(map(str, seeds))}; time to "
          f"{target} held: the first of {f['hold']} checks in a row at or above it, every "
          f"{p.get('eval_every')} steps; load: the machine's 1-minute load average as a run "
          f"started and ended.\n\n"
          + table(["seed", "scenario", "mode", "steps", "slept", f"s to {target} held",
                   "first s", "steps s", "accuracy", "p50 ms", "p90 ms", "p99 ms", "released",
                   "late", "carried", "drops", "load"], body)
          + ("\n" + table(["ratio", *(f"seed {x}" for x in seeds), f"median of {len(seeds)}"],
                          ratios) if ratios else ""))
    return {"straggler.md": md}


def sharing(r: dict | None) -> dict[str, str]:
    """The sharing experiment's runs (experiments.sharing): per seed and policy
    the jobs' mean completion times, the high jobs' ratio against FCFS and what each
    preemption cost."""
    if r is None:
        return {"sharing.md": "*Not measured yet: no record in "
                              "`docs/results/sharing-experiment.json`.*\n"}
    f, p = r["figures"], r["params"]
    order = ("priority", "fcfs")
    runs = sorted(f["runs"].items(),
                  key=lambda kv: (int(kv[0].split("-")[0]), order.index(kv[0].split("-")[1])))
    body = [[name.split("-")[0], name.split("-")[1], f"{x['mean_jct_s']:.1f}",
             f"{x['mean_jct_high_s']:.1f}", f"{x['mean_jct_low_s']:.1f}",
             f"{x['max_jct_low_s']:.1f}", f"{x['finished']}/{x['jobs']}", x["preemptions"],
             x["switch_calls"], x["gloo_calls"]] for name, x in runs]
    ratio, seeds = f["high_jct_ratio"], len(f["high_jct_ratios"])
    costs = f["preemption_costs"]
    cost = ("no job was preempted" if not costs else
            f"a preemption cost the preempted job {spread(f['preemption_gloo_calls'], 'g')} "
            f"calls on gloo and "
            + (f"{spread(f['preemption_to_return_s'], '.1f')} s from the call it left the "
               f"switch in to its first call back through it" if f["preemption_to_return_s"]
               else "never came back")
            + (f" ({f['never_back']} of them finished on gloo)" if f["never_back"] else "")
            + f", over {len(costs)} preemption{'s' * (len(costs) > 1)} (median, range)")
    md = (provenance(r) + f"\n{p['jobs']} jobs of {p['ranks']} ranks ({p.get('high', p['jobs'] // 2)} high "
          f"priority), a pool for {p['fit']}, {p['calls']} calls of {mib(p['size'])} each, "
          f"{rate(p['bw'])}{' Mbit/s' if p['bw'] else ''} links, arrivals {p['gap']:g} s apart "
          f"on average, INA_SWITCH_TIMEOUT={p['switch_timeout']:g} s, {seeds} seed"
          f"{'s' * (seeds > 1)}. JCT: from a job's arrival to its last rank's last call, s.\n\n"
          + table(["seed", "policy", "mean JCT", "high", "low", "max low", "finished",
                   "preemptions", "switch calls", "gloo calls"], body)
          + f"\nThe high jobs' mean JCT with priorities over FCFS: **{spread(ratio)}** "
          f"(per seed {', '.join(f'{x:.2f}' for x in f['high_jct_ratios'])}; goal at most "
          f"{f['goal']:g}: {f['judged']})"
          + (f"; the best any policy could give, every high job on the switch from its "
             f"arrival at the JCT of the jobs that never left it: per seed "
             f"{', '.join('-' if x is None else f'{x:.2f}' for x in f['best_high_jct_ratios'])}"
             if "best_high_jct_ratios" in f else "")
          + f"; all jobs': {spread(f['all_jct_ratio'])}; every job "
          f"finished with every result exact: {'yes' if f['all_finished'] else 'no'}. "
          f"{cost[0].upper() + cost[1:]}.{time_spent(f.get('time_spent'), p['calls'])}\n\n"
          f"![Each job's calls over time under each policy, first seed](generated/sharing.png)\n")
    return {"sharing.md": md}


def time_spent(t: dict | None, calls: int) -> str:
    """Where a sharing run's time went (experiments.sharing.time_spent), if recorded."""
    if t is None:
        return ""
    alone = ("" if t["start_s"] is None else
             f" A job that never left the switch (median): {t['start_s']:.2f} s from its "
             f"arrival to its ranks' return from init_process_group (the rendezvous, the "
             f"manager's join), {t['first_call_s']:.2f} s its first call, "
             f"{t['switch_s']:.2f} s its other {calls - 1}, {t['tail_s']:.2f} s to destroy "
             f"its group.")
    per = [f"{t[f'{way}_call_s']:.3f} s through {name}"
           for way, name in (("switch", "the switch"), ("gloo", "gloo"))
           if t[f"{way}_call_s"] is not None]
    return alone + (f" A call after a job's first took {' and '.join(per)} (mean, every "
                    f"job)." if per else "")


def fuzz(r: dict) -> dict[str, str]:
    f = r["figures"]
    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)
    rows = []
    for name, p in f["phases"].items():
        sent = sum(p["sent"].values())
        rate = sent / p["seconds"] if sent and p["seconds"] else None
        rows.append([name, cell(p["seconds"], ".2f"), f"{sent:,}", cell(rate, ",.0f"),
                     cell(p["received"], ","), cell(p.get("calls"), "d"),
                     "-" if "exact" not in p else ("yes" if p["exact"] else "no"),
                     cell(p.get("median_call_s"), ".3f"), cell(p.get("socket_errors"), ","),
                     cell(p.get("retransmissions"), ",")])
    verdict = ("every frame accounted for" if not f["problems"]
               else "problems: " + "; ".join(f["problems"]))
    return {"fuzz.md": provenance(r) + f"\n{f['frames']:,} hostile frames from {f['hosts']} hosts "
            f"({f['workers']} workers) on {f['target']} in {f['seconds']} s: {verdict}.\n\n"
            + table(["phase", "seconds", "hostile frames", "per second", "switch received",
                     "allreduce calls", "exact", "median call s", "worker socket errors",
                     "retransmissions"], rows)}


def p4c_samples(r: dict) -> dict[str, str]:
    f = r["figures"]
    outcomes = ("pass", "fail", "refused", "compile-fail", "driver-unsupported", "error")
    rows = [[t, *(str(v["outcomes"].get(o, 0)) for o in outcomes),
             f"{v['pass_where_bmv2_passes']} of {f['bmv2_passes']}" if f["bmv2_passes"] else "-",
             v["python_fallback"] or "-", v["wrong_where_bmv2_passes"]]
            for t, v in f["targets"].items()]
    return {"p4c_samples.md": provenance(r) + f"\n{f['samples']} v1model samples with an STF.\n\n"
            + table(["switch", *outcomes, "pass where BMv2 passes", "of them on the Python fallback",
                     "wrong packets where BMv2 passes"], rows)}


# -- the Tofino build: bf-p4c's resource summary, as tools/tofino_resources.py wrote it --

REGISTERS = {"bitmap_checker.bitmaps": "bitmap", "round_tracker.ages": "round age",
             "round_tracker.rounds": "round released", "contribution_counter.counts": "count",
             "exponent_max.exponents": "exponent", "fingerprint_sum.fingerprints": "fingerprint sum"}
# What a stage is for, by the tables of note placed in it (a name, or a prefix of
# p4c's generated ones), in the order the stage table names them.
ROLES = {"job_lookup.jobs": "lookups: jobs, slot_range, senders, loss probability, side by side",
         "arp_responder.arp_table": "ARP", "tbl_drop_simulator": "the loss draw",
         "l2_forwarding.mac_table": "L2",
         "bitmap_checker.check_and_mark": "the checks and the bitmap: one table, `check_and_mark`",
         "round_tracker.age_op": "the round's age and release, behind the same checks",
         "tbl_contribution_counter": "`done`", "next_step_selector.next_step": "NextStepSelector",
         "send": "`send`: result to the recirculation port, WAITING reply to its sender, or drop"}


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def tofino_summary(text: str) -> tuple[dict[str, str], list[tuple[int, list[str], list[str]]]]:
    """The summary's totals ("stateful ALUs": "36 of 48") and, per stage, its stateful
    ALUs' registers and its tables."""
    totals = dict(re.findall(r"^(\w[\w -]*?): (\d+ of \d+)", text, re.M))
    stages = [(int(n), [] if regs == "-" else regs.split(", "), tables.split(", "))
              for n, regs, tables in re.findall(r"^ *(\d+): \d+ \(([^)]*)\) \| (.*)$", text, re.M)]
    if not totals or not stages:
        raise SystemExit(f"{shown(TOFINO)}: no totals or stages (tools/tofino_resources.py)")
    return totals, stages


def alus(registers: list[str]) -> str:
    named = [REGISTERS.get(r, r) for r in registers if not r.startswith("value_aggregator.")]
    pairs = len(registers) - len(named)
    return ", ".join(named + ([f"{pairs} pair{'s' * (pairs > 1)}"] if pairs else [])) or "-"


def tofino_stages(text: str) -> dict[str, str]:
    _, stages = tofino_summary(text)

    def placed(name: str, tables: list[str]) -> bool:
        return any(t == name or (name.startswith("tbl_") and t.startswith(name)) for t in tables)
    rows = [[n, alus(regs), "; ".join(role for name, role in ROLES.items() if placed(name, tables))]
            for n, regs, tables in stages]
    return {"tofino_stages.md": f"*From `{shown(TOFINO)}`.*\n\n"
            + table(["Stage", "Stateful ALUs", "What"], rows)}


# -- figures inside a page's prose --------------------------------------------------

def pages() -> list[Path]:
    """The pages that may hold a named figure: the site's (its generated ones aside)
    and the folder READMEs."""
    return sorted([p for p in (REPO / "docs").rglob("*.md") if OUT not in p.parents]
                  + list((REPO / "innet_aggregation").rglob("README.md")))


def exponent_figures(record: dict) -> dict[str, str]:
    """The speculation rules' redone shares and precision (bench_exponents --recorded)."""
    rows = record["figures"]["rules"]

    def rule(depth: int, headroom: int, slack: int, workers: int) -> list[dict]:
        return [r for r in rows if (r["depth"], r["headroom"], r["slack"], r["workers"])
                == (depth, headroom, slack, workers)]

    def share(picked: list[dict]) -> str:
        low, high = (f"{100 * f(r['redone'] for r in picked):.1f}" for f in (min, max))
        return f"{low} %" if low == high else f"{low}-{high} %"

    def most(picked: list[dict]) -> str:
        return f"{100 * max(r['redone'] for r in picked):.1f} %"

    def waste(picked: list[dict]) -> str:
        return f"{sum(r['waste'] for r in picked) / len(picked):.1f}"

    now = [r for r in rows if r["now"]]
    return {
        "exp-before-4": share(rule(1, 2, 5, 4)),
        "exp-now-4": share(rule(3, 2, 7, 4)), "exp-now-8": share(rule(3, 2, 7, 8)),
        "exp-now-16": share(rule(3, 2, 7, 16)),
        "exp-slack6-4": most(rule(3, 2, 6, 4)), "exp-last4-4": most(rule(1, 4, 8, 4)),
        "exp-last4-waste": waste(rule(1, 4, 8, 4)),
        "exp-waste-4": waste(rule(3, 2, 7, 4)), "exp-waste-8": waste(rule(3, 2, 7, 8)),
        "exp-waste-16": waste(rule(3, 2, 7, 16)),
        "exp-worst-of-bound": f"{max(r['error_of_bound'] for r in now):.2f}",
    }


def inline_figures() -> dict[str, str]:
    """Every named figure, as the pages show it, from its record or build output."""
    demo_small = demo_figures(load("demo-small"))
    totals, _ = tofino_summary(TOFINO.read_text())
    return {
        **exponent_figures(load("bench-exponents")),
        # probes and redone blocks over all aggregation packets, the first step's included
        "demo-redone-share": f"{demo_small['redone_share']:.1%}",
        "demo-redone-after-warmup": (f"{demo_small['after_warmup'][0]:.2%}"
                                     if demo_small["after_warmup"] else "not counted"),
        "tofino-stages": totals["stages used"],
        "tofino-alus": totals["stateful ALUs"],
        "tofino-resources": f"{totals['stateful ALUs']} stateful ALUs, {totals['SRAM blocks']} "
                            f"SRAM blocks, {totals['TCAM blocks']} TCAM blocks",
    }


def with_figures(text: str, figures: dict[str, str], page: str) -> str:
    if re.search(r"^[ \t]*<!-- fig:", text, re.M):
        raise SystemExit(f"{page}: a figure's marker starts a line, where Markdown takes it for "
                         f"a block of HTML that ends the paragraph: put a word before it")

    def one(m: re.Match) -> str:
        if m[1] not in figures:
            raise SystemExit(f"{page}: <!-- fig:{m[1]} --> names no figure of "
                             f"tools/render_results.py's inline_figures(): {sorted(figures)}")
        return f"<!-- fig:{m[1]} -->{figures[m[1]]}<!-- /fig -->"
    return FIGURE.sub(one, text)


def render() -> dict[str, str]:
    """Every generated file's text, by name under docs/generated/."""
    out = {}
    out.update(bench_allreduce(load("bench-allreduce")))
    out.update(bench_scaling(load_if("bench-scaling")))
    out.update(bench_switch(load("bench-switch")))
    out.update(bench_worker(load("bench-worker")))
    out.update(bench_backend(load("bench-backend")))
    out.update(bench_observe(load_if("bench-observe")))
    others = [(r, setting, goal) for r, setting, goal in (
        (load_if("demo-small-busy1"), "Beside 1 process spinning a core (`BUSY=1`)", DEMO_GOAL),
        (load_if("demo-small-unshaped"), "Unshaped links (`BW=0`)", DEMO_UNSHAPED_GOAL))
        if r is not None]
    out.update(demo(load("demo-small"), load("demo-large"), others, load_if("demo-large-unshaped")))
    out.update(loss(load("loss-experiment")))
    out.update(straggler(load_if("straggler-experiment")))
    out.update(sharing(load_if("sharing-experiment")))
    out.update(fuzz(load("fuzz")))
    out.update(p4c_samples(load("p4c-samples")))
    out.update(tofino_stages(TOFINO.read_text()))
    return out


def plot_all() -> list[Path]:
    """Every plot the docs show, from the same records as the tables."""
    sweep = load("bench-allreduce")
    paths = [OUT / "switch_vs_ring.png"]
    plot_switch_vs_ring(sweep, paths[0])
    for values in sorted({x["values"] for x in sweep_points(sweep)}):
        paths.append(OUT / f"bench_allreduce_{values}.png")
        plot_switch_vs_ring(sweep, paths[-1], values)
    scaling = load_if("bench-scaling")
    if scaling:
        paths.append(OUT / "bench_scaling.png")
        plot_scaling(scaling, paths[-1])
    paths.append(OUT / "loss.png")
    plot_loss(load("loss-experiment"), paths[-1])
    shared = load_if("sharing-experiment")
    if shared:
        paths.append(OUT / "sharing.png")
        plot_sharing(shared["figures"]["timeline"], shared["params"]["seed"], paths[-1])
    return paths


def readme_block() -> str:
    return f"{BEGIN}\n{switch_vs_ring_text(load('bench-allreduce'), 'docs/generated/')}{END}"


def readme_with_block(text: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: readme_block(), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each file that differs from its record")
    args = parser.parse_args(argv)
    files = render()
    stale = [name for name, text in files.items()
             if not (OUT / name).exists() or (OUT / name).read_text() != text]
    readme = README.read_text()
    if readme_with_block(readme) != readme:
        stale.append("README.md")
    figures = inline_figures()
    rewritten = {}
    for page in pages():
        text = page.read_text()
        new = with_figures(text, figures, str(page.relative_to(REPO)))
        if new != text:
            rewritten[page] = new
            stale.append(str(page.relative_to(REPO)))
    if args.check:
        for name in stale:
            print(f"{name}: differs from its record in docs/results/ or its build output "
                  f"(python tools/render_results.py)")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (OUT / name).write_text(text)
    plots = plot_all()
    README.write_text(readme_with_block(readme))
    for page, text in rewritten.items():
        page.write_text(text)
    print(f"wrote {len(files)} files and {len(plots)} plots in {OUT.relative_to(REPO)}, README's "
          f"figure, and the figures in {len(rewritten)} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
