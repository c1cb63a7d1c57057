"""Whether lanes run a program's pipeline without one shared lock.

Lanes may run the pipeline in parallel, each owning a share of register state, only
where two frames that can touch the same register cell are sure to be steered to the
same lane. That holds when every register index is bits of a header field (the slot)
that no control writes, and no frame can reach registers through two such fields
(the aggregation program's slot-reset PacketOut indexes the bitmaps by its own slot
field, on a branch no aggregation packet takes): frame -> field value -> share, as
RSS steers by flow. ``plan`` proves that from the lowered program, or names what
stops it; the switch prints the answer at start (``describe``), and the native
backend acts on it: a frame holds the lock of its field's share (``field % shares``)
from its parser's end to its own, not one lock for every lane.

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
    """A proof (``keys`` set, ``reason`` None) or the reason there is none."""
    keys: list = _field(default_factory=list)   # header Fields the indices come from,
                                                # one a frame (_Frames)
    shifts: dict = _field(default_factory=dict)   # register name -> shift of key's bits
    bits: int = 0                       # key bits every index keeps (shares <= 2 ** bits)
    # key field -> True where registers indexed by it are reached only while its header
    # is valid: a frame whose key header the parser left invalid takes no share's lock.
    guarded: dict = _field(default_factory=dict)
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
        self.accesses = []           # RegisterRead and RegisterWrite statements
        for s in _statements(lowered):
            if isinstance(s, ir.Assign):
                self.defs.setdefault(s.field, []).append(s.value)
            elif isinstance(s, (ir.RegisterRead, ir.Random, ir.HashOffset)):
                self.written.add(s.field)
            elif isinstance(s, ir.AssignStackField):
                self.written.update(s.fields)
            elif isinstance(s, (ir.CopyHeader, ir.AddHeader, ir.SwapHeaders)):   # values
                for header in (getattr(s, n, None) for n in ("dst", "header", "a", "b")):
                    if header is not None:
                        self.written.update(header.fields)
            if isinstance(s, (ir.RegisterRead, ir.RegisterWrite)):
                self.accesses.append(s)
        self.written.update(c.target for c in lowered.update)

    def header_field(self, f) -> bool:
        return not self.program.header(f.header).metadata

    def untouched(self, f) -> bool:
        return f not in self.defs and f not in self.written

    def form(self, e, depth=0):
        """(field, shift, bits): bits [shift, shift + bits) of e are the field's low
        bits (the share needs no others); or the reason there is no such field."""
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


class _Frames:
    """Walks ingress then egress in order, along every branch that can be taken given
    what the walk knows of the key headers' validity (an If on ``isValid()`` met twice
    with no change between goes one way both times), and finds whether a frame can use
    two key fields. A state is (what is known: header -> valid, the key fields used so
    far); the walk carries the set of states the frames can be in, a handful: only
    the key fields' headers are tracked."""

    def __init__(self, key_of, headers: set):
        self.key_of = key_of
        self.headers = headers      # ids of the key fields' headers
        self.clash = None

    def walk(self, stmts, states: set) -> set:
        for s in stmts:
            if self.clash:
                break
            states = self.step(s, states)
        return states

    def step(self, s, states: set) -> set:
        if isinstance(s, (ir.RegisterRead, ir.RegisterWrite)):
            states = {(known, used | {self.key_of(s)}) for known, used in states}
            self.clash = next((used for _, used in states if len(used) > 1), None)
            return states
        if isinstance(s, ir.SetValid):
            return {(self.knowing(known, s.header, s.valid), used) for known, used in states}
        if isinstance(s, (ir.CopyHeader, ir.AddHeader, ir.RemoveHeader, ir.SwapHeaders)):
            gone = {id(getattr(s, n)) for n in ("dst", "header", "a", "b") if hasattr(s, n)}
            return {(frozenset((h, v) for h, v in known if h not in gone), used)
                    for known, used in states}
        if isinstance(s, ir.If):
            h = s.cond.header if isinstance(s.cond, ir.Valid) else None
            if h is None or id(h) not in self.headers:
                return self.walk(s.then, states) | self.walk(s.orelse, states)
            out = set()
            for known, used in states:
                fact = dict(known).get(id(h))
                if fact is not False:
                    out |= self.walk(s.then, {(self.knowing(known, h, True), used)})
                if fact is not True:
                    out |= self.walk(s.orelse, {(self.knowing(known, h, False), used)})
            return out
        if isinstance(s, ir.Repeat):
            for it in s.iterations:
                states = self.walk(it, states)
            return states
        if isinstance(s, ir.Apply):
            ran = set().union(*(self.walk(a.body, states) for a in s.actions)) or states
            return ran.union(*(self.walk(b, ran) for _, b in s.branches))
        return states

    @staticmethod
    def knowing(known: frozenset, header, valid: bool) -> frozenset:
        return frozenset({**dict(known), id(header): valid}.items())


def plan(program) -> Plan:
    """Prove lanes may shard register state by a header field, or say why not."""
    lowered = program.ir
    if lowered.special:
        return Plan(reason="the program clones, resubmits or recirculates: a copy's "
                           "register accesses are not the received frame's")
    prover = _Prover(program, lowered)
    if not prover.accesses:
        return Plan(reason="the program has no registers: nothing to shard")
    shifts, bits, by_field = {}, 64, {}
    for access in prover.accesses:
        register = access.register
        form = prover.form(access.index)
        if isinstance(form, str):
            return Plan(reason=f"register {register.name}: {form}")
        f, shift, kept = form
        if shifts.setdefault(register.name, shift) != shift:
            return Plan(reason=f"register {register.name} is indexed at two shifts of "
                               f"its key")
        by_field.setdefault(f, []).append(access)
        bits = min(bits, kept)
    if len(by_field) > 1:
        if any(isinstance(s, (ir.RegisterRead, ir.RegisterWrite))
               for state in lowered.states for s in state.ops):
            return Plan(reason="the parser reads or writes a register")
        keys = {id(a): f for f, accesses in by_field.items() for a in accesses}
        headers = {id(program.header(f.header)) for f in by_field}
        frames = _Frames(lambda access: keys[id(access)], headers)
        ingress = frames.walk(lowered.ingress, {(frozenset(), frozenset())})
        # A multicast's copies each run egress from where ingress left the frame.
        once = frames.walk(lowered.egress, ingress)
        used = frozenset().union(*(u for _, u in once))
        frames.walk(lowered.egress, {(known, used) for known, _ in ingress})
        if frames.clash:
            return Plan(reason="a frame can reach registers indexed by "
                               + " and by ".join(sorted(_name(f) for f in frames.clash)))
    guarded = {}
    for f, accesses in by_field.items():
        mine = {id(a) for a in accesses}
        frames = _Frames(lambda access: id(access) in mine, {id(program.header(f.header))})
        start = {(frozenset({(id(program.header(f.header)), False)}), frozenset())}
        out = frames.walk(lowered.egress, frames.walk(lowered.ingress, start))
        guarded[f] = not frames.clash and not any(True in used for _, used in out)
    return Plan(keys=list(by_field), shifts=shifts, bits=bits, guarded=guarded)


def describe(result: Plan) -> str:
    """The line the switch prints at start."""
    if result.reason is None:
        return (f"register state is shared out by "
                f"{' or '.join(_name(f) for f in result.keys)} "
                f"({len(result.shifts)} registers, {result.bits} bits of it): the lanes "
                f"run the pipeline in parallel, a frame under the lock of its share only")
    return f"the lanes run the pipeline under one lock: {result.reason}"
