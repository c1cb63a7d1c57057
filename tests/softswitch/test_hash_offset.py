"""Hashes (programs/hash_offset.p4): v1model's hash(), BMv2's
modify_field_with_hash_based_offset, with crc16, crc32, their custom forms (BMv2's
default parameters), csum16, identity and xor16 over fields off byte boundaries; bases
and sizes from the packet (a size of 0 taken as 1), a narrow destination (truncated);
checksums over the payload, verified and updated. Each value is checked against our
own computation here, both backends give the same frames, and BMv2's where it is
installed."""

from __future__ import annotations

import json
import random
import zlib

import pytest

from innet_aggregation.softswitch.backends.python.runtime import csum16
from innet_aggregation.softswitch.frontend import Unsupported
from tests.softswitch.conftest import load, pipeline, program_files
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2
from tests.softswitch.test_varbit_read import bits_to_bytes, crc16_arc

ETH = bytes.fromhex("020000000001" "020000000002") + b"\x88\xb6"


def header(base: int, size: int, x: int, y: int, z: int, k: int, payload: bytes,
           good_csum: bool = True) -> bytes:
    """in_h with, by default, the right checksum over x, y and the payload."""
    csum = csum16(x.to_bytes(1, "big") + y.to_bytes(4, "big") + payload) if good_csum else 0
    return (base.to_bytes(2, "big") + size.to_bytes(2, "big") + bytes([x]) + y.to_bytes(4, "big")
            + (z << 4 | k).to_bytes(2, "big") + csum.to_bytes(2, "big"))


def frames() -> list[bytes]:
    rng = random.Random(7)
    out = []
    for i in range(12):
        payload = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 5, 30))))
        size = (0, 1, 7, 65535)[i % 4] if i < 8 else rng.randrange(1 << 16)
        out.append(ETH + header(rng.randrange(1 << 16), size, rng.randrange(256),
                                rng.randrange(1 << 32), rng.randrange(1 << 12),
                                rng.randrange(16), payload, good_csum=i != 3) + payload)
    out.append(ETH[:12] + b"\x08\x00" + bytes(20))                  # no in_h: unchanged
    out.append(ETH + bytes(5))                                       # too short for in_h
    return out


def expected_out(frame: bytes) -> bytes:
    """out_h as computed here from the frame's in_h and payload."""
    i, payload = frame[14:27], frame[27:]
    base, size, x, y = (int.from_bytes(i[0:2], "big"), int.from_bytes(i[2:4], "big"), i[4],
                        int.from_bytes(i[5:9], "big"))
    z, k, csum = int.from_bytes(i[9:11], "big") >> 4, i[10] & 15, int.from_bytes(i[11:13], "big")
    xyz = bits_to_bytes((x << 32 | y) << 12 | z, 52)
    xor16 = 0
    for j in range(0, len(xyz), 2):
        xor16 ^= int.from_bytes(xyz[j:j + 2].ljust(2, b"\0"), "big")
    xy = bits_to_bytes(x << 32 | y, 40)
    fields = [
        (crc16_arc(xyz), 2), (zlib.crc32(xyz), 4),
        (crc16_arc(bits_to_bytes(y << 4 | k, 36)), 2),
        (zlib.crc32(bits_to_bytes(z << 8 | x, 20)) % 1000 + 7, 4),
        (csum16(xyz), 2),
        (int.from_bytes(bits_to_bytes(((y << 8 | x) << 12 | z) << 4 | k, 56), "big"), 8),
        (xor16, 2),
        ((zlib.crc32(xy) % (size or 1) + base) & 0xFFFF, 2),
        ((crc16_arc(y.to_bytes(4, "big")) % 1000 + 200) & 0xFF, 1),
        (int(csum16(xy + payload) != csum), 1),
        (csum16(bits_to_bytes(x << 4 | 3, 12) + payload), 2),
        (crc16_arc(y.to_bytes(4, "big") + payload), 2),
    ]
    return b"".join(value.to_bytes(n, "big") for value, n in fields)


def test_values_as_computed_here_on_both_backends():
    outputs = {b: [load("hash_offset", b).process(f, 1) for f in frames()]
               for b in ("native", "python")}
    assert outputs["native"] == outputs["python"]
    for frame, out in zip(frames()[:12], outputs["native"]):
        assert out == [(2, frame[:27] + expected_out(frame) + frame[27:])]
    assert outputs["native"][3][0][1][27 + 27] == 1, "the payload checksum failed"
    assert outputs["native"][12] == [(2, frames()[12])]
    assert outputs["native"][13] == [(2, frames()[13])]


def hash_primitives(doc: dict) -> list:
    return [p for a in doc["actions"] for p in a["primitives"]
            if p["op"] == "modify_field_with_hash_based_offset"]


@pytest.mark.parametrize("change, refusal", [
    (lambda doc: doc["calculations"][0].update(algo="xxh64"), "hash algorithm 'xxh64'"),
    (lambda doc: doc["checksums"][0].update(calculation=doc["calculations"][0]["name"])
     or doc["calculations"][0].update(algo="round_robin"), "hash algorithm 'round_robin'"),
    (lambda doc: hash_primitives(doc)[0]["parameters"][3].update(value="0x" + "f" * 17),
     "hash-based offset with a size that may not fit in 64 bits"),
    (lambda doc: hash_primitives(doc)[0]["parameters"][1].update(
        type="expression", value={"op": "-", "left": {"type": "hexstr", "value": "0x0"},
                                  "right": {"type": "hexstr", "value": "0x1"}}),
     "hash-based offset with a base that may not fit in 64 bits"),
])
def test_what_neither_backend_computes_is_refused_by_name(backend, change, refusal):
    doc = json.loads(program_files("hash_offset")[0].read_text())
    change(doc)
    with pytest.raises(Unsupported, match=refusal):
        pipeline(json.dumps(doc).encode(), backend)


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("hash_offset", backend, frames())
