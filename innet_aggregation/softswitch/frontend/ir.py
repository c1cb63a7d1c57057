"""The lowered program both backends print: one node class per construct.

Expressions carry the bounds of their true value (BMv2's unbounded integers):
``lo``/``hi``, or None where nothing bounds it, and ``boolean`` where the value is
a truth value (a comparison, ``not``, ``and``/``or``, a validity bit). Bounds are
computed once here, and a printer decides from them where a mask, a guard or a
refusal is needed. Statements and control nodes hold only IR nodes and the
``program`` declarations (Field, Header, RegisterSpec, CounterSpec, TableSpec).
"""

from __future__ import annotations

from dataclasses import dataclass, field as _field

BOUND_LIMIT = 1 << 4096      # beyond this a bound is dropped (None): shifts cannot blow up


def _clip(lo, hi):
    if lo is None or hi is None or abs(lo) > BOUND_LIMIT or abs(hi) > BOUND_LIMIT:
        return None, None
    return lo, hi


class Expr:
    __slots__ = ("lo", "hi", "boolean")

    def bounded(self, lo, hi, boolean=False):
        self.lo, self.hi = _clip(lo, hi)
        self.boolean = boolean
        return self

    @property
    def known(self) -> bool:
        return self.lo is not None

    def fits(self, width: int, signed: bool) -> bool:
        """Whether storing into a ``width``-bit field keeps the value unchanged."""
        if self.lo is None:
            return False
        if signed:
            half = 1 << (width - 1)
            return -half <= self.lo and self.hi < half
        return 0 <= self.lo and self.hi < (1 << width)


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value: int, boolean=False):
        self.value = value
        self.bounded(value, value, boolean)


class FieldRef(Expr):
    __slots__ = ("field",)

    def __init__(self, field):
        self.field = field
        if field.signed:
            half = 1 << (field.width - 1)
            self.bounded(-half, half - 1)
        else:
            self.bounded(0, (1 << field.width) - 1)


class Valid(Expr):
    """A header's validity bit (a truth value)."""
    __slots__ = ("header",)

    def __init__(self, header):
        self.header = header
        self.bounded(0, 1, True)


class Param(Expr):
    """An action parameter; action data is masked to its width where it enters a table."""
    __slots__ = ("index", "width")

    def __init__(self, index: int, width: int):
        self.index, self.width = index, width
        self.bounded(0, (1 << width) - 1)


class Lookahead(Expr):
    """``width`` bits at ``bit_offset`` past the parser's position (a Require precedes it)."""
    __slots__ = ("bit_offset", "width")

    def __init__(self, bit_offset: int, width: int):
        self.bit_offset, self.width = bit_offset, width
        self.bounded(0, (1 << width) - 1)


class StackField(Expr):
    """Field ``fields[index]``, the same field of each element of a header stack, by a
    computed index. An index past the stack drops the packet: BMv2's ``at()`` throws
    there, which no one catches, so simple_switch ends."""
    __slots__ = ("fields", "index")

    def __init__(self, fields: list, index: Expr):
        self.fields, self.index = fields, index
        ref = FieldRef(fields[0])
        self.bounded(ref.lo, ref.hi)


class Unary(Expr):
    """``not`` and ``d2b`` (truth values), ``~``, and ``b2d`` (a truth value as 0 or 1)."""
    __slots__ = ("op", "a")

    def __init__(self, op: str, a: Expr):
        self.op, self.a = op, a
        if op == "~":
            self.bounded(-a.hi - 1 if a.known else None, -a.lo - 1 if a.known else None)
        else:
            self.bounded(0, 1, op != "b2d")


class Cond(Expr):
    __slots__ = ("cond", "a", "b")

    def __init__(self, cond: Expr, a: Expr, b: Expr):
        self.cond, self.a, self.b = cond, a, b
        known = a.known and b.known
        self.bounded(min(a.lo, b.lo) if known else None, max(a.hi, b.hi) if known else None,
                     a.boolean and b.boolean)


class Cast(Expr):
    """``two_comp_mod`` (wrap), ``sat_cast`` or ``usat_cast`` (saturate) to ``width`` bits."""
    __slots__ = ("op", "a", "width")

    def __init__(self, op: str, a: Expr, width: int):
        self.op, self.a, self.width = op, a, width
        if op == "usat_cast":
            self.bounded(0, (1 << width) - 1)
        else:
            self.bounded(-(1 << (width - 1)), (1 << (width - 1)) - 1)


