"""Sharing one switch: jobs of two priorities through the job manager, with
priorities and preemption against first-come-first-served.

    python -m innet_aggregation.experiments.sharing --jobs 6 --high 3 --seeds 3   # the defaults

Hosts in namespaces with a management network (the manager, rendezvous and gloo on
it, as in a cluster), one switch process, and the manager (``switch_ctl serve``)
with a pool that fits two jobs (each asks for JOB_SLOTS slots of 2 x JOB_SLOTS), and
its default lease and sweep (a lease of a few seconds is lost on a loaded 2-core
host, and a job that loses it goes to gloo: that is not what is measured here).
Each job is ``--world`` ranks on hosts of their own, each rank
(experiments/sharing_rank.py) on the ``ina`` backend: ``--steps`` steps of a pause
(the step's compute) and one allreduce of ``--size`` integer-valued floats, checked
exact. The jobs arrive in a seeded order (``--high`` of them of tenant ``high``)
about ``--gap`` seconds apart. Two policies, on the same fabric, one after the
other: ``priority`` (tenant ``high`` has priority 5: a complete high job that does
not fit preempts a low one, whose ranks go on through gloo and come back when
room frees) and ``fcfs`` (every tenant priority 0: a job that does not fit waits
for room, its ranks starting on gloo after INA_SWITCH_TIMEOUT and coming to the
switch once it is installed).

A job's completion time (JCT) is from its ranks' start to rank 0's last step. Per
policy: the mean JCT of all jobs, of the high ones and of the low ones, and the
longest low one (none starves: every job finishes); the ratio of the high jobs'
mean JCT under priorities over FCFS, per seed; and per preemption, the calls the
preempted job made on gloo and the time from its last call through the switch to
its next one.

Writes <out>/sharing.csv (a row per job and policy), <out>/sharing.png (each job's
time line under each policy: waiting, on the switch, on gloo) and a JSON record
(experiments.record).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tomli_w

from ..testbed.stopping import Stopped, stop_on_signals
from ..testbed.targets import add_switch_arguments, default_target
from . import record
from .progress import Progress

JOB_SLOTS = 8                   # a job's window; the pool holds two
SECRET, HIGH_SECRET = "sharing-default-secret", "sharing-high-tenant-secret"
HIGH_PRIORITY = 5
POLICIES = ("priority", "fcfs")
CSV_FIELDS = ["seed", "policy", "job", "tier", "arrival_s", "finish_s", "jct_s",
              "switch_steps", "gloo_steps", "preemptions"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--jobs", type=int, default=6, help="jobs a run (default 6)")
    parser.add_argument("--high", type=int, default=3,
                        help="of them of tenant high (default 3)")
    parser.add_argument("--world", type=int, default=2, help="ranks a job (default 2)")
    parser.add_argument("--steps", type=int, default=40, help="steps a job (default 40)")
    parser.add_argument("--size", type=int, default=65536,
                        help="values an allreduce (default 65536)")
    parser.add_argument("--compute", type=float, default=0.2,
                        help="seconds of a step's compute (default 0.2)")
    parser.add_argument("--gap", type=float, default=3.0,
                        help="mean seconds between arrivals (default 3)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="arrival orders, each run under both policies (default 3)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the first arrival order's seed; the others follow (default 0)")
    add_switch_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("results/sharing"),
                        help="results folder (default results/sharing)")
    return parser


def schedule(args, seed: int) -> list[tuple[float, str]]:
    """(arrival, tier) per job: ``--high`` high ones in a seeded order, arrivals
    ``--gap`` apart on average, the first at 0."""
    rng = np.random.default_rng(seed)
    tiers = list(rng.permutation(["high"] * args.high + ["low"] * (args.jobs - args.high)))
    arrivals = np.concatenate([[0.0], np.cumsum(rng.uniform(0.5, 1.5, args.jobs - 1))])
    return [(float(args.gap * a), str(t)) for a, t in zip(arrivals, tiers)]


def _manager_config(topology, switch, tls, workdir: Path, port: int, policy: str) -> dict:
    return {
        "manager": {"listen": f"{topology.mgmt_address}:{port}", "secret": SECRET,
                    "cert": str(tls.server_cert), "key": str(tls.server_key),
                    "database": str(workdir / "manager.db"), "default_slots": JOB_SLOTS},
        "switch": {"grpc_addr": switch.grpc_addr,
                   "ports": sorted(h.switch_port for h in topology.hosts)},
        "pool": {"job_ids": [1, 16], "slots": [0, 2 * JOB_SLOTS - 1],
                 "services": [{"ip": f"10.0.0.{240 + i}", "mac": f"02:00:00:00:00:{240 + i:02x}"}
                              for i in range(8)]},
        "fabric": {"hosts": [{"mac": h.mac, "switch_port": h.switch_port}
                             for h in topology.hosts]},
        "tenants": {"high": {"secret": HIGH_SECRET,
                             "priority": HIGH_PRIORITY if policy == "priority" else 0}},
    }


class _Run:
    """One policy's run: a switch, a manager, and the jobs as they arrive."""

    def __init__(self, args, topology, tls, workdir: Path, target: str, policy: str):
        from ..testbed.targets import SwitchProcess, free_tcp_port, wait_listening

        self.args, self.topology, self.workdir, self.policy = args, topology, workdir, policy
        workdir.mkdir(parents=True)
        self.switch = SwitchProcess(target, topology.switch_ports,
                                    log_path=workdir / "switch.log").start(60)
        port = free_tcp_port()
        self.address = f"{topology.mgmt_address}:{port}"
        config = workdir / "manager.toml"
        config.write_text(tomli_w.dumps(_manager_config(topology, self.switch, tls, workdir,
                                                        port, policy)))
        self.manager = subprocess.Popen(
            [sys.executable, "-m", "innet_aggregation.switch_ctl", "serve", "--config",
             str(config)], stdout=open(workdir / "manager.log", "wb"),
            stderr=subprocess.STDOUT, start_new_session=True)
        wait_listening(topology.mgmt_address, port, self.manager)
        self.tls = tls
        self.ranks: dict[int, list] = {}

    def launch(self, job: int, tier: str, port: int) -> None:
        world = self.args.world
        hosts = self.topology.hosts[job * world:(job + 1) * world]
        env = {**os.environ, "INA_MANAGER": self.address,
               "INA_SECRET": HIGH_SECRET if tier == "high" else SECRET,
               "INA_CA_CERT": str(self.tls.ca_cert), "INA_JOB": f"{self.policy}-job{job}",
               "INA_SLOTS": str(JOB_SLOTS), "INA_JOIN_TIMEOUT": "600",
               "GLOO_SOCKET_IFNAME": self.topology.MGMT_IFNAME, "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": hosts[0].mgmt_ip, "MASTER_PORT": str(port),
               "WORLD_SIZE": str(world)}
        self.ranks[job] = []
        for rank, host in enumerate(hosts):
            out = open(self.workdir / f"job{job}.{rank}.jsonl", "w")
            err = open(self.workdir / f"job{job}.{rank}.log", "w")
            self.ranks[job].append(host.popen(
                [sys.executable, "-m", "innet_aggregation.experiments.sharing_rank",
                 "--steps", str(self.args.steps), "--size", str(self.args.size),
                 "--compute", str(self.args.compute)],
                stdout=out, stderr=err, env={**env, "RANK": str(rank)}))

    def finished(self) -> bool:
        return all(p.poll() is not None for ranks in self.ranks.values() for p in ranks)

    def stop(self) -> None:
        for ranks in self.ranks.values():
            for p in ranks:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if self.manager.poll() is None:
            self.manager.terminate()
            self.manager.wait(timeout=10)
        self.switch.stop()



