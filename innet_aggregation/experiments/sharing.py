"""``make sharing-experiment``: what priorities and preemption give the jobs of a shared
switch, against first come first served, through the real job manager.

    python -m innet_aggregation.experiments.sharing --seeds 3   # the default; SEEDS= in make

Hosts in namespaces with a management network (the manager, rendezvous and gloo on
it, as in a cluster), one embedded switch, the manager (``switch_ctl serve``) with a
pool that fits ``--fit`` jobs at once. ``--jobs`` jobs of ``--ranks`` ranks each, every
rank a process on a host of its own (the ``ina`` backend, INA_FALLBACK=gloo),
``--high`` of them high priority (by default 2 of 6: the minority a priority class
exists for; with more high jobs than the pool fits, the surplus queue behind each
other whatever the policy, and the run reports that floor: the ratio every high job
would give if it ran on the switch from its arrival), arrive at a seeded schedule (exponential gaps of mean ``--gap`` s); each makes
``--calls`` allreduce calls of ``--size`` integer-valued float32 values and checks
every result against the exact sum. Every host's data-plane and management links are
shaped to ``--bw`` Mbit/s alike, as one network carries both in a cluster: gloo's ring
then moves 2(n-1)/n of a call's bytes where the switch path moves them once (unshaped,
gloo's management bridge here outruns the embedded switch on two cores, and a job gains
nothing from the switch). Each seed runs the same schedule under both policies, each on
a fresh switch and manager:

- **priority**: the high jobs ask priority 5 (``INA_PRIORITY``): one that does not fit
  preempts a running low one, which goes on through gloo and comes back when slots free;
- **fcfs**: every job priority 0: one that does not fit waits its turn, training on
  gloo meanwhile (the backend starts on gloo when it is not joined within
  INA_SWITCH_TIMEOUT).

A job's ranks are started (torch imported) before the run's clock; a job arrives when
they are told to go, and its completion time (JCT) runs from then, through the
rendezvous and the manager's join, to the end of its last rank's last call. Per policy: the mean JCT of all jobs and of the high ones, the longest
of the low ones (no starvation: every job must finish), and per preemption what it
cost the preempted job: calls on gloo and seconds until back on the switch (from its
ranks' own record of the path each call took, ``worker/fallback.py``). Writes
``results/sharing/sharing.csv`` (a row a job a run), ``sharing.png`` and
``sharing-experiment.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..testbed.links import burst_bytes, check_rate
from .output import pyplot, write_csv
from .progress import Progress, duration
from .record import spread, write

TENANT, SECRET = "lab", "sharing-experiment-secret"
HIGH, LOW = 5, 0
POLICIES = ("priority", "fcfs")
JOB_SLOTS = 16
LEASE, SWEEP = 3.0, 0.5
PORT = 29800                     # rendezvous ports: PORT + a run's jobs
CSV_FIELDS = ["seed", "policy", "job", "class", "arrival_s", "finish_s", "jct_s", "calls",
              "wrong", "switch_calls", "gloo_calls", "preemptions"]
GOAL = 0.7                       # high jobs' mean JCT, priority over fcfs (issue 46)


def default_high(jobs: int) -> int:
    return max(1, jobs // 3)


def schedule(seed: int, jobs: int, gap: float, high: int | None = None) -> list[dict]:
    """Each job's arrival (s from the run's start) and priority class: ``high`` of them
    high (a third by default), in a seeded order, after exponential gaps; the first
    job arrives at 0."""
    high = default_high(jobs) if high is None else high
    rng = np.random.default_rng(seed)
    classes = rng.permutation(["high"] * high + ["low"] * (jobs - high))
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(gap, jobs - 1))])
    return [{"job": f"job{i}", "class": str(c), "arrival": round(float(a), 2)}
            for i, (c, a) in enumerate(zip(classes, arrivals))]


# -- a run ------------------------------------------------------------------------------

class Bed:
    """Namespaces with a management network, a switch and the manager, fresh per run."""

    def __init__(self, args, workdir: Path):
        from innet_aggregation.p4src import protocol
        from ..testbed.layout import link_mtu
        from ..testbed.netns import Namespaces
        from ..testbed.tls import make_bundle

        self.args, self.workdir = args, workdir
        self.topology = Namespaces(args.jobs * args.ranks, tag=f"sh{os.getpid() % 100000}",
                                   management=True,
                                   mtu=link_mtu(protocol.packet_format())).create()
        if args.bw:
            shape(self.topology, args.bw)
        self.tls = make_bundle(workdir / "tls", hosts=(self.topology.mgmt_address,))
        self.switch = self.manager = None

    def start(self, run: str) -> str:
        """A fresh switch and manager for ``run``; the manager's address."""

        from ..testbed.targets import SwitchProcess, free_tcp_port, start_manager

        self.switch = SwitchProcess("softswitch", self.topology.switch_ports,
                                    log_path=self.workdir / f"switch-{run}.log").start(60)
        port = free_tcp_port()
        address = f"{self.topology.mgmt_address}:{port}"
        self.log = self.workdir / f"manager-{run}.log"
        self.manager = start_manager({
            "manager": {"listen": address, "cert": str(self.tls.server_cert),
                        "key": str(self.tls.server_key),
                        "database": str(self.workdir / f"manager-{run}.db"),
                        "lease_seconds": LEASE, "sweep_seconds": SWEEP,
                        "default_slots": JOB_SLOTS},
            "tenants": {TENANT: {"secret": SECRET, "priority": LOW, "max_priority": HIGH}},
            "switch": {"grpc_addr": self.switch.grpc_addr},
            "pool": {"job_ids": [1, 16], "slots": [0, self.args.fit * JOB_SLOTS - 1],
                     "services": [{"ip": f"10.0.0.{240 + i}", "mac": f"02:00:00:00:00:{240 + i:x}"}
                                  for i in range(8)]},
            "fabric": {"hosts": [{"mac": h.mac, "switch_port": h.switch_port}
                                 for h in self.topology.hosts]}},
            self.workdir / f"manager-{run}.toml", self.log)
        return address

    def stop_run(self) -> None:
        if self.manager is not None and self.manager.poll() is None:
            self.manager.terminate()
            self.manager.wait(timeout=10)
        if self.switch is not None:
            self.switch.stop()
        self.manager = self.switch = None

    def destroy(self) -> None:
        self.stop_run()
        self.topology.destroy()


