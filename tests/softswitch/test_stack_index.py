"""Header stack elements by a computed index (programs/stack_index.p4): read and
written by indices from the packet, signed fields among them, and an index past the
stack, which drops the packet (BMv2 throws there, uncaught, and simple_switch ends).
Both backends give the same frames, and BMv2's for indices inside the stack."""

from __future__ import annotations


import pytest

from tests.softswitch.conftest import load
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2

ELEMENTS = bytes.fromhex("0af01111" "0b812222" "0c7f3333")


def frame(op: int, i: int, j: int, s: int) -> bytes:
    return bytes(12) + b"\x12\x34" + bytes([op, i, j, s & 0xFF]) + ELEMENTS + b"payload"


def inside() -> list[bytes]:
    return [frame(op, i, j, s) for op in (0, 1, 2) for i in range(3) for j in range(3)
            for s in (0, 5, -128)] + [frame(0, 3, 0, 1), frame(0, 0, 200, 1)]


def test_both_backends_read_and_write_the_indexed_element():
    for backend in ("native", "python"):
        soft = load("stack_index", backend)
        out = soft.process(frame(0, 1, 2, 5), 1)
        # el[1].a = el[2].a + 1; el[2].b = -127 - 5 wrapped; el[1].c = el[1].c ^ 0xFFFF;
        # ether_type = el[2].b ++ el[1].a.
        assert out == [(2, bytes(12) + bytes.fromhex("7c0d" "00010205" "0af01111" "0d81dddd"
                                                      "0c7c3333") + b"payload")]
        assert [soft.process(f, 1) for f in inside()] == \
            [load("stack_index", "python").process(f, 1) for f in inside()]


@pytest.mark.parametrize("op", [1, 2])
@pytest.mark.parametrize("i", [3, 4, 255])
def test_an_index_past_the_stack_drops_the_packet(op, i):
    for backend in ("native", "python"):
        soft = load("stack_index", backend)
        assert soft.process(frame(op, i, 0, 0), 1) == []
        assert soft.process(frame(op, 2, 0, 0), 1) != []      # the next one goes on


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("stack_index", backend, inside())