COMPARISONS = ("==", "!=", "<", ">", "<=", ">=")


class Binary(Expr):
    """Arithmetic ``+ - * / % & | ^ << >>``, comparisons, and ``and``/``or``."""
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b = op, a, b
        if op in COMPARISONS or op in ("and", "or"):
            self.bounded(0, 1, True)
        else:
            self.bounded(*_bounds(op, a, b))


def _bounds(op: str, a: Expr, b: Expr):
    if not (a.known and b.known):
        return None, None
    if op == "+":
        return a.lo + b.lo, a.hi + b.hi
    if op == "-":
        return a.lo - b.hi, a.hi - b.lo
    if op == "*":
        corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        return min(corners), max(corners)
    if op == "<<":
        if b.lo < 0 or b.hi >= 256:
            return None, None
        corners = [a.lo << b.lo, a.lo << b.hi, a.hi << b.lo, a.hi << b.hi]
        return min(corners), max(corners)
    if op == ">>":
        if b.lo < 0:
            return None, None
        bmax = min(b.hi, 4096)
        corners = [a.lo >> b.lo, a.lo >> bmax, a.hi >> b.lo, a.hi >> bmax]
        return min(corners), max(corners)
    if op in ("/", "%"):
        if a.lo < 0 or b.lo < 0:
            return None, None
        return 0, a.hi if op == "/" else max(min(a.hi, b.hi - 1), 0)
    if op == "&" and (a.lo >= 0 or b.lo >= 0):
        return 0, min(x.hi for x in (a, b) if x.lo >= 0)
    if a.lo >= 0 and b.lo >= 0:
        return 0, (1 << max(a.hi.bit_length(), b.hi.bit_length())) - 1
    # Two's complement: values in [-2^k, 2^k) stay there under & | ^.
    k = max(max(abs(x.lo), abs(x.hi) + 1).bit_length() for x in (a, b))
    return -(1 << k), (1 << k) - 1


# ---------------------------------------------------------------------- statements
@dataclass(eq=False)
class Assign:
    field: object
    value: Expr          # stored truncated to the field's width, as BMv2 does
    bits: int = 64       # 32: computable in uint32 arithmetic (widths.mark decides)


@dataclass(eq=False)
class AssignStackField:
    """``hs[index].f = value``: ``fields`` as in StackField, an index past it drops."""
    fields: list
    index: Expr
    value: Expr


@dataclass(eq=False)
class CopyHeader:
    dst: object          # Header
    src: object          # Header of the same field widths; invalid: dst becomes invalid


@dataclass(eq=False)
class AddHeader:
    header: object       # not metadata
    zero: bool           # add_header zeroes the fields and grows the packet; _fast only sets valid


@dataclass(eq=False)
class RemoveHeader:
    header: object


@dataclass(eq=False)
class SetValid:
    """Validity alone (a header stack's push and pop), the packet length unchanged."""
    header: object
    valid: bool


@dataclass(eq=False)
class SwapHeaders:
    """Exchange two headers' fields and validity (BMv2's stack shifts)."""
    a: object
    b: object


@dataclass(eq=False)
class RegisterRead:
    field: object
    register: object     # RegisterSpec
    index: Expr          # an out-of-range index (negative too) skips the read, as in BMv2


@dataclass(eq=False)
class RegisterWrite:
    register: object
    index: Expr
    value: Expr          # evaluated even when the index is out of range


@dataclass(eq=False)
class Count:
    counter: object      # CounterSpec
    index: Expr


@dataclass(eq=False)
class Random:
    field: object
    lo: Expr
    hi: Expr             # nothing is stored when lo > hi


@dataclass(eq=False)
class Exit:
    """Leave the control."""


@dataclass(eq=False)
class Return:
    """Leave the action."""


@dataclass(eq=False)
class Assert:
    cond: Expr           # a failure is counted (native) or logged (Python); the packet goes on


@dataclass(eq=False)
class Clone:
    """clone_{ingress,egress}_pkt_to_egress: after this pipeline, a copy to session
    ``session`` & 0x7FFF (simple_switch keeps 15 bits) keeping field list
    ``field_list``; the last call wins. Ingress or egress: where it is applied."""
    session: Expr
    field_list: int


