"""C printer, 32-bit lanes: an assignment that frontend/widths.py marked ``bits = 32``
printed in uint32_t arithmetic (runtime.c's ss_sext32, ss_sat32s, ss_sat32u). A mixin
of ``CPrinter`` (printer.py); every number goes through literals.py as there.
"""

from __future__ import annotations

from innet_aggregation.softswitch.frontend import ir
from innet_aggregation.softswitch.frontend.program import mask

from .literals import lit, wlit


class NarrowPrinter:
    """The uint32_t code of ``CPrinter`` for values widths.wraps accepts."""

    @staticmethod
    def store32(code: str, width: int, signed: bool) -> str:
        """A uint32_t value stored into a field of ``width`` <= 32 bits (as ``store``)."""
        if signed:
            return f"(uint64_t)(int64_t)(int32_t)ss_sext32({code}, {wlit(width)})"
        if width < 32:
            return f"(uint64_t)(({code}) & (uint32_t){lit(mask(width))})"
        return f"(uint64_t)({code})"

    def narrow(self, e: ir.Expr) -> str:
        """``e`` modulo 2^32 as a uint32_t expression (widths.wraps holds for ``e``)."""
        if isinstance(e, ir.Const):
            return f"(uint32_t){lit(e.value % (1 << 32))}"
        if isinstance(e, (ir.FieldRef, ir.Param)):
            return f"(uint32_t){self.expr(e)}"
        if isinstance(e, ir.Unary):
            return f"(uint32_t)~({self.narrow(e.a)})"
        if isinstance(e, ir.Binary):
            return f"(uint32_t)(({self.narrow(e.a)}) {e.op} ({self.narrow(e.b)}))"
        if e.op == "two_comp_mod":
            return f"ss_sext32({self.narrow(e.a)}, {wlit(e.width)})"
        sat = "ss_sat32s" if e.op == "sat_cast" else "ss_sat32u"
        return f"{sat}({self.narrow(e.a.a)}, {self.narrow(e.a.b)}, {int(e.a.op == '-')})"
