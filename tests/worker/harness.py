"""Worker processes in network namespaces, aggregating through a real switch target.

``Fabric`` owns a topology of its own (its own interface names, so it never meets
the packet tests' switch), a switch process (the fixture's target), and a
controller session of its own beside the packet tests' one; ``job()`` writes a job's TOML and installs it on fresh slots,
``run()`` starts ``python -m innet_aggregation.worker.run`` (or any module) on the job's hosts and
collects what each prints.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl import config as config_mod
from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.switch_ctl.client import SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.switch_ctl.tree import Tree
from innet_aggregation.testbed.netns import SwitchLink, Namespaces
from innet_aggregation.testbed.targets import SwitchProcess, unavailable
from innet_aggregation.testbed.layout import tree_config_dict

REPO = Path(__file__).resolve().parents[2]
SERVICE_IP = "10.0.0.254"
SERVICE_MAC = "02:00:00:00:00:fe"
WORKER_UDP_PORT = 41000


def job_udp_port(job_id: int) -> int:
    """Each job its own port of the program's 16 (switch_ctl apply refuses a shared one)."""
    return protocol.AGG_UDP_PORTS.start + job_id % len(protocol.AGG_UDP_PORTS)


@dataclass
class Job:
    id: int
    path: Path
    hosts: list            # testbed.netns.Host, worker i on hosts[i]
    first_slot: int
    num_slots: int

    @property
    def num_workers(self) -> int:
        return len(self.hosts)

    @property
    def udp_port(self) -> int:
        return job_udp_port(self.id)


@dataclass
class WorkerRun:
    worker: int
    returncode: int
    reports: list[dict]
    stderr: str

    @property
    def error(self) -> str | None:
        return next((r["error"] for r in self.reports if "error" in r), None)


