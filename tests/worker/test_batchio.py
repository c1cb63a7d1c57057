"""batchio's UDP GSO: runs of consecutive rows leave as one message each, and the
wire still carries one datagram per row, in order, with the same bytes; on the
testbed's links (a veth without TX offloads) the switch's port sees one frame per
row with a valid UDP checksum. A route that refuses segmentation falls back to one
datagram per message, and nothing is lost."""

from __future__ import annotations

import logging
import os
import socket

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.testbed.netns import Namespaces, in_netns
from innet_aggregation.worker.batchio import BatchSocket

ROW = 1038                   # a 256-value packet's payload
SO_NO_CHECK = 11             # asm-generic/socket.h
ROWS = np.r_[np.arange(0, 150), 3, 7, 8, 9, 199, 198, np.arange(100, 200)]


def packets(count: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, (count, ROW), dtype=np.uint8).view(np.dtype((np.void, ROW))).reshape(-1)


def loopback_pair():
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.5)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.connect(receiver.getsockname())
    return sender, receiver


def drain(sock: socket.socket) -> list[bytes]:
    got = []
    try:
        while True:
            got.append(sock.recv(1 << 16))
    except socket.timeout:
        return got


def test_runs_of_rows_go_out_as_one_datagram_per_row():
    sender, receiver = loopback_pair()
    tx = packets(200)
    io = BatchSocket(sender, tx, np.zeros((4, 1088), np.uint8))
    assert io.gso == 63                   # 63 rows of 1038 bytes fit a 64 KiB datagram
    firsts, lengths = io._runs(ROWS)
    assert lengths.tolist() == [63, 63, 24, 1, 3, 1, 1, 63, 37]
    assert io.send(ROWS) == (len(ROWS), 0)
    got = drain(receiver)
    assert got == [tx[i].tobytes() for i in ROWS]


def test_a_route_that_refuses_segmentation_falls_back_and_loses_nothing(caplog):
    sender, receiver = loopback_pair()
    # Without a UDP checksum the kernel refuses a segmented message (EINVAL).
    sender.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    tx = packets(200)
    io = BatchSocket(sender, tx, np.zeros((4, 1088), np.uint8))
    with caplog.at_level(logging.WARNING, logger="worker"):
        assert io.send(ROWS) == (len(ROWS), 0)
    assert io.gso == 1
    assert "UDP GSO refused on this route (EINVAL)" in caplog.text
    assert drain(receiver) == [tx[i].tobytes() for i in ROWS]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")
def test_the_switch_port_sees_one_frame_per_row_with_its_checksum():
    peer_ip, peer_mac = "10.0.0.200", "02:00:00:00:00:c8"
    with Namespaces(1) as net:
        host = net.hosts[0]
        host.run(["ip", "neigh", "add", peer_ip, "lladdr", peer_mac, "dev", host.ifname],
                 check=True)
        port = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
        port.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        port.bind((host.switch_ifname, 0))
        port.settimeout(0.5)
        with in_netns(host.netns):
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sender.connect((peer_ip, 9000))
        tx = packets(200)
        io = BatchSocket(sender, tx, np.zeros((4, 1088), np.uint8))
        assert io.gso > 1
        assert io.send(ROWS) == (len(ROWS), 0)
        frames = [Ether(f) for f in drain(port)]
        port.close()
        sender.close()
    udp = [f for f in frames if UDP in f and f[IP].dst == peer_ip]
    assert [bytes(f[UDP].payload) for f in udp] == [tx[i].tobytes() for i in ROWS]
    for f in udp:
        sent = f[UDP].chksum
        del f[UDP].chksum
        assert sent != 0 and Ether(bytes(f))[UDP].chksum == sent
