"""A job manager's testbed: eight hosts in namespaces with a management network, one
switch process (no program: the manager pushes it), and the manager itself as a
process of its own (``switch_ctl serve``) in the root namespace, listening with TLS
on the management network, so that a test can kill and restart it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.client import P4RuntimeError, SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.testbed.layout import link_mtu
from innet_aggregation.testbed.netns import Namespaces
from innet_aggregation.testbed.targets import SwitchProcess, free_tcp_port, unavailable
from innet_aggregation.testbed.tls import make_bundle

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cret-for-the-manager-tests"
LEASE = 3.0
SWEEP = 0.5
POOL_SLOTS = 32
JOB_SLOTS = 16
SERVICES = [("10.0.0.250", "02:00:00:00:00:fa"), ("10.0.0.251", "02:00:00:00:00:fb"),
            ("10.0.0.252", "02:00:00:00:00:fc")]


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


@dataclass
class Rank:
    rank: int
    process: subprocess.Popen
    out: Path
    err: Path

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out.read_text().splitlines()
                if line.startswith("{")]

    def event(self, name: str) -> dict | None:
        return next((e for e in self.events() if e.get("event") == name), None)

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"rank {self.rank} still running after {timeout} s:\n"
                                 f"{self.out.read_text()}\n{self.stderr[-3000:]}") from None


@dataclass
class ManagerBed:
    workdir: Path
    target: str = "softswitch"
    values: int | None = None          # the program's values per packet (None: the default)
    topology: Namespaces | None = None
    switch: SwitchProcess | None = None
    manager: subprocess.Popen | None = None
    port: int = 0
    restarts: int = 0
    ranks: list[Rank] = field(default_factory=list)
    listener: dict = field(default_factory=dict)    # [manager] settings of the listener
    unlisted: tuple[int, ...] = ()     # hosts left out of fabric.hosts: the manager learns them
    tenants: dict = field(default_factory=dict)     # [tenants.NAME] beside manager.secret
    switch_metrics: str | None = None  # the switch's --metrics-addr, if any

    def start(self) -> "ManagerBed":
        self.topology = Namespaces(8, tag=f"mg{os.getpid() % 100000}", management=True,
                                   mtu=link_mtu(protocol.packet_format(self.values))).create()
        try:
            self.tls = make_bundle(self.workdir / "tls", hosts=(self.topology.mgmt_address,))
            self.other_ca = make_bundle(self.workdir / "other-tls")
            self.start_switch()
            self.port = free_tcp_port()
            self.config_path = self.workdir / "manager.toml"
            self.config_path.write_text(tomli_w.dumps(self.manager_config()))
            self.start_manager()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def address(self) -> str:
        return f"{self.topology.mgmt_address}:{self.port}"

    def manager_config(self) -> dict:
        return {
            "manager": {"listen": f"{self.topology.mgmt_address}:{self.port}", "secret": SECRET,
                        "cert": str(self.tls.server_cert), "key": str(self.tls.server_key),
                        "database": str(self.workdir / "manager.db"), "lease_seconds": LEASE,
                        "sweep_seconds": SWEEP, "default_slots": JOB_SLOTS, **self.listener},
            "switch": {"grpc_addr": self.switch.grpc_addr,
                       "ports": sorted(h.switch_port for h in self.topology.hosts),
                       **({"values_per_packet": self.values} if self.values else {})},
            "pool": {"job_ids": [1, 8], "slots": [0, POOL_SLOTS - 1],
                     "services": [{"ip": ip, "mac": mac} for ip, mac in SERVICES]},
            "fabric": {"hosts": [{"mac": h.mac, "switch_port": h.switch_port}
                                 for h in self.topology.hosts
                                 if h.index not in self.unlisted]},
            **({"tenants": self.tenants} if self.tenants else {}),
        }

    # -- the manager process ---------------------------------------------------------
    def start_manager(self, fault: str | None = None) -> None:
        """The manager, killing itself at ``fault`` (faulty_manager.py) if given."""
        self.log_path = self.workdir / f"manager-{self.restarts}.log"
        program = (["-m", "innet_aggregation.switch_ctl"] if fault is None
                   else [str(Path(__file__).with_name("faulty_manager.py")), fault])
        with open(self.log_path, "wb") as log:
            self.manager = subprocess.Popen(
                [sys.executable, *program, "serve", "--config",
                 str(self.config_path)], stdout=log, stderr=subprocess.STDOUT,
                env=env(), cwd=REPO, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.manager.poll() is not None:
                raise RuntimeError(f"the manager exited with {self.manager.returncode}:\n"
                                   f"{self.log_path.read_text()}")
            try:
                with socket.create_connection((self.topology.mgmt_address, self.port), 0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"the manager did not listen:\n{self.log_path.read_text()}")

    def kill_manager(self) -> None:
        self.manager.send_signal(signal.SIGKILL)
        self.manager.wait()
        self.restarts += 1

    def manager_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.workdir.glob("manager-*.log")))

    def start_switch(self) -> None:
        """A switch with no program and no entries, on the ports (and the P4Runtime
        address) of the one before, if any."""
        starts = len(list(self.workdir.glob("switch*.log")))
        self.switch = SwitchProcess(self.target, self.topology.switch_ports,
                                    grpc_addr=self.switch.grpc_addr if self.switch else None,
                                    log_path=self.workdir / f"switch-{starts}.log",
                                    metrics_addr=self.switch_metrics).start(60)

    def kill_switch(self) -> None:
        self.switch.process.kill()
        self.switch.process.wait()

    def restart_switch(self) -> None:
        """A crash: the switch process killed, a fresh one (no program, no entries) on
        the same ports and P4Runtime address."""
        self.kill_switch()
        self.start_switch()

    def installed(self) -> dict[int, object]:
        """The jobs the switch holds, read by a backup controller (the manager is
        primary); none while it has no program (or is loading one)."""
        try:
            with SwitchConnection(self.switch.grpc_addr, 0, (0, 1)) as conn:
                conn.load_p4info()
                return {job.id: job for job in Controller(conn).installed_jobs()}
        except P4RuntimeError:
            return {}

    def deadline_jobs(self) -> list[int]:
        """The job ids the switch's round tracker holds (jobs with a deadline)."""
        with SwitchConnection(self.switch.grpc_addr, 0, (0, 1)) as conn:
            conn.load_p4info()
            tracker = Controller(conn).round_tracker
            return [match["job_id"] for match, *_ in tracker.entries(tracker.TABLE)]

    def database(self) -> dict[str, tuple[str, int]]:
        """The manager's database: job name -> (state, job id)."""
        with sqlite3.connect(self.workdir / "manager.db") as db:
            return {name: (state, json.loads(config)["job"]["id"])
                    for name, state, config in db.execute("SELECT name, state, config FROM jobs")}

    def jobs(self) -> dict:
        from innet_aggregation.switch_ctl.manager.client import _Manager
        answer = _Manager(self.address, SECRET, self.tls.ca_cert).request({"op": "jobs"})
        assert answer["status"] == "ok", answer
        return answer

    # -- ranks -----------------------------------------------------------------------
    def launch(self, job: str, hosts: list[int], *args: str, extra_env: dict | None = None,
               ca_cert: Path | None = None) -> list[Rank]:
        """One rank process per host of ``hosts`` (rank i on hosts[i]), in its namespace."""
        ranks = []
        outdir = self.workdir / job
        outdir.mkdir(exist_ok=True)
        for rank, index in enumerate(hosts):
            rank_env = {"INA_CA_CERT": str(ca_cert or self.tls.ca_cert), **(extra_env or {})}
            ranks.append(launch_rank(self.topology.hosts[index], outdir, rank, len(hosts),
                                     self.address, job, rank_env, args))
        self.ranks += ranks
        return ranks

    def stop(self) -> None:
        stop_ranks_and_manager(self.ranks, self.manager)
        if self.switch is not None:
            self.switch.stop()
        if self.topology is not None:
            self.topology.destroy()


