"""Header stacks assigned as a whole (programs/stack_assign.p4): in the parser (BMv2's
assign_header_stack: next is copied too, so the copy's next element is the one after
the last copied), in ingress element by element after a pop or an invalidated element,
and the stack's last element read in a parser assignment (a stack_field operand).
Both backends give the same frames, and BMv2's where it is installed."""

from __future__ import annotations


import pytest

from tests.softswitch.conftest import load
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2

TAGS = ([], [(0, 1, 5)], [(1, 1, 5), (0, 2, 6)], [(1, 1, 5), (2, 2, 6), (0, 3, 7)],
        [(2, 1, 5), (0, 9, 0x1234)], [(1, 1, 5), (1, 2, 6), (2, 3, 7), (0, 4, 8)],
        [(1, 1, 0xFFFF)] * 2 + [(0, 2, 2)], [(1, 1, 5)] * 4)


def tag_bytes(tags) -> bytes:
    return b"".join(bytes([more, kind]) + value.to_bytes(2, "big") for more, kind, value in tags)


def frames() -> list[bytes]:
    out = []
    for op in range(4):
        for i, tags in enumerate(TAGS):
            src = bytes.fromhex("0200000000") + bytes([op])
            out.append(bytes.fromhex("0200000000") + bytes([i]) + src + b"\x88\xb5"
                       + tag_bytes(tags) + b"payload")
    out.append(bytes(12) + b"\x08\x00" + bytes(20))          # no tags at all
    return out


def test_both_backends_give_the_same_frames_and_copy_stacks_whole():
    outputs = {b: [load("stack_assign", b).process(f, 1) for f in frames()]
               for b in ("native", "python")}
    assert outputs["native"] == outputs["python"]
    by_frame = dict(zip(frames(), outputs["native"]))
    # Copied after two tags (next 2 copied too): the third tag goes to copy[2]. The sum
    # and the last value of the tags extracted into the first stack are in the
    # destination.
    copied = by_frame[frames()[3]]
    assert copied == [(2, bytes.fromhex("0200" "000b" "0006") + frames()[3][6:14]
                       + tag_bytes(TAGS[3][:2]) + tag_bytes(TAGS[3]) + b"payload")]
    # Copied after one tag: copy[1] gets the next one.
    one = by_frame[frames()[4]]
    assert one[0][1][14:] == tag_bytes(TAGS[4][:1]) + tag_bytes(TAGS[4]) + b"payload"
    # Copied full: extracting into the copy's next is StackOutOfBounds (port 3).
    full = by_frame[frames()[5]]
    assert full[0][0] == 3 and full[0][1][14:] == (tag_bytes(TAGS[5][:3]) * 2
                                                   + tag_bytes(TAGS[5][3:]) + b"payload")
    # The sum wraps at 16 bits: 0xffff + 0xffff + 2.
    assert by_frame[frames()[6]][0][1][2:6] == bytes.fromhex("0000" "0002")
    # op 1: popped, then copied element by element; op 2: tags[0] invalid, then copied
    # (the parser's copy[2] becomes invalid as tags[2] is).
    popped = by_frame[frames()[len(TAGS) + 2]]
    assert popped[0][1][14:] == tag_bytes(TAGS[2][1:]) * 2 + b"payload"
    invalid = by_frame[frames()[2 * len(TAGS) + 3]]
    assert invalid[0][1][14:] == tag_bytes(TAGS[3][1:2]) * 2 + b"payload"


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("stack_assign", backend, frames())
