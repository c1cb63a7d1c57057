"""Differential test: the same frames through BMv2 and the softswitch give the same output.

Runs only where simple_switch_grpc is installed (and as root, for the veth pairs):
BMv2 runs programs/primitives.p4 behind real interfaces, the softswitch pipeline
runs the same JSON in process, and every frame's output (port, bytes) must match.
"""

from __future__ import annotations

import os
import select
import time

import pytest

from innet_aggregation.testbed.targets import bmv2_path
from innet_aggregation.switch_ctl.client import P4MulticastGroupEntry
from tests.softswitch.conftest import connect, load, program_files
from tests.softswitch.test_primitives import frame

NEEDS_BMV2 = pytest.mark.skipif(bmv2_path() is None or os.geteuid() != 0,
                                reason="needs simple_switch_grpc and root")
pytestmark = NEEDS_BMV2

GROUP = 5
REPLICAS = [(1, 0), (2, 7), (3, 9), (4, 2)]


def cases() -> list[bytes]:
    out = []
    for op in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16):
        for a, b, sa, sb in ((0xFFFFFFF0, 0x20, 30000, 10000), (5, 3, -30000, 10000),
                             (11, 0, -5, 7), (GROUP, 7, -32768, -1), (0x01, 1, 1, 2)):
            out.append(frame(op, a, b, sa, sb, nib=0x5C, payload=b"\x00\x00\x00\x01tail"))
    out += [frame(16, a=77, sa=5, r2=9), frame(16, a=55, sa=200, r2=9), frame(16, a=1, sa=5)]
    out += [frame(1)[:24], frame(0xEE), frame(0xF3, a=0x52, payload=b"\0\0\0\1"),
            b"\x02" * 12 + b"\x88\x12" + b"data", b"\x02" * 12 + b"\x08\x00" + bytes(30),
            b"\x02" * 12 + b"\x88\xb6\x42rest", b"\x02" * 12 + b"\x88\xb6\x43rest",
            b"\x02" * 12 + b"\x88\xb6"]
    return out


def test_bmv2_and_softswitch_agree_frame_by_frame(backend):
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    soft = load("primitives", backend)
    soft.groups[GROUP] = REPLICAS        # outputs are compared sorted: order is not tested
    with Namespaces(4) as topo, SwitchProcess("bmv2", topo.switch_ports) as bmv2:
        conn = connect(bmv2.grpc_addr, "primitives")
        try:
            conn.insert(P4MulticastGroupEntry(GROUP, replicas=list(REPLICAS)))
        finally:
            conn.close()
        mismatches, forwarded = compare(topo, cases(), lambda data: soft.process(data, 1))
    assert not mismatches, mismatches[:3]
    assert forwarded > 50                      # most cases send something: not a vacuous match


def agrees_with_bmv2(program: str, backend: str, frames: list[bytes]) -> None:
    """``program`` (a test program with no entries) on this backend, in process, puts
    out what BMv2 puts out behind veths, frame by frame, and forwards every frame (so
    the match is not one of silences)."""
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    soft = load(program, backend)
    with Namespaces(4) as topo, SwitchProcess("bmv2", topo.switch_ports) as bmv2:
        connect(bmv2.grpc_addr, program).close()
        mismatches, forwarded = compare(topo, frames, lambda data: soft.process(data, 1))
    assert not mismatches, mismatches[:3]
    assert forwarded == len(frames)


def compare(topo, frames, expected) -> tuple[list, int]:
    """Send each frame into BMv2 from host 0; collect what every host gets and compare
    it with ``expected(frame)``. Returns the mismatches and how many frames forwarded."""
    socks = [h.raw_socket() for h in topo.hosts]
    try:
        time.sleep(0.5)
        for sock in socks:
            drain(sock)
        port_of = {sock: h.switch_port for sock, h in zip(socks, topo.hosts)}
        mismatches, forwarded = [], 0
        for data in frames:
            want = sorted(expected(data))
            socks[0].send(data)
            got = sorted(collect(socks, port_of, len(want)))
            forwarded += bool(want)
            if got != want:
                mismatches.append((data.hex(), want, got))
        return mismatches, forwarded
    finally:
        for sock in socks:
            sock.close()


def drain(sock) -> None:
    while select.select([sock], [], [], 0)[0]:
        sock.recv(65536)


def collect(socks, port_of, expected: int, quiet: float = 0.4,
            patience: float = 3.0) -> list[tuple[int, bytes]]:
    """Frames the switch sent to the hosts: until ``expected`` have come (waiting up to
    ``patience`` seconds: BMv2 on a loaded machine is slow), then until ``quiet``
    seconds pass without another."""
    out = []
    deadline = time.monotonic() + patience
    while True:
        wait = quiet if len(out) >= expected else max(deadline - time.monotonic(), quiet)
        ready, _, _ = select.select(socks, [], [], wait)
        if not ready:
            return out
        for sock in ready:
            data, addr = sock.recvfrom(65536)
            if addr[2] != 4:                       # not the host's own outgoing frame
                out.append((port_of[sock], data))


def program_forwarding(grpc_addr: str) -> None:
    """The same P4Runtime writes for both switches (forwarding.p4)."""
    from tests.softswitch.test_p4runtime import MAC2, add_route

    conn = connect(grpc_addr, "forwarding")
    try:
        add_route(conn, "10.0.0.0", 8, 1, "02:00:00:00:00:aa")
        add_route(conn, "10.1.0.0", 16, 2, "02:00:00:00:00:bb")
        add_route(conn, "10.1.2.0", 24, 3, "02:00:00:00:00:cc")
        for prio, src, proto, action, port in ((10, "10.0.0.0/&255.0.0.0", None, "drop", None),
                                               (20, "10.0.0.5/&255.255.255.255", "17/&0xff",
                                                "set_port", 4),
                                               (30, "10.0.0.7/&255.255.255.255", None,
                                                "set_port", 2)):
            match = {"src_addr": src} | ({"protocol": proto} if proto else {})
            conn.insert(conn.table_entry("Ing.acl", f"Ing.{action}", match,
                                         {"port": port} if port else {}, priority=prio))
        conn.insert(conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": MAC2}, {"port": 2}))
        conn.insert(P4MulticastGroupEntry(1, replicas=[(port, 0) for port in (1, 2, 3, 4)]))
    finally:
        conn.close()


def test_bmv2_and_softswitch_agree_on_p4runtime_programmed_tables(switch):
    from scapy.layers.l2 import Ether

    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess
    from tests.softswitch.test_p4runtime import MAC1, MAC2, MAC9, ip_frame

    program_forwarding(switch.addr)
    frames = [ip_frame(src=src, dst=dst, proto=proto, tos=tos, ttl=ttl)
              for src in ("10.0.0.5", "10.0.0.6", "10.0.0.7", "20.0.0.1")
              for dst in ("10.9.9.9", "10.1.9.9", "10.1.2.3", "11.0.0.1")
              for proto, tos, ttl in ((17, 0xB8, 64), (6, 0x24, 1), (17, 0xC4, 0))]
    frames += [bytes(Ether(src=MAC1, dst=dst, type=0x0806) / (b"\0" * 28))
               for dst in (MAC2, MAC9, "ff:ff:ff:ff:ff:ff")]
    with Namespaces(4) as topo, SwitchProcess("bmv2", topo.switch_ports) as bmv2:
        program_forwarding(bmv2.grpc_addr)
        mismatches, forwarded = compare(topo, frames, lambda data: switch.send(data, 1))
    assert not mismatches, mismatches[:3]
    assert forwarded > len(frames) // 2
