"""Train a small model with DDP across the testbed: gradients summed in the switch, then with gloo.

    python -m testbed.demo --workers 4 [--epochs 5] [--bw 20] [--target softswitch|bmv2]

A 64-32-10 MLP on scikit-learn's digits, one process per Mininet host. The gloo
process group (rendezvous over the hosts' addresses, through the switch) starts
DDP; in the first run a DDP communication hook sends every gradient bucket through
the switch's aggregation pipeline, in the second gloo's own allreduce (TCP, also
through the switch, as plain L2 forwarding) does. Same seed, data and steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .layout import add_topology_arguments
from .targets import add_switch_arguments, default_target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="per-worker batch size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--bw", type=float, default=20.0, help="link rate, Mbit/s")
    add_switch_arguments(parser)
    add_topology_arguments(parser)
    return parser


def run(args) -> None:
    from .agents import HostAgents
    from .topology import Testbed

    target = args.target or default_target()
    t0 = time.monotonic()
    shape = "switch" if args.topo == "star" else f"spine and {args.leaves} leaf switches"
    print(f"[demo] starting the topology: {args.workers} hosts, {target} {shape}, "
          f"links {args.bw:g} Mbit/s", flush=True)
    with Testbed(args.workers, bw=args.bw, target=target, num_slots=args.slots,
                 topo=args.topo, leaves=args.leaves, tls=args.tls,
                 grpc_host=args.grpc_host) as testbed:
        print("[demo] job installed by the controller; starting one worker process per host "
              "(torch import, gloo rendezvous through the switch)", flush=True)
        with HostAgents(testbed) as agents:
            results = {}
            for backend in ("switch", "gloo"):
                label = "in-switch aggregation" if backend == "switch" else "gloo allreduce"
                print(f"[demo] training with {label}, {args.epochs} epochs", flush=True)
                results[backend] = agents.call({"op": "train", "backend": backend,
                                                "epochs": args.epochs, "batch": args.batch,
                                                "lr": args.lr, "seed": 0}, timeout=1800)
            counters = testbed.switch_counters()
    report(results, counters, args, target)
    print(f"[demo] done in {time.monotonic() - t0:.0f} s", flush=True)


def report(results: dict[str, list[dict]], counters: dict, args, target: str) -> None:
    first = results["switch"][0]
    print(f"\nDDP on {args.workers} workers: 64-32-10 MLP ({first['parameters']} parameters), "
          f"digits, {first['steps']} steps of {args.batch} samples per worker, {target} "
          f"{'switch' if args.topo == 'star' else f'spine and {args.leaves} leaves'}, "
          f"{args.bw:g} Mbit/s links\n")
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
        print(f"{backend:<12} {accuracy:>9.3f} {step:>8.1f} {allreduce:>13.1f} {cpu:>12.1f} "
              f"{sent:>15.1f} {retrans:>16}")
    switch = results["switch"]
    packets = sum(a["aggregation_packets"] for a in switch)
    redone = sum(a["redone"] for a in switch)
    print(f"\nswitch / gloo step time: {step_ratio(results):.2f}. Aggregation packets: {packets} "
          f"sent by the {len(switch)} workers, {redone} of them ({redone / max(packets, 1):.1%}) "
          f"blocks redone because\nthe speculated exponent missed (the first step probes every "
          f"block).")
    print("\nms/step: median step time (forward, backward, allreduce, update) of the slowest "
          "worker.\nallreduce ms: median time from DDP's call of the comm hook to its result, "
          "slowest worker\n(it includes waiting for the slowest worker's gradients).\nCPU ms/step: "
          "processor time of a worker process per step (mean over workers; the kernel's\n"
          "work for its sockets included, the switch's not).\nKB sent: bytes each worker's interface transmitted during training, headers "
          "included. The switch\nrun sends each 64-value block once (312 B frames), plus redone "
          "blocks and retransmissions; gloo's\nring sends 2(n-1)/n of the gradient per step in "
          "TCP segments.\nretransmissions: aggregation packets resent after a loss was detected "
          "or a timer fired (switch),\nTCP segments (gloo).")
    for switch, outcomes in counters.items():
        admitted = {k: v["packets"] for k, v in outcomes.items() if v["packets"]}
        if admitted:
            print(f"\n{switch} counters (packets): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(admitted.items())))


def step_ratio(results: dict[str, list[dict]]) -> float:
    """Slowest worker's median step time through the switch over gloo's."""
    slowest = {b: max(a["step_time_ms"] for a in answers) for b, answers in results.items()}
    return slowest["switch"] / slowest["gloo"]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("demo: needs root (Mininet creates namespaces and links)", file=sys.stderr)
        return 1
    try:
        run(args)
    except Exception as exc:
        print(f"demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted; the topology was torn down", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
