"""Malformed frames are handled the way BMv2 handles them, never with an exception."""

from __future__ import annotations

import random

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from p4src import protocol
from tests.softswitch.conftest import load, pipeline


def frames(seed: int, valid: list[bytes]):
    """Random bytes, and every truncation and single-byte corruption of ``valid``."""
    rng = random.Random(seed)
    for _ in range(300):
        yield bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120)))
    for frame in valid:
        for cut in range(len(frame)):
            yield frame[:cut]
        for _ in range(100):
            pos = rng.randrange(len(frame))
            yield frame[:pos] + bytes([rng.getrandbits(8)]) + frame[pos + 1:]


def aggregation_frame() -> bytes:
    fmt = protocol.packet_format()
    payload = fmt.pack(count=1, msg_type=protocol.MsgType.CONTRIBUTION, job_id=1, slot=5,
                       pkt_id=7).tobytes()
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:02:02:02:02:02")
                 / IP(src="10.0.0.1", dst="10.0.0.100")
                 / UDP(sport=40000, dport=protocol.AGG_UDP_PORT_BASE, chksum=0) / payload)


@pytest.mark.parametrize("name", ["primitives", "forwarding", "aggregation"])
def test_malformed_frames_never_raise(name, backend):
    if name == "aggregation":
        pipe = pipeline(protocol.PROGRAM_JSON.read_bytes(), backend)
        valid = [aggregation_frame()]
    else:
        pipe = load(name, backend)
        valid = [b"\x02" * 12 + b"\x88\xb5" + bytes(range(40)),
                 b"\x02" * 12 + b"\x08\x00" + b"\x45" + bytes(40)]
    pipe.groups[1] = [(1, 0), (2, 1)]
    for i, frame in enumerate(frames(7, valid)):
        out = pipe.process(frame, 1 + i % 4)
        assert all(isinstance(port, int) and isinstance(data, bytes) for port, data in out)
