"""Varbit fields (programs/varbit.p4): extract with a length of 0 to 8 bytes, more
than the header holds (HeaderTooShort), more than the frame holds (PacketTooShort),
the header copied into another (its length too) and invalidated, each emitted as long
as it was extracted. Both backends give the same frames, and BMv2's where it is
installed."""

from __future__ import annotations


import pytest

from tests.softswitch.conftest import load
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2


def frames() -> list[bytes]:
    out = []
    for op in range(3):
        src = bytes.fromhex("0200000000") + bytes([op])
        for length in (0, 1, 3, 8, 9, 200):
            option = bytes([length, (0x40 + length) & 0xFF]) + bytes(range(1, length + 1))[:8]
            out.append(bytes.fromhex("020000000001") + src + b"\x88\xb5" + option
                       + b"\xbe\xef" + b"payload")
    out.append(bytes(12) + b"\x88\xb5" + bytes([5, 1, 2, 3]))          # too short
    out.append(bytes(12) + b"\x08\x00" + bytes(20))
    return out


def test_both_backends_give_the_same_frames():
    outputs = {b: [load("varbit", b).process(f, 1) for f in frames()]
               for b in ("native", "python")}
    assert outputs["native"] == outputs["python"]
    by_frame = dict(zip(frames(), outputs["native"]))
    # op 1 with three bytes: the option twice, then the trailer.
    copied = by_frame[frames()[6 + 2]]
    option = bytes([3, 0x43, 1, 2, 3])
    assert copied == [(2, frames()[8][:14] + option + option + b"\xbe\xefpayload")]
    # Nine bytes is more than the header holds: HeaderTooShort, port 4.
    assert by_frame[frames()[4]][0][0] == 4
    assert by_frame[frames()[-2]][0][0] == 3


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("varbit", backend, frames())
