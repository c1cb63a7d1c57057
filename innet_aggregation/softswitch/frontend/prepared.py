"""Whether a multicast's copies may share one deparse of their last headers.

Each copy of a multicast runs egress on its own state, then the deparser writes every
valid header. A header that egress can neither write a field of nor make valid or
invalid leaves every copy with the bytes ingress left it: the aggregation program's
1,024 summed values are the same for every rank; only Ethernet, IPv4 and UDP
addresses differ. ``plan`` finds the longest run of such headers at the end of the
deparse order (a header after one that egress changes may move but not change), or
names what stops it; the switch says the answer at start (``describe``), and the
native backend acts on it: the run is deparsed once a multicast, and each copy's
deparser writes its own headers, then copies those bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field as _field

from innet_aggregation.softswitch.frontend import ir
from innet_aggregation.softswitch.frontend.lower import walk_actions

# Standard metadata the switch sets before each copy's egress.
BEFORE_EGRESS = ("egress_port", "egress_spec", "instance_type", "egress_rid", "packet_length")
# Statements that write no field and change no header's validity.
READ_ONLY = (ir.RegisterWrite, ir.Count, ir.Exit, ir.Return, ir.Assert, ir.If, ir.Repeat,
             ir.Apply)


@dataclass
class Plan:
    """``shared``: the headers, in deparse order, every copy deparses alike (a proof
    where ``reason`` is None), else empty with the reason."""
    shared: list = _field(default_factory=list)
    reason: str | None = None


def changed(program) -> tuple[set, set] | str:
    """(ids of the fields, ids of the headers whose validity) a copy's egress may
    change, or the statement kind that stops the proof."""
    lowered = program.ir
    fields = {f.id for f in (program.std(n) for n in BEFORE_EGRESS) if f is not None}
    fields |= {c.target.id for c in lowered.update}
    headers: set = set()
    for s in walk_actions(lowered.egress):
        if isinstance(s, (ir.Assign, ir.RegisterRead, ir.Random, ir.HashOffset)):
            fields.add(s.field.id)
        elif isinstance(s, ir.AssignStackField):
            fields.update(f.id for f in s.fields)
        elif isinstance(s, (ir.CopyHeader, ir.AddHeader, ir.RemoveHeader, ir.SetValid,
                            ir.SwapHeaders)):
            for header in (getattr(s, n, None) for n in ("dst", "header", "a", "b")):
                if header is not None:
                    headers.add(header.id)
                    fields.update(f.id for f in header.fields)
        elif not isinstance(s, READ_ONLY):
            return f"egress has a {type(s).__name__}, which the proof does not follow"
    return fields, headers


def plan(program) -> Plan:
    """Prove which headers at the end of the deparse order every copy deparses alike,
    or say why none."""
    lowered = program.ir
    if lowered.special:
        return Plan(reason="the program clones, resubmits or recirculates")
    found = changed(program)
    if isinstance(found, str):
        return Plan(reason=found)
    fields, headers = found
    shared: list = []
    for header in reversed(lowered.deparse):
        named = {f.id for f in header.fields}
        if header.length is not None:
            named.add(header.length.id)
        if header.id in headers or named & fields:
            if not shared:
                return Plan(reason=f"egress may change {header.name}, the last header "
                                   "deparsed")
            break
        shared.insert(0, header)
    return Plan(shared=shared)


def describe(result: Plan) -> str:
    """The line the switch prints at start."""
    if result.reason is None:
        return (f"a multicast deparses {', '.join(h.name for h in result.shared)} once "
                f"for all its copies (egress writes none of them)")
    return f"each multicast copy is deparsed whole: {result.reason}"