def run_policy(args, topology, tls, workdir: Path, target: str, seed: int, policy: str,
               base_port: int) -> tuple[list[dict], list[dict], dict]:
    """The jobs of ``seed``'s schedule under ``policy``: a row per job, each
    preemption's cost, and each job's steps (for the picture)."""
    plan = schedule(args, seed)
    run = _Run(args, topology, tls, workdir, target, policy)
    try:
        start = time.time()
        for job, (arrival, tier) in enumerate(plan):
            time.sleep(max(0.0, start + arrival - time.time()))
            run.launch(job, tier, base_port + job)
        deadline = time.monotonic() + 60 + 20 * args.jobs * (1 + args.steps * args.compute)
        while not run.finished():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{policy}: jobs still running after their time")
            time.sleep(0.2)
        for job, ranks in run.ranks.items():
            for rank, p in enumerate(ranks):
                if p.returncode != 0:
                    log = (workdir / f"job{job}.{rank}.log").read_text()
                    raise RuntimeError(f"{policy}: job {job} rank {rank} exited with "
                                       f"{p.returncode}:\n{log[-3000:]}")
    finally:
        run.stop()
    rows, costs, lines = [], [], {}
    for job, (arrival, tier) in enumerate(plan):
        events = [[json.loads(line) for line in
                   (workdir / f"job{job}.{rank}.jsonl").read_text().splitlines()]
                  for rank in range(args.world)]
        steps = [[e for e in ev if e["event"] == "step"] for ev in events]
        if any(len(s) != args.steps or not all(e["exact"] for e in s) for s in steps):
            raise RuntimeError(f"{policy}: job {job} did not make every step exact")
        if len({tuple(e["path"] for e in s) for s in steps}) != 1:
            raise RuntimeError(f"{policy}: job {job}'s ranks took different paths")
        paths = [e["path"] for e in steps[0]]
        ends = [e["at"] - start for e in steps[0]]
        began = min(e["at"] for ev in events for e in ev if e["event"] == "started") - start
        preemptions = 0
        for i in range(1, len(paths)):
            if paths[i] == "gloo" and "switch" in paths[:i] and paths[i - 1] == "switch":
                preemptions += 1
                back = next((k for k in range(i, len(paths)) if paths[k] == "switch"), None)
                costs.append({"policy": policy, "seed": seed, "job": job, "tier": tier,
                              "gloo_calls": (back if back is not None else len(paths)) - i,
                              "return_s": ends[back] - ends[i - 1] if back is not None
                              else None})
        rows.append({"seed": seed, "policy": policy, "job": job, "tier": tier,
                     "arrival_s": arrival, "finish_s": ends[-1], "jct_s": ends[-1] - arrival,
                     "switch_steps": paths.count("switch"), "gloo_steps": paths.count("gloo"),
                     "preemptions": preemptions})
        lines[job] = {"arrival": arrival, "began": began, "ends": ends, "paths": paths,
                      "tier": tier}
    return rows, costs, lines


