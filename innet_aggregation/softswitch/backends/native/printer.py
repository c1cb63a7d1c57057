"""C printer: a lowered program (``frontend.ir``) as one C translation unit.

The unit defines the program's sizes, includes ``runtime.c`` (tables, PRE, I/O: it
includes control.c and io.c) and adds ``ss_setup``, ``ss_ingress`` and
``ss_egress``, one printer rule per IR node. Every field is a ``uint64_t`` slot of
the packet state (signed fields sign-extended), so fields, keys, parameters and
registers wider than 64 bits are refused. An expression prints as C code equal to
its value modulo 2^64: ring operations (+ - * ~ & | ^ <<) are exact whatever the
value; an operation that needs the value itself (comparison, >>, /, %, saturation,
an index) is printed only where the IR's bounds prove it fits uint64_t or int64_t,
otherwise the program is refused (``NativeUnsupported``) and runs on the Python
backend. Nothing from the JSON reaches the C text except numbers, each through
``validate.num`` or ``validate.u64`` (an int in range, or refused): literals.py. The
parser, the checksums and the deparser are packet.py's; the controls, tables,
actions and registers, and the unit, here.
"""

from __future__ import annotations

import re

from innet_aggregation.softswitch.frontend import ir, prepared, shards, widths
from innet_aggregation.softswitch.frontend.lower import named, walk
from innet_aggregation.softswitch.frontend.program import Field, Header, Program, mask
from innet_aggregation.softswitch.frontend.validate import MAX_CELLS, MAX_FIELD_LIST, MAX_ID, \
    MAX_LOOKAHEAD, num

from .literals import (I64_MAX, I64_MIN, MAX_BYTES, U64, NativeUnsupported, exact_kind, kind_of,
                       lit, slit, wlit)
from .narrow import NarrowPrinter
from .packet import PacketPrinter

PARAM = re.compile(r"\bad\[")    # x_Param's code: an action's parameter in the table's data


