"""Python printer: a lowered program (``frontend.ir``) as two Python functions.

Every header field becomes a local variable of ``ingress`` (parser, verify
checksums, ingress control) and ``egress`` (egress control, update checksums,
deparser); the state between them is one tuple, so a multicast copy is free.
Actions are inlined where their table is applied, one printer rule per IR node,
so no packet ever walks the JSON. Values follow BMv2: expressions are unbounded
integers, truncated to a field's width where stored, and only where the IR's
bounds do not prove the value fits. This backend runs every program the front
half accepts; the native backend falls back to it. Names become identifiers of
``[A-Za-z0-9_]`` only, and every number goes through ``validate.num`` (an int in
range, or refused): literals.py. The parser, the checksums and the headers' layouts
are packet.py's; the controls, tables and actions, and the two functions, here.
"""

from __future__ import annotations

import random
import re

from innet_aggregation.softswitch.backends.python import runtime
from innet_aggregation.softswitch.frontend import ir
from innet_aggregation.softswitch.frontend.lower import walk
from innet_aggregation.softswitch.frontend.program import Field, Header, Program, Unsupported, mask
from innet_aggregation.softswitch.frontend.validate import MAX_BITS, MAX_FIELD_LIST, MAX_ID, \
    MAX_LOOKAHEAD, num

from .literals import MAX_BYTES, id_lit, ident, lit
from .packet import PacketPrinter