def shape(topology, mbit: float) -> None:
    """Both directions of every host's data-plane and management link: an HTB class of
    ``mbit`` with a bucket of ``links.HTB_BURST_S`` at that rate (as topology.py's)."""
    burst = burst_bytes(mbit)

    def htb(*prefix: str, dev: str) -> None:
        for argv in (["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb",
                      "default", "1"],
                     ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1",
                      "htb", "rate", f"{mbit}mbit", "burst", str(burst), "cburst", str(burst)]):
            subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=30)

    for host in topology.hosts:
        ns = ("ip", "netns", "exec", host.netns)
        htb(*ns, dev=host.ifname)
        htb(*ns, dev=topology.MGMT_IFNAME)
        htb(dev=host.switch_ifname)
        htb(dev=f"{topology.tag}m{host.index}")


def run_policy(bed: Bed, args, seed: int, policy: str, jobs: list[dict], first_port: int,
               say) -> list[dict]:
    """The seed's schedule under ``policy``; each job's row (its ranks' record joined)."""
    run = f"{seed}-{policy}"
    address = bed.start(run)
    out = bed.workdir / run
    out.mkdir()
    env = {**os.environ, "INA_MANAGER": address, "INA_SECRET": SECRET,
           "INA_CA_CERT": str(bed.tls.ca_cert), "INA_FALLBACK": "gloo",
           "INA_SWITCH_TIMEOUT": str(args.switch_timeout), "INA_JOIN_TIMEOUT": "600",
           "GLOO_SOCKET_IFNAME": bed.topology.MGMT_IFNAME, "OMP_NUM_THREADS": "1"}
    ranks: list[tuple[dict, int, subprocess.Popen]] = []
    try:
        for j, job in enumerate(jobs):        # started ahead: torch's import is no job's time
            job_env = {**env, "INA_JOB": job["job"],
                       "INA_PRIORITY": str(HIGH if policy == "priority" and
                                           job["class"] == "high" else LOW)}
            hosts = bed.topology.hosts[args.ranks * j:args.ranks * (j + 1)]
            for rank, host in enumerate(hosts):
                log = open(out / f"{job['job']}-{rank}.log", "w")
                ranks.append((job, rank, host.popen(
                    [sys.executable, "-m", "innet_aggregation.experiments.sharing",
                     "--rank", str(rank), "--world", str(args.ranks),
                     "--master", f"{hosts[0].mgmt_ip}:{first_port + j}",
                     "--calls", str(args.calls), "--size", str(args.size),
                     "--go", str(out / f"{job['job']}.go"),
                     "--record", str(out / f"{job['job']}.{rank}.json")],
                    stdout=log, stderr=subprocess.STDOUT, env=job_env)))
        for job, rank, process in ranks:
            ready = out / f"{job['job']}.{rank}.json.ready"
            while not ready.exists():
                if process.poll() is not None:
                    log = (out / f"{job['job']}-{rank}.log").read_text()
                    raise RuntimeError(f"{run}: rank {rank} of {job['job']} exited with "
                                       f"{process.returncode} before its job arrived:\n"
                                       f"{log[-3000:]}")
                time.sleep(0.1)
        started = time.time()
        for job in jobs:
            time.sleep(max(0.0, started + job["arrival"] - time.time()))
            job["launched"] = time.time() - started
            (out / f"{job['job']}.go").touch()
        deadline = time.time() + args.timeout
        for job, rank, process in ranks:
            try:
                process.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.returncode != 0:
                log = (out / f"{job['job']}-{rank}.log").read_text()
                raise RuntimeError(f"{run}: rank {rank} of {job['job']} exited with "
                                   f"{process.returncode}:\n{log[-3000:]}")
    finally:
        for _, _, process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
        preempted = bed.log.read_text().count("preempted by") if bed.log.exists() else 0
        bed.stop_run()
    rows = [job_row(job, out, started, seed, policy, args.ranks) for job in jobs]
    say(f"  {run}: manager said 'preempted by' {preempted} times")
    return rows


