"""Train a model with DDP across the testbed: gradients summed in the switch, then with gloo.

    python -m innet_aggregation.experiments.demo --workers 4 [--model small|large] [--epochs E] [--bw MBIT]
                           [--target softswitch|bmv2] [--chaos] [--busy N] [--runs R]

An MLP on scikit-learn's digits, one process per Mininet host. The gloo process
group (rendezvous over the hosts' addresses, through the switch) starts DDP; in the
first run a DDP communication hook sends every gradient bucket through the switch's
aggregation pipeline, in the second gloo's own allreduce (TCP, also through the
switch, as plain L2 forwarding) does. Same seed, data and steps.

``small`` (the default, quick): 64-32-10, 2,410 parameters, 20 Mbit/s links; its
step is mostly the workers' CPU. ``large``: 64-1024-1024-10, 1.13 M parameters
(4.5 MB of gradient a step), 100 Mbit/s links, where the links set the pace; it
also measures each backend's time to a test accuracy (--accuracy), the clock
stopped while worker 0 scores the held-out fifth of the digits.

``--busy N`` (``make demo BUSY=N``) trains both backends beside N processes that spin a
core each (testbed/busy.py): the machine as busy as a training host, the same for both.
``--runs R`` (``make demo RUNS=R``; ``make bench-demo`` runs 5 quiet and 5 busy) repeats
the pair R times on the same hosts, every other run gloo first, and reports every run's
ratio and each backend's worker CPU per MB of gradient: one run on a shared machine
says little.

``--chaos`` (``make demo CHAOS=1``) trains through the job manager instead, while the
switch is killed and restarted and then the job's lease revoked (``chaos.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from innet_aggregation.p4src import protocol

from . import record
from .link_model import agg_frame_bytes
from .models import MODELS
from ..testbed.layout import add_program_argument, add_topology_arguments, check_deadline
from .progress import Progress
from .trace_picture import draw
from ..testbed.stopping import Stopped, stop_on_signals
from ..testbed.targets import add_switch_arguments, default_target


BACKENDS = ("switch", "gloo")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--model", choices=MODELS, default="small",
                        help="small: 64-32-10 (quick); large: 64-1024-1024-10, 1.13 M "
                             "parameters, with time to accuracy (default small)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="default: the model's (small 5, large 8)")
    parser.add_argument("--batch", type=int, default=32, help="per-worker batch size")
    parser.add_argument("--lr", type=float, default=None,
                        help="Adam's learning rate (default: small 0.01, large 0.001)")
    parser.add_argument("--bw", type=float, default=None,
                        help="link rate, Mbit/s, 0 for unshaped links (default: small 20, "
                             "large 100)")
    parser.add_argument("--accuracy", type=float, default=None,
                        help="time each backend to this test accuracy (default: large 0.95, "
                             "small none)")
    parser.add_argument("--eval-every", type=int, default=5,
                        help="steps between accuracy checks when timing one (default 5)")
    parser.add_argument("--ina", action="store_true",
                        help="train through torch.distributed's ina backend (DDP with no hook) "
                             "instead of the switch's DDP hook")
    parser.add_argument("--chaos", action="store_true",
                        help="through the job manager, the switch killed and restarted during "
                             "training, then the job's lease revoked; per step the path taken, "
                             "and the accuracy against gloo's (experiments/chaos.py)")
    parser.add_argument("--deadline-ms", type=float, default=0.0,
                        help="bounded-time aggregation: the job's deadline, the switch's and "
                             "every session's (default 0: none); prints what it released")
    parser.add_argument("--busy", type=int, default=0,
                        help="CPU-bound processes spinning beside both backends' training "
                             "(default 0)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="write torch.profiler traces (Chrome JSON) of 2 steps after the "
                             "warm-up, per worker and backend, into DIR, and a picture of "
                             "worker 0's switch calls (DIR/switch-rank0.png)")
    parser.add_argument("--runs", type=int, default=1,
                        help="train both backends this many times, every other run gloo "
                             "first (default 1)")
    add_switch_arguments(parser)
    add_topology_arguments(parser)
    add_program_argument(parser)
    return parser


def settle(args) -> argparse.Namespace:
    """Fill in the model's defaults and refuse settings that cannot run."""
    model = MODELS[args.model]
    for name in ("epochs", "lr", "bw", "accuracy"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(model, name))
    if args.epochs < 1 or args.batch < 1 or args.eval_every < 1 or args.runs < 1:
        raise ValueError("--epochs, --batch, --eval-every and --runs must be at least 1")
    if args.busy < 0:
        raise ValueError(f"--busy must not be negative, not {args.busy}")
    if args.lr <= 0 or args.bw < 0:
        raise ValueError("--lr must be positive and --bw not negative")
    if args.accuracy is not None and not 0 < args.accuracy <= 1:
        raise ValueError(f"--accuracy is a fraction in (0, 1], not {args.accuracy}")
    if args.runs > 1 and args.chaos:
        raise ValueError("--runs with --chaos: the chaos run kills and restarts the switch "
                         "once, through one training")
    if args.deadline_ms and args.chaos:
        raise ValueError("--deadline-ms with --chaos: the chaos run's job comes from the job "
                         "manager, not this testbed's job file")
    check_deadline(args.deadline_ms)
    return args