@dataclass
class Fabric:
    target: str
    num_hosts: int
    workdir: Path
    topology: Namespaces | None = None
    switch: SwitchProcess | None = None
    control: Controller | None = None
    next_slot: int = 0
    next_job: int = 100
    jobs: list[Job] = field(default_factory=list)
    io_threads: int | None = None        # the softswitch's packet threads (None: its default)
    tag: str = "wk"                      # namespace names: two fabrics at once need two

    def start(self) -> "Fabric":
        self.topology = Namespaces(self.num_hosts, tag=f"{self.tag}{os.getpid() % 100000}").create()
        try:
            self.switch = SwitchProcess(self.target, self.topology.switch_ports,
                                        log_path=self.workdir / f"{self.target}.log",
                                        io_threads=self.io_threads).start(60)
            self.control = Controller(SwitchConnection(self.switch.grpc_addr).connect())
            self.control.push()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.control is not None:
            self.control.conn.close()
        if self.switch is not None:
            self.switch.stop()
        if self.topology is not None:
            self.topology.destroy()

    def restart_switch(self) -> None:
        """Kill the switch and start a fresh process on the same ports and P4Runtime
        address: no program, no entries, no slot state, as after a crash."""
        self.control.conn.close()
        if self.switch.process.poll() is None:
            self.switch.process.kill()
            self.switch.process.wait()
        self.switch = SwitchProcess(self.target, self.topology.switch_ports,
                                    grpc_addr=self.switch.grpc_addr,
                                    log_path=self.workdir / f"{self.target}-restarted.log").start(60)
        self.control = None

    def reconnect(self) -> None:
        """The fabric's controller again, on the program someone else pushed."""
        self.control = Controller(SwitchConnection(self.switch.grpc_addr).connect())
        self.control.conn.load_p4info()

    # -- control plane ---------------------------------------------------------
    def _config(self, job: Job) -> config_mod.Config:
        return jobfile.load(job.path)

    def job(self, num_workers: int, num_slots: int = 16, *, first_host: int = 0,
            service: tuple[str, str] = (SERVICE_IP, SERVICE_MAC),
            deadline_ms: float | None = None) -> Job:
        """A job over hosts ``first_host``..., on slots no earlier job used and a UDP
        port of its own, with ``service`` as its (IPv4, MAC) service address, and
        ``deadline_ms`` if given."""
        job_id = self.next_job
        self.next_job += 1
        hosts = self.topology.hosts[first_host:first_host + num_workers]
        lines = ["[switch]", f'grpc_addr = "{self.switch.grpc_addr}"', "device_id = 0",
                 f"ports = {[h.switch_port for h in self.topology.hosts]}", "",
                 "[job]", f"id = {job_id}", f"udp_port = {job_udp_port(job_id)}",
                 f'service_ip = "{service[0]}"', f'service_mac = "{service[1]}"',
                 f"first_slot = {self.next_slot}", f"num_slots = {num_slots}"]
        if deadline_ms is not None:
            lines.append(f"deadline_ms = {deadline_ms}")
        for i, h in enumerate(hosts):
            lines += ["", "[[job.workers]]", f"id = {i}", f'mac = "{h.mac}"', f'ip = "{h.ip}"',
                      f"udp_port = {WORKER_UDP_PORT}", f"switch_port = {h.switch_port}"]
        path = self.workdir / f"job{job_id}.toml"
        path.write_text("\n".join(lines) + "\n")
        job = Job(job_id, path, hosts, self.next_slot, num_slots)
        self.next_slot += num_slots
        self.control.apply(self._config(job))
        self.jobs.append(job)
        return job

    def remove(self, job: Job) -> None:
        self.control.remove(self._config(job))
        self.jobs.remove(job)

    def set_loss(self, job: Job, probability: float) -> None:
        """Drop this fraction of aggregation packets on every port, in and out."""
        self.control.set_loss(self._config(job).switch.ports, ingress=probability,
                              egress=probability)

    def counters(self, job: Job) -> dict[str, int]:
        return {k: v["packets"] for k, v in self.control.counters().items()}

    # -- workers -----------------------------------------------------------------
    def run(self, job: Job, args: list[str], *, workers: list[int] | None = None,
            extra: dict[int, list[str]] | None = None, module: str = "innet_aggregation.worker.run",
            late: dict[int, float] | None = None, together: bool = False,
            timeout: float = 180, env: dict[str, str] | None = None) -> list[WorkerRun]:
        """Run ``module`` on each worker's host (all of them, or ``workers``) with
        ``--config <job> --worker-id <i>`` plus ``args`` (and ``extra[i]``), starting
        worker i ``late[i]`` seconds after the others (a straggler); waits for all.
        ``together``: each runs ``module.main`` once all are ready (tests.worker.together),
        a straggler ``late[i]`` after that, for a test that judges the order of their
        first packets: started one after another, their interpreters' start-ups on a
        busy machine differ by seconds. ``env``: variables set for the workers."""
        ids = list(range(job.num_workers) if workers is None else workers)
        extra, late = extra or {}, late or {}
        launched = time.monotonic()
        # Output goes to files, not pipes: a pipe nobody drains fills after ~160 reports
        # and blocks its worker in print(), which stalls every other worker's call.
        outdir = Path(tempfile.mkdtemp(prefix=f"job{job.id}-", dir=self.workdir))
        if together:
            (outdir / "gate").mkdir()
        procs = {}
        for i in sorted(ids, key=lambda i: late.get(i, 0.0)):
            if together:
                start = [sys.executable, "-m", "tests.worker.together", str(outdir / "gate"),
                         str(len(ids)), str(late.get(i, 0.0)), module]
            else:
                start = [sys.executable, "-m", module]
                time.sleep(max(0.0, launched + late.get(i, 0.0) - time.monotonic()))
            with open(outdir / f"{i}.out", "w") as out, open(outdir / f"{i}.err", "w") as err:
                procs[i] = job.hosts[i].popen(
                    [*start, "--config", str(job.path), "--worker-id", str(i), *args,
                     *extra.get(i, [])], stdout=out, stderr=err, env={**_env(), **(env or {})},
                    cwd=REPO)
        deadline = time.monotonic() + timeout
        for i, proc in procs.items():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    p.kill()
                    p.wait()
                raise AssertionError(f"worker {i} still running after {timeout} s (a hang); "
                                     f"switch log tail:\n{self.switch.log_tail()}")
        runs = []
        for i in ids:
            proc = procs[i]
            out = (outdir / f"{i}.out").read_text()
            reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            runs.append(WorkerRun(i, proc.returncode, reports, (outdir / f"{i}.err").read_text()))
        return runs


_tree_fabrics = itertools.count()


