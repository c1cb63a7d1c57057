"""The native switch's sends on real veth pairs: sendmmsg's linear frames
(backends/native/mmsg.c) arrive whole and in order, frames over a page among them;
AF_XDP (SOFTSWITCH_TX=af_xdp, backends/native/xsk.c) sends the same frames in the same
order per port, and a port that cannot have an AF_XDP socket falls back to sendmmsg
and says so."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from innet_aggregation import cbuild
from innet_aggregation.switch_ctl.client import P4MulticastGroupEntry
from tests.softswitch.conftest import connect

XSK_C = (Path(__file__).resolve().parents[2] / "innet_aggregation" / "softswitch" / "backends"
         / "native" / "xsk.c")
AF_XDP = 44


def _af_xdp_missing() -> str | None:
    """Why this machine cannot run these tests, or None."""
    if os.geteuid() != 0:
        return "veth pairs, namespaces and AF_XDP sockets need root"
    if cbuild.compiler() is None:
        return "no C compiler for the native backend"
    try:
        socket.socket(AF_XDP, socket.SOCK_RAW, 0).close()
    except OSError as exc:
        return f"this kernel has no AF_XDP sockets ({exc})"
    return None


needs_af_xdp = pytest.mark.skipif(_af_xdp_missing() is not None, reason=str(_af_xdp_missing()))
needs_veth = pytest.mark.skipif(os.geteuid() != 0 or cbuild.compiler() is None,
                                reason="veth pairs and namespaces need root, the native "
                                       "backend a C compiler")


def test_an_unknown_send_method_is_refused_at_start():
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]),
               SOFTSWITCH_TX="io_uring")
    result = subprocess.run([sys.executable, "-m", "innet_aggregation.softswitch", "--no-p4"],
                            capture_output=True, text=True, timeout=20, env=env)
    assert result.returncode == 1
    assert "SOFTSWITCH_TX must be one of sendmmsg, af_xdp, got 'io_uring'" in result.stderr


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def _collect(socks, want: list[int], timeout: float = 10.0) -> list[list[bytes]]:
    """Our frames (EtherType 0x88b5) arriving on each socket, until each has its
    ``want`` or ``timeout`` passes."""
    got = [[] for _ in socks]
    deadline = time.monotonic() + timeout
    while any(len(g) < w for g, w in zip(got, want)) and time.monotonic() < deadline:
        ready, _, _ = select.select(socks, [], [], 0.1)
        for sock in ready:
            frame = sock.recv(65536)
            if frame[12:14] == b"\x88\xb5":
                got[socks.index(sock)].append(frame)
    return got


def _forward(tx: str, monkeypatch, burst: int = 32, rounds: int = 8):
    """Frames from host 0 through a switch sending as ``tx``: unicast to host 2 and
    broadcasts (multicast to every port), of 60 to 8,000 bytes (past a UMEM chunk:
    multi-buffer), in bursts; what hosts 1 and 2 received, the switch's log, and
    the frames sent."""
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    monkeypatch.setenv("SOFTSWITCH_TX", tx)
    with Namespaces(3, mtu=9000) as topo, SwitchProcess("softswitch", topo.switch_ports) as switch:
        conn = connect(switch.grpc_addr, "forwarding")
        socks = [h.raw_socket() for h in topo.hosts]
        try:
            for sock in socks:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            conn.insert([conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": h.mac},
                                          {"port": h.switch_port}) for h in topo.hosts])
            conn.insert(P4MulticastGroupEntry(1, replicas=[(h.switch_port, 0) for h in topo.hosts]))
            src, dst = topo.hosts[0], topo.hosts[2]
            sizes = [60, 1514, 4200, 8000, 300, 4096, 4097, 9014]
            received, sent = [[], []], []
            time.sleep(0.2)
            for r in range(rounds):
                frames = []
                for i in range(burst):
                    n = r * burst + i
                    to = b"\xff" * 6 if n % 3 == 0 else _mac(dst.mac)
                    head = to + _mac(src.mac) + b"\x88\xb5" + n.to_bytes(4, "big")
                    frames.append(head + bytes([n & 0xff]) * (sizes[n % len(sizes)] - len(head)))
                for frame in frames:
                    socks[0].send(frame)
                sent += frames
                broadcasts = sum(f[:6] == b"\xff" * 6 for f in frames)
                got = _collect(socks[1:], [broadcasts, burst])
                received[0] += got[0]
                received[1] += got[1]
            time.sleep(0.2)       # nothing more comes
            late = _collect(socks[1:], [1, 1], timeout=0.3)
            received[0] += late[0]
            received[1] += late[1]
        finally:
            conn.close()
            for sock in socks:
                sock.close()
        assert switch.process.poll() is None
        log = switch.log_path.read_text()
    return received, log, sent


@needs_veth
def test_sendmmsg_sends_every_frame_whole_and_in_order(monkeypatch):
    """Each frame behind a virtio-net header whose length is the frame's own: a wrong
    length, a header left in the frame or a frame cut at a page would show here."""
    received, log, sent = _forward("sendmmsg", monkeypatch, rounds=4)
    assert "sends: sendmmsg on every port" in log
    assert received[1] == sent
    assert received[0] == [f for f in sent if f[:6] == b"\xff" * 6]
    assert {len(f) for f in sent} >= {4097, 8000, 9014}


@needs_af_xdp
def test_af_xdp_sends_the_same_frames_in_the_same_order_as_sendmmsg(monkeypatch):
    by_mmsg, log_mmsg, _ = _forward("sendmmsg", monkeypatch)
    by_xdp, log_xdp, _ = _forward("af_xdp", monkeypatch)
    assert "sends: sendmmsg on every port" in log_mmsg
    sends = [line for line in log_xdp.splitlines() if " sends: " in line]
    assert sends and "AF_XDP in copy mode on" in sends[-1] and "sendmmsg on" not in sends[-1], sends
    numbers = [[int.from_bytes(f[14:18], "big") for f in port] for port in by_xdp]
    # host 1 gets every broadcast, host 2 every frame, each once, in the order sent
    assert numbers[0] == [n for n in range(256) if n % 3 == 0]
    assert numbers[1] == list(range(256))
    assert by_xdp == by_mmsg


HOLDER = r"""
#include <net/if.h>
#include <stdio.h>
#include "%s"
/* Holds an AF_XDP socket on queue 0 of argv[1] until stdin closes. */
int main(int argc, char **argv) {
    ss_xsk x;
    int err = argc == 2 ? ss_xsk_open(&x, (int)if_nametoindex(argv[1]), 1514) : -EINVAL;
    printf("%%d\n", err);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}