class CPrinter(PacketPrinter, NarrowPrinter):
    """Prints the C unit of one lowered program."""

    def __init__(self, program: Program):
        self.prog = program
        self.ir = program.ir
        self.lines: list[str] = []
        self.depth = 0
        self.labels = 0
        self.touched: set[int] | None = None     # while printing egress: the fields it names
        # While printing a Repeat as a loop over _i: a field's id step, and a
        # register's lane step (in its group) or index step (alone), per iteration.
        self.field_step: dict = {}
        self.reg_step: dict = {}
        # While printing a Repeat's loop: the fields every iteration names alike, held in
        # locals; and the loops, each a function of its own (repeat_function).
        self.scalars: dict | None = None
        self.functions: list[str] = []
        self.table_index = {name: i for i, name in enumerate(program.tables)}
        self.reg_index = {name: i for i, name in enumerate(program.registers)}
        # name -> (the group's first register, lane, registers in the group): a
        # group's cell i of lane k is word i * stride + k of one block.
        self.reg_lane = {spec.name: (group[0].name, lane, len(group))
                         for group in self.ir.register_groups
                         for lane, spec in enumerate(group)}
        self.ctr_index = {name: i for i, name in enumerate(program.counters)}
        self.shards = shards.plan(program)      # lanes in parallel where it is a proof
        self.prepared = prepared.plan(program)  # a multicast's shared headers deparsed once
        self.shared_fields: set[int] = set()    # fields only their deparse names
        for field in program.field_list:
            if field.width > 64:
                raise NativeUnsupported(f"field {field.header}.{field.name} is {field.width} "
                                        "bits (the native backend holds fields up to 64)")
        for spec in program.registers.values():
            if spec.width > 64:
                raise NativeUnsupported(f"register {spec.name} is {spec.width} bits wide")
        for action in program.actions.values():
            for pname, width in action.params:
                if width > 64:
                    raise NativeUnsupported(f"parameter {pname} of action {action.name} is "
                                            f"{width} bits")

    # ------------------------------------------------------------------ output
    def add(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def label(self, stem: str) -> str:
        self.labels += 1
        return f"L_{stem}{self.labels}"

    def nested(self, head: str, body, *args, tail: str = "}") -> None:
        self.add(head)
        self.depth += 1
        body(*args)
        self.depth -= 1
        if tail:
            self.add(tail)

    @property
    def fields(self) -> str:
        """The fields' array: in a loop's function, the restrict pointer ``_F`` (no
        register cell is a field)."""
        return "S->f" if self.scalars is None else "_F"

    def fref(self, field) -> str:
        if self.touched is not None:
            self.touched.add(field.id)
        if self.scalars and field in self.scalars:
            return self.scalars[field]
        fid = num(field.id, 0, len(self.prog.field_list))
        step = self.field_step.get(field)
        return f"{self.fields}[{fid} + _i * {num(step, 1, len(self.prog.field_list))}U]" \
            if step else f"{self.fields}[{fid}]"

    def hid(self, header: Header) -> str:
        return num(header.id, 0, len(self.prog.headers))

    def valid_code(self, header: Header) -> str:
        return "1" if header.metadata else f"S->v[{self.hid(header)}]"

    # ------------------------------------------------------------------ expressions
    def store(self, e: ir.Expr, code: str, width: int, signed: bool) -> str:
        """``code`` (the value of ``e``) truncated to a ``width``-bit field, as BMv2 stores."""
        if e.fits(width, signed):
            return code
        if signed:
            return f"ss_sext({code}, {wlit(width)})"
        return f"(({code}) & {lit(mask(width))})"

    def expr(self, e: ir.Expr) -> str:
        return getattr(self, "x_" + type(e).__name__)(e)

    def x_Const(self, e: ir.Const) -> str:
        return lit(e.value)

    def x_FieldRef(self, e: ir.FieldRef) -> str:
        return self.fref(e.field)

    def x_Valid(self, e: ir.Valid) -> str:
        return f"(uint64_t){self.valid_code(e.header)}"

    def x_Param(self, e: ir.Param) -> str:
        return f"ad[{num(e.index, 0, MAX_ID)}]"

    def x_Lookahead(self, e: ir.Lookahead) -> str:
        if e.width > 64 or e.bit_offset < 0:
            raise NativeUnsupported(f"lookahead of {e.width} bits")
        return f"ss_get(S->pkt + S->off, {num(e.bit_offset, 0, MAX_LOOKAHEAD)}, {wlit(e.width)})"

    def stack_slot(self, fields: list, index: ir.Expr) -> str:
        """The field of element ``index`` (ss_index drops the packet past the stack)."""
        exact_kind(index, "a header stack index")      # negative: past the stack as a uint64_t
        if self.touched is not None:
            self.touched.update(f.id for f in fields)
        ids = ", ".join(num(f.id, 0, len(self.prog.field_list)) for f in fields)
        code, n = self.expr(index), num(len(fields), 1, MAX_ID)
        if index.lo < 0 or index.hi >= len(fields):
            code = f"ss_index(S, {code}, {n})"
        return f"{self.fields}[((const uint32_t[{n}]){{{ids}}})[{code}]]"

    def x_StackField(self, e: ir.StackField) -> str:
        return self.stack_slot(e.fields, e.index)

    def x_Unary(self, e: ir.Unary) -> str:
        a = self.expr(e.a)
        if e.op == "not":
            return f"(uint64_t)!({a})"
        if e.op == "~":
            return f"(~({a}))"
        if e.op == "b2d" or (e.a.known and 0 <= e.a.lo and e.a.hi <= 1):
            return a
        if not e.a.known or e.a.lo <= -(1 << 64) or e.a.hi >= 1 << 64:
            # Only then is "zero modulo 2^64" the same as zero.
            raise NativeUnsupported("d2b of a value that may not fit in 64 bits")
        return f"(uint64_t)(({a}) != 0)"

    def x_Cond(self, e: ir.Cond) -> str:
        return f"(({self.expr(e.cond)}) ? ({self.expr(e.a)}) : ({self.expr(e.b)}))"

    def x_Cast(self, e: ir.Cast) -> str:
        if e.width > 64:
            raise NativeUnsupported(f"{e.op} to {e.width} bits")
        a = self.expr(e.a)
        if e.op == "two_comp_mod":
            return f"ss_sext({a}, {wlit(e.width)})"
        kind = exact_kind(e.a, f"the operand of {e.op}")
        x = f"(int64_t)({a})" if kind == "s" else f"({a})"
        parts = []
        if kind == "s" and (not e.a.known or e.a.lo < e.lo):
            parts.append(f"{x} < {slit(e.lo)} ? (uint64_t){slit(e.lo)}")
        if e.hi <= I64_MAX or kind == "u":
            hi_c = slit(e.hi) if kind == "s" else lit(e.hi)
            parts.append(f"{x} > {hi_c} ? (uint64_t){hi_c}")
        return "(" + " : ".join(parts + [f"(uint64_t){x}"]) + ")"

    def x_Binary(self, e: ir.Binary) -> str:
        op, a, b = e.op, e.a, e.b
        ac, bc = self.expr(a), self.expr(b)
        if op in ir.COMPARISONS:
            ka, kb = kind_of(a), kind_of(b)
            if op in ("==", "!=") and a.known and b.known and max(a.hi, b.hi) - min(a.lo, b.lo) <= U64:
                return f"(uint64_t)(({ac}) {op} ({bc}))"
            if ka == "u" and kb == "u":
                return f"(uint64_t)(({ac}) {op} ({bc}))"
            if ka and kb and a.lo >= I64_MIN and a.hi <= I64_MAX and b.lo >= I64_MIN and b.hi <= I64_MAX:
                return f"(uint64_t)((int64_t)({ac}) {op} (int64_t)({bc}))"
            raise NativeUnsupported(f"comparison {op} of values that may not fit in 64 bits")
        if op in ("and", "or"):
            return f"(uint64_t)(({ac}) {'&&' if op == 'and' else '||'} ({bc}))"
        if op in ("+", "-", "*", "&", "|", "^"):
            return f"(({ac}) {op} ({bc}))"
        if op in ("<<", ">>"):
            if exact_kind(b, "a shift amount") != "u":
                raise NativeUnsupported("shift by a possibly negative amount")
            if op == "<<":
                if isinstance(b, ir.Const) and b.value < 64:
                    return f"(({ac}) << {b.value}U)"
                return f"(({bc}) >= 64 ? 0ULL : ({ac}) << ({bc}))"
            if exact_kind(a, "the left operand of >>") == "u":
                return f"(({bc}) >= 64 ? 0ULL : ({ac}) >> ({bc}))"
            return f"(uint64_t)((int64_t)({ac}) >> (({bc}) >= 63 ? 63 : ({bc})))"
        # / and %
        if exact_kind(a, op) != "u" or exact_kind(b, op) != "u":
            raise NativeUnsupported(f"{op} of a possibly negative value")
        return f"ss_div(S, {ac}, {bc}, {int(op == '%')})"

    # ------------------------------------------------------------------ statements
    def block(self, nodes: list) -> None:
        for node in nodes:
            getattr(self, "s_" + type(node).__name__)(node)

    def s_Assign(self, s: ir.Assign) -> None:
        f = s.field
        if s.bits == widths.NARROW:
            self.add(f"{self.fref(f)} = {self.store32(self.narrow(s.value), f.width, f.signed)};")
            return
        self.add(f"{self.fref(f)} = {self.store(s.value, self.expr(s.value), f.width, f.signed)};")

    def s_AssignStackField(self, s: ir.AssignStackField) -> None:
        f = s.fields[0]
        self.add(f"{self.stack_slot(s.fields, s.index)} = "
                 f"{self.store(s.value, self.expr(s.value), f.width, f.signed)};")

    def s_CopyHeader(self, s: ir.CopyHeader) -> None:
        dst, src = s.dst, s.src
        self.add(f"if ({self.valid_code(src)}) {{")
        for d, f in zip(dst.fields, src.fields):
            self.add(f"    {self.fref(d)} = "
                     f"{self.store(ir.FieldRef(f), self.fref(f), d.width, d.signed)};")
        if not dst.metadata:
            self.add(f"    S->v[{self.hid(dst)}] = 1;")
        self.add("}")
        if not dst.metadata:
            self.add(f"else S->v[{self.hid(dst)}] = 0;")

    def s_AddHeader(self, s: ir.AddHeader) -> None:
        h = s.header
        self.add(f"if (!S->v[{self.hid(h)}]) {{")
        if s.zero:
            for f in h.fields:
                self.add(f"    {self.fref(f)} = 0;")
            self.add(f"    S->plen_reg += {self.size(h)};")
        self.add(f"    S->v[{self.hid(h)}] = 1;")
        self.add("}")

    def s_RemoveHeader(self, s: ir.RemoveHeader) -> None:
        h = self.hid(s.header)
        self.add(f"if (S->v[{h}]) {{ S->v[{h}] = 0; S->plen_reg -= {self.size(s.header)}; }}")

    def size(self, header: Header) -> str:
        """The header's bytes now (its varbit field as long as it was extracted)."""
        fixed = num(header.nbytes, 0, MAX_BYTES)
        return fixed if header.length is None else f"({fixed} + ({self.fref(header.length)} >> 3))"

    def s_SetValid(self, s: ir.SetValid) -> None:
        self.add(f"S->v[{self.hid(s.header)}] = {int(s.valid)};")

    def s_SwapHeaders(self, s: ir.SwapHeaders) -> None:
        pairs = [(f"S->v[{self.hid(s.a)}]", f"S->v[{self.hid(s.b)}]")]
        pairs += [(self.fref(x), self.fref(y)) for x, y in zip(s.a.fields, s.b.fields)]
        self.add("{ uint64_t _t; " + " ".join(f"_t = {x}; {x} = {y}; {y} = _t;"
                                              for x, y in pairs) + " }")

    def in_range(self, index: ir.Expr, size: int) -> str:
        """The C test that ``_ix`` (the value of ``index``) is a cell of ``size``."""
        kind = exact_kind(index, "an index")
        if index.lo >= 0 and index.hi < size:
            return "1"
        if kind == "u":
            return f"_ix < {num(size, 1, MAX_CELLS + 1)}ULL"
        return f"(int64_t)_ix >= 0 && (int64_t)_ix < {num(size, 1, MAX_CELLS + 1)}LL"

    def guarded(self, index: ir.Expr, size: int, stmt: str, prelude: str = "") -> None:
        """``stmt`` on element ``_ix`` only if it is in range (BMv2 skips an
        out-of-range register or counter access); ``prelude`` runs either way."""
        test = self.in_range(index, size)
        self.add(f"{{ uint64_t _ix = {self.expr(index)}; {prelude}if ({test}) {stmt} }}")

    def selected(self, index: ir.Expr, size: int, lvalue: str, value: str,
                 prelude: str = "") -> None:
        """In a loop's function, ``lvalue = value`` with no branch: out of range, the
        spare cell past the register's last (ss_reg_init) stands in and ``lvalue``
        keeps what it held (as ``guarded`` skips it), so the loop has no control flow
        and the C compiler vectorizes it. The spare is no share's (lanes may write it
        at once; what it holds is never used), so a frame never touches a cell of a
        share whose lock it does not hold, as cell 0 standing in did."""
        test = self.in_range(index, size)
        self.add(f"{{ uint64_t _ix = {self.expr(index)}; {prelude}int _in = {test}; "
                 f"_ix = _in ? _ix : {num(size, 1, MAX_CELLS + 1)}ULL; "
                 f"{lvalue} = _in ? ({value}) : {lvalue}; }}")

    def cell(self, reg) -> str:
        """The C lvalue of ``reg``'s cell ``_ix`` (in a loop, of the register _i steps on)."""
        r = num(self.reg_index[reg.name], 0, len(self.reg_index))
        cells = "c->reg32" if narrow(reg) else "c->reg"
        step = self.reg_step.get(reg, 0)
        by = f"_i * {num(step, 1, len(self.reg_index))}U" if step else ""
        if reg.name not in self.reg_lane:
            return f"{cells}[{r} + {by}][_ix]" if step else f"{cells}[{r}][_ix]"
        stride = num(self.reg_lane[reg.name][2], 2, len(self.reg_index) + 1)
        return (f"{cells}[{r}][_ix * {stride}U + {by}]" if step
                else f"{cells}[{r}][_ix * {stride}U]")

    def loop_steps(self, iterations: list) -> tuple[dict, dict] | None:
        """Each name of the first iteration and how it steps from one iteration to the
        next, if every one steps by a constant: a field's id, a grouped register's lane
        (within one group), an ungrouped register's index. None: print one by one."""
        names = [named(it) for it in iterations]
        fields, regs = {}, {}
        for j, first in enumerate(names[0]):
            run = [it[j] for it in names]
            if isinstance(first, Field):
                ids = [f.id for f in run]
                steps, into = {b - a for a, b in zip(ids, ids[1:])}, fields
            else:
                if len({narrow(r) for r in run}) != 1:
                    return None
                lanes = [self.reg_lane.get(r.name) for r in run]
                if all(lane is None for lane in lanes):
                    ids = [self.reg_index[r.name] for r in run]
                elif len({lane and lane[0] for lane in lanes}) == 1 and None not in lanes:
                    ids = [lane[1] for lane in lanes]
                else:
                    return None
                steps, into = {b - a for a, b in zip(ids, ids[1:])}, regs
            if len(steps) != 1:
                return None
            (step,) = steps
            if step < 0 or into.get(first, step) != step:
                return None
            into[first] = step
        return fields, regs

    def s_Repeat(self, s: ir.Repeat) -> None:
        steps = self.loop_steps(s.iterations)
        if steps is None:
            for iteration in s.iterations:
                self.block(iteration)
            return
        if self.touched is not None:
            self.touched.update(f.id for it in s.iterations for f in named(it)
                                if isinstance(f, Field))
        self.repeat_function(s, *steps)

    def repeat_function(self, s: ir.Repeat, fields: dict, regs: dict) -> None:
        """The loop as a function of its own, called here. Alone, and with the fields
        every iteration names alike in locals, the C compiler sees that they and the
        register indices they hold stay put, so it hoists the indices' range checks
        and vectorizes the loop; inside ss_ingress's thousands of lines it does neither,
        and a store to such a field each iteration could alias a register's cell."""
        self.field_step, self.reg_step = fields, regs
        self.scalars = {f: f"_s{num(f.id, 0, len(self.prog.field_list))}"
                        for f, step in fields.items() if not step}
        caller, self.lines, depth, self.depth = self.lines, [], self.depth, 1
        self.add("uint64_t *restrict const _F = S->f;")
        if self.scalars:
            self.add("uint64_t " + ", ".join(f"{name} = _F[{f.id}]"
                                               for f, name in self.scalars.items()) + ";")
        self.nested(f"for (uint32_t _i = 0; _i < {num(len(s.iterations), 2, MAX_ID)}U; _i++) {{",
                    self.block, s.iterations[0])
        for f, name in self.scalars.items():
            self.add(f"_F[{f.id}] = {name};")
        body, self.lines, self.depth = self.lines, caller, depth
        self.field_step, self.reg_step, self.scalars = {}, {}, None
        name = f"ss_repeat{len(self.functions)}"
        ad = any(PARAM.search(line) for line in body)   # an action's parameters (x_Param)
        self.functions.append(
            f"static __attribute__((noinline)) void {name}(ss_ctx *c, ss_state *S"
            + (", const uint64_t *ad" if ad else "") + ") {\n    (void)c;\n"
            + "\n".join(body) + "\n}\n")
        self.add(f"{name}(c, S{', ad' if ad else ''});")

    def s_RegisterRead(self, s: ir.RegisterRead) -> None:
        reg, f = s.register, s.field
        cell = ir.Const(0).bounded(0, mask(reg.width))
        value = self.store(cell, f"(uint64_t){self.cell(reg)}", f.width, f.signed)
        if self.scalars is not None:
            self.selected(s.index, reg.size, self.fref(f), value)
        else:
            self.guarded(s.index, reg.size, f"{self.fref(f)} = {value};")

    def s_RegisterWrite(self, s: ir.RegisterWrite) -> None:
        reg = s.register
        value = self.store(s.value, self.expr(s.value), reg.width, False)
        if self.scalars is not None:
            self.selected(s.index, reg.size, self.cell(reg), "_vx", f"uint64_t _vx = {value}; ")
        else:
            self.guarded(s.index, reg.size, f"{self.cell(reg)} = _vx;", f"uint64_t _vx = {value}; ")

    def s_Count(self, s: ir.Count) -> None:
        n = num(self.ctr_index[s.counter.name], 0, len(self.ctr_index))
        self.guarded(s.index, s.counter.size,
                     f"{{ SS_COUNT(c->cpk[{n}][_ix], 1); SS_COUNT(c->cby[{n}][_ix], S->in_len); }}")

    def s_Random(self, s: ir.Random) -> None:
        if exact_kind(s.lo, "a random bound") != "u" or exact_kind(s.hi, "a random bound") != "u":
            raise NativeUnsupported("random bounds that may be negative")
        f = s.field
        value = ir.Const(0).bounded(s.lo.lo, s.hi.hi)
        self.add(f"{{ uint64_t _lo = {self.expr(s.lo)}, _hi = {self.expr(s.hi)}; "
                 f"if (_lo <= _hi) {self.fref(f)} = "
                 f"{self.store(value, 'ss_random(c, _lo, _hi)', f.width, f.signed)}; }}")

    def s_Exit(self, s) -> None:
        self.add(f"goto {self.exit_label};")

    def s_Return(self, s) -> None:
        self.add(f"goto {self.return_label};")

    def s_Assert(self, s: ir.Assert) -> None:
        self.add(f"if (!({self.expr(s.cond)})) SS_COUNT(c->stat_asserts, 1);")

    def s_Clone(self, s: ir.Clone) -> None:
        session = self.store(s.session, self.expr(s.session), 15, False)
        self.add(f"S->clone = (uint32_t){session} | 0x8000u; "
                 f"S->clone_fl = {num(s.field_list, 0, MAX_FIELD_LIST)};")

    def s_Resubmit(self, s: ir.Resubmit) -> None:
        self.add(f"S->resub_fl = {num(s.field_list, 0, MAX_FIELD_LIST)};")

    def s_Recirculate(self, s: ir.Recirculate) -> None:
        self.add(f"S->recirc_fl = {num(s.field_list, 0, MAX_FIELD_LIST)};")

    def special_functions(self, instance_type) -> None:
        """ss_keep (a field list's fields copied), ss_reset_meta (simple_switch's
        reset_metadata) and ss_set_instance, which the runtime's re-entry paths call."""
        prog = self.prog
        self.add("static void ss_keep(ss_state *D, const ss_state *S, uint32_t field_list) {")
        self.add("    switch (field_list) {")
        for fl, fields in sorted(prog.field_lists.items()):
            copies = " ".join(f"D->f[{self.fid(f)}] = {self.fref(f)};" for f in fields)
            self.add(f"    case {num(fl, 0, MAX_FIELD_LIST)}: {copies} break;")
        self.add("    default: (void)D; (void)S; break;")
        self.add("    }")
        self.add("}")
        meta = [self.fid(f) for f in prog.metadata_fields] if self.ir.special else []
        self.add("static void ss_reset_meta(ss_state *S) {")
        if meta:
            self.add(f"    static const uint32_t m[] = {{{', '.join(meta)}}};")
            self.add(f"    for (uint32_t i = 0; i < {num(len(meta), 1, MAX_ID)}; i++) S->f[m[i]] = 0;")
        else:
            self.add("    (void)S;")
        self.add("}")
        self.add("static void ss_set_instance(ss_state *S, uint64_t instance) {")
        self.add(f"    {self.fref(instance_type)} = instance;" if instance_type is not None
                 else "    (void)S; (void)instance;")
        self.add("}")

    def fid(self, field) -> str:
        return num(field.id, 0, len(self.prog.field_list))

    def s_If(self, s: ir.If) -> None:
        self.nested(f"if ({self.expr(s.cond)}) {{", self.block, s.then, tail="")
        self.nested("} else {", self.block, s.orelse)

    def s_Apply(self, node: ir.Apply) -> None:
        spec = node.table
        ti = num(self.table_index[spec.name], 0, len(self.table_index))
        self.add("{")
        self.depth += 1
        self.add(f"ss_table *_t = &c->t[{ti}]; int _hit = 0; int32_t _a; const uint64_t *ad;")
        if node.keys:
            for key, (_, width, _) in zip(node.keys, spec.keys):
                if width > 64:
                    raise NativeUnsupported(f"a {width}-bit key in table {spec.name}")
            keys = ", ".join(self.expr(k) for k in node.keys)
            self.add(f"uint64_t _k[{num(len(node.keys), 1, MAX_ID)}] = {{{keys}}};")
            if spec.match_type == "exact":
                self.add(f"int32_t _e = ss_lookup_exact(_t, _k, {num(len(node.keys), 1, MAX_ID)});")
            else:
                self.add("int32_t _e = ss_lookup_scan(_t, _k);")
            self.add("if (_e >= 0) {")
            self.add("    _hit = 1; _a = _t->action[_e]; ad = _t->data + (size_t)_e * (_t->nd + 1);")
            if spec.direct_counter:
                self.add("    SS_COUNT(_t->pkts[_e], 1); SS_COUNT(_t->bytes[_e], S->in_len);")
            self.add("} else { _a = _t->def_action; ad = _t->def_data; }")
        else:
            self.add("_a = _t->def_action; ad = _t->def_data;")
        self.add("(void)_hit; (void)ad; (void)_a;")
        for i, action in enumerate(node.actions):
            head = ("{" if len(node.actions) == 1
                    else f"{'else ' if i else ''}if (_a == {num(action.id, 0, MAX_ID)}) {{")
            self.nested(head, self.action, action)
        for i, (cond, body) in enumerate(node.branches):
            test = ("_hit" if cond == "hit" else "!_hit" if cond == "miss"
                    else " || ".join(f"_a == {num(aid, 0, MAX_ID)}" for aid in cond) or "0")
            self.nested(f"{'else ' if i else ''}if ({test}) {{", self.block, body)
        self.depth -= 1
        self.add("}")

    def action(self, action: ir.Action) -> None:
        returns = any(isinstance(s, ir.Return) for s in walk(action.body))
        self.return_label = self.label("ret") if returns else None
        self.block(action.body)
        if returns:
            self.add(f"{self.return_label}: ;")

    # ------------------------------------------------------------------ parser
    # ------------------------------------------------------------------ checksums
    # ------------------------------------------------------------------ unit
    def control(self, nodes: list, name: str) -> None:
        self.exit_label = self.label(f"exit_{name}")
        self.block(nodes)
        self.add(f"{self.exit_label}: ;")

    def setup(self) -> None:
        prog = self.prog
        self.add("static void ss_setup(ss_ctx *c) {")
        for name, spec in prog.tables.items():
            ti = self.table_index[name]
            nd = max([len(prog.action(a).params) for a in spec.applied_actions] + [0])
            for _, width, _ in spec.keys:
                if width > 64:
                    raise NativeUnsupported(f"a {width}-bit key in table {name}")
            self.add(f"    ss_table_init(c, &c->t[{num(ti, 0, len(prog.tables))}], "
                     f"{num(max(len(spec.keys), 1), 1, MAX_ID)}, {num(nd, 0, MAX_ID)}, "
                     f"{int(spec.match_type != 'exact')});")
            for f, (mt, _, _) in enumerate(spec.keys):
                if mt == "range":
                    self.add(f"    ss_table_range(c, &c->t[{num(ti, 0, len(prog.tables))}], "
                             f"{num(f, 0, MAX_ID)});")
        nregs = len(prog.registers)
        for name, spec in prog.registers.items():
            r = num(self.reg_index[name], 0, nregs)
            first, lane, stride = self.reg_lane.get(name, (name, 0, 1))
            if lane == 0:
                self.add(f"    ss_reg_init(c, {r}, {num(spec.size, 1, MAX_CELLS + 1)}U, "
                         f"{num(stride, 1, nregs + 1)}U, {int(narrow(spec))});")
            else:
                self.add(f"    ss_reg_lane(c, {r}, {num(self.reg_index[first], 0, nregs)}, "
                         f"{num(lane, 1, nregs)}U);")
        for name, spec in prog.counters.items():
            self.add(f"    ss_ctr_init(c, {num(self.ctr_index[name], 0, len(prog.counters))}, "
                     f"{num(spec.size, 1, MAX_CELLS + 1)}U);")
        if self.shards.reason is None:
            self.add(f"    c->nshards = {num(1 << min(self.shards.bits, 6), 1, 65)};")
        self.add("}")

    def take_shards(self) -> None:
        """After the parser, the locks of the shares this frame's key fields name (a
        field whose registers are reached only while its header is valid: only then)."""
        self.add("{ uint64_t _m = 0;")
        for f in self.shards.keys:
            test = (f"if ({self.valid_code(self.prog.header(f.header))}) "
                    if self.shards.guarded[f] else "")
            self.add(f"  {test}_m |= 1ULL << ({self.fref(f)} & (uint64_t)(c->nshards - 1));")
        self.add("  ss_shards_take(c, _m); }")

    def unit(self, runtime_path: str) -> str:
        prog = self.prog
        std = {n: prog.std(n) for n in ("ingress_port", "packet_length", "instance_type",
                                         "parser_error", "egress_spec", "egress_port",
                                         "mcast_grp", "egress_rid")}
        maxhdr = sum(h.max_nbytes for h in self.ir.deparse) + 64
        head = [
            "/* Generated by softswitch's C printer from a BMv2 JSON: do not edit. */",
            f"#define SS_NFIELDS {num(len(prog.field_list), 0, MAX_ID)}",
            f"#define SS_NHEADERS {num(len(prog.headers), 0, MAX_ID)}",
            f"#define SS_NTABLES {num(len(prog.tables), 0, MAX_ID)}",
            f"#define SS_NREGS {num(len(prog.registers), 0, MAX_ID)}",
            f"#define SS_NCTRS {num(len(prog.counters), 0, MAX_ID)}",
            f"#define SS_MAXHDR {num(maxhdr, 64, MAX_ID)}",
            f"#define SS_MAXCELLS {num(MAX_CELLS, 1, MAX_CELLS + 1)}",
            f"#define SS_INGRESS_PORT {num(std['ingress_port'].id, 0, len(prog.field_list))}",
            *(["#define SS_PREPARED 1"] if self.prepared.shared else []),
            f"#include {_c_string(runtime_path)}",
            "",
            f"static uint64_t ss_spec(const ss_state *S) {{ return {self.fref(std['egress_spec'])}; }}",
            "static uint64_t ss_mcast(const ss_state *S) { return "
            + (self.fref(std["mcast_grp"]) if std["mcast_grp"] else "0") + "; }",
            "",
        ]
        self.setup()
        self.add("")
        self.special_functions(std["instance_type"])
        self.add("")
        self.add("static void ss_ingress(ss_ctx *c, ss_state *S) {")
        self.depth = 1
        self.add(f"uint64_t perr = {num(prog.no_error, 0, MAX_ID)}; (void)perr;")
        if std["packet_length"] is not None:
            self.add(f"{self.fref(std['packet_length'])} = S->plen;")
        self.parser()
        if std["parser_error"] is not None:
            self.add(f"{self.fref(std['parser_error'])} = perr;")
        if self.ir.special:
            self.add("if (S->parse_only) return;")
        if self.shards.reason is None:
            self.take_shards()
        self.checksums(self.ir.verify, True)
        self.control(self.ir.ingress, "ingress")
        self.depth = 0
        self.add("}")
        self.add("")
        self.add("static int64_t ss_egress(ss_ctx *c, ss_state *S, uint32_t port, int has_rid, "
                 "uint32_t rid, uint32_t instance, uint8_t *out, uint32_t cap, ss_state *e2e) {")
        self.depth = 1
        self.touched = set()
        self.add("(void)rid; (void)has_rid; (void)instance; (void)e2e;")
        self.add(f"{self.fref(std['egress_port'])} = port;")
        self.add(f"{self.fref(std['egress_spec'])} = {num(prog.drop_port + 1, 1, MAX_ID + 1)};")
        if std["instance_type"] is not None:
            self.add(f"{self.fref(std['instance_type'])} = instance;")
        if std["egress_rid"] is not None:
            self.add(f"if (has_rid) {self.fref(std['egress_rid'])} = rid;")
        if std["packet_length"] is not None:
            self.add(f"{self.fref(std['packet_length'])} = S->plen_reg;")
        self.control(self.ir.egress, "egress")
        if self.ir.special:
            # The E2E clone: this state now, its metadata reset but for the field list.
            self.add("if (S->clone && !S->abort) { memcpy(e2e, S, sizeof *S); ss_reset_meta(e2e); "
                     "ss_keep(e2e, S, S->clone_fl); }")
        self.add(f"if ({self.fref(std['egress_spec'])} == {num(prog.drop_port, 0, MAX_ID)} "
                 "|| S->abort) "
                 "return -1;")
        self.checksums(self.ir.update, False)
        self.deparser()
        self.add("if (o + (S->plen - S->off) > cap) return -1;")
        self.add("memcpy(out + o, S->pkt + S->off, S->plen - S->off);")
        self.add("return o + (S->plen - S->off);")
        self.depth = 0
        self.add("}")
        self.replica()
        if self.prepared.shared:
            self.prepare()
        return "\n".join(head + self.functions + self.lines) + "\n"


    def replica(self) -> None:
        """ss_replica: the state a copy's egress starts from. Only the fields egress
        names (and field lists, which a recirculation or E2E clone keeps) are copied;
        the rest, ingress's temporaries mostly, are never read again. ss_replica_shared:
        the same for a copy whose shared headers ss_prepare deparsed (their fields
        left out where nothing else in egress names them)."""
        touched = self.touched | {f.id for fields in self.prog.field_lists.values()
                                  for f in fields}
        self.touched = None
        self.copier("ss_replica", touched | self.shared_fields)
        if self.prepared.shared:
            self.copier("ss_replica_shared", touched)

    def copier(self, name: str, ids: set) -> None:
        """A function that copies the fields ``ids`` (memcpy of each run of them) and the
        state past the fields."""
        self.add(f"static void {name}(ss_state *D, const ss_state *S) {{")
        runs: list = []
        for i in sorted(ids):
            if runs and runs[-1][1] == i:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
        for lo, hi in runs:
            n = len(self.prog.field_list)
            self.add(f"    memcpy(D->f + {num(lo, 0, n)}, S->f + {num(lo, 0, n)}, "
                     f"{num(hi - lo, 1, n)} * sizeof(uint64_t));")
        self.add("    memcpy(D->v, S->v, sizeof *S - offsetof(ss_state, v));")
        self.add("}")


def narrow(reg) -> bool:
    """Whether a register's cells are uint32_t (runtime.c's reg32): up to 32 bits wide."""
    return reg.width <= 32


def _c_string(text: str) -> str:
    """A C string literal for ``text`` (a path), every unusual byte escaped."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        out.append(ch if ch.isalnum() or ch in "/._-+" else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def emit(program: Program, runtime_path: str) -> str:
    """The C unit for ``program``; raises NativeUnsupported for what only Python runs."""
    try:
        return CPrinter(program).unit(runtime_path)
    except RecursionError:
        raise NativeUnsupported("the program's controls are nested too deeply") from None
