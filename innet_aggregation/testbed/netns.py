"""Hosts in network namespaces, wired to a switch by veth pairs (no Mininet needed).

Each host gets its own namespace with one interface, eth0; the switch side of each
pair stays in the root namespace with no address, as Mininet does, so a switch
process started there reads and writes them with AF_PACKET. Names carry the pid,
so concurrent runs never touch each other's interfaces, and teardown deletes only
what this object made.

With ``management=True`` each host also gets mgmt0, on a Linux bridge in the root
namespace that has an address of its own: a network beside the switch's, through
which the hosts reach a job manager running in the root namespace (the data plane
still goes through the switch only).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import socket
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .stopping import dies_with_parent, whole

CLONE_NEWNET = 0x40000000
_topologies = itertools.count()
ETH_P_ALL = 0x0003
_libc = ctypes.CDLL(None, use_errno=True)


def _run(*argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


@contextmanager
def in_netns(name: str):
    """Run the calling thread inside namespace ``name``; sockets opened here stay there."""
    with open("/proc/thread-self/ns/net") as own, open(f"/var/run/netns/{name}") as target:
        if _libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name} failed")
        try:
            yield
        finally:
            if _libc.setns(own.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace failed")


def open_raw_socket(netns: str | None, ifname: str) -> socket.socket:
    """An AF_PACKET socket bound to ``ifname`` (in ``netns``, or here if None)."""
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((ifname, 0))
        return sock
    if netns is None:
        return make()
    with in_netns(netns):
        return make()


@dataclass
class Host:
    index: int
    netns: str
    ip: str
    mac: str
    switch_port: int
    switch_ifname: str
    ifname: str = "eth0"
    mgmt_ip: str | None = None          # on mgmt0, where the topology has a management network

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """``argv`` in this host's namespace; it stops if this process is killed outright
        (stopping.dies_with_parent), as the namespace goes with it."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns, *dies_with_parent(argv)],
                                **kwargs)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], **kwargs)

    def raw_socket(self) -> socket.socket:
        return open_raw_socket(self.netns, self.ifname)


