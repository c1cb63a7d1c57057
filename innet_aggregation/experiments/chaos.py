"""``make demo`` with ``--chaos``: DDP on the digits through the job manager while
the switch's side goes away, and the same training on gloo alone.

    python -m innet_aggregation.experiments.demo --chaos [--workers 3] [--epochs 6]

Hosts in namespaces with a management network (the manager, rendezvous and gloo on
it, as in a cluster), one switch process, the manager (``switch_ctl serve``). Three
runs of the same model, data and steps, each rank on the ``ina`` backend (DDP with
no hook), ``INA_SWITCH_TIMEOUT=2`` (or the caller's INA_SWITCH_TIMEOUT): in phase ``switch`` the switch is killed at
step FAULT_STEP and started again 5 s later (the manager puts the job back); in phase
``lease`` the ranks' way to the manager is cut until the manager has reclaimed the
job's lease (and taken it off the switch); then ``gloo``, the reference. Per step,
the path its calls took (through the switch, or gloo) and its time; at the end each
run's test accuracy against gloo's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


FAULT_STEP = 15
PAUSE = 0.2                     # seconds between steps: the run outlasts a restart
SECRET = "chaos-demo-secret"
LEASE, SWEEP = 3.0, 0.5
SWITCH_TIMEOUT = "2"
PORT = 29700


def run(args) -> int:
    from innet_aggregation.p4src import protocol
    from ..testbed.layout import link_mtu
    from ..testbed.netns import Namespaces
    from ..testbed.targets import SwitchProcess, default_target, free_tcp_port, start_manager
    from ..testbed.tls import make_bundle

    target = args.target or default_target()
    workdir = Path(tempfile.mkdtemp(prefix="ina-chaos-"))
    topology = Namespaces(args.workers, tag=f"ch{os.getpid() % 100000}", management=True,
                          mtu=link_mtu(protocol.packet_format())).create()
    switch = manager = None
    try:
        tls = make_bundle(workdir / "tls", hosts=(topology.mgmt_address,))
        switch = SwitchProcess(target, topology.switch_ports,
                               log_path=workdir / "switch-0.log").start(60)
        port = free_tcp_port()
        address = f"{topology.mgmt_address}:{port}"
        manager = start_manager({
            "manager": {"listen": address, "secret": SECRET, "cert": str(tls.server_cert),
                        "key": str(tls.server_key), "database": str(workdir / "manager.db"),
                        "lease_seconds": LEASE, "sweep_seconds": SWEEP, "default_slots": 16},
            "switch": {"grpc_addr": switch.grpc_addr},
            "pool": {"job_ids": [1, 8], "slots": [0, 31],
                     "services": [{"ip": "10.0.0.250", "mac": "02:00:00:00:00:fa"}]},
            "fabric": {"hosts": [{"mac": h.mac, "switch_port": h.switch_port}
                                 for h in topology.hosts]}},
            workdir / "manager.toml", workdir / "manager.log")
        print(f"[chaos] {args.workers} hosts, {target} switch, job manager at {address} "
              f"(lease {LEASE:g} s); logs in {workdir}", flush=True)
        env = {**os.environ, "INA_MANAGER": address, "INA_SECRET": SECRET,
               "INA_CA_CERT": str(tls.ca_cert),
               "INA_SWITCH_TIMEOUT": os.environ.get("INA_SWITCH_TIMEOUT", SWITCH_TIMEOUT),
               "INA_JOIN_TIMEOUT": "120", "GLOO_SOCKET_IFNAME": topology.MGMT_IFNAME,
               "OMP_NUM_THREADS": "1"}

        def kill_and_restart():
            nonlocal switch
            print(f"[chaos] step {FAULT_STEP}: the switch is killed; started again in 5 s",
                  flush=True)
            switch.process.kill()
            switch.process.wait()
            time.sleep(5)
            switch = SwitchProcess(target, topology.switch_ports, grpc_addr=switch.grpc_addr,
                                   log_path=workdir / "switch-1.log").start(60)

        def revoke_lease():
            hosts, route = topology.hosts[:args.workers], f"{topology.mgmt_address}/32"
            print(f"[chaos] step {FAULT_STEP}: the ranks' way to the manager is cut until it "
                  f"reclaims the job's lease", flush=True)
            for host in hosts:
                host.run(["ip", "route", "add", "prohibit", route], check=True)
            deadline = time.monotonic() + 30
            while (b"stopped renewing" not in (workdir / "manager.log").read_bytes()
                   and time.monotonic() < deadline):
                time.sleep(0.2)
            for host in hosts:
                host.run(["ip", "route", "del", "prohibit", route], check=True)

        results = {}
        for phase, fault in (("switch", kill_and_restart), ("lease", revoke_lease),
                             ("gloo", None)):
            print(f"\n[chaos] phase {phase}: "
                  + ("DDP on gloo alone (the reference)" if fault is None else
                     "DDP on the ina backend through the manager"), flush=True)
            results[phase] = _train(topology, env, workdir, phase, args, fault)
        print("\nfinal test accuracy: " + ", ".join(
            f"{phase} {r['accuracy']:.3f}" for phase, r in results.items())
              + f" (gloo alone: {results['gloo']['accuracy']:.3f})")
        return 0
    finally:
        if manager is not None and manager.poll() is None:
            manager.terminate()
            manager.wait(timeout=10)
        if switch is not None:
            switch.stop()
        topology.destroy()



def _train(topology, env, workdir: Path, phase: str, args, fault) -> dict:
    """One run on every host; ``fault()`` once every rank has logged FAULT_STEP steps.
    Prints each step's path and time (rank 0's); returns rank 0's final report."""
    out = workdir / phase
    master = topology.hosts[0].mgmt_ip
    ranks = []
    for rank, host in enumerate(topology.hosts[:args.workers]):
        log = open(workdir / f"{phase}-{rank}.log", "w")
        ranks.append((host.popen(
            [sys.executable, "-m", "innet_aggregation.experiments.chaos", "--rank", str(rank),
             "--world", str(args.workers), "--master", f"{master}:{PORT}", "--out", str(out),
             "--epochs", str(args.epochs), "--backend", "gloo" if fault is None else "cpu:ina"],
            stdout=log, stderr=log, env={**env, "INA_JOB": f"chaos-{phase}"}), log))
    try:
        shown = 0
        faulted = fault is None
        while any(p.poll() is None for p, _ in ranks):
            steps = [_steps(out, r) for r in range(args.workers)]
            for step in steps[0][shown:]:
                print(f"  step {step['step']:>3}: {step['path']:<6} {step['ms']:8.1f} ms",
                      flush=True)
            shown = len(steps[0])
            if not faulted and min(len(s) for s in steps) >= FAULT_STEP:
                faulted = True
                fault()
            time.sleep(0.2)
        for step in _steps(out, 0)[shown:]:
            print(f"  step {step['step']:>3}: {step['path']:<6} {step['ms']:8.1f} ms")
        for rank, (process, _) in enumerate(ranks):
            if process.returncode != 0:
                raise RuntimeError(f"rank {rank} of phase {phase} failed: "
                                   f"{(workdir / f'{phase}-{rank}.log').read_text()[-2000:]}")
    finally:
        for process, log in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    final = json.loads(Path(f"{out}.final").read_text())
    paths = [s["path"] for s in _steps(out, 0)]
    print(f"[chaos] phase {phase}: {paths.count('switch')} steps through the switch, "
          f"{paths.count('gloo')} through gloo; test accuracy {final['accuracy']:.3f}",
          flush=True)
    return final


