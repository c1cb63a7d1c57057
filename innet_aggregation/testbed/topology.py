"""The Mininet testbed: P4 switches, N worker hosts, the job installed by the controller.

    python -m innet_aggregation.testbed.topology --workers 4                      # one switch
    python -m innet_aggregation.testbed.topology --workers 8 --topo tree --leaves 2   # a spine and 2 leaves

Host hN is worker N-1, at 10.0.0.N with MAC 02:00:00:00:00:0N: on port N of the one
switch, or on leaf (N-1) // (N / leaves) (testbed.layout.tree_config_dict).
Links are rate-limited by tc (HTB through Mininet's TCLink); no Open vSwitch and no
Mininet controller are involved, so nothing outside this topology is touched. The
job's TOML configuration is generated from the topology and written next to the
switch log, so ``python -m innet_aggregation.switch_ctl counters <job.toml>`` works from another shell.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl import config as config_mod
from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.switch_ctl.client import SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.switch_ctl.tree import Tree

from .agents import AgentError, HostAgents
from .layout import (add_program_argument, add_topology_arguments, check_mtu, check_topology,
                     default_values_per_packet, default_window, host_mac, job_config_dict,
                     link_mtu, tree_config_dict)
from .links import burst_bytes, check_rate
from .p4switch import BoundedHost, P4Switch, QuietMininet
from .stopping import STOP_SIGNALS, Stopped, stop_on_signals, whole
from .targets import add_switch_arguments, cpu_seconds, default_target, free_tcp_port
from .tls import TLSBundle, make_bundle

from mininet.cli import CLI  # noqa: E402  (importable once testbed.p4switch ran)
from mininet.link import TCIntf, TCLink  # noqa: E402
from mininet.log import setLogLevel  # noqa: E402

# Above switch_ctl's default (1), which would be refused as a duplicate: a
# `switch_ctl counters job.toml` from another shell reads as a backup.
ELECTION_ID = (0, 2)
_instances = itertools.count()


def netem_available() -> bool:
    """Whether this kernel has sch_netem (needed for link delay and loss); probed in a
    throwaway network namespace so no real interface is touched."""
    probe = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root",
                            "netem", "delay", "0ms"], capture_output=True)
    return probe.returncode == 0


class ShapedIntf(TCIntf):
    """Mininet's HTB shaping with an explicit quantum (the default, rate / r2q,
    exceeds the kernel's limit above ~16 Mbit/s and every link setup prints a
    warning) and bursts (``burst`` and ``cburst``, ``links.burst_bytes``) of
    ``links.HTB_BURST_S`` at the link's rate, at least Mininet's 15 kB. HTB sends
    only what its bucket holds when the qdisc is serviced, late on a busy VM: with a
    few hundred bytes (HTB's default) 20 Mbit/s delivered 308 B frames at half the
    rate, and a bucket much smaller than the service gaps starves the link. A large
    one refills in every pause and carries a call past the rate. ``links`` keeps it
    small against a call, and the benchmarks measure what the links deliver and
    each path's share of it. ``mtu`` (layout.link_mtu) is set before the shaping,
    whose quantum is one frame of that size."""

    def config(self, mtu: int = 1500, **params):
        self.cmd(f"ip link set dev {self.name} mtu {mtu}")
        self.quantum = mtu + 14
        return super().config(**params)

    def bwCmds(self, bw=None, *args, **kwargs):
        cmds, parent = super().bwCmds(bw, *args, **kwargs)
        burst = burst_bytes(bw or 0)
        return [c.replace(" burst 15k", f" burst {burst} cburst {burst} quantum {self.quantum}")
                if " htb rate " in c else c for c in cmds], parent


class ShapedLink(TCLink):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("cls1", ShapedIntf)
        kwargs.setdefault("cls2", ShapedIntf)
        super().__init__(*args, **kwargs)


@dataclass
class Testbed:
    """Build, start, configure and tear down the topology (a context manager).

    ``topo`` "star": one switch, host hN on port N. "tree": a spine and ``leaves``
    leaf switches, ``workers / leaves`` hosts on each, every link (host-leaf and
    leaf-spine) shaped alike; the job is one tree job (testbed.layout).
    ``bw`` is each link's rate in Mbit/s (None: unlimited). ``delay`` (e.g. "1ms")
    and ``link_loss`` (percent) need netem in the kernel; without it they raise.
    ``num_slots`` is the job's window (None: ``default_window``).
    ``values_per_packet`` picks the program (protocol.program; None: the target's
    ``layout.default_values_per_packet``), which job.toml names, so the workers load
    the same one.
    The switches' P4Runtime servers listen on ``grpc_host`` (loopback by default);
    ``tls`` gives them and the controller mutual TLS with certificates made for the
    run (testbed.tls, in the run's directory; job.toml names them).
    ``deadline_ms`` is the job's bounded-time aggregation deadline (0: none).
    """
    workers: int
    bw: float | None = 20.0
    target: str = field(default_factory=default_target)
    delay: str | None = None
    link_loss: float | None = None
    num_slots: int | None = None
    job_id: int = 1
    workdir: Path | None = None
    log_level: str = "warning"
    topo: str = "star"
    leaves: int = 2
    tls: bool = False
    grpc_host: str = "127.0.0.1"
    values_per_packet: int | None = None
    deadline_ms: float = 0.0
    io_threads: int | None = None

    def __post_init__(self):
        if not 1 <= self.workers <= min(protocol.MAX_WORKERS, 250):
            raise ValueError(f"workers must be 1..{min(protocol.MAX_WORKERS, 250)}, "
                             f"not {self.workers}")
        check_topology(self.topo, self.workers, self.leaves)
        check_rate(self.bw or 0)
        self.program = protocol.program(self.values_per_packet
                                        or default_values_per_packet(self.target))
        self.net = None
        self.switches: dict[str, P4Switch] = {}        # by the job description's names
        self.controllers: dict[str, Controller] = {}
        self.config: config_mod.Config | Tree | None = None
        self._own_workdir = self.workdir is None
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="testbed-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tls_bundle: TLSBundle | None = None

    @property
    def config_path(self) -> Path:
        return self.workdir / "job.toml"

    @property
    def hosts(self) -> list:
        return self.net.hosts if self.net else []

    def configs(self) -> dict[str, config_mod.Config]:
        """Each switch's configuration, by name (parents first)."""
        if isinstance(self.config, Tree):
            return dict(self.config.switches)
        return {"switch": self.config} if self.config else {}

    def start(self) -> "Testbed":
        setLogLevel(self.log_level)
        try:
            if os.geteuid() != 0:
                raise PermissionError("the testbed needs root (Mininet)")
            if (self.delay or self.link_loss) and not netem_available():
                raise RuntimeError("this kernel has no netem (sch_netem): link delay and loss "
                                   "are unavailable; use the switch's loss simulator instead")
            if self.tls:
                self.tls_bundle = make_bundle(self.workdir / "tls", (self.grpc_host,))
            self._build()
            self._configure_job()
        except BaseException:
            self.stop()
            raise
        return self

    def _add_switch(self, name: str, node: str) -> P4Switch:
        self.switches[name] = self.net.addSwitch(
            node, cls=P4Switch, target=self.target,
            grpc_addr=f"{self.grpc_host}:{free_tcp_port()}",
            log_path=self.workdir / f"{name}.log", tls=self.tls_bundle,
            io_threads=self.io_threads)
        return self.switches[name]

    def _build(self) -> None:
        self.net = QuietMininet(controller=None, host=BoundedHost, switch=P4Switch,
                                link=ShapedLink, build=False, autoSetMacs=False,
                                waitConnected=False)
        # Interface names are <node>-eth<port>, at most 15 characters.
        node = f"s{os.getpid() % 10000}{next(_instances) % 10}"
        # no TX checksum offload: see netns.py
        link = {"bw": self.bw, "txo": False, "mtu": link_mtu(self.program.format)}
        if self.delay:
            link["delay"] = self.delay
        if self.link_loss:
            link["loss"] = self.link_loss
        if self.topo == "star":
            edges = [self._add_switch("switch", node)] * self.workers
            ports = list(range(1, self.workers + 1))
        else:
            per_leaf = self.workers // self.leaves
            spine = self._add_switch("spine", f"{node}sp")
            edges, ports = [], []
            for j in range(self.leaves):
                leaf = self._add_switch(f"leaf{j}", f"{node}l{j}")
                self.net.addLink(leaf, spine, port1=per_leaf + 1, port2=j + 1, cls=ShapedLink,
                                 **link)
                edges += [leaf] * per_leaf
                ports += list(range(1, per_leaf + 1))
        for i, (edge, port) in enumerate(zip(edges, ports), start=1):
            host = self.net.addHost(f"h{i}", ip=f"10.0.0.{i}/24", mac=host_mac(i))
            self.net.addLink(host, edge, port2=port, cls=ShapedLink, **link)
        self.net.build()
        for host in self.net.hosts:
            host.cmd("sysctl -q -w net.ipv6.conf.all.disable_ipv6=1")
        check_mtu({intf.name: intf.node.cmd(f"cat /sys/class/net/{intf.name}/mtu")
                   for host in self.net.hosts for intf in host.intfList() if intf.name != "lo"},
                  self.program.format)
        self.net.start()

    def _configure_job(self) -> None:
        window = self.num_slots or default_window(self.workers, self.target,
                                                  self.program.values_per_packet)
        if self.topo == "star":
            switch = self.switches["switch"]
            raw = job_config_dict(switch.port_map(), switch.grpc_addr, switch.device_id,
                                  self.job_id, window,
                                  values_per_packet=self.program.values_per_packet,
                                  deadline_ms=self.deadline_ms)
        else:
            raw = tree_config_dict({n: (s.grpc_addr, s.device_id) for n, s in self.switches.items()},
                                   self.leaves, self.workers // self.leaves, self.job_id, window,
                                   values_per_packet=self.program.values_per_packet,
                                   deadline_ms=self.deadline_ms)
        if self.tls_bundle is not None:
            for switch in [raw["switch"]] if "switch" in raw else raw["switches"].values():
                switch.update(self.tls_bundle.job_settings())
        self.config_path.write_text(tomli_w.dumps(raw))
        self.config = jobfile.load(self.config_path)
        for name, config in self.configs().items():     # parents first
            conn = SwitchConnection(config.switch.grpc_addr, config.switch.device_id,
                                    ELECTION_ID, tls=config.switch.tls).connect()
            self.controllers[name] = Controller(conn)
            self.controllers[name].push(self.program.json, self.program.p4info)
            self.controllers[name].apply(config)

    def set_loss(self, ingress: float | None = None, egress: float | None = None,
                 switches: list[str] | None = None) -> None:
        """Simulated drop probability (0..1) on every port of each switch (all of them,
        or those named: "switch", or "spine" and "leafJ")."""
        configs = self.configs()
        for name in switches or configs:
            if name not in configs:
                raise ValueError(f"no switch {name!r} in this testbed ({', '.join(configs)})")
            self.controllers[name].set_loss(configs[name].switch.ports, ingress, egress)

    def switch_counters(self) -> dict[str, dict[str, dict[str, int]]]:
        """Each switch's P4 outcome counters, and the softswitch's data-plane counters
        (``data_plane_received``, ``..._ring_drops``, ...: every frame it lost, by where)
        beside them."""
        out = {}
        for name, control in self.controllers.items():
            io = self.switches[name].process.io_counters()
            out[name] = {**control.counters(),
                         **{f"data_plane_{k}": {"packets": v, "bytes": 0} for k, v in io.items()}}
        return out

    def counters(self) -> dict[str, dict[str, int]]:
        """Outcome counters, summed over the switches."""
        total: dict[str, dict[str, int]] = {}
        for counters in self.switch_counters().values():
            for name, c in counters.items():
                t = total.setdefault(name, {"packets": 0, "bytes": 0})
                t["packets"] += c["packets"]
                t["bytes"] += c["bytes"]
        return total

    def switch_cpu_seconds(self) -> float:
        """CPU time (user and system, all threads) the switch processes have used."""
        return sum(cpu_seconds(s.process.process.pid) for s in set(self.switches.values()))

    def interfaces(self) -> list[str]:
        """The switch-side interfaces (the only ones in the root namespace)."""
        return sorted(i for s in set(self.switches.values()) for i in s.port_map().values())

    @whole
    def stop(self) -> None:
        for control in self.controllers.values():
            control.conn.close()
        self.controllers = {}
        if self.net is not None:
            for node in self.net.values():
                if node.shell is not None and node.waiting:    # a signal cut a command short
                    node.sendInt()
                    node.waitOutput()
            for switch in self.switches.values():
                if switch.process is not None:
                    switch.process.stop()  # before its interfaces disappear
            self.net.stop()
            self.net = None
        if self._own_workdir and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Testbed":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class TestbedCLI(CLI):
    """Mininet's CLI plus the testbed's own commands: counters, loss, allreduce."""

    def __init__(self, testbed: Testbed, **kwargs):
        self.testbed = testbed
        self.agents = None
        super().__init__(testbed.net, **kwargs)

    def run(self):
        try:
            super().run()
        finally:                    # at exit, or a stop signal (stopping.Stopped)
            if self.agents is not None:
                self.agents.stop(graceful=False)
                self.agents = None

    def do_counters(self, _line):
        """Print each switch's outcome counters."""
        for switch, counters in self.testbed.switch_counters().items():
            print(f"[{switch}]")
            for name, c in counters.items():
                print(f"{name:<28} {c['packets']:>10} packets {c['bytes']:>12} bytes")

    def do_loss(self, line):
        """loss PERCENT [EGRESS%] [SWITCH,...]: simulated loss (ingress, egress) on every
        port of every switch, or of those named (spine, leaf0, ...)."""
        try:
            words = line.split()
            switches = words.pop().split(",") if words and not words[-1][0].isdigit() else None
            values = [float(x) / 100 for x in words]
            if not 1 <= len(values) <= 2:
                raise ValueError("give one or two percentages")
            self.testbed.set_loss(values[0], values[-1], switches)
        except (ValueError, RuntimeError) as exc:
            print(f"loss: {exc}")

    def do_allreduce(self, line):
        """allreduce [SIZE]: every host sums SIZE integer-valued floats through the switch."""
        try:
            size = int(line or 4096)
            if self.agents is None:
                print("starting one worker process per host ...")
                self.agents = HostAgents(self.testbed, gloo=False).start()
            answers = self.agents.call({"op": "allreduce", "backend": "switch", "size": size,
                                        "reps": 1, "seed": 0, "barrier": False})
        except ValueError as exc:
            print(f"allreduce: {exc}")
            return
        except AgentError as exc:
            print(f"allreduce: {exc}\n(worker processes stopped; the next allreduce starts new "
                  f"ones, on slots the switch may hold half-aggregated: restart the testbed)")
            if self.agents is not None:
                self.agents.stop(graceful=False)
                self.agents = None
            return
        for host, a in zip(self.testbed.hosts, answers):
            print(f"{host.name}: {1000 * a['times'][0]:.1f} ms, exact {a['exact'][0]}, "
                  f"{a['retransmissions'][0]} retransmissions, {a['tx_bytes'][0]} bytes sent")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Mininet testbed with a P4 aggregation switch")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--bw", type=float, default=20.0, help="link rate, Mbit/s (default 20)")
    parser.add_argument("--delay", help="link delay, e.g. 1ms (needs netem in the kernel)")
    parser.add_argument("--link-loss", type=float, help="link loss %% (needs netem)")
    add_switch_arguments(parser)
    add_topology_arguments(parser)
    add_program_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # At a terminal, Ctrl-C interrupts the CLI's command (Mininet's) and `exit` ends
    # the testbed; from a script or a scheduler, SIGINT ends it as SIGTERM does.
    stop_on_signals([s for s in STOP_SIGNALS if s != signal.SIGINT or not sys.stdin.isatty()])
    try:
        testbed = Testbed(args.workers, bw=args.bw, target=args.target or default_target(),
                          delay=args.delay, link_loss=args.link_loss, num_slots=args.slots,
                          log_level="info", topo=args.topo, leaves=args.leaves,
                          tls=args.tls, grpc_host=args.grpc_host, values_per_packet=args.values,
                          io_threads=args.io_threads)
        with testbed:
            shape = (f"one {testbed.target} switch" if args.topo == "star"
                     else f"a {testbed.target} spine and {args.leaves} leaves")
            grpc = ", ".join(f"{n} {s.process.listen_addr}" for n, s in testbed.switches.items())
            security = "mutual TLS" if args.tls else "plaintext"
            print(f"\n{args.workers} workers on {shape} (P4Runtime {grpc}, {security}), "
                  f"links {args.bw:g} Mbit/s, MTU {link_mtu(testbed.program.format)} B, "
                  f"{testbed.program.values_per_packet} values per packet")
            print(f"job configuration: {testbed.config_path}   switch and host logs: "
                  f"{testbed.workdir} (removed on exit)")
            print(f"counters from another shell: {sys.executable} -m innet_aggregation.switch_ctl counters "
                  f"{testbed.config_path}")
            print("try: h1 ping -c1 hN | allreduce 4096 | loss 1 | loss 5 0 spine | counters   "
                  "(hosts h1..hN are workers 0..N-1)\n")
            TestbedCLI(testbed)
    except (RuntimeError, PermissionError, ValueError, OSError) as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"testbed: stopped by {stop.name}; the topology was torn down", file=sys.stderr)
        return stop.code
    except KeyboardInterrupt:
        print("testbed: interrupted; the topology was torn down", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
