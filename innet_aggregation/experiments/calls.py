"""The measuring core of the allreduce experiments (bench-allreduce, bench-scaling):
timed calls on a running testbed's hosts, the links' delivered rate, and each path's
figures at a point (median and 95 % interval, link time, first transmissions, where
the switch path's time went), with the command-line options they share.
"""

from __future__ import annotations

import math
import statistics

from ..testbed.gradients import DATA
from ..testbed.gradients import load as load_gradients
from ..testbed.links import check_rate, check_workers
from .link_model import agg_frame_bytes, capacity_mbit, link_time_s
from .stats import MIN_CALLS, median_interval

WARMUP = 2                      # unrecorded calls a point: the first probes every block
MAX_REPS = 200                  # a point's timed calls, however short its calls
BULK_PORT = 5201
CSV_FIELDS = ["topo", "workers", "values", "mtu", "size", "bytes", "bw_mbit", "data", "backend",
              "rep", "time_s", "cpu_worker_s", "cpu_switch_s", "first_tx", "retransmissions",
              "redone", "tx_bytes", "capacity_mbit"]


def csv_list(kind):
    """An option's comma-separated values, each parsed by ``kind``."""
    def parse(text: str):
        return [kind(x) for x in text.split(",") if x.strip()]
    return parse


def add_measure_arguments(parser) -> None:
    parser.add_argument("--reps", type=int, default=MIN_CALLS,
                        help=f"timed calls a point, after {WARMUP} warm-up calls (default "
                             f"{MIN_CALLS}: medians with a 95 %% bootstrap interval; fewer are "
                             f"measured but never judged against a goal)")
    parser.add_argument("--min-timed-s", type=float, default=2.0,
                        help=f"a point takes more than --reps timed calls where its calls are "
                             f"short, so that they last at least this many seconds (at most "
                             f"{MAX_REPS} calls): single short calls vary most")
    parser.add_argument("--data", choices=DATA, default="recorded",
                        help="what the calls sum: recorded DDP gradients (testbed.gradients, "
                             "make record-gradients), normal floats, or integers (whose block "
                             "exponents never change: no block is ever redone) (default recorded)")


def check_arguments(args) -> None:
    """Everything refusable, refused before a testbed starts."""
    for bw in args.bw:
        check_rate(bw)
    for n in args.workers:
        check_workers(n)
    if args.reps < 1:
        raise ValueError(f"--reps must be at least 1, not {args.reps}")
    if args.min_timed_s < 0:
        raise ValueError(f"--min-timed-s must not be negative, not {args.min_timed_s}")
    if args.data == "recorded":
        load_gradients()


def timed_calls(reps: int, call_s: float, min_timed_s: float) -> int:
    """``reps``, or more where ``call_s`` is short: enough to last ``min_timed_s``."""
    return max(reps, min(MAX_REPS, math.ceil(min_timed_s / max(call_s, 1e-6))))


def measure(testbed, agents, backend: str, size: int, reps: int, ina: bool = False,
            data: str = "integers", min_timed_s: float = 0.0) -> list[dict]:
    """``WARMUP`` unrecorded calls, then ``reps`` timed ones (more if the last warm-up
    call took under ``min_timed_s / reps``): per rep the slowest worker's time, the
    workers' mean CPU and first transmissions, the most bytes a worker put on its
    link, the blocks redone (every worker redoes the same), the switch's CPU per
    call. With ``ina`` the switch's calls go through the torch backend (recorded as
    "switch")."""
    wire = "ina" if ina and backend == "switch" else backend
    warm = agents.call({"op": "allreduce", "backend": wire, "size": size, "reps": WARMUP,
                        "seed": reps, "barrier": True, "data": data, "first_call": 0},
                       timeout=1800)
    reps = timed_calls(reps, max(a["times"][-1] for a in warm), min_timed_s)
    cpu = testbed.switch_cpu_seconds()
    answers = agents.call({"op": "allreduce", "backend": wire, "size": size, "reps": reps,
                           "seed": 0, "barrier": True, "data": data, "first_call": WARMUP},
                          timeout=1800)
    switch_cpu = (testbed.switch_cpu_seconds() - cpu) / reps
    if not all(all(a["exact"]) for a in answers):
        raise RuntimeError(f"{backend} allreduce of {size} values on {len(answers)} workers "
                           f"returned a wrong sum")
    return [{"backend": backend, "size": size, "bytes": 4 * size, "rep": r, "data": data,
             "time_s": max(a["times"][r] for a in answers),
             "cpu_worker_s": statistics.mean(a["cpu"][r] for a in answers),
             "cpu_switch_s": switch_cpu,
             "first_tx": statistics.mean(a["packets"][r] - a["retransmissions"][r]
                                         for a in answers),
             "retransmissions": sum(a["retransmissions"][r] for a in answers),
             "redone": answers[0]["redone"][r],
             "tx_bytes": max(a["tx_bytes"][r] for a in answers),
             # The slowest worker's: where the call's time went (worker/breakdown.py).
             "breakdown": max(answers, key=lambda a: a["times"][r])["breakdown"][r]
             if "breakdown" in answers[0] else None}
            for r in range(reps)]