def _steps(out: Path, rank: int) -> list[dict]:
    path = Path(f"{out}.{rank}.jsonl")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


# -- one rank ---------------------------------------------------------------------------

def rank_main(argv: list[str] | None = None) -> int:
    """A rank of one phase: DDP (no hook) on the digits, as testbed/train.py's model."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from sklearn.datasets import load_digits
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..testbed.model import accuracy_of, mlp

    parser = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--epochs"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--master", "--out", "--backend"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    from innet_aggregation.worker import backend    # registers "ina"

    dist.init_process_group(args.backend, init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world)
    fallback = backend.session_of().fallback if args.backend != "gloo" else None
    x, y = load_digits(return_X_y=True)
    order = torch.tensor(np.random.default_rng(0).permutation(len(x)))
    x = torch.tensor(x / 16.0, dtype=torch.float32)[order]
    y = torch.tensor(y)[order]
    n_test = len(x) // 5
    x_test, y_test = x[:n_test], y[:n_test]
    x_train, y_train = x[n_test:][args.rank::args.world], y[n_test:][args.rank::args.world]
    torch.manual_seed(0)
    model = mlp([32])
    ddp = DDP(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch, step = 32, 0
    steps_per_epoch = len(x[n_test:]) // args.world // batch
    with open(f"{args.out}.{args.rank}.jsonl", "w") as log:
        for epoch in range(args.epochs):
            perm = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
            for i in range(steps_per_epoch):
                idx = perm[i * batch:(i + 1) * batch]
                before = dict(fallback.counts) if fallback else None
                start = time.perf_counter()
                loss = loss_fn(ddp(x_train[idx]), y_train[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                ms = (time.perf_counter() - start) * 1000
                path = ("gloo" if fallback is None or fallback.counts["gloo"] > before["gloo"]
                        else "switch")
                log.write(json.dumps({"step": step, "path": path, "ms": ms}) + "\n")
                log.flush()
                step += 1
                time.sleep(PAUSE)
    if args.rank == 0:
        Path(f"{args.out}.final").write_text(json.dumps(
            {"accuracy": accuracy_of(model, x_test, y_test), "steps": step}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(rank_main())