@dataclass
class Namespaces:
    """``num_hosts`` hosts, host i on switch port i+1, addresses 10.0.0.(first_host+i+1)/24
    (``first_host`` numbers the hosts of several switches apart, in one subnet)."""
    num_hosts: int
    tag: str = field(default_factory=lambda: f"t{os.getpid() % 100000}x{next(_topologies) % 100}")
    subnet_prefix: str = "10.0.0."
    hosts: list[Host] = field(default_factory=list)
    first_host: int = 0
    management: bool = False
    mgmt_prefix: str | None = None       # "198.18.N." once the management network exists
    mtu: int = 1500                      # both ends of each host's link (layout.link_mtu)

    MGMT_IFNAME = "mgmt0"

    def __post_init__(self):
        if not 1 <= self.num_hosts <= 250:
            raise ValueError("num_hosts must be between 1 and 250")
        if len(self.tag) > 9:
            raise ValueError("tag must be at most 9 characters (interface names are 15)")
        if not 68 <= self.mtu <= 65535:
            raise ValueError(f"mtu must be 68..65535 (IPv4's least, veth's most), not {self.mtu}")

    @property
    def switch_ports(self) -> dict[int, str]:
        return {h.switch_port: h.switch_ifname for h in self.hosts}

    @property
    def bridge(self) -> str:
        return f"{self.tag}mb"

    @property
    def mgmt_address(self) -> str | None:
        """The root namespace's address on the management network."""
        return f"{self.mgmt_prefix}1" if self.mgmt_prefix else None

    def create(self) -> "Namespaces":
        if os.geteuid() != 0:
            raise PermissionError("creating network namespaces needs root")
        try:
            if self.management:
                self._add_bridge()
            for i in range(self.num_hosts):
                self._add_host(i)
        except Exception:
            self.destroy()
            raise
        return self

    def _add_host(self, i: int) -> None:
        n = self.first_host + i + 1
        host = Host(index=i, netns=f"{self.tag}h{i}", ip=f"{self.subnet_prefix}{n}",
                    mac=f"02:00:00:00:{n >> 8:02x}:{n & 0xff:02x}",
                    switch_port=i + 1, switch_ifname=f"{self.tag}s{i}")
        peer = f"{self.tag}p{i}"
        _run("ip", "netns", "add", host.netns)
        self.hosts.append(host)  # so destroy() removes it even if the rest fails
        _run("ip", "link", "add", host.switch_ifname, "mtu", str(self.mtu), "type", "veth",
             "peer", "name", peer, "mtu", str(self.mtu))
        _run("ip", "link", "set", peer, "netns", host.netns)
        ns = ("ip", "netns", "exec", host.netns)
        _run(*ns, "ip", "link", "set", peer, "name", host.ifname)
        _run(*ns, "ip", "link", "set", host.ifname, "address", host.mac)
        _run(*ns, "ip", "addr", "add", f"{host.ip}/24", "dev", host.ifname)
        _run(*ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run(*ns, "ip", "link", "set", host.ifname, "up")
        # A user-space switch forwards what the kernel hands it; with TX checksum
        # offload the checksum is never filled in and the receiver drops the packet.
        # Off, it takes UDP segmentation with it: a worker's GSO messages are cut
        # into datagrams here, one frame each to the switch.
        _run(*ns, "ethtool", "-K", host.ifname, "tx", "off")
        _switch_side_up(host.switch_ifname)
        if self.management:
            self._add_mgmt_link(host)

    def _add_bridge(self) -> None:
        """A bridge with an address in a 198.18.N.0/24 (RFC 2544's benchmarking range)
        that no interface here uses yet."""
        used = _run("ip", "-4", "-o", "addr", "show").stdout
        start = (os.getpid() + next(_topologies)) % 512
        for k in range(512):
            n = (start + k) % 512
            prefix = f"198.{18 + n // 256}.{n % 256}."
            if f" {prefix}" not in used:
                break
        else:
            raise RuntimeError("no free 198.18.0.0/15 subnet for a management network")
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self.mgmt_prefix = prefix
        Path(f"/proc/sys/net/ipv6/conf/{self.bridge}/disable_ipv6").write_text("1")
        _run("ip", "addr", "add", f"{prefix}1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def _add_mgmt_link(self, host: Host) -> None:
        outer, peer = f"{self.tag}m{host.index}", f"{self.tag}q{host.index}"
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", peer)
        host.mgmt_ip = f"{self.mgmt_prefix}{host.index + 2}"
        _run("ip", "link", "set", peer, "netns", host.netns)
        ns = ("ip", "netns", "exec", host.netns)
        _run(*ns, "ip", "link", "set", peer, "name", self.MGMT_IFNAME)
        _run(*ns, "ip", "addr", "add", f"{host.mgmt_ip}/24", "dev", self.MGMT_IFNAME)
        _run(*ns, "ip", "link", "set", self.MGMT_IFNAME, "up")
        Path(f"/proc/sys/net/ipv6/conf/{outer}/disable_ipv6").write_text("1")
        _run("ip", "link", "set", outer, "master", self.bridge)
        _run("ip", "link", "set", outer, "up")

    @whole
    def destroy(self) -> None:
        for host in self.hosts:
            _run("ip", "link", "del", host.switch_ifname, check=False)  # removes the peer too
            if self.management:
                _run("ip", "link", "del", f"{self.tag}m{host.index}", check=False)
            _run("ip", "netns", "del", host.netns, check=False)
        self.hosts = []
        if self.mgmt_prefix is not None:
            _run("ip", "link", "del", self.bridge, check=False)
            self.mgmt_prefix = None

    def __enter__(self) -> "Namespaces":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()


def _switch_side_up(ifname: str) -> None:
    """A switch's interface: no TX checksum offload (see ``Namespaces._add_host``), no IPv6
    chatter."""
    _run("ethtool", "-K", ifname, "tx", "off")
    ipv6 = Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6")
    if ipv6.exists():            # absent under IPv6's least MTU, 1280 B
        ipv6.write_text("1")
    _run("ip", "link", "set", ifname, "up")


@dataclass
class SwitchLink:
    """A cable between two switch processes: a veth pair, both ends in the root
    namespace, named ``<tag>a`` and ``<tag>b``."""
    tag: str

    @property
    def ends(self) -> tuple[str, str]:
        return f"{self.tag}a", f"{self.tag}b"

    def create(self) -> "SwitchLink":
        a, b = self.ends
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        try:
            for end in self.ends:
                _switch_side_up(end)
        except Exception:
            self.destroy()
            raise
        return self

    @whole
    def destroy(self) -> None:
        _run("ip", "link", "del", self.ends[0], check=False)