@dataclass(eq=False)
class Resubmit:
    """After ingress, ingress again on the original packet, keeping field list
    ``field_list`` (0: simple_switch's flag cleared, no resubmit)."""
    field_list: int


@dataclass(eq=False)
class Recirculate:
    """After egress, the deparsed packet to the parser again, keeping ``field_list``
    (0: no recirculation)."""
    field_list: int


@dataclass(eq=False)
class If:
    cond: Expr
    then: list
    orelse: list


@dataclass(eq=False)
class Repeat:
    """Statements run as they stand, in order: ``iterations`` (lists of the same length)
    differ only in the fields and registers they name (lower.reroll). A printer may
    print them as a loop over the fields' and registers' positions, or one by one."""
    iterations: list


# Parser statements: the first of them to fail sets the parser error and stops parsing.
@dataclass(eq=False)
class Require:
    nbytes: int          # that many bytes left, else PacketTooShort


@dataclass(eq=False)
class Extract:
    header: object


@dataclass(eq=False)
class ExtractVL:
    """Extract a header with a varbit field of ``nbits`` bits, as BMv2 does: not a
    multiple of 8 is ParserInvalidArgument, fewer bytes left PacketTooShort, more than
    the header's most bytes HeaderTooShort; else its length field holds ``nbits``."""
    header: object
    nbits: Expr          # in [0, 2^32): BMv2 takes it as an int, so 2^31 and up is too short
    invalid_argument: int
    too_long: int        # HeaderTooShort's code


@dataclass(eq=False)
class Verify:
    cond: Expr
    error: Expr


@dataclass(eq=False)
class Advance:
    nbytes: Expr         # else PacketTooShort


# ---------------------------------------------------------------------- structure
@dataclass(eq=False)
class Action:
    id: int
    name: str
    params: list         # [(name, width)]
    body: list           # statements


@dataclass(eq=False)
class Apply:
    """Apply ``table``: look ``keys`` up (exact, ternary, LPM or range, as ``table.match_type``
    says), run the entry's action or the default one, then the branch whose
    condition holds: "hit", "miss" or a tuple of action ids."""
    table: object        # TableSpec
    keys: list           # one Expr per key, unsigned, masked to the key's width
    actions: list        # [Action] the table can run
    branches: list       # [(condition, statements)]


@dataclass(eq=False)
class ParserState:
    index: int
    ops: list            # statements, parser statements included
    key: Expr | None     # the select key as one integer, each part padded to whole bytes
    key_bits: int
    cases: list          # [(value, mask or None, next index)]; -1 accepts
    default: int


@dataclass(eq=False)
class Calculation:
    """A BMv2 calculation: ``algo`` (one of validate.HASH_ALGORITHMS) over the bits of
    ``inputs`` (the fields of an invalid header skipped, a varbit field as long as it is
    now), then, with ``payload``, from the next whole byte the unparsed rest of the packet."""
    algo: str
    inputs: list         # [(Header, [Field]) or (None, (value, width))]
    payload: bool


@dataclass(eq=False)
class Checksum:
    target: object       # Field
    cond: Expr | None
    calc: Calculation


@dataclass(eq=False)
class HashOffset:
    """``field = base + calc % size`` (BMv2's modify_field_with_hash_based_offset): in
    uint64_t arithmetic, a size of 0 taken as 1, stored truncated to the field."""
    field: object
    base: Expr           # both in [0, 2^64)
    calc: Calculation
    size: Expr


@dataclass(eq=False)
class Lowered:
    states: list         # [ParserState] in a forward order
    init: int
    parser_loops: bool   # whether a transition goes back in that order
    verify: list         # [Checksum]
    update: list         # [Checksum]
    ingress: list        # statements and Applies
    egress: list
    deparse: list        # [Header]
    actions: dict = _field(default_factory=dict)   # id -> Action
    special: bool = False    # clone, resubmit or recirculate anywhere: the re-entry paths
    # Registers a backend may store side by side, cell by cell (each a list of
    # RegisterSpec, in declaration order): the same size and width, touched by the
    # same actions, so one packet reads a run of neighbouring words, not one word in
    # each of many arrays (lower.register_groups).
    register_groups: list = _field(default_factory=list)