class Source:
    """Indented Python source being generated."""

    def __init__(self, depth: int = 0):
        self.lines: list[str] = []
        self.depth = depth

    def add(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Compiled:
    """What the printer hands the runtime: generated functions and the specs they use."""

    def __init__(self, program: Program):
        self.source = ""
        self.ingress = None
        self.egress = None
        self.tables = program.tables        # name -> TableSpec
        self.registers = program.registers  # name -> RegisterSpec
        self.counters = program.counters    # name -> CounterSpec
        self.actions = program.actions      # id -> ActionSpec
        self.errors = program.errors        # name -> code
        self.namespace = {}                 # globals of the generated functions


class PyPrinter(PacketPrinter):
    """Prints the two packet functions of one lowered program."""

    def __init__(self, program: Program):
        self.prog = program
        self.ir = program.ir
        self.drop_port = program.drop_port
        self.out = Compiled(program)
        self.ns: dict = {"ParserError": runtime.ParserError, "_Exit": runtime.Exit,
                         "_Return": runtime.Return, "csum16": runtime.csum16,
                         "_hash": runtime.hash_value,
                         "_lookahead": runtime.lookahead,
                         "_stack_index": runtime.stack_index, "_log_assert": runtime.log_assert,
                         "_NOTCACHED": runtime.NOT_CACHED, "_randint": random.Random().randint,
                         "_SPI": [], "_SPE": [], "_SPR": []}
        self.std = program.std
        self.structs: dict[str, tuple] = {}
        self.src = Source()
        self.temps = 0
        self.where = ""
        # Python names: one local per field, one per header validity bit.
        self.vars: dict[int, str] = {}
        self.valid_vars: dict[int, str] = {}
        used_prefixes, used_vars = set(), set()
        for header in program.headers.values():
            prefix = ident(header.name)
            while prefix in used_prefixes:
                prefix += "_"
            used_prefixes.add(prefix)
            self.valid_vars[header.id] = f"V_{prefix}"
            for field in header.fields:
                var = f"F_{prefix}__{ident(field.name)}"
                while var in used_vars:
                    var += "_"
                used_vars.add(var)
                self.vars[field.id] = var
        for spec in program.registers.values():
            self.ns[f"R{id_lit(spec.id)}"] = spec.cells
        for spec in program.counters.values():
            self.ns[f"CP{id_lit(spec.id)}"] = spec.packets
            self.ns[f"CB{id_lit(spec.id)}"] = spec.bytes
        # Every field, validity bit and bookkeeping value that crosses ingress -> egress.
        self.state_vars: list[str] = []
        for header in program.headers.values():
            self.state_vars += [self.v(f) for f in header.fields]
            if not header.metadata:
                self.state_vars.append(self.vv(header))
        self.state_vars += ["pkt", "off", "plen_reg", "in_len"]

    def v(self, field: Field) -> str:
        return self.vars[field.id]

    def vv(self, header: Header) -> str:
        return self.valid_vars[header.id]

    def bits(self, field: Field) -> str:
        """A field's bits as a non-negative integer (unsigned fields always are)."""
        return f"({self.v(field)} & {lit(mask(field.width))})" if field.signed else self.v(field)

    def valid_code(self, header: Header) -> str:
        return "True" if header.metadata else self.vv(header)

    def add(self, line: str) -> None:
        self.src.add(line)

    def temp(self, stem: str) -> str:
        self.temps += 1
        return f"_{stem}{self.temps}"

    def nested(self, head: str, nodes: list) -> None:
        self.add(head)
        self.src.depth += 1
        self.add("pass")
        self.block(nodes)
        self.src.depth -= 1

    # ------------------------------------------------------------------ expressions
    def expr(self, e: ir.Expr) -> str:
        return getattr(self, "x_" + type(e).__name__)(e)

    def store(self, e: ir.Expr, code: str, width: int, signed: bool) -> str:
        """``code`` (the value of ``e``) truncated to a ``width``-bit field, as BMv2 stores."""
        if e.boolean:
            code = f"(1 if {code} else 0)"
        if e.fits(width, signed):
            return code
        if signed:
            half = 1 << (width - 1)
            return f"((({code}) + {lit(half)}) & {lit(mask(width))}) - {lit(half)}"
        return f"({code}) & {lit(mask(width))}"

    def x_Const(self, e: ir.Const) -> str:
        if e.boolean:
            return "True" if e.value else "False"
        return lit(e.value)

    def x_FieldRef(self, e: ir.FieldRef) -> str:
        return self.v(e.field)

    def x_Valid(self, e: ir.Valid) -> str:
        return self.vv(e.header)

    def x_Param(self, e: ir.Param) -> str:
        return f"ad{id_lit(e.index)}"

    def x_Lookahead(self, e: ir.Lookahead) -> str:
        return (f"_lookahead(pkt, off, {num(e.bit_offset, 0, MAX_LOOKAHEAD)}, "
                f"{num(e.width, 1, MAX_BITS + 1)})")

    def index(self, fields: list, index: ir.Expr) -> str:
        code = self.expr(index)
        if not index.known or index.lo < 0 or index.hi >= len(fields):
            code = f"_stack_index({code}, {num(len(fields), 1, MAX_ID)})"
        return code

    def x_StackField(self, e: ir.StackField) -> str:
        return f"({', '.join(self.v(f) for f in e.fields)},)[{self.index(e.fields, e.index)}]"

    def x_Unary(self, e: ir.Unary) -> str:
        a = self.expr(e.a)
        return {"not": f"(not {a})", "~": f"(~{a})", "d2b": f"({a} != 0)",
                "b2d": f"(1 if {a} else 0)"}[e.op]

    def x_Cond(self, e: ir.Cond) -> str:
        return f"({self.expr(e.a)} if {self.expr(e.cond)} else {self.expr(e.b)})"

    def x_Cast(self, e: ir.Cast) -> str:
        a, width = self.expr(e.a), e.width
        if e.op == "two_comp_mod":
            half = 1 << (width - 1)
            if e.a.fits(width, False) and isinstance(e.a, (ir.FieldRef, ir.Param)):
                return f"({a} - {lit(1 << width)} if {a} >= {lit(half)} else {a})"
            return f"((({a}) + {lit(half)}) & {lit(mask(width))}) - {lit(half)}"
        tmp = self.temp("t")
        lo, hi = lit(e.lo), lit(e.hi)
        return f"({lo} if ({tmp} := {a}) < {lo} else {hi} if {tmp} > {hi} else {tmp})"

    def x_Binary(self, e: ir.Binary) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.op == "<<" and not (isinstance(e.b, ir.Const) and e.b.value < 4096):
            # A shift by a runtime amount is bounded so a huge count cannot exhaust memory.
            return f"({a} << {b} if {b} < 4096 else 0)"
        return f"({a} {'//' if e.op == '/' else e.op} {b})"

    # ------------------------------------------------------------------ statements
    def block(self, nodes: list) -> None:
        for node in nodes:
            getattr(self, "s_" + type(node).__name__)(node)

    def s_Assign(self, s: ir.Assign) -> None:
        f = s.field
        self.add(f"{self.v(f)} = {self.store(s.value, self.expr(s.value), f.width, f.signed)}")

    def s_Repeat(self, s: ir.Repeat) -> None:
        for iteration in s.iterations:       # fields are names here, not an array
            self.block(iteration)

    def s_AssignStackField(self, s: ir.AssignStackField) -> None:
        i, f = self.temp("i"), s.fields[0]
        self.add(f"{i} = {self.index(s.fields, s.index)}")
        value = self.store(s.value, self.expr(s.value), f.width, f.signed)
        for n, field in enumerate(s.fields):
            self.add(f"{'if' if n == 0 else 'elif'} {i} == {n}: {self.v(field)} = {value}")

    def s_CopyHeader(self, s: ir.CopyHeader) -> None:
        dst, src = s.dst, s.src
        self.add(f"if {self.valid_code(src)}:")
        for d, f in zip(dst.fields, src.fields):
            self.add(f"    {self.v(d)} = {self.v(f)}")
        if not dst.metadata:
            self.add(f"    {self.vv(dst)} = True")
            self.add("else:")
            self.add(f"    {self.vv(dst)} = False")

    def s_AddHeader(self, s: ir.AddHeader) -> None:
        h = s.header
        self.add(f"if not {self.vv(h)}:")
        if s.zero:
            for f in h.fields:
                self.add(f"    {self.v(f)} = 0")
            self.add(f"    plen_reg += {self.size(h)}")
        self.add(f"    {self.vv(h)} = True")

    def s_RemoveHeader(self, s: ir.RemoveHeader) -> None:
        self.add(f"if {self.vv(s.header)}:")
        self.add(f"    {self.vv(s.header)} = False")
        self.add(f"    plen_reg -= {self.size(s.header)}")

    def size(self, header: Header) -> str:
        """The header's bytes now (its varbit field as long as it was extracted)."""
        fixed = num(header.nbytes, 0, MAX_BYTES)
        return fixed if header.length is None else f"({fixed} + ({self.v(header.length)} >> 3))"

    def s_SetValid(self, s: ir.SetValid) -> None:
        self.add(f"{self.vv(s.header)} = {s.valid}")

    def s_SwapHeaders(self, s: ir.SwapHeaders) -> None:
        pairs = [(self.vv(s.a), self.vv(s.b))]
        pairs += [(self.v(x), self.v(y)) for x, y in zip(s.a.fields, s.b.fields)]
        for x, y in pairs:
            self.add(f"{x}, {y} = {y}, {x}")

    def guarded(self, index: ir.Expr, size: int, *stmts) -> None:
        """``stmts`` on element ``idx`` (a function of the index's name) only if it is in
        range: BMv2 skips an out-of-range access (a negative one too, which Python
        would take from the end)."""
        code = self.expr(index)
        if not re.fullmatch(r"[A-Za-z_]\w*|\d+", code):
            var = self.temp("ix")
            self.add(f"{var} = {code}")
            code = var
        if index.known and index.lo >= 0 and index.hi < size:
            for stmt in stmts:
                self.add(stmt(code))
            return
        size_code = num(size, 1, MAX_ID)
        nonnegative = index.known and index.lo >= 0
        self.add(f"if {code} < {size_code}:" if nonnegative else f"if 0 <= {code} < {size_code}:")
        for stmt in stmts:
            self.add("    " + stmt(code))

    def s_RegisterRead(self, s: ir.RegisterRead) -> None:
        reg, f = s.register, s.field
        cell = ir.Const(0).bounded(0, mask(reg.width))
        self.guarded(s.index, reg.size, lambda ix: f"{self.v(f)} = " + self.store(
            cell, f"R{id_lit(reg.id)}[{ix}]", f.width, f.signed))

    def s_RegisterWrite(self, s: ir.RegisterWrite) -> None:
        reg = s.register
        value = self.temp("vx")
        self.add(f"{value} = {self.store(s.value, self.expr(s.value), reg.width, False)}")
        self.guarded(s.index, reg.size, lambda ix: f"R{id_lit(reg.id)}[{ix}] = {value}")

    def s_Count(self, s: ir.Count) -> None:
        n = id_lit(s.counter.id)
        self.guarded(s.index, s.counter.size, lambda ix: f"CP{n}[{ix}] += 1",
                     lambda ix: f"CB{n}[{ix}] += in_len")

    def s_Random(self, s: ir.Random) -> None:
        f = s.field
        lo, hi = self.temp("lo"), self.temp("hi")
        self.add(f"{lo} = {self.expr(s.lo)}")
        self.add(f"{hi} = {self.expr(s.hi)}")
        self.add(f"if {lo} <= {hi}:")
        self.add(f"    {self.v(f)} = "
                 + self.store(ir.Const(0).bounded(None, None), f"_randint({lo}, {hi})",
                              f.width, f.signed))

    def s_Exit(self, s) -> None:
        self.add("raise _Exit")

    def s_Return(self, s) -> None:
        self.add("raise _Return")

    def s_Assert(self, s: ir.Assert) -> None:
        self.add(f"if not {self.expr(s.cond)}:")
        self.add(f"    _log_assert({self.where!r})")

    def s_If(self, s: ir.If) -> None:
        self.nested(f"if {self.expr(s.cond)}:", s.then)
        self.nested("else:", s.orelse)

    def s_Apply(self, node: ir.Apply) -> None:
        spec = node.table
        tid = id_lit(spec.id)
        keys = [self.expr(k) for k in node.keys]
        if not keys:
            self.add("_hit = False")
            self.add(f"_a, _d = D{tid}[0]")
        else:
            key = keys[0] if len(keys) == 1 else "(" + ", ".join(keys) + ",)"
            if spec.match_type == "exact":
                self.add(f"_e = E{tid}.get({key})")
            else:
                self.add(f"_k = {key}")
                self.add(f"_e = C{tid}.get(_k, _NOTCACHED)")
                self.add("if _e is _NOTCACHED:")
                self.add(f"    _e = L{tid}(_k)")
            self.add("if _e is None:")
            self.add("    _hit = False")
            self.add(f"    _a, _d = D{tid}[0]")
            self.add("else:")
            self.add("    _hit = True")
            if spec.direct_counter:
                # Entries of a table with a direct counter carry it: [packets, bytes].
                self.add("    _a, _d, _c = _e")
                self.add("    _c[0] += 1")
                self.add("    _c[1] += in_len")
            else:
                self.add("    _a, _d = _e")
        for i, action in enumerate(node.actions):
            self.add("if True:" if len(node.actions) == 1
                     else f"{'elif' if i else 'if'} _a == {id_lit(action.id)}:")
            self.src.depth += 1
            self.action(action)
            self.src.depth -= 1
        for i, (cond, body) in enumerate(node.branches):
            test = ("_hit" if cond == "hit" else "not _hit" if cond == "miss"
                    else f"_a in ({''.join(id_lit(aid) + ', ' for aid in cond)})")
            self.nested(f"{'elif' if i else 'if'} {test}:", body)

    def action(self, action: ir.Action) -> None:
        nparams = len(action.params)
        if nparams:
            self.add(", ".join(f"ad{i}" for i in range(nparams)) + ", = _d")
        self.where = f"action {action.name}"
        if any(isinstance(s, ir.Return) for s in walk(action.body)):
            self.nested("try:", action.body)
            self.add("except _Return:")
            self.add("    pass")
        else:
            self.add("pass")
            self.block(action.body)

    # ------------------------------------------------------------------ special operations
    # clone, resubmit and recirculate set locals (``_clone``/``_clone_fl``, ``_resub``,
    # ``_recirc``) that the end of ingress or egress hands the pipeline in ``_SPI``,
    # ``_SPE`` and ``_SPR`` (what the pipeline runs again, with the kept fields), read
    # and cleared under the pipeline's lock after each call.
    def s_Clone(self, s: ir.Clone) -> None:
        self.add(f"_clone = ({self.expr(s.session)}) & 32767")
        self.add(f"_clone_fl = {num(s.field_list, 0, MAX_FIELD_LIST)}")

    def s_Resubmit(self, s: ir.Resubmit) -> None:
        self.add(f"_resub = {num(s.field_list, 0, MAX_FIELD_LIST)}")

    def s_Recirculate(self, s: ir.Recirculate) -> None:
        self.add(f"_recirc = {num(s.field_list, 0, MAX_FIELD_LIST)}")

    def kept(self, var: str) -> str:
        """(field list id, the values of its fields now) for the id in ``var``."""
        parts = "".join(
            f"({', '.join(self.v(f) for f in fields)},) if {var} == {num(fl, 0, MAX_FIELD_LIST)} else "
            for fl, fields in sorted(self.prog.field_lists.items()) if fields)
        return f"({var}, {parts}())"

    def apply_kept(self, var: str) -> list[str]:
        """Lines storing a ``kept`` tuple's values into its fields."""
        lines = [f"if {var} is not None:", f"    _kfl, _kv = {var}"]
        branches = [(fl, fields) for fl, fields in sorted(self.prog.field_lists.items()) if fields]
        for i, (fl, fields) in enumerate(branches):
            lines.append(f"    {'elif' if i else 'if'} _kfl == {num(fl, 0, MAX_FIELD_LIST)}: "
                         f"{', '.join(self.v(f) for f in fields)}, = _kv")
        return lines

    def special_entry(self, instance_type) -> None:
        """A re-entry (resubmit, recirculate) starts with simple_switch's reset metadata,
        the kept fields, then its instance type (ingress_port is 0 unless kept)."""
        self.add("_clone, _clone_fl, _resub = None, 0, 0")
        for line in self.apply_kept("kept"):
            self.add(line)
        if instance_type is not None:
            self.add(f"{self.v(instance_type)} = instance_type")

    def special_exits(self, ingress: Source, egress: Source, state: list) -> None:
        """The I2E clone's return after the parser (metadata reset, then the kept fields,
        as simple_switch does to its copy) and the E2E clone's copy of the state after
        the egress control (metadata reset but for its field list)."""
        meta = {self.v(f) for f in self.prog.metadata_fields}
        state_code = ", ".join(state)
        i = ingress.lines.index("    " + _CLONE_MARK)
        block = ["if clone:"] + [f"    {v} = 0" for v in state if v in meta]
        block += ["    " + line for line in self.apply_kept("kept")]
        block += [f"    return 0, 0, ({state_code},)"]
        ingress.lines[i:i + 1] = ["    " + line for line in block]
        i = egress.lines.index("    " + _E2E_MARK)
        block = ["if _clone is not None:"]
        lists = [(fl, {self.v(f) for f in fields})
                 for fl, fields in sorted(self.prog.field_lists.items())]
        for n, (fl, keep) in enumerate(lists + [(None, set())]):
            values = ", ".join(v if v not in meta or v in keep else "0" for v in state)
            head = "else:" if fl is None else \
                f"{'elif' if n else 'if'} _clone_fl == {num(fl, 0, MAX_FIELD_LIST)}:"
            block += [f"    {head}", f"        _SPE.append((_clone, ({values},)))"]
        egress.lines[i:i + 1] = ["    " + line for line in block]

    # ------------------------------------------------------------------ controls
    def control(self, nodes: list) -> None:
        if not nodes:
            self.add("pass")
            return
        self.nested("try:", nodes)
        self.add("except _Exit:")
        self.add("    pass")

    def generate(self) -> Compiled:
        std = {n: self.std(n) for n in ("ingress_port", "packet_length", "instance_type",
                                         "parser_error", "egress_spec", "egress_port",
                                         "mcast_grp", "egress_rid")}

        special = self.ir.special
        ingress = self.src = Source(1)
        self.add("plen = in_len = plen_reg = len(pkt)")
        self.add("off = 0")
        self.add(f"perr = {id_lit(self.prog.no_error)}")
        self.add(f"{self.v(std['ingress_port'])} = ingress_port")
        if special:
            self.special_entry(std["instance_type"])
        if std["packet_length"] is not None:
            self.add(f"{self.v(std['packet_length'])} = plen")
        self.parser()
        if std["parser_error"] is not None:
            self.add(f"{self.v(std['parser_error'])} = perr")
        if special:
            self.add(_CLONE_MARK)
        self.checksums(self.ir.verify, True)
        self.control(self.ir.ingress)
        if special:
            self.add("if _clone is not None or _resub:")
            self.add(f"    _SPI.append((_clone, {self.kept('_clone_fl')}, "
                     f"{self.kept('_resub')} if _resub else None))")
        grp = self.v(std["mcast_grp"]) if std["mcast_grp"] is not None else "0"

        egress = self.src = Source(1)
        self.add(f"{self.v(std['egress_port'])} = egress_port")
        self.add(f"{self.v(std['egress_spec'])} = {num(self.drop_port + 1, 1, MAX_ID + 1)}")
        if std["instance_type"] is not None:
            self.add(f"{self.v(std['instance_type'])} = instance_type")
        if std["egress_rid"] is not None:
            self.add("if rid is not None:")
            self.add(f"    {self.v(std['egress_rid'])} = rid")
        if std["packet_length"] is not None:
            self.add(f"{self.v(std['packet_length'])} = plen_reg")
        if special:
            self.add("_clone, _clone_fl, _recirc = None, 0, 0")
        self.control(self.ir.egress)
        if special:
            self.add(_E2E_MARK)
        self.add(f"if {self.v(std['egress_spec'])} == {id_lit(self.drop_port)}:")
        self.add("    return None")
        self.checksums(self.ir.update, False)
        self.add("_out = []")
        for header in self.ir.deparse:
            if header.length is not None:
                self.deparse_varbit(header)
                continue
            sname, _, _, pack_args = self.header_struct(header)
            line = f"_out.append({sname}.pack({', '.join(pack_args)}))"
            if header.metadata:
                self.add(line)
            else:
                self.add(f"if {self.vv(header)}:")
                self.add(f"    {line}")
        self.add("_out.append(pkt[off:])")
        if special:
            self.add("if _recirc:")
            self.add(f"    _SPR.append({self.kept('_recirc')})")
        self.add("return b''.join(_out)")

        # Only what egress uses crosses over, and ingress zeroes only what is read
        # before it is written (p4c's many write-only temporaries cost nothing).
        egress_names = set(re.findall(r"\b\w+\b", "\n".join(egress.lines)))
        state = [v for v in self.state_vars if v in egress_names]
        live = _read_names(ingress.lines) | _read_names(egress.lines) | set(state)
        live |= {self.v(std["egress_spec"]), grp}
        _drop_dead_stores(ingress.lines, live)
        _drop_dead_stores(egress.lines, live)
        needed = _read_names(ingress.lines) | set(state) | {self.v(std["egress_spec"]), grp}
        init = [(self.v(f), 0) for f in self.prog.field_list]
        init += [(self.vv(h), False) for h in self.prog.headers.values() if not h.metadata]
        init = [(var, value) for var, value in init if var in needed]
        self.ns["_INIT"] = tuple(value for _, value in init)
        if special:
            self.special_exits(ingress, egress, state)

        src = Source()
        src.add("def ingress(pkt, ingress_port, instance_type=0, kept=None, clone=False):")
        src.add('    """Parse and run ingress: (egress_spec, mcast_grp, state); a re-entry\'s '
                'kept fields, or (clone) only parse, as an I2E clone."""')
        if init:
            src.add("    " + ", ".join(var for var, _ in init) + ", = _INIT")
        src.lines += ingress.lines
        src.add(f"    return {self.v(std['egress_spec'])}, {grp}, ({', '.join(state)},)")
        src.add("")
        src.add("def egress(state, egress_port, rid, instance_type):")
        src.add('    """Run egress and deparse: the frame to send, or None if dropped."""')
        if state:
            src.add(f"    {', '.join(state)}, = state")
        src.lines += egress.lines
        self.out.source = src.text()
        return self.out



_CLONE_MARK = "#<I2E clone returns here>"
_E2E_MARK = "#<E2E clone copies here>"
_TARGETS = re.compile(r"\s*+(?:\w+,\s*)*\w+,?\s=(?!=)")   # "a, b = ": no backtracking
_NAME = re.compile(r"\b\w+\b")


def _read_names(lines: list[str]) -> set[str]:
    """Names a block of generated code reads (an assignment's targets do not count)."""
    names = set()
    for line in lines:
        targets = _TARGETS.match(line)
        names.update(_NAME.findall(line, targets.end() if targets else 0))
    return names


def _drop_dead_stores(lines: list[str], live: set[str]) -> None:
    """Turn stores to fields nothing ever reads (p4c's temporaries) into ``pass``."""
    for i, line in enumerate(lines):
        m = re.match(r"(\s*)(F_\w+) = (.*)$", line)
        if m and m.group(2) not in live and not re.search(r"\w\(", m.group(3)):
            lines[i] = f"{m.group(1)}pass"


def compile_program(program: Program) -> Compiled:
    """The Python functions for a checked, lowered program."""
    printer = PyPrinter(program)
    try:
        out = printer.generate()
    except RecursionError:
        raise Unsupported("the program's controls are nested too deeply") from None
    out.namespace = printer.ns
    try:
        code = compile(out.source, "<softswitch pipeline>", "exec")
    except (SyntaxError, RecursionError, MemoryError) as exc:   # Python's own nesting limits
        raise Unsupported(f"the program is nested too deeply for Python ({exc})") from None
    exec(code, printer.ns)
    out.ingress = printer.ns["ingress"]
    out.egress = printer.ns["egress"]
    return out