def run(args) -> None:
    from ..testbed.agents import HostAgents
    from ..testbed.busy import busy
    from ..testbed.topology import Testbed

    target = args.target or default_target()
    t0, load = time.monotonic(), os.getloadavg()[0]
    shape = "switch" if args.topo == "star" else f"spine and {args.leaves} leaf switches"
    print(f"[demo] starting the topology: {args.workers} hosts, {target} {shape}, "
          f"links {f'{args.bw:g} Mbit/s' if args.bw else 'unshaped'}", flush=True)
    with Testbed(args.workers, bw=args.bw or None, target=target, num_slots=args.slots,
                 topo=args.topo, leaves=args.leaves, tls=args.tls,
                 grpc_host=args.grpc_host, values_per_packet=args.values,
                 deadline_ms=args.deadline_ms, io_threads=args.io_threads) as testbed:
        print("[demo] job installed by the controller; starting one worker process per host "
              "(torch import, gloo rendezvous through the switch)", flush=True)
        with HostAgents(testbed) as agents:
            command = {"op": "train", "epochs": args.epochs, "batch": args.batch,
                       "lr": args.lr, "seed": 0, "hidden": list(MODELS[args.model].hidden),
                       "accuracy": args.accuracy, "eval_every": args.eval_every}
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                command["profile"] = str(args.profile.resolve())
            if args.busy:
                print(f"[demo] {args.busy} processes spinning a core each beside both "
                      f"backends", flush=True)
            runs = []
            progress = Progress(len(BACKENDS) * args.runs, "demo")
            with busy(args.busy):
                for run_index in range(args.runs):
                    runs.append(train_pair(agents, command, args, run_index, progress))
            counters = testbed.switch_counters()
            fmt = testbed.program.format
    first = {b: runs[0][b] for b in BACKENDS}
    report(first, counters, args, target, fmt)
    if args.runs > 1:
        print(runs_line(runs))
    if args.profile:
        picture = args.profile / "switch-rank0.png"
        draw(args.profile / "switch-rank0.json", picture,
             f"worker 0 of {args.workers}, {MODELS[args.model].name()}, two DDP steps through "
             f"the switch ({f'{args.bw:g} Mbit/s' if args.bw else 'unshaped'} links)")
        print(f"[demo] traces in {args.profile}; worker 0's switch calls: {picture}")
    record.write(record_name(args), {"step_ratio": (step_ratio(runs[0]) if len(runs) == 1 else
                                                  record.spread([step_ratio(r) for r in runs])),
                                   "backends": first, "runs": [run_summary(r) for r in runs]},
                 params=vars(args), load_before=load)
    print(f"[demo] done in {time.monotonic() - t0:.0f} s", flush=True)


