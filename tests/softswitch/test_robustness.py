"""Malformed frames: never an exception, never a frame made from garbage.

Through the aggregation program with a job installed, every truncation and
single-byte corruption of a worker's contribution, and random bytes, get exactly
one ingress outcome each and leave nothing (the switch has no L2 route and no flood
group, so anything that left would be one the aggregation path made) but a WAITING
reply, the header alone back to the sender, for a corrupted copy that became a
retransmission asking for one. Through the
test programs, the native and Python backends give the same bytes for each.
"""

from __future__ import annotations

import random

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.p4src import protocol
from tests.softswitch.conftest import pipeline, program_files
from tests.softswitch.test_backends_agree import JOB, SERVICE_MAC, agree, both, install_job

INGRESS, EGRESS = "AggIngress.ingress_outcomes", "AggEgress.egress_outcomes"
Outcome = protocol.IngressOutcome
# Worker 0 of install_job's job, on its port: the only sender a frame can pass for,
# so no slot ever completes and no result may leave.
WORKER_PORT = 1
HEADERS = 14 + 20 + 8   # Ethernet, IPv4, UDP: from here on the parser calls it aggregation
# What a frame may come to; COMPLETED and RESENT would send a result. WAITING_SENT
# answers a copy of the contribution whose corrupted byte made it ask (its
# ``contributions`` not 0) with the header alone.
HARMLESS = {Outcome.CONSUMED, Outcome.DUPLICATE_DROPPED, Outcome.MALFORMED, Outcome.UNKNOWN_JOB,
            Outcome.UNKNOWN_SENDER, Outcome.BAD_SLOT, Outcome.FORWARDED_L2, Outcome.WAITING_SENT}
WAITING_FRAME = HEADERS + protocol.packet_format().header_bytes


def frames(seed: int, valid: list[bytes]):
    """Random bytes; then every truncation of each ``valid`` frame, and the frame with
    each of its bytes changed in turn (to a random other value)."""
    rng = random.Random(seed)
    for _ in range(300):
        yield bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120)))
    for frame in valid:
        for cut in range(len(frame)):
            yield frame[:cut]
        for pos in range(len(frame)):
            yield frame[:pos] + bytes([frame[pos] ^ rng.randrange(1, 256)]) + frame[pos + 1:]


def contribution() -> bytes:
    fmt = protocol.packet_format()
    payload = fmt.pack(count=1, msg_type=protocol.MsgType.CONTRIBUTION, job_id=JOB, slot=5,
                       pkt_id=7).tobytes()
    return bytes(Ether(src="02:00:00:00:00:01", dst=SERVICE_MAC)
                 / IP(src="10.0.0.1", dst="10.0.0.254")
                 / UDP(sport=40000, dport=protocol.AGG_UDP_PORT_BASE, chksum=0) / payload)


def outcomes(pipe, counter: str) -> list[int]:
    return list(pipe.counters[counter].packets)


def test_malformed_frames_get_one_outcome_each_and_nothing_leaves(backend):
    pipe = pipeline(protocol.PROGRAM_JSON.read_bytes(), backend)
    install_job(pipe, 16)
    valid = contribution()
    seen: dict[Outcome, int] = {}
    for i, frame in enumerate(frames(7, [valid])):
        before = outcomes(pipe, INGRESS)
        out = pipe.process(frame, WORKER_PORT)
        delta = [a - b for a, b in zip(outcomes(pipe, INGRESS), before)]
        assert sum(delta) == 1 and min(delta) == 0, (i, frame.hex(), delta)
        outcome = Outcome(delta.index(1))
        if outcome == Outcome.WAITING_SENT:
            assert [(port, len(reply), reply[HEADERS]) for port, reply in out] == [
                (WORKER_PORT, WAITING_FRAME, protocol.MsgType.WAITING)], (i, frame.hex(), out)
        else:
            assert out == [], (i, frame.hex(), out)
        seen[outcome] = seen.get(outcome, 0) + 1
        if 300 <= i < 300 + len(valid):      # the truncations, in order of length
            cut = i - 300
            want = Outcome.MALFORMED if cut >= HEADERS else Outcome.FORWARDED_L2
            assert outcome == want, (cut, outcome)
    waiting = [0] * len(protocol.EgressOutcome)
    waiting[protocol.EgressOutcome.WAITING_REPLY] = seen.get(Outcome.WAITING_SENT, 0)
    assert outcomes(pipe, EGRESS) == waiting
    assert set(seen) <= HARMLESS, seen
    # The corruptions reached every check of the aggregation path, not one only.
    assert HARMLESS - {Outcome.WAITING_SENT} <= set(seen), seen


@pytest.mark.parametrize("name", ["primitives", "forwarding"])
def test_malformed_frames_give_the_same_bytes_on_both_backends(name):
    pipes = both(program_files(name)[0].read_bytes())
    for pipe in pipes:
        pipe.groups[1] = [(1, 0), (2, 1)]
    valid = [b"\x02" * 12 + b"\x88\xb5" + bytes(range(40)),
             b"\x02" * 12 + b"\x08\x00" + b"\x45" + bytes(40)]
    rng = random.Random(8)
    assert agree(pipes, [(frame, rng.randrange(1, 5)) for frame in frames(7, valid)]) > 0
    for counter, spec in pipes[1].counters.items():
        assert list(pipes[0].counters[counter].packets) == list(spec.packets), counter
        assert list(pipes[0].counters[counter].bytes) == list(spec.bytes), counter
    for register, spec in pipes[1].registers.items():
        assert list(pipes[0].registers[register].cells) == list(spec.cells), register
