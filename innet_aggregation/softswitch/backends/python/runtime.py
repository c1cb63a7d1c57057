"""What the Python backend's generated functions call: parser errors, exit and
return, a stack index checked, the checksum and BMv2's other hashes, lookahead and the
assertion log."""

from __future__ import annotations

import functools
import logging
import struct

from innet_aggregation.softswitch.frontend.validate import HASH_ALGORITHMS


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


# (width, polynomial, initial value, final xor, reflected): BMv2's CRCs, the custom
# ones with its default parameters.
_CRCS = {"crc16": (16, 0x8005, 0, 0, True), "crc16_custom": (16, 0x8005, 0, 0, True),
         "crc32": (32, 0x04C11DB7, 0xFFFFFFFF, 0xFFFFFFFF, True),
         "crc32_custom": (32, 0x04C11DB7, 0xFFFFFFFF, 0xFFFFFFFF, True),
         "crcCCITT": (16, 0x1021, 0xFFFF, 0, False), "crc8_custom": (8, 0x07, 0, 0, False),
         "crc64_custom": (64, 0x1B, 0, 0, True)}


_ALGORITHMS = list(HASH_ALGORITHMS)


@functools.lru_cache(maxsize=None)
def _crc_table(width: int, poly: int, reflected: bool) -> tuple:
    top, full = 1 << (width - 1), (1 << width) - 1
    if reflected:
        rpoly = int(f"{poly:0{width}b}"[::-1], 2)
    table = []
    for byte in range(256):
        if reflected:
            reg = byte
            for _ in range(8):
                reg = (reg >> 1) ^ rpoly if reg & 1 else reg >> 1
        else:
            reg = byte << (width - 8)
            for _ in range(8):
                reg = ((reg << 1) ^ poly) & full if reg & top else (reg << 1) & full
        table.append(reg)
    return tuple(table)


def hash_value(code: int, data: bytes) -> int:
    """BMv2's hash ``code`` (an index of validate.HASH_ALGORITHMS) of ``data``."""
    algo = _ALGORITHMS[code]
    if algo in ("csum16", "cksum16"):
        return csum16(data)
    if algo in _CRCS:
        width, poly, reg, xorout, reflected = _CRCS[algo]
        table, full = _crc_table(width, poly, reflected), (1 << width) - 1
        for byte in data:
            if reflected:
                reg = table[(reg ^ byte) & 0xFF] ^ (reg >> 8)
            else:
                reg = table[((reg >> (width - 8)) ^ byte) & 0xFF] ^ ((reg << 8) & full)
        return reg ^ xorout
    if algo == "identity":
        return int.from_bytes(data[:8], "big")
    size = 2 if algo == "xor16" else 4                 # xor16, xor32
    out = 0
    for i in range(0, len(data), size):
        out ^= int.from_bytes(data[i:i + size].ljust(size, b"\0"), "big")
    return out


def lookahead(pkt, off: int, bit_offset: int, width: int) -> int:
    """``width`` bits at ``bit_offset`` past ``off`` (the bytes are there: a Require checked)."""
    end = off + (bit_offset + width + 7) // 8
    total = (end - off) * 8
    return (int.from_bytes(pkt[off:end], "big") >> (total - bit_offset - width)) & ((1 << width) - 1)


def log_assert(where: str) -> None:
    logging.getLogger("softswitch").error("assert/assume failed in %s", where)


NOT_CACHED = object()