@dataclass
class TreeFabric(Fabric):
    """A spine and ``leaves`` leaf switches of ``per_leaf`` hosts each (the testbed's
    tree layout, ``testbed.layout.tree_config_dict``), each switch a process of the
    target with a controller session of its own; leaf j's uplink is a veth pair to
    spine port j+1."""
    leaves: int = 2
    per_leaf: int = 2
    topologies: list = field(default_factory=list)
    links: list = field(default_factory=list)
    switches: dict = field(default_factory=dict)      # name -> SwitchProcess
    controls: dict = field(default_factory=dict)      # name -> Controller

    def start(self) -> "TreeFabric":
        tag = f"tr{os.getpid() % 10000}{next(_tree_fabrics) % 10}"
        try:
            spine_ports = {}
            for j in range(self.leaves):
                topo = Namespaces(self.per_leaf, tag=f"{tag}{j}",
                                first_host=j * self.per_leaf).create()
                self.topologies.append(topo)
                link = SwitchLink(f"{tag}u{j}").create()
                self.links.append(link)
                spine_ports[j + 1] = link.ends[1]
                self._start_switch(f"leaf{j}", {**topo.switch_ports,
                                                self.per_leaf + 1: link.ends[0]})
            self._start_switch("spine", spine_ports)
            self.switch = self.switches["spine"]
        except BaseException:
            self.stop()
            raise
        return self

    def _start_switch(self, name: str, ports: dict[int, str]) -> None:
        self.switches[name] = SwitchProcess(self.target, ports,
                                            log_path=self.workdir / f"{name}.log").start(60)
        self.controls[name] = Controller(SwitchConnection(self.switches[name].grpc_addr).connect())
        self.controls[name].push()

    def stop(self) -> None:
        for control in self.controls.values():
            control.conn.close()
        for switch in self.switches.values():
            switch.stop()
        for thing in self.links + self.topologies:
            thing.destroy()

    @property
    def hosts(self) -> list:
        return [h for topo in self.topologies for h in topo.hosts]

    def _config(self, job: Job) -> Tree:
        return jobfile.load(job.path)

    def job(self, num_slots: int = 16, *, per_leaf: int | None = None, first: int = 0,
            addresses: int = 0) -> Job:
        """A tree job on slots no earlier job used, over hosts ``first``.. ``first +
        per_leaf`` of every leaf (all by default), numbered 0.. leaf by leaf; each
        ``addresses`` value gives every switch a service address of its own."""
        job_id = self.next_job
        self.next_job += 1
        per_leaf = per_leaf or self.per_leaf
        raw = tree_config_dict({n: (s.grpc_addr, 0) for n, s in self.switches.items()},
                               self.leaves, self.per_leaf, job_id, num_slots,
                               udp_port=WORKER_UDP_PORT)
        raw["job"].update(first_slot=self.next_slot, udp_port=job_udp_port(job_id))
        hosts = []
        for j in range(self.leaves):
            leaf = raw["switches"][f"leaf{j}"]
            leaf["workers"] = leaf["workers"][first:first + per_leaf]
            for k, w in enumerate(leaf["workers"]):
                w["id"] = j * per_leaf + k
                hosts.append(self.topologies[j].hosts[first + k])
        for n, (name, sw) in enumerate(raw["switches"].items()):
            if addresses:
                sw["service_ip"] = f"10.0.0.{200 + 10 * addresses + n}"
                sw["service_mac"] = f"02:00:00:00:{0x10 + addresses:02x}:{n:02x}"
        path = self.workdir / f"tree{job_id}.toml"
        path.write_text(tomli_w.dumps(raw))
        job = Job(job_id, path, hosts, self.next_slot, num_slots)
        self.next_slot += num_slots
        for name, config in self._config(job).switches.items():   # parents first
            self.controls[name].apply(config)
        self.jobs.append(job)
        return job

    def remove(self, job: Job) -> None:
        for name, config in reversed(self._config(job).switches.items()):
            self.controls[name].remove(config)
        self.jobs.remove(job)

    def set_loss(self, job: Job, probability: float) -> None:
        """Drop this fraction of aggregation packets on every link, in each direction:
        on leaving every switch port, and on entering the leaves from the workers."""
        tree = self._config(job)
        for name, config in tree.switches.items():
            ports = config.switch.ports
            self.controls[name].set_loss(ports, egress=probability)
            workers = [w.switch_port for w in config.job.workers] if name != tree.root else []
            self.controls[name].set_loss(workers, ingress=probability)

    def counters(self, job: Job) -> dict[str, dict[str, int]]:
        return {name: {k: v["packets"] for k, v in control.counters().items()}
                for name, control in self.controls.items()}


def skip_unless_runnable(target: str) -> None:
    """Skip, saying why, where the worker fabrics cannot run on ``target``."""
    import pytest
    if os.geteuid() != 0:
        pytest.skip("worker end-to-end tests need root to create network namespaces")
    if not protocol.PROGRAM_JSON.exists():
        pytest.skip(f"{protocol.PROGRAM_JSON} is missing: run 'make p4'")
    reason = unavailable(target)
    if reason:
        pytest.skip(reason)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
