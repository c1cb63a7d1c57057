"""Header unions (programs/header_unions.p4): the parser extracts one member or both
(the second invalidates the first), ingress reads the union's and each member's
validity, makes a member valid (the other becomes invalid), invalidates one, assigns
one as a whole; the deparser emits the union. Both backends give the same frames, and
BMv2's where it is installed."""

from __future__ import annotations


import pytest

from tests.softswitch.conftest import load
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2

BODIES = {0x88b5: bytes.fromhex("a111") + b"\xbe\xef",
          0x88b6: bytes.fromhex("b1" "01020304" "05") + b"\xbe\xef",
          0x88b7: bytes.fromhex("a111" "b1" "01020304" "05") + b"\xbe\xef",
          0x0800: bytes(20)}


def frames() -> list[bytes]:
    out = []
    for op in range(6):
        for ether_type, body in BODIES.items():
            src = bytes.fromhex("0200000000") + bytes([op])
            out.append(bytes.fromhex("020000000001") + src + ether_type.to_bytes(2, "big")
                       + body + b"payload")
    # Too short for the long member: PacketTooShort, port 3, the short one kept.
    out.append(bytes(6) + bytes.fromhex("020000000000") + b"\x88\xb6" + b"\xb1\x01")
    out.append(bytes(6) + bytes.fromhex("020000000001") + b"\x88\xb7" + b"\xa1\x11\xb1")
    return out


def test_both_backends_give_the_same_frames_and_members_exclude_each_other():
    outputs = {b: [load("header_unions", b).process(f, 1) for f in frames()]
               for b in ("native", "python")}
    assert outputs["native"] == outputs["python"]
    by_frame = dict(zip(frames(), outputs["native"]))
    n = len(BODIES)
    # Both members extracted: only the long one is left, so only it is emitted.
    both = by_frame[frames()[2]]
    assert both[0][0] == 2 and both[0][1][12:] == b"\x88\xb7" + bytes.fromhex("b1" "01020304" "05") + b"\xbe\xefpayload"
    assert both[0][1][3:6] == bytes.fromhex("0500aa")
    # op 1 on the short member: the long one made valid replaces it in the frame.
    replaced = by_frame[frames()[n + 0]]
    assert replaced[0][1][14:20] == bytes.fromhex("b1" "01020304" "07")
    # op 3 (the short one invalid) on the short member: the union is invalid, no 0xBB.
    removed = by_frame[frames()[3 * n + 0]]
    assert removed[0][1][14:] == b"\xbe\xefpayload" and removed[0][1][10] == 0
    # Too short: parser error, port 3.
    assert by_frame[frames()[-2]][0][0] == 3


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("header_unions", backend, frames())
