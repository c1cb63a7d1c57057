"""What the Python backend's generated functions call: parser errors, exit and
return, a stack index checked, the checksum, lookahead and the assertion log."""

from __future__ import annotations

import logging
import struct


class ParserError(Exception):
    """Raised by generated parser code; carries the P4 error code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class Exit(Exception):
    """The P4 ``exit`` statement: leaves the current control."""


class Return(Exception):
    """A ``return`` inside a conditional of an action: leaves the action."""


class Dropped(Exception):
    """The packet is dropped where BMv2 would throw (a stack index past the stack)."""


def stack_index(i: int, size: int) -> int:
    if not 0 <= i < size:
        raise Dropped
    return i


def csum16(data: bytes) -> int:
    """The one's complement checksum BMv2 computes for HashAlgorithm.csum16."""
    if len(data) & 1:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def lookahead(pkt, off: int, bit_offset: int, width: int) -> int:
    """``width`` bits at ``bit_offset`` past ``off`` (the bytes are there: a Require checked)."""
    end = off + (bit_offset + width + 7) // 8
    total = (end - off) * 8
    return (int.from_bytes(pkt[off:end], "big") >> (total - bit_offset - width)) & ((1 << width) - 1)


def log_assert(where: str) -> None:
    logging.getLogger("softswitch").error("assert/assume failed in %s", where)


NOT_CACHED = object()
