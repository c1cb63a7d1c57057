"""End to end through the Mininet testbed, one switch and a tree: ping via the switches,
one allreduce, clean teardown."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from innet_aggregation.p4src import protocol

NUM_HOSTS = 3


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the Mininet testbed needs root"
    try:
        from innet_aggregation.testbed.p4switch import import_mininet
        import_mininet()
    except ImportError as exc:
        return str(exc)
    if not protocol.PROGRAM_JSON.exists():
        return f"{protocol.PROGRAM_JSON} is missing: run 'make p4'"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@pytest.fixture(scope="module", params=[
    ("softswitch", "star", 256), ("softswitch", "tree", 256), ("softswitch", "star", 1024),
    pytest.param(("bmv2", "star", 256), marks=pytest.mark.bmv2),
    pytest.param(("bmv2", "tree", 256), marks=pytest.mark.bmv2),
    pytest.param(("bmv2", "star", 1024), marks=pytest.mark.bmv2)],
    ids=lambda p: "-".join(map(str, p)))
def testbed(request):
    """256 values per packet on Ethernet's MTU; 1024 on a jumbo one."""
    from innet_aggregation.testbed.targets import bmv2_path
    from innet_aggregation.testbed.topology import Testbed
    target, topo, values = request.param
    wanted = os.environ.get("AGG_SWITCH")
    if wanted and wanted != target:
        pytest.skip(f"AGG_SWITCH={wanted} selects the other target")
    if target == "bmv2" and bmv2_path() is None:
        pytest.skip("simple_switch_grpc is not on PATH")
    # A tree of 2 leaves: h1, h2 on leaf0, h3, h4 on leaf1.
    hosts = NUM_HOSTS if topo == "star" else 4
    bed = Testbed(hosts, bw=50.0, target=target, topo=topo, values_per_packet=values).start()
    yield bed
    bed.stop()


def test_ping_through_the_switch(testbed):
    h1, h2, h3 = testbed.hosts[:3]
    for src, dst in ((h1, h2), (h3, h1)):     # in a tree, h3 -> h1 crosses the spine
        out = src.cmd(f"ping -c 2 -W 3 {dst.IP()}")
        assert " 0% packet loss" in out, out
    # ARP was answered by the other host, through the switch's flood group.
    assert h2.MAC() in h1.cmd(f"ip neigh show {h2.IP()}")


def test_switch_answers_arp_for_the_job(testbed):
    for i in (0, len(testbed.hosts) - 1):
        host = testbed.hosts[i]
        config = testbed.config
        job = (config.for_worker(i) if hasattr(config, "for_worker") else config).job
        host.cmd(f"ping -c 1 -W 2 {job.service_ip}")  # only to trigger ARP
        assert job.service_mac in host.cmd(f"ip neigh show {job.service_ip}")


def test_tx_checksum_offload_is_off(testbed):
    for host in testbed.hosts:
        features = host.cmd(f"ethtool -k {host.defaultIntf().name}")
        assert "tx-checksumming: off" in features, features
        # a worker's UDP GSO messages are cut here, not handed to the switch whole
        assert "tx-udp-segmentation: off" in features, features
    for ifname in testbed.interfaces():
        features = subprocess.run(["ethtool", "-k", ifname], capture_output=True, text=True).stdout
        assert "tx-checksumming: off" in features, features


def test_every_link_has_the_mtu_of_the_programs_packets(testbed):
    from innet_aggregation.testbed.layout import link_mtu
    mtu = link_mtu(testbed.program.format)
    assert mtu == (1500 if testbed.program.values_per_packet <= 256 else 4138)
    for host in testbed.hosts:
        assert host.cmd(f"cat /sys/class/net/{host.defaultIntf().name}/mtu").strip() == str(mtu)
    for ifname in testbed.interfaces():
        assert Path(f"/sys/class/net/{ifname}/mtu").read_text().strip() == str(mtu)
    # A jumbo frame crosses the switch whole (ping refuses to fragment it).
    h1, h2 = testbed.hosts[:2]
    out = h1.cmd(f"ping -c 1 -W 3 -M do -s {mtu - 28} {h2.IP()}")
    assert " 0% packet loss" in out, out


def test_one_allreduce_through_the_switch(testbed):
    from innet_aggregation.testbed.agents import HostAgents
    with HostAgents(testbed, gloo=False) as agents:
        answers = agents.call({"op": "allreduce", "backend": "switch", "size": 5000,
                               "reps": 1, "seed": 1, "barrier": False}, timeout=120)
    assert all(a["exact"] == [True] for a in answers), answers
    assert len({a["digests"][0] for a in answers}) == 1


def test_teardown_removes_what_it_made(testbed):
    interfaces = testbed.interfaces()
    processes = [s.process.process for s in testbed.switches.values()]
    assert interfaces and all(p.poll() is None for p in processes)
    testbed.stop()
    assert all(p.poll() is not None for p in processes)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not [name for name in interfaces if f" {name}:" in links or f" {name}@" in links]