def job_row(job: dict, out: Path, started: float, seed: int, policy: str, ranks: int) -> dict:
    """A job's figures from its ranks' records (rank 0's calls and paths; the last
    rank's end, as a job is done when its last rank is)."""
    records = [json.loads((out / f"{job['job']}.{r}.json").read_text()) for r in range(ranks)]
    calls = records[0]["calls"]
    paths = [c["path"] for c in calls]
    if any([c["path"] for c in r["calls"]] != paths for r in records[1:]):
        raise RuntimeError(f"{job['job']}: its ranks took different paths on a call")
    finish = max(r["finished"] for r in records) - started
    ends = [max(r["calls"][k]["at"] for r in records) - started for k in range(len(calls))]
    return {"seed": seed, "policy": policy, "job": job["job"], "class": job["class"],
            "arrival_s": job["launched"], "finish_s": finish,
            "jct_s": finish - job["launched"],
            "calls": len(calls), "wrong": sum(r["wrong"] for r in records),
            "switch_calls": paths.count("switch"), "gloo_calls": paths.count("gloo"),
            "preemptions": preemptions(calls, records[0]["changes"]),
            "phases": phases(job["launched"], max(r["joined"] for r in records) - started,
                             ends, paths, finish),
            "path_at": [[round(c["at"] - started, 3), c["path"]] for c in calls]}


