"""Hosts that speak raw frames and UDP to a running switch, for the packet tests.

Frames go out through an AF_PACKET socket in the host's namespace (so tests can
send anything: spoofed, short, foreign); results come back through an ordinary UDP
socket bound to the worker's port, so the host's own stack checks their IP and UDP
headers like a real worker's would.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import time
from dataclasses import dataclass

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.config import Config, ParentLink, parse
from innet_aggregation.testbed.netns import Host, in_netns

PACKET_OUTGOING = 4
SERVICE_IP = "10.0.0.254"
SERVICE_MAC = "02:00:00:00:00:fe"
WORKER_UDP_PORT = 40000


def make_config(hosts: list[Host], switch_ports: list[int], grpc_addr: str, job_id: int,
                first_slot: int, num_slots: int, udp_port: int = protocol.AGG_UDP_PORT_BASE,
                parent: Host | None = None, total_workers: int = 0,
                deadline_ms: float | None = None) -> Config:
    """A job with one worker per host, worker id = position in ``hosts``; with
    ``parent``, the switch is a leaf whose parent switch is that host's address."""
    job = {"id": job_id, "udp_port": udp_port, "service_ip": SERVICE_IP,
           "service_mac": SERVICE_MAC, "first_slot": first_slot, "num_slots": num_slots,
           "workers": [{"id": i, "mac": h.mac, "ip": h.ip, "udp_port": WORKER_UDP_PORT,
                        "switch_port": h.switch_port} for i, h in enumerate(hosts)]}
    if deadline_ms is not None:
        job["deadline_ms"] = deadline_ms
    config = parse({
        "switch": {"grpc_addr": grpc_addr, "device_id": 0, "ports": sorted(switch_ports)},
        "job": job,
    })
    if parent is None:
        return config
    return dataclasses.replace(config, job=dataclasses.replace(
        config.job, parent=ParentLink(parent.switch_port, parent.mac, parent.ip),
        total_workers=total_workers))


@dataclass
class Result:
    header: dict[str, int]
    values: np.ndarray | None     # None: a WAITING reply, the header alone
    src: tuple[str, int]
    size: int                     # UDP payload bytes


class TestHost:
    """A host of the topology, driven by the test process through its namespace."""
    __test__ = False  # not a pytest class

    def __init__(self, host: Host, udp_port: int = WORKER_UDP_PORT):
        self.host = host
        self.udp_port = udp_port
        with in_netns(host.netns):
            self.raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            self.raw.bind((host.ifname, 0))
            self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self.udp.bind((host.ip, udp_port))
        self.udp.setblocking(False)
        self.raw.setblocking(False)

    def close(self) -> None:
        self.raw.close()
        self.udp.close()

    # -- sending -------------------------------------------------------------
    def frame(self, payload: bytes, *, src_ip: str | None = None, src_port: int | None = None,
              dst_port: int = protocol.AGG_UDP_PORT_BASE) -> bytes:
        pkt = (Ether(src=self.host.mac, dst=SERVICE_MAC)
               / IP(src=src_ip or self.host.ip, dst=SERVICE_IP)
               / UDP(sport=src_port or self.udp_port, dport=dst_port) / payload)
        return bytes(pkt)

    def send_frame(self, frame: bytes) -> None:
        self.raw.send(frame)

    def contribute(self, values, *, job_id: int, slot: int, set_: int, pkt_id: int = 0,
                   exponent: int = 0, fingerprint: int = 0, asks: bool = False,
                   msg_type: int = protocol.MsgType.CONTRIBUTION, quorum: int = 0,
                   **frame_kw) -> None:
        """``asks``: for a WAITING reply, should it be a duplicate of an unfinished slot.
        ``quorum``: a QUORUM contribution, released once that many workers are in."""
        payload = contribution(values, job_id=job_id, slot=slot, set_=set_, pkt_id=pkt_id,
                               exponent=exponent, fingerprint=fingerprint,
                               contributions=quorum if quorum else int(asks),
                               msg_type=protocol.MSG_QUORUM if quorum else msg_type)
        self.send_frame(self.frame(payload, **frame_kw))

    # -- receiving -----------------------------------------------------------
    def drain(self) -> None:
        for sock in (self.udp, self.raw):
            try:
                while True:
                    sock.recv(65535)
            except BlockingIOError:
                pass

    def results(self, count: int, timeout: float = 10.0) -> list[Result]:
        """Exactly ``count`` results (or WAITING replies), or fewer if the timeout
        passes first."""
        fmt = protocol.packet_format()
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.udp], [], [], left)[0]:
                break
            data, src = self.udp.recvfrom(65535)
            packets = fmt.decode(data)
            header = {k: int(v[0]) for k, v in fmt.unpack(packets).items()}
            values = packets["values"][0].astype(np.int64) if len(data) > fmt.header_bytes else None
            out.append(Result(header, values, src, len(data)))
        return out

    def raw_frames(self, timeout: float = 2.0, want=lambda f: True) -> list[bytes]:
        """Incoming frames (not our own outgoing ones) that ``want`` accepts."""
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.raw], [], [], left)[0]:
                return frames
            frame, addr = self.raw.recvfrom(65535)
            if addr[2] != PACKET_OUTGOING and want(frame):
                frames.append(frame)


def contribution(values, *, job_id: int, slot: int, set_: int, pkt_id: int = 0,
                 exponent: int = 0, msg_type: int = protocol.MsgType.CONTRIBUTION,
                 contributions: int = 0, fingerprint: int = 0) -> bytes:
    fmt = protocol.packet_format()
    values = np.asarray(values, dtype=np.int64).reshape(1, fmt.values_per_packet)
    return fmt.pack(values.astype(np.int32), msg_type=msg_type, job_id=job_id, set=set_,
                    slot=slot, pkt_id=pkt_id, exponent=exponent, contributions=contributions,
                    fingerprint=fingerprint).tobytes()
