"""Header stacks (programs/header_stacks.p4): extract into a stack in a parser loop,
select on its last element, StackOutOfBounds, push_front and pop_front by 1, 2 and
more than the size, elements made valid and written, valid ones read.
Both backends give the same frames, and BMv2's where it is installed."""

from __future__ import annotations


import pytest

from tests.softswitch.conftest import load
from tests.softswitch.test_vs_bmv2 import NEEDS_BMV2, agrees_with_bmv2

TAGS = ([], [(0, 1, 5)], [(1, 1, 5), (0, 2, 6)], [(1, 1, 5), (1, 2, 6), (1, 3, 7), (0, 4, 8)],
        [(1, 1, 5)] * 5, [(1, 9, 0x1234)], [(1, 1, 5), (1, 2, 6)] + [(0, 7, 0xFFFF)])


def frames() -> list[bytes]:
    out = []
    for op in range(8):
        for i, tags in enumerate(TAGS):
            body = b"".join(bytes([more, kind]) + value.to_bytes(2, "big")
                            for more, kind, value in tags)
            src = bytes.fromhex("0200000000") + bytes([op])
            out.append(bytes.fromhex("0200000000") + bytes([i]) + src + b"\x88\xb5" + body
                       + b"payload")
    out.append(bytes(12) + b"\x08\x00" + bytes(20))          # no tags at all
    return out


def test_both_backends_give_the_same_frames_and_shift_as_bmv2_does():
    outputs = {b: [load("header_stacks", b).process(f, 1) for f in frames()]
               for b in ("native", "python")}
    assert outputs["native"] == outputs["python"]
    by_frame = dict(zip(frames(), outputs["native"]))
    # push_front(1) onto two tags: the new element first, its value the next one's + 1.
    pushed = by_frame[frames()[len(TAGS) * 1 + 2]]
    assert pushed[0][0] == 2 and pushed[0][1][14:26] == bytes.fromhex("00a10006" "01010005"
                                                                      "00020006")
    # Five tags: the fifth is StackOutOfBounds (port 3), left in the payload.
    overflow = by_frame[frames()[4]]
    assert overflow[0][0] == 3 and overflow[0][1].endswith(bytes.fromhex("01010005") + b"payload")


@NEEDS_BMV2
def test_bmv2_agrees_frame_by_frame(backend):
    agrees_with_bmv2("header_stacks", backend, frames())