def phases(arrival: float, joined: float, ends: list[float], paths: list[str],
           finish: float) -> dict:
    """Where a job's JCT went (s, its slowest rank's): from its arrival until every rank
    returned from init_process_group (the rendezvous, the manager's join, the vote on
    the path), its first call, its other calls, split by the path each took (a call's
    time: from the end of the one before), and the tail (destroy_process_group: the
    session's close, the lease's)."""
    steps = np.diff(ends)
    return {"start_s": joined - arrival, "first_call_s": ends[0] - joined,
            "switch_s": float(sum(t for t, p in zip(steps, paths[1:]) if p == "switch")),
            "gloo_s": float(sum(t for t, p in zip(steps, paths[1:]) if p == "gloo")),
            "tail_s": finish - ends[-1],
            "switch_n": paths[1:].count("switch"), "gloo_n": paths[1:].count("gloo")}


def time_spent(rows: list[dict]) -> dict:
    """The median phases (``phases``) of the jobs that never left the switch, and the
    mean seconds of a call after the first through each path, over every job."""
    alone = [r["phases"] for r in rows if not r["gloo_calls"]]
    out = {k: statistics.median(p[k] for p in alone) if alone else None
           for k in ("start_s", "first_call_s", "switch_s", "tail_s")}
    for way in ("switch", "gloo"):
        n = sum(r["phases"][f"{way}_n"] for r in rows)
        out[f"{way}_call_s"] = sum(r["phases"][f"{way}_s"] for r in rows) / n if n else None
    return out


def preemptions(calls: list[dict], changes: list) -> list[dict]:
    """Each time a job was preempted (its path's changes, ``Fallback.changes``: the call
    from which on, 1-based, the path, why): the calls it made on gloo until it was back
    on the switch, and the seconds from the end of the call it left the switch in to
    the end of its first call back through it (None: it finished on gloo, or came back
    only after its last call)."""
    costs = []
    for k, (number, path, why) in enumerate(changes):
        if path != "gloo" or "preempted" not in why:
            continue
        back = next((n for n, p, _ in changes[k + 1:] if p == "switch"), None)
        if back is not None and back > len(calls):    # back for a call it never made
            back = None
        end = len(calls) if back is None else back - 1
        costs.append({"gloo_calls": sum(c["path"] == "gloo" for c in calls[number - 1:end]),
                      "to_return_s": (None if back is None else
                                      round(calls[back - 1]["at"] - calls[number - 1]["at"], 3))})
    return costs


# -- the figures ------------------------------------------------------------------------

def summarize(rows: list[dict]) -> dict:
    """One run's (a seed, a policy) means and extremes."""
    jct = {c: [r["jct_s"] for r in rows if c in ("all", r["class"])]
           for c in ("all", "high", "low")}
    return {"mean_jct_s": statistics.mean(jct["all"]),
            "mean_jct_high_s": statistics.mean(jct["high"]),
            "mean_jct_low_s": statistics.mean(jct["low"]),
            "max_jct_low_s": max(jct["low"]),
            "finished": sum(r["calls"] == r["expected"] for r in rows), "jobs": len(rows),
            "wrong": sum(r["wrong"] for r in rows),
            "preemptions": sum(len(r["preemptions"]) for r in rows),
            "switch_calls": sum(r["switch_calls"] for r in rows),
            "gloo_calls": sum(r["gloo_calls"] for r in rows)}


def best_ratio(rows: list[dict]) -> float | None:
    """One seed's floor under the high jobs' ratio: every high job on the switch from
    its arrival, at the median JCT of the seed's jobs that never left it (either
    policy), over their JCT under FCFS. No scheduler does better with this pool."""
    alone = [r["jct_s"] for r in rows if not r["gloo_calls"]]
    if not alone:
        return None
    alone = statistics.median(alone)
    fcfs = [r["jct_s"] for r in rows if (r["policy"], r["class"]) == ("fcfs", "high")]
    return statistics.mean(min(j, alone) for j in fcfs) / statistics.mean(fcfs)


