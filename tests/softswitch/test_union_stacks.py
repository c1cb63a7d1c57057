"""Stacks of header unions (programs/union_stacks.p4): the parser extracts a member of
the stack's next element in a loop (StackOutOfBounds when full) and copies the whole
stack, next included (BMv2's assign_union_stack); ingress pushes and pops it as BMv2
does (the unions swapped, the emptied elements left as the swaps left them), copies
it member by member, and reads members by constant index. Both backends give the
same frames, and BMv2's where it is installed."""

from __future__ import annotations


import pytest

from tests.softswitch.conftest import load
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2

A, B = 0x0A, 0x0B
GO, COPY = 0x10, 0x30
# (kind, member bytes) in packet order.
BODIES = ([(A, "11")], [(GO | A, "11"), (B, "222222")],
          [(GO | B, "333333"), (GO | A, "44"), (B, "555555")],
          [(GO | A, "11"), (GO | A, "12"), (GO | A, "13"), (A, "14")],
          [(COPY | A, "11"), (B, "666666")],
          [(GO | B, "777777"), (COPY | A, "12"), (A, "13")],
          [(GO | A, "11"), (GO | B, "222222"), (COPY | A, "33"), (A, "44")])


def body(items) -> bytes:
    return b"".join(bytes([kind]) + bytes.fromhex(data) for kind, data in items)


def frames() -> list[bytes]:
    out = []
    for op in range(7):
        for i, items in enumerate(BODIES):
            src = bytes.fromhex("0200000000") + bytes([op])
            out.append(bytes.fromhex("0200000000") + bytes([i]) + src + b"\x88\xb5"
                       + body(items) + b"payload")
    out.append(bytes(12) + b"\x08\x00" + bytes(20))
    return out


def test_both_backends_give_the_same_frames_and_run_union_stacks_as_bmv2():
    outputs = {b: [load("union_stacks", b).process(f, 1) for f in frames()]
               for b in ("native", "python")}
    assert outputs["native"] == outputs["python"]
    by_frame = dict(zip(frames(), outputs["native"]))
    n = len(BODIES)

    def out(op, i):
        return by_frame[frames()[op * n + i]][0]
    # The deparser emits the kinds, then the stack's valid members, then the copy's.
    # A then B: us[1].b's low byte in the destination.
    assert out(0, 1) == (2, frames()[1][:5] + b"\x22" + frames()[1][6:14]
                         + bytes([GO | A, B]) + bytes.fromhex("11" "222222") + b"payload")
    # Three elements and a fourth: StackOutOfBounds (port 3), the fourth left as payload.
    assert out(0, 3)[0] == 3 and out(0, 3)[1][14:] == (
        bytes([GO | A] * 3 + [A]) + bytes.fromhex("111213") + bytes([0x14]) + b"payload")
    # Copied after one element (next 1 copied too): copy[1].b is the next one.
    assert out(0, 4)[1][14:] == bytes([COPY | A, B]) + bytes.fromhex("11" "11" "666666") \
        + b"payload"
    # Copied after three: extracting into the copy's next is StackOutOfBounds.
    assert out(0, 6)[0] == 3
    # push_front(1) onto one element: us[1] is what us[0] was; us[0] keeps what us[2]
    # held, here nothing valid.
    assert out(1, 0)[1][14:] == bytes([A]) + bytes.fromhex("11") + b"payload"
    # push_front(1) onto three: us[0] keeps the old us[2] (BMv2 leaves it valid).
    assert out(1, 2)[1][14:] == bytes([GO | B, GO | A, B]) + bytes.fromhex(
        "555555" "333333" "44") + b"payload"
    # pop_front(1) of three: us[2] keeps the old us[0].
    assert out(2, 2)[1][14:] == bytes([GO | B, GO | A, B]) + bytes.fromhex(
        "44" "555555" "333333") + b"payload"
    # op 5: copied member by member, then copy[1].b made valid (copy[1].a invalid).
    assert out(5, 1)[1][14:] == bytes([GO | A, B]) + bytes.fromhex(
        "11" "222222" "11" "b0b0b0") + b"payload"


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("union_stacks", backend, frames())