def figures(rows: list[dict], costs: list[dict], seeds: list[int]) -> dict:
    """Per policy the mean JCTs and the longest low one; per seed the ratio of the
    high jobs' mean JCT under priorities over FCFS; each preemption's cost."""
    def mean(policy, tier=None, seed=None, agg=statistics.mean):
        return agg(r["jct_s"] for r in rows if r["policy"] == policy
                   and (tier is None or r["tier"] == tier) and (seed is None or r["seed"] == seed))

    by_policy = {p: {"mean_jct_s": mean(p), "high_mean_jct_s": mean(p, "high"),
                     "low_mean_jct_s": mean(p, "low"), "low_max_jct_s": mean(p, "low", agg=max),
                     "preemptions": sum(r["preemptions"] for r in rows if r["policy"] == p)}
                 for p in POLICIES}
    ratios = [mean("priority", "high", s) / mean("fcfs", "high", s) for s in seeds]
    returned = [c["return_s"] for c in costs if c["return_s"] is not None]
    return {"policies": by_policy,
            "high_ratio": record.spread(ratios), "high_ratios": ratios,
            "all_ratio": record.spread([mean("priority", seed=s) / mean("fcfs", seed=s)
                                        for s in seeds]),
            "preemption_cost": {
                "gloo_calls": record.spread([c["gloo_calls"] for c in costs]) if costs else None,
                "return_s": record.spread(returned) if returned else None,
                "returned": len(returned), "each": costs}}