def figures(rows: list[dict], seeds: list[int]) -> dict:
    runs = {f"{s}-{p}": summarize([r for r in rows if (r["seed"], r["policy"]) == (s, p)])
            for s in seeds for p in POLICIES}
    ratios = [runs[f"{s}-priority"]["mean_jct_high_s"] / runs[f"{s}-fcfs"]["mean_jct_high_s"]
              for s in seeds]
    costs = [c for r in rows for c in r["preemptions"]]
    back = [c["to_return_s"] for c in costs if c["to_return_s"] is not None]
    ratio = spread(ratios)
    return {
        "runs": runs,
        "high_jct_ratio": ratio, "high_jct_ratios": ratios,
        "best_high_jct_ratios": [best_ratio([r for r in rows if r["seed"] == s]) for s in seeds],
        "all_jct_ratio": spread([runs[f"{s}-priority"]["mean_jct_s"] / runs[f"{s}-fcfs"]["mean_jct_s"]
                                 for s in seeds]),
        "goal": GOAL,
        "judged": ("met" if ratio["max"] <= GOAL else
                   "missed" if ratio["min"] > GOAL else "undecided"),
        "all_finished": all(r["finished"] == r["jobs"] and not r["wrong"] for r in runs.values()),
        "preemption_costs": costs,
        "preemption_gloo_calls": spread([c["gloo_calls"] for c in costs]) if costs else None,
        "preemption_to_return_s": spread(back) if back else None,
        "never_back": sum(c["to_return_s"] is None for c in costs),
        "time_spent": time_spent(rows),
    }


def report(f: dict, seeds: list[int], say) -> None:
    say(f"\n{'seed':>4} {'policy':<9} {'mean JCT s':>10} {'high':>7} {'low':>7} "
        f"{'max low':>8} {'finished':>8} {'preempt':>7} {'switch':>6} {'gloo':>5}")
    for s in seeds:
        for p in POLICIES:
            r = f["runs"][f"{s}-{p}"]
            say(f"{s:>4} {p:<9} {r['mean_jct_s']:>10.1f} {r['mean_jct_high_s']:>7.1f} "
                f"{r['mean_jct_low_s']:>7.1f} {r['max_jct_low_s']:>8.1f} "
                f"{r['finished']:>4}/{r['jobs']:<3} {r['preemptions']:>7} "
                f"{r['switch_calls']:>6} {r['gloo_calls']:>5}")
    ratio = f["high_jct_ratio"]
    say(f"\nhigh-priority mean JCT, priority over fcfs: {ratio['median']:.2f} "
        f"({ratio['min']:.2f}-{ratio['max']:.2f} over {len(seeds)} seed(s)); goal at most "
        f"{GOAL}: {f['judged']}")
    say("the best any policy could give (every high job on the switch from its arrival): "
        + ", ".join("-" if x is None else f"{x:.2f}" for x in f["best_high_jct_ratios"])
        + " per seed")
    all_ratio = f["all_jct_ratio"]
    say(f"all jobs' mean JCT, priority over fcfs: {all_ratio['median']:.2f} "
        f"({all_ratio['min']:.2f}-{all_ratio['max']:.2f}); every job finished, every "
        f"result exact: {'yes' if f['all_finished'] else 'NO'}")
    t = f["time_spent"]
    if t["start_s"] is not None:
        say(f"a job that never left the switch (median): {t['start_s']:.2f} s from its "
            f"arrival to its ranks' return from init_process_group, {t['first_call_s']:.2f} s "
            f"its first call, {t['switch_s']:.2f} s its other calls, {t['tail_s']:.2f} s to "
            f"destroy its group")
    say("a call after the first, mean s: "
        + ", ".join(f"{way} {t[f'{way}_call_s']:.3f}" for way in ("switch", "gloo")
                    if t[f"{way}_call_s"] is not None))
    if f["preemption_costs"]:
        g, t = f["preemption_gloo_calls"], f["preemption_to_return_s"]
        say(f"a preemption cost the preempted job {g['median']:g} calls on gloo "
            f"({g['min']:g}-{g['max']:g}) and "
            + (f"{t['median']:.1f} s to return to the switch ({t['min']:.1f}-{t['max']:.1f})"
               if t else "it never returned")
            + f", over {len(f['preemption_costs'])} preemptions")