"""


@needs_af_xdp
def test_a_port_without_af_xdp_falls_back_to_sendmmsg_and_says_so(monkeypatch, tmp_path):
    """Queue 0 of one port's interface held by another AF_XDP socket: that port cannot
    bind one (EBUSY), sends with sendmmsg, and the switch names it and why."""
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    source = tmp_path / "holder.c"
    source.write_text(HOLDER % XSK_C)
    subprocess.run([cbuild.compiler(), "-O1", "-o", str(tmp_path / "holder"), str(source)],
                   check=True)
    monkeypatch.setenv("SOFTSWITCH_TX", "af_xdp")
    with Namespaces(2) as topo:
        free, held = topo.hosts
        names = free.switch_ifname, held.switch_ifname
        holder = subprocess.Popen([str(tmp_path / "holder"), held.switch_ifname],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "0"
            with SwitchProcess("softswitch", topo.switch_ports) as switch:
                conn = connect(switch.grpc_addr, "forwarding")
                socks = [h.raw_socket() for h in topo.hosts]
                try:
                    conn.insert([conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": h.mac},
                                                  {"port": h.switch_port}) for h in topo.hosts])
                    time.sleep(0.2)
                    frames = [_mac(held.mac) + _mac(topo.hosts[0].mac) + b"\x88\xb5"
                              + bytes([i]) * 100 for i in range(20)]
                    for frame in frames:
                        socks[0].send(frame)
                    assert _collect(socks[1:], [20])[0] == frames
                finally:
                    conn.close()
                    for sock in socks:
                        sock.close()
                sends = [line for line in switch.log_path.read_text().splitlines()
                         if " sends: " in line]
        finally:
            holder.stdin.close()
            holder.wait(timeout=10)
    assert sends, "the switch did not say how it sends"
    assert f"AF_XDP in copy mode on {names[0]};" in sends[-1]
    assert f"sendmmsg on {names[1]} (Device or resource busy)" in sends[-1]
