"""Whether lanes could run a program's pipeline without one shared lock.

Lanes may run the pipeline in parallel, each owning a share of register state, only
where two frames that can touch the same register cell are sure to be steered to the
same lane. That holds when every register access is indexed by bits of one header
field (the slot) that no control writes: frame -> field value -> share, as RSS steers
by flow. ``plan`` proves that from the lowered program, or names what stops it; the
switch prints the answer at start (``describe``).

For each register it finds the shift at which the field's bits sit in the index
(``cell = slot ++ set``: 1), so the share of a cell is ``(index >> shift) % shares``,
the same for every access a frame makes whenever shares is a power of two no larger
than ``2 ** bits``.
"""

from __future__ import annotations

from dataclasses import dataclass, field as _field

from innet_aggregation.softswitch.frontend import ir

DEPTH = 16          # definitions followed through temporaries before giving up


@dataclass
class Plan:
    """A proof (``key`` set, ``reason`` None) or the reason there is none."""
    key: object = None                  # the header Field every register index comes from
    shifts: dict = _field(default_factory=dict)   # register name -> shift of key's bits
    bits: int = 0                       # key bits every index keeps (shares <= 2 ** bits)
    reason: str | None = None


def _statements(lowered: ir.Lowered):
    """Every statement the program can run, actions' bodies and the parser's too."""
    stack = [s for state in lowered.states for s in state.ops]
    stack += list(lowered.ingress) + list(lowered.egress)
    seen = set()
    for action in [*lowered.actions.values(), None]:
        while stack:
            s = stack.pop()
            yield s
            if isinstance(s, ir.If):
                stack += s.then + s.orelse
            elif isinstance(s, ir.Repeat):
                stack += [x for it in s.iterations for x in it]
            elif isinstance(s, ir.Apply):
                stack += [x for a in s.actions if a.id not in seen and not seen.add(a.id)
                          for x in a.body]
                stack += [x for _, branch in s.branches for x in branch]
        if action is not None and action.id not in seen:
            seen.add(action.id)
            stack += action.body


def _name(f) -> str:
    return f"{f.header}.{f.name}"


class _Prover:
    def __init__(self, program, lowered: ir.Lowered):
        self.program = program
        self.defs: dict = {}         # field -> [value Expr] of its plain assignments
        self.written: set = set()    # fields written any other way (extract aside)
        self.accesses = []           # (register, index Expr)
        for s in _statements(lowered):
            if isinstance(s, ir.Assign):
                self.defs.setdefault(s.field, []).append(s.value)
            elif isinstance(s, (ir.RegisterRead, ir.Random, ir.HashOffset)):
                self.written.add(s.field)
            elif isinstance(s, ir.AssignStackField):
                self.written.update(s.fields)
            elif isinstance(s, (ir.CopyHeader, ir.AddHeader, ir.SetValid, ir.SwapHeaders)):
                for header in (getattr(s, n, None) for n in ("dst", "header", "a", "b")):
                    if header is not None:
                        self.written.update(header.fields)
            if isinstance(s, (ir.RegisterRead, ir.RegisterWrite)):
                self.accesses.append((s.register, s.index))
        self.written.update(c.target for c in lowered.update)

    def header_field(self, f) -> bool:
        return not self.program.header(f.header).metadata

    def untouched(self, f) -> bool:
        return f not in self.defs and f not in self.written

    def form(self, e, depth=0):
        """(field, shift, bits): bits [shift, shift + bits) of e are the field's low
        bits, the bits above are zero, those below come from elsewhere; or a reason."""
        if depth > DEPTH:
            return "its definitions go too deep"
        if isinstance(e, ir.FieldRef):
            f = e.field
            if self.header_field(f):
                if not self.untouched(f):
                    return f"{_name(f)} is written by the program"
                if f.signed or f.varbit:
                    return f"{_name(f)} is signed or a varbit"
                return f, 0, f.width
            values = self.defs.get(f, [])
            if len(values) != 1 or f in self.written:
                return f"{_name(f)} is metadata not set once from a header field"
            return self.form(values[0], depth + 1)
        if isinstance(e, ir.Binary) and e.op in ("&", "<<", "|"):
            a, b = e.a, e.b
            if e.op != "<<" and isinstance(a, ir.Const):
                a, b = b, a
            inner = self.form(a, depth + 1)
            if isinstance(inner, str):
                if e.op == "|":      # the field may be on the other side
                    other = self.form(b, depth + 1)
                    return other if isinstance(other, str) else self._or(other, a, inner)
                return inner
            f, shift, bits = inner
            if e.op == "<<" and isinstance(b, ir.Const) and 0 <= b.value < 64:
                return f, shift + b.value, bits
            if e.op == "&" and isinstance(b, ir.Const) and b.value >= 0:
                run = 0
                while run < bits and b.value >> (shift + run) & 1:
                    run += 1
                return (f, shift, run) if run else "a mask drops the field's bits"
            if e.op == "|":
                return self._or(inner, b, "")
        return f"an index that is not the field's bits ({type(e).__name__})"

    @staticmethod
    def _or(inner, low, why):
        """A | B: the field's bits survive where B is known to sit below them."""
        f, shift, bits = inner
        if low.known and low.lo >= 0 and low.hi < (1 << shift):
            return f, shift, bits
        return why or "an index ORs other bits into the field's"


def plan(program) -> Plan:
    """Prove lanes may shard register state by one header field, or say why not."""
    lowered = program.ir
    if lowered.special:
        return Plan(reason="the program clones, resubmits or recirculates: a copy's "
                           "register accesses are not the received frame's")
    prover = _Prover(program, lowered)
    if not prover.accesses:
        return Plan(reason="the program has no registers: nothing to shard")
    key, shifts, bits = None, {}, 64
    for register, index in prover.accesses:
        form = prover.form(index)
        if isinstance(form, str):
            return Plan(reason=f"register {register.name}: {form}")
        f, shift, kept = form
        if key is not None and f is not key:
            return Plan(reason=f"register {register.name} is indexed by {_name(f)}, "
                               f"others by {_name(key)}")
        if shifts.setdefault(register.name, shift) != shift:
            return Plan(reason=f"register {register.name} is indexed at two shifts of "
                               f"{_name(f)}")
        key, bits = f, min(bits, kept)
    return Plan(key=key, shifts=shifts, bits=bits)


def describe(result: Plan) -> str:
    """The line the switch prints at start."""
    if result.reason is None:
        return (f"register state can be shared out by {_name(result.key)} "
                f"({len(result.shifts)} registers, {result.bits} bits of it); the lanes "
                f"still run the pipeline under one lock")
    return f"the lanes run the pipeline under one lock: {result.reason}"