def plot(rows: list[dict], seed: int, path: Path) -> None:
    """The first seed's jobs over time under each policy: each call a tick coloured by
    its path, from the job's arrival to its end."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharex=True, sharey=True)
    for ax, policy in zip(axes, POLICIES):
        jobs = [r for r in rows if (r["seed"], r["policy"]) == (seed, policy)]
        for y, r in enumerate(jobs):
            ax.plot([r["arrival_s"], r["finish_s"]], [y, y], color="0.8", lw=6, zorder=1)
            for way, colour in (("switch", "tab:blue"), ("gloo", "tab:orange")):
                at = [a for a, p in r["path_at"] if p == way]
                ax.scatter(at, [y] * len(at), marker="|", s=60, color=colour, zorder=2,
                           label=way if y == 0 else None)
            ax.text(r["finish_s"] + 0.5, y, f"{r['jct_s']:.0f} s", va="center", fontsize=7)
        ax.set_yticks(range(len(jobs)),
                      [f"{r['job']} ({r['class']})" for r in jobs], fontsize=8)
        ax.set_title(f"{policy}: mean JCT high {statistics.mean(r['jct_s'] for r in jobs if r['class'] == 'high'):.1f} s",
                     fontsize=9)
        ax.set_xlabel("s since the first arrival")
    axes[0].legend(fontsize=8, loc="lower right", title="a call through", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the experiment ---------------------------------------------------------------------

def check(args) -> None:
    """Refuse settings that cannot run, before anything starts."""
    if args.jobs < 2 or args.jobs > 16:
        raise SystemExit(f"--jobs must be 2 to 16 (the pool's job ids), not {args.jobs}")
    if args.high is None:
        args.high = default_high(args.jobs)
    if not 1 <= args.high < args.jobs:
        raise SystemExit(f"--high must be 1 to {args.jobs - 1} (both classes present), not "
                         f"{args.high}")
    if not 1 <= args.fit < args.jobs:
        raise SystemExit(f"--fit must be 1 to --jobs - 1 (some must wait), not {args.fit}")
    if not 2 <= args.ranks or args.jobs * args.ranks > 64:
        raise SystemExit(f"--ranks must be at least 2 and --jobs x --ranks at most 64 hosts, "
                         f"not {args.ranks} x {args.jobs}")
    try:
        check_rate(args.bw)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if args.calls < 1 or args.size < 1 or args.seeds < 1:
        raise SystemExit(f"--calls, --size and --seeds must be at least 1, not "
                         f"{args.calls}, {args.size}, {args.seeds}")
    if args.gap < 0 or args.switch_timeout <= 0:
        raise SystemExit(f"--gap must be at least 0 and --switch-timeout above 0, not "
                         f"{args.gap}, {args.switch_timeout}")


def run(args) -> int:
    from ..testbed.targets import unavailable

    check(args)
    if os.geteuid() != 0:
        raise SystemExit("the sharing experiment needs root (network namespaces)")
    if (why := unavailable("softswitch")):
        raise SystemExit(f"the sharing experiment needs the embedded switch: {why}")
    load = os.getloadavg()[0]
    seeds = list(range(args.seed, args.seed + args.seeds))
    workdir = Path(tempfile.mkdtemp(prefix="ina-sharing-"))
    progress = Progress(len(seeds) * len(POLICIES), "sharing")
    say = progress.say
    say(f"[sharing] {args.jobs} jobs of {args.ranks} ranks ({args.high} high), a pool for "
        f"{args.fit}, {args.calls} calls of {args.size} values each, links "
        f"{f'{args.bw:g} Mbit/s' if args.bw else 'unshaped'}, mean gap {args.gap:g} s, "
        f"seeds {seeds}; logs in {workdir}")
    bed = Bed(args, workdir)
    rows = []
    try:
        for n, seed in enumerate(seeds):
            jobs = schedule(seed, args.jobs, args.gap, args.high)
            say(f"seed {seed}: " + ", ".join(f"{j['job']} {j['class']} at {j['arrival']:g} s"
                                             for j in jobs))
            order = POLICIES if n % 2 == 0 else POLICIES[::-1]    # a drifting load on both
            for policy in order:
                first_port = PORT + 20 * (2 * n + order.index(policy))
                got = run_policy(bed, args, seed, policy, [dict(j) for j in jobs],
                                 first_port, say)
                for r in got:
                    r["expected"] = args.calls
                rows += got
                s = summarize(got)
                progress.advance(f"seed {seed} {policy}: mean JCT {s['mean_jct_s']:.1f} s, "
                                 f"high {s['mean_jct_high_s']:.1f} s")
    finally:
        bed.destroy()
    f = figures(rows, seeds)
    report(f, seeds, say)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "sharing.csv", CSV_FIELDS,
              [{c: (len(r[c]) if c == "preemptions" else
                    round(r[c], 3) if isinstance(r[c], float) else r[c]) for c in CSV_FIELDS}
               for r in rows])
    plot(rows, seeds[0], out / "sharing.png")
    f["jobs"] = [{k: v for k, v in r.items() if k != "path_at"} for r in rows]
    f["timeline"] = [r for r in rows if r["seed"] == seeds[0]]
    record = write("sharing-experiment", f, load_before=load, out=out, params={
        k: getattr(args, k) for k in ("jobs", "high", "fit", "ranks", "bw", "calls", "size", "gap", "seed", "seeds",
                                      "switch_timeout")})
    say(f"wrote {out / 'sharing.csv'}, {out / 'sharing.png'} and {record} "
        f"({duration(time.monotonic() - progress.started)})")
    return 0 if f["all_finished"] else 1


# -- one rank ---------------------------------------------------------------------------

def rank_main(args) -> int:
    """A rank of one job: ``--calls`` all_reduce calls on the ``ina`` backend, each
    result checked against the exact sum; its record: per call the path it took and
    when it ended, and the fallback's changes of path (from which call, why)."""
    import torch
    import torch.distributed as dist

    from innet_aggregation.worker import backend    # registers "ina"

    Path(f"{args.record}.ready").touch()
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.02)
    went = time.time()
    dist.init_process_group("cpu:ina", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world)
    joined = time.time()
    fallback = backend.session_of().fallback
    calls, wrong = [], 0
    for call in range(args.calls):
        mine = inputs(args.size, call, args.rank)
        tensor = torch.from_numpy(mine.copy())
        before = fallback.counts["gloo"]
        dist.all_reduce(tensor)
        exact = sum(inputs(args.size, call, r).astype(np.float64) for r in range(args.world))
        wrong += int(np.count_nonzero(tensor.numpy() != exact))
        path = "gloo" if fallback.counts["gloo"] > before else "switch"
        calls.append({"path": path, "at": time.time()})
    changes = list(fallback.changes)
    dist.destroy_process_group()
    Path(args.record).write_text(json.dumps({"calls": calls, "changes": changes, "wrong": wrong,
                                             "went": went, "joined": joined,
                                             "finished": time.time()}))
    return 0


