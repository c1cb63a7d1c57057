"""Everything that is not aggregation is switched at L2: unicast, flooding, ARP, TCP."""

from __future__ import annotations

import socket
import threading

from scapy.layers.l2 import ARP, Ether

from innet_aggregation.testbed.netns import in_netns

from .harness import SERVICE_IP, SERVICE_MAC

ETHERTYPE_TEST = 0x88B5  # IEEE local experimental


def test_known_mac_is_forwarded_to_its_port_only(hosts, job):
    job(4)  # installs the workers' MACs
    frame = bytes(Ether(src=hosts[0].host.mac, dst=hosts[3].host.mac, type=ETHERTYPE_TEST)
                  / (b"unicast" * 10))
    for h in hosts:
        h.drain()
    hosts[0].send_frame(frame)
    mine = lambda f: f[12:14] == ETHERTYPE_TEST.to_bytes(2, "big")
    assert hosts[3].raw_frames(want=mine) == [frame]
    assert hosts[1].raw_frames(timeout=0.3, want=mine) == []
    assert hosts[0].raw_frames(timeout=0.3, want=mine) == []


def test_broadcast_floods_every_port_but_the_ingress(hosts, job):
    job(2)
    frame = bytes(Ether(src=hosts[1].host.mac, dst="ff:ff:ff:ff:ff:ff", type=ETHERTYPE_TEST)
                  / (b"flood" * 12))
    for h in hosts:
        h.drain()
    hosts[1].send_frame(frame)
    mine = lambda f: f[12:14] == ETHERTYPE_TEST.to_bytes(2, "big")
    for i, h in enumerate(hosts):
        got = h.raw_frames(timeout=1.0 if i != 1 else 0.3, want=mine)
        assert got == ([] if i == 1 else [frame]), f"host {i}"


def test_switch_answers_arp_for_the_service_address(hosts, job):
    job(2)
    request = bytes(Ether(src=hosts[0].host.mac, dst="ff:ff:ff:ff:ff:ff")
                    / ARP(op=1, hwsrc=hosts[0].host.mac, psrc=hosts[0].host.ip, pdst=SERVICE_IP))
    hosts[0].drain()
    hosts[0].send_frame(request)
    replies = [Ether(f) for f in hosts[0].raw_frames(want=lambda f: f[12:14] == b"\x08\x06")]
    replies = [r for r in replies if r[ARP].op == 2]
    assert len(replies) == 1
    arp = replies[0][ARP]
    assert (arp.hwsrc, arp.psrc) == (SERVICE_MAC, SERVICE_IP)
    assert (arp.hwdst, arp.pdst) == (hosts[0].host.mac, hosts[0].host.ip)
    assert replies[0].dst == hosts[0].host.mac


def test_tcp_between_hosts_through_the_switch(hosts, job):
    """Host kernels resolve each other by flooded ARP and talk TCP (what gloo needs)."""
    job(2)
    a, b = hosts[0].host, hosts[1].host
    with in_netns(b.netns):
        server = socket.create_server((b.ip, 5555))
    with in_netns(a.netns):
        client = socket.socket()
    server.settimeout(10)
    client.settimeout(10)
    received = []

    def serve():
        conn, _ = server.accept()
        with conn:
            data = b""
            while len(data) < 100_000:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            received.append(data)
            conn.sendall(b"ok")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        client.connect((b.ip, 5555))
        payload = bytes(range(256)) * 391
        client.sendall(payload[:100_000])
        assert client.recv(2) == b"ok"
    finally:
        client.close()
        thread.join(timeout=15)
        server.close()
    assert received == [(bytes(range(256)) * 391)[:100_000]]
