"""Varbit fields read (programs/varbit_read.p4): compared (BMv2 compares the values,
whatever their lengths), headers with them compared and copied, and in checksums that
take them as long as they were extracted, off byte boundaries too (csum16, crc16), and
in a verify checksum. Both backends give the same frames, and BMv2's where it is
installed."""

from __future__ import annotations

import json

import pytest

from innet_aggregation.softswitch.backends.python.runtime import csum16
from innet_aggregation.softswitch.frontend import Unsupported
from tests.softswitch.conftest import load, pipeline, program_files
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2

ETH = bytes.fromhex("020000000001" "020000000002") + b"\x88\xb5"


def option(data: bytes, csum: int | None = None) -> bytes:
    """len, csum (by default the right one over len and data), data."""
    if csum is None:
        csum = csum16(bytes([len(data)]) + data)
    return bytes([len(data)]) + csum.to_bytes(2, "big") + data


def frames() -> list[bytes]:
    pairs = [(b"", b""), (b"\x01", b"\x01"), (b"\x01", b"\x02"), (b"\x01", b"\x00\x01"),
             (b"\x00", b""), (b"abc", b"abc"), (b"abcdefgh", b"abcdefgh"),
             (b"abcdefgh", b"abcdefgi"), (b"\xff" * 8, b"\xfe")]
    out = [ETH + option(a) + option(b) + b"tail" for a, b in pairs]
    out.append(ETH + option(b"xyz", csum=0x1234) + option(b"xyz") + b"tail")  # checksum_error
    out.append(ETH + bytes([9]) + bytes(11))                              # HeaderTooShort
    out.append(ETH + option(b"ab") + bytes([4, 0, 0, 1]))                 # PacketTooShort
    out.append(ETH[:12] + b"\x08\x00" + bytes(20))                        # no options
    return out


def bits_to_bytes(value: int, nbits: int) -> bytes:
    """A calculation's input as BMv2 builds it: the bits, padded with zeros to whole bytes."""
    pad = -nbits % 8
    return (value << pad).to_bytes((nbits + pad) // 8, "big")


def crc16_arc(data: bytes) -> int:
    """CRC-16/ARC (BMv2's crc16), bit by bit."""
    reg = 0
    for byte in data:
        reg ^= byte
        for _ in range(8):
            reg = (reg >> 1) ^ 0xA001 if reg & 1 else reg >> 1
    return reg


def checksums(a: bytes, b: bytes) -> tuple[int, int]:
    """res.sum: csum16 over 4w0xa, a, len(b), b, 4w5; res.crc: crc16 over a, 3w1, b."""
    av, bv, na, nb = int.from_bytes(a, "big"), int.from_bytes(b, "big"), 8 * len(a), 8 * len(b)
    total = (((0xA << na | av) << 8 | len(b)) << nb | bv) << 4 | 5
    crc = ((av << 3) | 1) << nb | bv
    return (csum16(bits_to_bytes(total, 4 + na + 8 + nb + 4)),
            crc16_arc(bits_to_bytes(crc, na + 3 + nb)))


def test_both_backends_give_the_same_frames():
    outputs = {b: [load("varbit_read", b).process(f, 1) for f in frames()]
               for b in ("native", "python")}
    assert outputs["native"] == outputs["python"]
    got = dict(zip(frames(), outputs["native"]))
    flags = {}
    for frame in frames()[:10]:
        (port, out), = got[frame]
        assert port == 2
        a, b = _options(frame)
        end = 14 + 3 + len(a) + 3 + len(b)
        assert out[:end] == frame[:end] and out[end + 5:] == frame[end:] == b"tail"
        flags[a, b] = out[end]
        assert int.from_bytes(out[end + 1:end + 3], "big") == checksums(a, b)[0], "csum16"
        assert int.from_bytes(out[end + 3:end + 5], "big") == checksums(a, b)[1], "crc16"
    # Equal values compare equal, whatever their lengths (00 and nothing, 01 and 0001:
    # BMv2 compares values, not lengths); copies too.
    assert flags[b"", b""] == flags[b"abc", b"abc"] == 1 | 4 | 16
    assert flags[b"\x01", b"\x00\x01"] == flags[b"\x00", b""] == 1 | 16
    assert flags[b"\x01", b"\x02"] == flags[b"abcdefgh", b"abcdefgi"] == 2 | 16
    assert flags[b"xyz", b"xyz"] == 1 | 8 | 16, "the verify checksum over a failed"
    assert flags[b"\xff" * 8, b"\xfe"] == 2 | 16
    (_, short), = got[frames()[10]]
    # HeaderTooShort: both invalid (equal as headers), the result, the rest unparsed.
    assert short[14] == 128 | 4 and short[19:] == frames()[10][14:]


def _options(frame: bytes) -> tuple[bytes, bytes]:
    la = frame[14]
    lb = frame[14 + 3 + la]
    return frame[17:17 + la], frame[20 + la:20 + la + lb]


def first_action(doc: dict) -> list:
    return doc["actions"][0]["primitives"]


def stack_extract(doc: dict) -> dict:
    return next(op for state in doc["parsers"][0]["parse_states"] for op in state["parser_ops"]
                if op["parameters"][0]["type"] == "stack")


@pytest.mark.parametrize("change, refusal", [
    (lambda doc: first_action(doc)[0]["parameters"][0].update(value=["a", "data"]),
     r"varbit field a\.data written"),
    (lambda doc: first_action(doc).append(
        {"op": "push", "parameters": [{"type": "header_stack", "value": "s"},
                                      {"type": "hexstr", "value": "0x1"}]}),
     "push_front/pop_front of stack s of varbit headers"),
    (lambda doc: stack_extract(doc).update(op="extract", parameters=[{"type": "stack",
                                                                      "value": "s"}]),
     "extract of stack 's' .a varbit field. without a length"),
])
def test_what_neither_backend_runs_is_refused_by_name(backend, change, refusal):
    doc = json.loads(program_files("varbit_read")[0].read_text())
    change(doc)
    with pytest.raises(Unsupported, match=refusal):
        pipeline(json.dumps(doc).encode(), backend)


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("varbit_read", backend, frames())