def inputs(size: int, call: int, rank: int) -> np.ndarray:
    """Integer-valued float32: the switch's sum is exact."""
    rng = np.random.default_rng([call, rank])
    return rng.integers(-1000, 1001, size).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=6, help="jobs, --high of them high priority")
    parser.add_argument("--fit", type=int, default=2, help="jobs the pool fits at once")
    parser.add_argument("--ranks", type=int, default=4, help="ranks (hosts) a job")
    parser.add_argument("--bw", type=float, default=20.0,
                        help="every link's rate, Mbit/s (0: unshaped)")
    parser.add_argument("--calls", type=int, default=40, help="allreduce calls a job makes")
    parser.add_argument("--size", type=int, default=131072, help="float32 values a call")
    parser.add_argument("--high", type=int,
                        help="jobs of high priority, the others low (default: a third)")
    parser.add_argument("--gap", type=float, default=2.0,
                        help="mean seconds between arrivals (2: faster than the pool drains)")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--seeds", type=int, default=3, help="seeds, each running both policies")
    parser.add_argument("--switch-timeout", type=float, default=2.0,
                        help="INA_SWITCH_TIMEOUT of every rank (s)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a run's jobs may take after the last arrival")
    parser.add_argument("--out", default="results/sharing")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        return rank_main(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
