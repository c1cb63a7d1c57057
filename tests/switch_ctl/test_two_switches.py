"""One process drives two switches at once: a connection, an arbitration and a
controller per switch, none of them sharing state (what a leaf/spine tree needs)."""

from __future__ import annotations

import os

import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl import config as config_mod
from innet_aggregation.switch_ctl.client import P4TableEntry, SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.testbed.targets import unavailable
from tests.softswitch.test_cli_and_veth import receive

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")


def job(switch, topo, job_id: int) -> config_mod.Config:
    return config_mod.parse({
        "switch": {"grpc_addr": switch.grpc_addr, "device_id": 0,
                   "ports": sorted(topo.switch_ports)},
        "job": {"id": job_id, "udp_port": protocol.AGG_UDP_PORT_BASE,
                "service_ip": "10.0.0.254", "service_mac": "02:00:00:00:00:fe",
                "first_slot": 0, "num_slots": 8,
                "workers": [{"id": i, "mac": h.mac, "ip": h.ip, "udp_port": 41000,
                             "switch_port": h.switch_port} for i, h in enumerate(topo.hosts)]}})


def jobs_on(conn: SwitchConnection) -> list[int]:
    entries = conn.read_raw(P4TableEntry("AggIngress.job_lookup.jobs"))
    return sorted(int.from_bytes(e.table_entry.match[0].exact.value, "big") for e in entries)


def test_one_process_controls_two_switches(tmp_path):
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    if unavailable("softswitch"):
        pytest.skip(unavailable("softswitch"))
    with Namespaces(2, tag="twoA") as topo_a, Namespaces(2, tag="twoB") as topo_b, \
            SwitchProcess("softswitch", topo_a.switch_ports) as switch_a, \
            SwitchProcess("softswitch", topo_b.switch_ports) as switch_b:
        # The same election id on both: arbitration is per switch, so both are primary.
        conn_a = SwitchConnection(switch_a.grpc_addr, 0, (0, 7)).connect()
        conn_b = SwitchConnection(switch_b.grpc_addr, 0, (0, 7)).connect()
        try:
            assert conn_a.is_primary and conn_b.is_primary
            ctl_a, ctl_b = Controller(conn_a), Controller(conn_b)
            ctl_a.push()
            ctl_b.push()
            ctl_a.apply(job(switch_a, topo_a, 11))
            ctl_b.apply(job(switch_b, topo_b, 22))
            assert (jobs_on(conn_a), jobs_on(conn_b)) == ([11], [22])
            for topo in (topo_a, topo_b):       # each switch forwards by its own entries
                src, dst = topo.hosts
                frame = (bytes.fromhex(dst.mac.replace(":", "")) +
                         bytes.fromhex(src.mac.replace(":", "")) + b"\x88\xb5" + bytes(50))
                send, recv = src.raw_socket(), dst.raw_socket()
                try:
                    send.send(frame)
                    assert frame in receive(recv)
                finally:
                    send.close()
                    recv.close()
            ctl_a.remove(job(switch_a, topo_a, 11))
            assert (jobs_on(conn_a), jobs_on(conn_b)) == ([], [22])
            conn_a.close()                       # one session ends; the other goes on
            assert ctl_b.apply(job(switch_b, topo_b, 22)).total == 0
        finally:
            conn_a.close()
            conn_b.close()
