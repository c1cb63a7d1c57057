"""Which assignments of a rerolled run may be computed in 32-bit lanes.

A field of up to 32 bits is stored modulo 2^W (W <= 32), and 2^W divides 2^32, so a
value built by wrapping operations (+ - * & | ^ ~, two_comp_mod to <= 32 bits) from
fields, constants and action data needs only their low 32 bits: uint32 arithmetic
gives the stored value exactly, in twice as many SIMD lanes per vector as 64-bit
(the aggregation program's add over its K values). A saturating cast needs the exact
sum, not its residue: it is narrow only for ``sat_cast``/``usat_cast`` to 32 bits of
an add or subtract whose operands are exact 32-bit values of that sign, where the
overflow test of two's complement arithmetic decides the clamp. Anything else
(comparisons, shifts, division, wider casts, unknown bounds) stays 64-bit. The front
end decides; a printer prints ``ir.Assign.bits`` or ignores it (Python does)."""

from __future__ import annotations

from innet_aggregation.softswitch.frontend import ir

NARROW = 32
WRAPPING = ("+", "-", "*", "&", "|", "^")
SATURATING = {"sat_cast": (-(1 << 31), (1 << 31) - 1), "usat_cast": (0, (1 << 32) - 1)}


def mark(statements: list) -> None:
    """Set ``bits = 32`` on each assignment of ``statements`` computable in 32 bits."""
    for s in statements:
        if isinstance(s, ir.Assign) and s.field.width <= NARROW and not s.field.varbit \
                and wraps(s.value):
            s.bits = NARROW


def wraps(e: ir.Expr) -> bool:
    """Whether uint32 arithmetic gives ``e``'s value modulo 2^32."""
    if isinstance(e, ir.FieldRef):
        return e.field.width <= 64 and not e.field.varbit
    if isinstance(e, (ir.Const, ir.Param)):
        return True
    if isinstance(e, ir.Unary):
        return e.op == "~" and wraps(e.a)
    if isinstance(e, ir.Binary):
        return e.op in WRAPPING and wraps(e.a) and wraps(e.b)
    if isinstance(e, ir.Cast):
        if e.op == "two_comp_mod":
            return e.width <= NARROW and wraps(e.a)
        return saturates(e)
    return False


def saturates(e: ir.Cast) -> bool:
    """Whether ``e`` clamps a 32-bit add or subtract of exact 32-bit operands."""
    a = e.a
    if e.width != NARROW or not isinstance(a, ir.Binary) or a.op not in ("+", "-"):
        return False
    lo, hi = SATURATING[e.op]
    return all(x.known and lo <= x.lo and x.hi <= hi and wraps(x) for x in (a.a, a.b))