def launch_rank(host, outdir: Path, rank: int, world: int, manager: str, job: str,
                rank_env: dict, args) -> Rank:
    """One rank (tests.switch_ctl.manager_rank) in ``host``'s namespace, joining ``job``
    at the manager; ``rank_env`` adds to or overrides the INA_* settings."""
    out, err = outdir / f"{rank}.out", outdir / f"{rank}.err"
    full_env = {**env(), "INA_MANAGER": manager, "INA_SECRET": SECRET, "INA_JOB": job,
                "INA_JOB_CREDENTIAL": credential_of(job), "INA_JOIN_TIMEOUT": "60", **rank_env}
    with open(out, "w") as o, open(err, "w") as e:
        process = host.popen([sys.executable, "-m", "tests.switch_ctl.manager_rank", "--rank",
                              str(rank), "--world", str(world), *args],
                             stdout=o, stderr=e, env=full_env, cwd=REPO)
    return Rank(rank, process, out, err)


def nothing_left(bed: "ManagerBed") -> None:
    """A test's jobs gone from the manager and the switch."""
    until(lambda: not bed.jobs()["running"] and not bed.jobs()["waiting"], 3 * LEASE,
          "the test's jobs left the manager")
    until(lambda: not bed.installed(), 5, "the test's jobs left the switch")


def skip_unless_runnable() -> None:
    """A manager's bed needs root (namespaces) and the embedded switch."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("the manager tests need root to create network namespaces")
    reason = unavailable("softswitch")
    if reason:
        pytest.skip(reason)


def credential_of(job: str) -> str:
    """The credential a test's job shares among its ranks (INA_JOB_CREDENTIAL)."""
    return f"credential-of-{job}"


def stop_ranks_and_manager(ranks: list[Rank], manager: subprocess.Popen | None) -> None:
    for rank in ranks:
        if rank.process.poll() is None:
            rank.process.kill()
            rank.process.wait()
    if manager is not None and manager.poll() is None:
        manager.terminate()
        try:
            manager.wait(timeout=10)
        except subprocess.TimeoutExpired:
            manager.kill()
            manager.wait()


def until(condition, timeout: float, what: str, interval: float = 0.1):
    """``condition()``'s first true value within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(interval)