def record_name(args) -> str:
    """demo-MODEL for the model's own links, with what differs from them: the links'
    rate and the busy processes, so a busy or unshaped run keeps its own record."""
    bw = "" if args.bw == MODELS[args.model].bw else (f"-{args.bw:g}mbit" if args.bw else
                                                      "-unshaped")
    return f"demo-{args.model}{bw}" + (f"-busy{args.busy}" if args.busy else "")


def train_pair(agents, command: dict, args, run_index: int, progress: Progress) -> dict:
    """Both backends once, on the same hosts and data; every other run gloo goes first,
    so neither always trains on a warmer (or a more disturbed) machine."""
    order = BACKENDS if run_index % 2 == 0 else BACKENDS[::-1]
    results = {}
    for backend in order:
        label = ("gloo allreduce" if backend == "gloo" else "in-switch aggregation"
                 + (" (the ina backend)" if args.ina else ""))
        wire = "ina" if args.ina and backend == "switch" else backend
        of = f" (run {run_index + 1} of {args.runs})" if args.runs > 1 else ""
        progress.say(f"[demo] training with {label}, {args.epochs} epochs{of}")
        results[backend] = agents.call(dict(command, backend=wire), timeout=1800)
        progress.advance(f"{backend}{of}")
    return {"first": order[0], **{b: results[b] for b in BACKENDS}}


def cpu_ms_per_mb(answers: list[dict]) -> float:
    """A worker's processor time per MB of float32 gradient it reduced (mean over workers):
    the step's forward and backward are the same for both backends, so the difference
    between them is what the allreduce costs the host."""
    return sum(a["cpu_ms_per_step"] / (4e-6 * a["parameters"]) for a in answers) / len(answers)


def run_summary(results: dict) -> dict:
    return {"first": results["first"], "step_ratio": step_ratio(results),
            "step_ms": {b: max(a["step_time_ms"] for a in results[b]) for b in BACKENDS},
            "cpu_ms_per_mb": {b: cpu_ms_per_mb(results[b]) for b in BACKENDS}}


def runs_line(runs: list[dict]) -> str:
    summaries = [run_summary(r) for r in runs]
    ratios = ", ".join(f"{s['step_ratio']:.2f}" for s in summaries)
    cpu = {b: [s["cpu_ms_per_mb"][b] for s in summaries] for b in BACKENDS}
    mid = {b: statistics.median(v) for b, v in cpu.items()}
    return (f"\n{len(runs)} runs (every other one gloo first), switch / gloo step time: {ratios}."
            f"\nWorker CPU per MB of gradient, median of the runs: switch {mid['switch']:.0f} ms, "
            f"gloo {mid['gloo']:.0f} ms ({mid['switch'] / mid['gloo']:.2f}).")