def breakdown_ms(rows: list[dict]) -> dict | None:
    """The switch path's calls' phases (their slowest worker's), medians in ms, and
    the wait's split."""
    calls = [r["breakdown"] for r in rows if r.get("breakdown")]
    if not calls:
        return None
    phases = {name: 1e3 * statistics.median(c["phases"][name] for c in calls)
              for name in calls[0]["phases"]}
    return {**phases, "other": 1e3 * statistics.median(c["other"] for c in calls),
            "ranks_wait": 1e3 * statistics.median(c["ranks_wait_s"] for c in calls),
            "network_wait": 1e3 * statistics.median(c["network_wait_s"] for c in calls)}


def breakdown_line(switch: list[dict], gloo: list[dict]) -> str:
    """Where the switch path's median call went, beside gloo's median time."""
    ms = breakdown_ms(switch)
    t_sw = 1e3 * statistics.median(r["time_s"] for r in switch)
    t_gloo = 1e3 * statistics.median(r["time_s"] for r in gloo)
    phases = ", ".join(f"{name} {value:.2f}" for name, value in
                       sorted(((n, v) for n, v in ms.items()
                               if n not in ("ranks_wait", "network_wait") and v >= 0.005),
                              key=lambda item: -item[1]))
    return (f"  switch path {t_sw:.2f} ms (gloo {t_gloo:.2f} ms), its phases' medians in ms: "
            f"{phases}; of the wait, ranks {ms['ranks_wait']:.2f}, switch and wire "
            f"{ms['network_wait']:.2f}")


def measure_capacity(agents, payload: int, reps: int) -> dict:
    """The links' delivered rate (link_model.capacity_mbit), Mbit/s of frames: a TCP transfer of
    ``payload`` bytes from worker 0 to worker 1, ``reps`` times, each after a pause."""
    answers = agents.call({"op": "bulk", "bytes": payload, "reps": reps, "port": BULK_PORT},
                          timeout=1800)
    sender, receiver = answers[0], answers[1]
    rates = [capacity_mbit(w, payload, f, t) for w, f, t in
             zip(sender["tx_bytes"], receiver["first_chunk"], receiver["seconds"])]
    return median_interval(rates)


def interval_ms(values: list[float]) -> dict:
    return {k: (1000 * v if k != "n" else v) for k, v in median_interval(values).items()}


def path_figures(rows: list[dict], nominal_mbit: float | None, values: int) -> dict:
    """One path's figures at one point: time (median, 95 % interval), the link time its
    bytes need at the delivered capacity, first transmissions against the nominal rate."""
    size = rows[0]["size"]
    t = interval_ms([r["time_s"] for r in rows])
    capacity = rows[0]["capacity_mbit"]
    link_ms = 1000 * link_time_s(statistics.median(r["tx_bytes"] for r in rows), capacity)
    share = None
    if nominal_mbit and rows[0]["backend"] == "switch":
        link_pps = nominal_mbit * 1e6 / (8 * agg_frame_bytes(values))
        share = statistics.median(r["first_tx"] / r["time_s"] for r in rows) / link_pps
    mb = 4 * size / 1e6
    return {"time_ms": t, "wire_bytes": statistics.median(r["tx_bytes"] for r in rows),
            "capacity_mbit": capacity, "link_ms": link_ms,
            "link_share": link_ms / t["median"], "first_tx_share": share,
            "redone_per_call": statistics.mean(r["redone"] for r in rows),
            "blocks_per_call": -(-size // values),
            "retransmissions": sum(r["retransmissions"] for r in rows),
            "cpu_worker_ms_per_mb": 1000 * statistics.median(r["cpu_worker_s"] for r in rows) / mb,
            "cpu_switch_ms_per_mb": 1000 * statistics.median(r["cpu_switch_s"] for r in rows) / mb,
            "breakdown_ms": breakdown_ms(rows)}


def ms(s: dict) -> str:
    return f"{s['median']:.1f} ({s['lo']:.1f}-{s['hi']:.1f})"
