"""The aggregation add in 32-bit lanes only where 32 bits give the stored value.

frontend/widths.py lets the native printer compute a rerolled run's assignments in
uint32 arithmetic when the target field has at most 32 bits and the value is built
from wrapping operations (or a 32-bit saturating add of exact 32-bit operands).
Here the aggregation program's add is rewritten to ``stored + v`` over values and
cells of 16, 32 and 48 bits: 16 must wrap at 2^16, 32 at 2^32, and 48 must keep its
bits above 32 (64-bit code). Native and Python must give the same frames and cells
(test_backends_agree covers the real program's saturating add at the int32 limits).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.frontend import ir
from tests.softswitch.test_backends_agree import (JOB, SERVICE_MAC, WORKERS, agree, both,
                                                  install_job)


def plain_add(width: int) -> bytes:
    """The aggregation program with ``width``-bit values and cells, added with a plain +."""
    doc = json.loads(protocol.PROGRAM_JSON.read_bytes())
    for header_type in doc["header_types"]:
        if header_type["name"] == "values_h":
            header_type["fields"] = [[name, width, signed]
                                     for name, _, signed in header_type["fields"]]
        if header_type["name"] == "scalars_0":
            header_type["fields"] = [[name, width if name == "value_aggregator_stored" else w, s]
                                     for name, w, s in header_type["fields"]]
    for reg in doc["register_arrays"]:
        if ".value_aggregator.value_" in reg["name"]:
            reg["bitwidth"] = width
    (action,) = [a for a in doc["actions"] if a["name"].endswith(".add_values")]
    for primitive in action["primitives"]:
        target = primitive["parameters"][0]
        if primitive["op"] == "assign" and target["value"][0] == "values":
            stored = {"type": "field", "value": ["scalars", "value_aggregator_stored"]}
            primitive["parameters"][1] = {"type": "expression", "value": {
                "op": "+", "left": stored, "right": target}}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("width", [16, 32, 48])
def test_a_plain_add_wraps_at_its_own_width_on_both_backends(width):
    text = plain_add(width)
    add = next(a for a in frontend.load(text).ir.actions.values()
               if a.name.endswith(".add_values"))
    (repeat,) = add.body
    assigns = [s for it in repeat.iterations for s in it if isinstance(s, ir.Assign)]
    assert {s.bits for s in assigns} == {32 if width <= 32 else 64}
    pipes = both(text)
    for pipe in pipes:
        install_job(pipe, 16)
    fmt = protocol.packet_format()
    k = fmt.values_per_packet
    header = len(fmt.pack(np.zeros((1, k), "int32"),
                          msg_type=protocol.MsgType.CONTRIBUTION, job_id=JOB, slot=0, set=0,
                          pkt_id=0, exponent=0).tobytes()) - 4 * k
    rng = random.Random(7)
    top = (1 << width) - 1
    frames = []
    for n in range(120):
        slot = n % 4
        for w in range(WORKERS):
            head = fmt.pack(np.zeros((1, k), "int32"),
                            msg_type=protocol.MsgType.CONTRIBUTION, job_id=JOB, slot=slot,
                            set=0, pkt_id=n, exponent=0).tobytes()[:header]
            values = b"".join(rng.choice([top, top - 1, 1 << (width - 1), rng.getrandbits(width)])
                              .to_bytes(width // 8, "big") for _ in range(k))
            data = bytes(Ether(src=f"02:00:00:00:00:{w + 1:02x}", dst=SERVICE_MAC)
                         / IP(src=f"10.0.0.{w + 1}", dst="10.0.0.254")
                         / UDP(sport=40000 + w, dport=protocol.AGG_UDP_PORT_BASE, chksum=0,
                             len=8 + header + 4 * k)      # the length the program checks
                         / (head + values))
            frames.append((data, w + 1))
    assert agree(pipes, frames) > 50
    for name in pipes[1].registers:
        assert list(pipes[0].registers[name].cells) == list(pipes[1].registers[name].cells), name