def report(results: dict[str, list[dict]], counters: dict, args, target: str,
           fmt: protocol.PacketFormat) -> None:
    first = results["switch"][0]
    print(f"\nDDP on {args.workers} workers: {MODELS[args.model].name()} "
          f"({first['parameters']:,} parameters), "
          f"digits, {first['steps']} steps of {args.batch} samples per worker, {target} "
          f"{'switch' if args.topo == 'star' else f'spine and {args.leaves} leaves'}, "
          f"{f'{args.bw:g} Mbit/s' if args.bw else 'unshaped'} links\n")
    header = (f"{'aggregation':<12} {'accuracy':>9} {'ms/step':>8} {'allreduce ms':>13} "
              f"{'CPU ms/step':>12} {'KB sent/worker':>15} {'retransmissions':>16}")
    print(header)
    print("-" * len(header))
    for backend, answers in results.items():
        accuracy = answers[0]["accuracy"]
        step = max(a["step_time_ms"] for a in answers)
        allreduce = max(a["allreduce_ms"] for a in answers)
        cpu = sum(a["cpu_ms_per_step"] for a in answers) / len(answers)
        sent = sum(a["tx_bytes"] for a in answers) / len(answers) / 1000
        if backend == "switch":
            retrans = f"{sum(a['retransmissions'] for a in answers)} packets"
        else:
            retrans = f"{sum(a['tcp_retrans'] for a in answers)} TCP segs"
        name = "switch (ina)" if backend == "switch" and args.ina else backend
        print(f"{name:<12} {accuracy:>9.3f} {step:>8.1f} {allreduce:>13.1f} {cpu:>12.1f} "
              f"{sent:>15.1f} {retrans:>16}")
    if args.accuracy is not None:
        time_to_accuracy(results, args)
    switch = results["switch"]
    packets = sum(a["aggregation_packets"] for a in switch)
    redone = sum(a["redone"] for a in switch)
    print(f"\nswitch / gloo step time: {step_ratio(results):.2f}. Aggregation packets: {packets} "
          f"sent by the {len(switch)} workers, {redone} of them ({redone / max(packets, 1):.1%}) "
          f"blocks redone because\nthe speculated exponent missed (the first step probes every "
          f"block){after_warmup(switch)}.")
    print("\nms/step: median step time (forward, backward, allreduce, update) of the slowest "
          "worker.\nallreduce ms: median time from DDP's call of the comm hook to its result, "
          "slowest worker\n(it includes waiting for the slowest worker's gradients).\nCPU ms/step: "
          "processor time of a worker process per step (mean over workers; the kernel's\n"
          "work for its sockets included, the switch's not).\nKB sent: bytes each worker's interface transmitted during training, headers "
          f"included. The switch\nrun sends each {fmt.values_per_packet}-value block once "
          f"({agg_frame_bytes(fmt.values_per_packet)} B frames), plus redone "
          "blocks and retransmissions; gloo's\nring sends 2(n-1)/n of the gradient per step in "
          "TCP segments.\nretransmissions: aggregation packets resent after a loss was detected "
          "or a timer fired (switch),\nTCP segments (gloo).")
    line = breakdown_line(switch, results["gloo"])
    if line:
        print(line)
    if args.deadline_ms:
        print(deadline_line(switch, args.deadline_ms))
    for switch, outcomes in counters.items():
        admitted = {k: v["packets"] for k, v in outcomes.items() if v["packets"]}
        if admitted:
            print(f"\n{switch} counters (packets): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(admitted.items())))


def breakdown_line(switch: list[dict], gloo: list[dict]) -> str | None:
    """Where the slowest worker's mean switch call went after the warm-up, beside
    gloo's allreduce time (worker/breakdown.py)."""
    answers = [a for a in switch if a.get("breakdown") and a["breakdown"]["calls"]]
    if not answers:
        return None
    slowest = max(answers, key=lambda a: a["breakdown"]["seconds"])
    b = slowest["breakdown"]
    phases = {**b["phases"], "other": b["other"]}
    parts = ", ".join(f"{name} {1e3 * value:.2f}" for name, value in
                      sorted(phases.items(), key=lambda item: -item[1]) if value >= 5e-6)
    return (f"\nwhere the switch path's time went (worker {switch.index(slowest)}, the mean of "
            f"its {b['calls']} calls after the warm-up, ms): {1e3 * b['seconds']:.2f} = "
            f"{parts}; of the wait, ranks {1e3 * b['ranks_wait_s']:.2f}, switch and wire "
            f"{1e3 * b['network_wait_s']:.2f}. gloo's allreduce: "
            f"{max(a['allreduce_ms'] for a in gloo):.2f} ms a bucket (INA_DEBUG=INFO: a line "
            f"per call).")


def time_to_accuracy(results: dict[str, list[dict]], args) -> None:
    """Each backend's training time to the target accuracy, and its spread of step times."""
    print(f"\ntime to {args.accuracy:.0%} test accuracy (checked every {args.eval_every} steps; "
          f"every worker's clock stops while worker 0 checks):\n")
    header = (f"{'aggregation':<12} {'steps':>6} {'seconds':>8} {'ms/step median (min-max)':>25} "
              f"{'final accuracy':>15}")
    print(header)
    print("-" * len(header))
    seconds = {}
    for backend, answers in results.items():
        slowest = max(answers, key=lambda a: a["step_time_ms"])
        spread = (f"{slowest['step_time_ms']:.0f} ({slowest['step_min_ms']:.0f}-"
                  f"{slowest['step_max_ms']:.0f})")
        if answers[0]["target_steps"] is None:
            steps, took = "-", "not reached"
        else:
            seconds[backend] = max(a["time_to_target_s"] for a in answers)
            steps, took = str(answers[0]["target_steps"]), f"{seconds[backend]:.1f}"
        print(f"{backend:<12} {steps:>6} {took:>8} {spread:>25} {answers[0]['accuracy']:>15.3f}")
    if len(seconds) == 2:
        print(f"\nswitch / gloo time to {args.accuracy:.0%}: "
              f"{seconds['switch'] / seconds['gloo']:.2f}")
    else:
        print(f"\n{args.accuracy:.0%} was not reached by {' and '.join(sorted(set(results) - set(seconds)))}"
              f" in {args.epochs} epochs: more --epochs, or a lower --accuracy.")
    print("seconds: training wall time, slowest worker, up to the step after which the check "
          "passed.\nms/step: the slowest worker's median step and its fastest and slowest.")


def deadline_line(answers: list[dict], deadline_ms: float) -> str:
    """What a deadline released, from every worker's session counters (train.py)."""
    if not all("released" in a for a in answers):
        return f"\ndeadline {deadline_ms:g} ms: the workers count no releases"
    results = sum(a["results_received"] for a in answers)
    values = sum(a["steps"] * a["parameters"] for a in answers)
    released, late = (sum(a[k] for a in answers) for k in ("released", "late"))
    carried = sum(a["carried_values"] for a in answers)
    return (f"\ndeadline {deadline_ms:g} ms: {released} results released early "
            f"({released / max(results, 1):.2%} of the workers' results), {late} blocks late "
            f"({late / max(results, 1):.2%}), {carried} gradient values carried into the next "
            f"step ({carried / max(values, 1):.2%}).")


def redone_after_warmup(answers: list[dict]) -> tuple[float, int] | None:
    """Redone blocks' share of the aggregation packets after the warm-up steps, whose
    calls are new to the session (train.WARMUP_STEPS), and how many those were; None
    for answers without them (a record from before they were counted)."""
    if not answers or any("warmup_redone" not in a for a in answers):
        return None
    redone = sum(a["redone"] - a["warmup_redone"] for a in answers)
    packets = sum(a["aggregation_packets"] - a["warmup_packets"] for a in answers)
    return redone / max(packets, 1), answers[0]["warmup_steps"]


def after_warmup(answers: list[dict]) -> str:
    """The share after the warm-up steps, as a clause of the demo's report (or nothing)."""
    share = redone_after_warmup(answers)
    return ("" if share is None else f"; after the first {share[1]} steps, whose calls are "
            f"new to the session, {share[0]:.2%}")


def step_ratio(results: dict) -> float:
    """Slowest worker's median step time through the switch over gloo's."""
    slowest = {b: max(a["step_time_ms"] for a in results[b]) for b in BACKENDS}
    return slowest["switch"] / slowest["gloo"]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settle(args)
    except ValueError as exc:
        parser.error(str(exc))
    if os.geteuid() != 0:
        print("demo: needs root (Mininet creates namespaces and links)", file=sys.stderr)
        return 1
    stop_on_signals()
    try:
        if args.chaos:
            from . import chaos
            chaos.run(args)
        else:
            run(args)
    except Exception as exc:
        print(f"demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"demo: stopped by {stop.name}; the topology was torn down", file=sys.stderr)
        return stop.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
