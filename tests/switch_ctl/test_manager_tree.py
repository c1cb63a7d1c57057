"""The job manager owning a tree: a spine and two leaves, each a process of the
embedded switch (no program: the manager pushes it), two hosts per leaf with a
management network, and the manager (``switch_ctl serve``) in the root namespace.
A job of four ranks, two per leaf, registers through the manager, runs across the
three switches with exact sums, and leaves all three when it closes, or when its
ranks are killed and their leases run out. A restarted manager keeps the job and
puts it back on a restarted leaf. A job whose ranks share one leaf spans that leaf
alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from innet_aggregation.switch_ctl.client import P4RuntimeError, SwitchConnection
from innet_aggregation.switch_ctl.config import ConfigError
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.switch_ctl.manager import config as manager_config
from innet_aggregation.switch_ctl.manager.wire import job_key
from innet_aggregation.testbed.netns import Namespaces, SwitchLink
from innet_aggregation.testbed.targets import SwitchProcess, free_tcp_port

from .manager_harness import (LEASE, REPO, SECRET, SWEEP, Rank, credential_of, env,
                              launch_rank, skip_unless_runnable, stop_ranks_and_manager,
                              until)
from .test_manager import finished, held, joined

SERVICES = [(f"10.0.0.{250 + i}", f"02:00:00:00:00:f{i}") for i in range(4)]


class TreeBed:
    """Leaf j: hosts 10.0.0.(2j+1), (2j+2) on its ports 1, 2, its uplink on port 3 to
    spine port j+1; each leaf's hosts on a management bridge of their own, routed to
    the first bridge's address, where the manager listens."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.topologies, self.links, self.switches, self.ranks = [], [], {}, []
        self.ports = {}
        self.manager = None
        tag = f"mt{os.getpid() % 10000}"
        try:
            spine_ports = {}
            for j in range(2):
                topo = Namespaces(2, tag=f"{tag}{j}", first_host=2 * j, management=True).create()
                self.topologies.append(topo)
                link = SwitchLink(f"{tag}u{j}").create()
                self.links.append(link)
                spine_ports[j + 1] = link.ends[1]
                self._switch(f"leaf{j}", {**topo.switch_ports, 3: link.ends[0]})
            self._switch("spine", spine_ports)
            self.address = f"{self.topologies[0].mgmt_address}:{free_tcp_port()}"
            for host in self.topologies[1].hosts:
                host.run(["ip", "route", "add", f"{self.topologies[0].mgmt_address}/32", "via",
                          self.topologies[1].mgmt_address], check=True)
            self.config_path = workdir / "manager.toml"
            self.config_path.write_text(tomli_w.dumps(self.config()))
            self._start_manager()
        except BaseException:
            self.stop()
            raise

    def _switch(self, name: str, ports: dict[int, str], grpc_addr: str | None = None) -> None:
        self.ports[name] = ports
        self.switches[name] = SwitchProcess("softswitch", ports, grpc_addr=grpc_addr,
                                            log_path=self.workdir / f"{name}.log").start(60)

    def restart_switch(self, name: str) -> None:
        """A crash: a fresh process (no program, no entries) on the same ports and address."""
        self.switches[name].process.kill()
        self.switches[name].process.wait()
        self._switch(name, self.ports[name], self.switches[name].grpc_addr)

    def restart_manager(self) -> None:
        self.manager.kill()
        self.manager.wait()
        self._start_manager()

    @property
    def hosts(self) -> list:
        return [h for topo in self.topologies for h in topo.hosts]

    def config(self) -> dict:
        leaf = {"ports": [1, 2, 3], "parent": "spine", "uplink_port": 3}
        return {
            "manager": {"listen": self.address, "secret": SECRET, "insecure": True,
                        "database": str(self.workdir / "manager.db"), "lease_seconds": LEASE,
                        "sweep_seconds": SWEEP, "default_slots": 16},
            "tree": {"root": "spine"},
            "switches": {"spine": {"grpc_addr": self.switches["spine"].grpc_addr,
                                   "ports": [1, 2]},
                         **{f"leaf{j}": {**leaf, "grpc_addr": self.switches[f"leaf{j}"].grpc_addr,
                                         "parent_port": j + 1} for j in range(2)}},
            "pool": {"slots": [0, 31], "services": [{"ip": ip, "mac": mac}
                                                    for ip, mac in SERVICES]},
            "fabric": {"hosts": [{"mac": h.mac, "switch": f"leaf{j}", "switch_port": h.switch_port}
                                 for j, topo in enumerate(self.topologies) for h in topo.hosts]},
        }

    def _start_manager(self) -> None:
        self.log_path = self.workdir / "manager.log"
        with open(self.log_path, "ab") as log:
            self.manager = subprocess.Popen(
                [sys.executable, "-m", "innet_aggregation.switch_ctl", "serve", "--config",
                 str(self.config_path)], stdout=log, stderr=subprocess.STDOUT, env=env(),
                cwd=REPO, start_new_session=True)
        starts = self.log_path.read_text().count("job manager listening")
        until(lambda: self.log_path.read_text().count("job manager listening") > starts
              or self.manager.poll() is not None, 60, "the manager listens")
        assert self.manager.poll() is None, self.log_path.read_text()

    def installed(self) -> dict[str, set[int]]:
        """Each switch's job ids, read by a backup controller (the manager is primary).
        A switch without a program (restarted) holds none; any other failure to read
        (a deadline on a busy machine) is tried again for 20 s, then raised."""
        ids = {}
        for name, switch in self.switches.items():
            deadline = time.monotonic() + 20
            while name not in ids:
                try:
                    with SwitchConnection(switch.grpc_addr, 0, (0, 1)) as conn:
                        conn.load_p4info()
                        ids[name] = {job.id for job in Controller(conn).installed_jobs()}
                except P4RuntimeError as exc:
                    if "No forwarding pipeline" in str(exc):
                        ids[name] = set()
                    elif time.monotonic() > deadline:
                        raise
                    else:
                        time.sleep(0.5)
        return ids

    def launch(self, job: str, hosts: list[int], *args: str) -> list[Rank]:
        ranks = []
        (self.workdir / job).mkdir()
        for rank, index in enumerate(hosts):
            ranks.append(launch_rank(self.topologies[index // 2].hosts[index % 2],
                                     self.workdir / job, rank, len(hosts), self.address, job,
                                     {"INA_INSECURE": "1"}, args))
        self.ranks += ranks
        return ranks

    def stop(self) -> None:
        stop_ranks_and_manager(self.ranks, self.manager)
        for switch in self.switches.values():
            switch.stop()
        for thing in self.links + self.topologies:
            thing.destroy()


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    skip_unless_runnable()
    bed = TreeBed(tmp_path_factory.mktemp("manager-tree"))
    yield bed
    bed.stop()


def test_a_job_across_the_tree_is_exact_and_leaves_every_switch(bed):
    release = bed.workdir / "release-a"
    a = bed.launch("tree-a", [0, 1, 2, 3], "--reps", "3", "--size", "3000",
                   "--hold", str(release))
    events = joined(a)
    job_id = events[0]["job_id"]
    assert {(e["job_id"], e["first_slot"], e["udp_port"]) for e in events} == {
        (job_id, events[0]["first_slot"], events[0]["udp_port"])}
    # Each rank talks to its own leaf's service address: two leaves, two addresses.
    assert events[0]["service_ip"] == events[1]["service_ip"] != events[2]["service_ip"] \
        == events[3]["service_ip"]
    assert bed.installed() == {"spine": {job_id}, "leaf0": {job_id}, "leaf1": {job_id}}
    held(a)
    release.touch()
    finished(a, calls=3)
    until(lambda: bed.installed() == {"spine": set(), "leaf0": set(), "leaf1": set()}, 10,
          "tree-a left every switch")


def test_killed_ranks_lose_the_job_on_every_switch(bed):
    b = bed.launch("tree-b", [0, 1, 2, 3], "--reps", "100000", "--size", "2000",
                   "--pause", "0.01")
    job_id = joined(b)[0]["job_id"]
    until(lambda: all(len(r.events()) > 3 for r in b), 60, "tree-b's calls ran")
    assert all(job_id in ids for ids in bed.installed().values())
    for r in b:
        r.process.kill()
    killed = time.monotonic()
    for r in b:
        r.process.wait()
    until(lambda: "stopped renewing" in bed.log_path.read_text() and
          bed.installed() == {"spine": set(), "leaf0": set(), "leaf1": set()},
          LEASE + SWEEP + 10, "tree-b reclaimed and off every switch")
    assert time.monotonic() - killed <= LEASE + SWEEP + 2.0


def test_a_restarted_manager_keeps_the_job_and_repairs_a_restarted_leaf(bed):
    between = bed.workdir / "between-d"
    d = bed.launch("tree-d", [0, 1, 2, 3], "--sessions", "2", "--reps", "2",
                   "--between", str(between))
    job_id = joined(d)[0]["job_id"]
    until(lambda: all(len(r.events()) == 3 for r in d), 60, "tree-d's first session")
    bed.restart_manager()
    assert (f"job {job_key('tree-d', credential_of('tree-d'))} (id {job_id}) restored from the "
            f"database") in bed.log_path.read_text()
    bed.restart_switch("leaf1")
    until(lambda: job_id in bed.installed()["leaf1"], 20, "tree-d back on leaf1")
    assert "job %d is not on the switch: re-applying it" % job_id in bed.log_path.read_text()
    assert all(job_id in ids for ids in bed.installed().values())
    between.touch()            # new sessions on the same job, through the repaired leaf
    finished(d, calls=4)
    until(lambda: bed.installed() == {"spine": set(), "leaf0": set(), "leaf1": set()}, 10,
          "tree-d left every switch")


def test_a_job_on_one_leaf_spans_that_leaf_alone(bed):
    c = bed.launch("tree-c", [2, 3], "--reps", "2", "--hold", str(bed.workdir / "release-c"))
    job_id = joined(c)[0]["job_id"]
    assert bed.installed() == {"spine": set(), "leaf0": set(), "leaf1": {job_id}}
    (bed.workdir / "release-c").touch()
    finished(c, calls=2)
    until(lambda: not bed.installed()["leaf1"], 10, "tree-c left leaf1")


def test_a_tree_managers_file_is_checked_whole(tmp_path):
    raw = {"manager": {"listen": "127.0.0.1:7000", "secret": SECRET},
           "tree": {"root": "spine"},
           "switches": {"spine": {"grpc_addr": "127.0.0.1:1", "ports": [1, 2]},
                        "leaf0": {"grpc_addr": "127.0.0.1:2", "ports": [1, 2, 3],
                                  "parent": "spine", "uplink_port": 3, "parent_port": 1},
                        "leaf1": {"grpc_addr": "127.0.0.1:3", "ports": [1, 2, 3],
                                  "parent": "spine", "uplink_port": 3, "parent_port": 2}},
           "pool": {"services": [{"ip": ip, "mac": mac} for ip, mac in SERVICES]},
           "fabric": {"hosts": [{"mac": "02:00:00:00:00:01", "switch": "leaf0",
                                 "switch_port": 1}]}}
    config = manager_config.parse(raw, tmp_path)
    assert list(config.switches) == ["spine", "leaf0", "leaf1"]
    assert config.tree.parents == {"leaf0": "spine", "leaf1": "spine"}
    assert config.homes == {"02:00:00:00:00:01": "leaf0"}
    raw["switches"]["leaf1"].update(parent="leaf9", colour="blue")
    raw["switch"] = {"grpc_addr": "127.0.0.1:1"}
    raw["pool"]["services"] = raw["pool"]["services"][:2]
    raw["fabric"]["hosts"] += [{"mac": "02:00:00:00:00:02", "switch": "leaf0", "switch_port": 3},
                               {"mac": "02:00:00:00:00:03", "switch": "leaf7", "switch_port": 1},
                               {"mac": "02:00:00:00:00:04", "switch_port": 2}]
    with pytest.raises(ConfigError) as err:
        manager_config.parse(raw, tmp_path)
    for said in ["give [switch] (one switch) or [tree] and [switches.NAME] (a tree), not both",
                 "switches.leaf1 has unknown keys colour",
                 "switches.leaf1.parent 'leaf9' is not a switch of the tree",
                 "switches.leaf0: port 3 is given to both worker 02:00:00:00:00:02 and the uplink",
                 "02:00:00:00:00:03 is behind switch 'leaf7', which [switches] lacks",
                 "fabric.hosts[3].switch must name the switch it is behind",
                 "pool.services lists 2 service addresses; a job across the tree takes one per "
                 "switch, 3"]:
        assert said in str(err.value), (said, str(err.value))