def plot(lines: dict, path: Path) -> None:
    """Each job's time line under each policy (the first seed's): grey from arrival
    to its first step, then each step's interval on the switch or on gloo."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(POLICIES), figsize=(12, 4), sharex=True, sharey=True)
    for ax, policy in zip(axes, POLICIES):
        for job, line in sorted(lines[policy].items()):
            y = -job
            first = line["ends"][0] if line["ends"] else line["arrival"]
            ax.barh(y, first - line["arrival"], left=line["arrival"], color="0.85", height=0.6)
            previous = first
            for end, step_path in zip(line["ends"][1:], line["paths"][1:]):
                ax.barh(y, end - previous, left=previous, height=0.6,
                        color="tab:green" if step_path == "switch" else "tab:orange")
                previous = end
            ax.text(line["arrival"], y + 0.35, f"job {job} ({line['tier']})", fontsize=7)
        ax.set_title(f"{policy}: green switch, orange gloo, grey before its first step")
        ax.set_xlabel("seconds since the first arrival")
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_summary(fig: dict) -> None:
    for policy, f in fig["policies"].items():
        print(f"  {policy:<8} mean JCT {f['mean_jct_s']:6.1f} s, high {f['high_mean_jct_s']:6.1f} "
              f"s, low {f['low_mean_jct_s']:6.1f} s (longest low {f['low_max_jct_s']:.1f} s), "
              f"{f['preemptions']} preemptions")
    r = fig["high_ratio"]
    print(f"  high jobs' mean JCT, priorities over FCFS: {r['median']:.2f} "
          f"({r['min']:.2f}-{r['max']:.2f} over the seeds)")
    cost = fig["preemption_cost"]
    if cost["gloo_calls"] is not None:
        back = (f", back on the switch {cost['return_s']['median']:.1f} s after its last "
                f"switch call (median of the {cost['returned']} that came back before their "
                f"end)" if cost["return_s"] is not None else ", none came back before its end")
        print(f"  {len(cost['each'])} preemptions: {cost['gloo_calls']['median']:g} calls on "
              f"gloo (median){back}")


def run(args) -> tuple[list[dict], list[dict], dict]:
    from innet_aggregation.p4src import protocol

    from ..testbed.layout import link_mtu
    from ..testbed.netns import Namespaces
    from ..testbed.tls import make_bundle

    target = args.target or default_target()
    workdir = Path(tempfile.mkdtemp(prefix="ina-sharing-"))
    topology = Namespaces(args.jobs * args.world, tag=f"sh{os.getpid() % 100000}",
                          management=True, mtu=link_mtu(protocol.packet_format())).create()
    rows, costs, lines = [], [], {}
    progress = Progress(args.seeds * len(POLICIES), "sharing")
    try:
        tls = make_bundle(workdir / "tls", hosts=(topology.mgmt_address,))
        progress.say(f"[sharing] {args.jobs} jobs of {args.world} ranks ({args.high} high), "
                     f"{args.steps} steps of {args.compute:g} s and {args.size} values each, "
                     f"a pool of two jobs on one {target} switch; logs in {workdir}")
        for seed in range(args.seed, args.seed + args.seeds):
            # Each seed's other policy first on odd seeds: neither always runs first.
            for i, policy in enumerate(POLICIES[::-1] if seed % 2 else POLICIES):
                got, cost, line = run_policy(args, topology, tls, workdir / f"{seed}-{policy}",
                                             target, seed, policy,
                                             29500 + 100 * (2 * seed + i))
                rows += got
                costs += cost
                if seed == args.seed:
                    lines[policy] = line
                progress.advance(f"seed {seed}, {policy}")
    finally:
        topology.destroy()
    return rows, costs, lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("sharing: needs root (network namespaces)", file=sys.stderr)
        return 1
    if not 0 < args.high < args.jobs or args.world < 2 or args.steps < 2 or args.seeds < 1:
        print("sharing: needs 0 < --high < --jobs, --world >= 2, --steps >= 2, --seeds >= 1",
              file=sys.stderr)
        return 1
    load = os.getloadavg()[0]
    stop_on_signals()
    try:
        rows, costs, lines = run(args)
    except Stopped as stop:
        print(f"sharing: stopped by {stop.name}; the namespaces were removed", file=sys.stderr)
        return stop.code
    except Exception as exc:
        print(f"sharing: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "sharing.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    plot(lines, args.out / "sharing.png")
    fig = figures(rows, costs, list(range(args.seed, args.seed + args.seeds)))
    print_summary(fig)
    record.write("sharing-experiment", {**fig, "runs": rows}, params=vars(args),
                 load_before=load, out=args.out)
    print(f"wrote {args.out / 'sharing.csv'}, {args.out / 'sharing.png'}, "
          f"{args.out / 'sharing-experiment.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
