"""Port security: only the switch sources a job's service addresses. Frames from any
port that claim them (forged results, gratuitous or forged ARP) are dropped and
counted as SPOOFED_SOURCE; everything else still flows."""

from __future__ import annotations

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from innet_aggregation.p4src import protocol

from .harness import SERVICE_IP, SERVICE_MAC, WORKER_UDP_PORT
from .test_validation import assert_next_round_exact, delta

ETHERTYPE_TEST = 0x88B5


def forged_result(config, to) -> bytes:
    """A result for ``to`` as the switch would send it: from the service addresses."""
    fmt = protocol.packet_format()
    payload = fmt.pack(np.full((1, fmt.values_per_packet), 7, dtype=np.int32),
                       msg_type=protocol.MsgType.RESULT, job_id=config.job.id,
                       slot=config.job.first_slot, set=0, contributions=2).tobytes()
    return bytes(Ether(src=SERVICE_MAC, dst=to.host.mac)
                 / IP(src=SERVICE_IP, dst=to.host.ip)
                 / UDP(sport=config.job.udp_port, dport=WORKER_UDP_PORT) / payload)


def spoofs(config, hosts, attacker) -> list[bytes]:
    """Every way a frame can claim a service address, from ``attacker``'s port."""
    me, victim = attacker.host, hosts[1]
    return [
        forged_result(config, victim),
        # The service MAC alone, and the service IP alone, as source.
        bytes(Ether(src=SERVICE_MAC, dst=victim.host.mac, type=ETHERTYPE_TEST) / (b"x" * 50)),
        bytes(Ether(src=me.mac, dst=victim.host.mac) / IP(src=SERVICE_IP, dst=victim.host.ip)
              / UDP(sport=1234, dport=WORKER_UDP_PORT) / (b"y" * 30)),
        # Gratuitous ARP for the service IP (request and reply), from the attacker's MAC.
        bytes(Ether(src=me.mac, dst="ff:ff:ff:ff:ff:ff")
              / ARP(op=1, hwsrc=me.mac, psrc=SERVICE_IP, pdst=SERVICE_IP)),
        bytes(Ether(src=me.mac, dst="ff:ff:ff:ff:ff:ff")
              / ARP(op=2, hwsrc=me.mac, psrc=SERVICE_IP, hwdst="ff:ff:ff:ff:ff:ff",
                    pdst=SERVICE_IP)),
        # ARP that binds the service MAC to another IP, the Ethernet source honest.
        bytes(Ether(src=me.mac, dst=victim.host.mac)
              / ARP(op=2, hwsrc=SERVICE_MAC, psrc=me.ip, hwdst=victim.host.mac,
                    pdst=victim.host.ip)),
    ]


def test_frames_claiming_a_service_address_are_dropped_and_counted(switch, hosts, job):
    config = job(2)
    for attacker in (hosts[0], hosts[5]):      # a worker of the job, and a non-member
        frames = spoofs(config, hosts, attacker)
        for h in hosts:
            h.drain()
        before = switch.counters()
        for frame in frames:
            attacker.send_frame(frame)
        # Nothing reaches any host: no result, no frame (the switch sends no ARP here).
        assert hosts[1].results(1, timeout=0.5) == []
        for h in hosts:
            assert h.raw_frames(timeout=0.2) == [], f"host {h.host.index} got a spoof"
        after = switch.counters()
        assert delta(before, after, "ingress.spoofed_source") == len(frames)
        assert delta(before, after, "ingress.forwarded_l2") == 0
    assert_next_round_exact(hosts, config)


def test_honest_frames_still_flow_and_are_counted_as_forwarded(switch, hosts, job):
    job(2)
    me, victim = hosts[5], hosts[1]
    frame = bytes(Ether(src=me.host.mac, dst=victim.host.mac, type=ETHERTYPE_TEST) / (b"z" * 50))
    ask = bytes(Ether(src=me.host.mac, dst="ff:ff:ff:ff:ff:ff")
                / ARP(op=1, hwsrc=me.host.mac, psrc=me.host.ip, pdst=SERVICE_IP))
    for h in hosts:
        h.drain()
    before = switch.counters()
    me.send_frame(frame)
    me.send_frame(ask)
    mine = lambda f: f[12:14] == ETHERTYPE_TEST.to_bytes(2, "big")
    assert victim.raw_frames(want=mine) == [frame]
    replies = [Ether(f) for f in me.raw_frames(want=lambda f: f[12:14] == b"\x08\x06")]
    assert [(r[ARP].op, r[ARP].psrc, r[ARP].hwsrc) for r in replies] == [
        (2, SERVICE_IP, SERVICE_MAC)]
    after = switch.counters()
    assert delta(before, after, "ingress.forwarded_l2") == 2
    assert delta(before, after, "ingress.spoofed_source") == 0


def test_removing_the_job_lifts_its_port_security(switch, hosts, job):
    config = job(2)
    switch.controller.remove(config)
    frame = bytes(Ether(src=SERVICE_MAC, dst=hosts[1].host.mac, type=ETHERTYPE_TEST)
                  / (b"x" * 50))
    hosts[1].drain()
    before = switch.counters()
    hosts[5].send_frame(frame)
    assert hosts[1].raw_frames(want=lambda f: f == frame) == [frame]
    assert delta(before, switch.counters(), "ingress.forwarded_l2") == 1
    switch.controller.apply(config)
    assert switch.controller.apply(config).total == 0
