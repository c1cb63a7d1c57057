"""How the C printer writes a value into C: a number through ``validate.num`` or
``validate.u64`` (an int in range, or refused), and whether an expression's value
fits the 64-bit type its code computes in; what does not is ``NativeUnsupported``,
and the program runs on the Python backend. Shared by printer.py and packet.py."""

from __future__ import annotations

from innet_aggregation.softswitch.frontend import ir
from innet_aggregation.softswitch.frontend.program import Unsupported
from innet_aggregation.softswitch.frontend.validate import MAX_HEADER_BITS, num, u64

U64 = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
lit = u64
MAX_BYTES = MAX_HEADER_BITS // 8 + 1     # bounds of a header's size and bit positions


class NativeUnsupported(Unsupported):
    """A construct the C printer cannot print exactly; the Python backend runs it."""


def kind_of(e: ir.Expr) -> str | None:
    """"u" if the value fits uint64_t, "s" if it fits int64_t, else None."""
    if not e.known:
        return None
    if 0 <= e.lo and e.hi <= U64:
        return "u"
    if I64_MIN <= e.lo and e.hi <= I64_MAX:
        return "s"
    return None


def exact_kind(e: ir.Expr, what: str) -> str:
    kind = kind_of(e)
    if kind is None:
        raise NativeUnsupported(f"{what} may not fit in 64 bits")
    return kind


def slit(value: int) -> str:
    """A signed 64-bit C literal (INT64_MIN has no literal of its own)."""
    return ("(-0x7fffffffffffffffLL - 1)" if value == I64_MIN
            else f"({num(value, I64_MIN, I64_MAX + 1)}LL)")


def wlit(width: int) -> str:
    """A width the C code handles: 1 to 64 bits."""
    return num(width, 1, 65)
