"""C emitter: a checked ``frontend.Program`` as one C translation unit.

The unit defines the program's sizes, includes ``native/runtime.c`` (tables, PRE,
I/O) and adds ``ss_setup``, ``ss_ingress`` and ``ss_egress``. Every field is a
``uint64_t`` slot of the packet state (signed fields sign-extended), so the emitter
refuses fields, keys, parameters and registers wider than 64 bits.

Values follow BMv2's unbounded integers: each expression is C code that equals the
true value modulo 2^64, together with bounds of the true value. Ring operations
(+ - * ~ & | ^ <<) are exact modulo 2^64 whatever the bounds; an operation that
needs the value itself (comparison, >>, /, %, saturation, an index) is emitted only
when the bounds prove it fits in uint64_t or int64_t, otherwise the program is
refused (``NativeUnsupported``) and runs on the Python backend. Nothing from the
JSON reaches the C text except numbers, and every number goes through
``validate.num`` or ``validate.u64`` (an int in range, or refused): names become ids.
"""

from __future__ import annotations

from innet_aggregation.softswitch.frontend.program import Apply, Field, Header, If, Program, Unsupported, hexstr, mask
from innet_aggregation.softswitch.frontend.validate import MAX_CELLS, MAX_CHECKSUM_BITS, MAX_HEADER_BITS, MAX_ID, \
    MAX_LOOKAHEAD, num, u64

U64 = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


class NativeUnsupported(Unsupported):
    """A construct the C emitter cannot translate exactly; the Python backend can."""


class Val:
    """C code equal to the value mod 2^64, and bounds of the value (None: unknown)."""

    __slots__ = ("code", "lo", "hi")

    def __init__(self, code: str, lo, hi):
        self.code, self.lo, self.hi = code, lo, hi

    @property
    def known(self) -> bool:
        return self.lo is not None and abs(self.lo) < (1 << 200) and abs(self.hi) < (1 << 200)

    def kind(self) -> str | None:
        """"u" if the value fits uint64_t, "s" if it fits int64_t, else None."""
        if not self.known:
            return None
        if 0 <= self.lo and self.hi <= U64:
            return "u"
        if I64_MIN <= self.lo and self.hi <= I64_MAX:
            return "s"
        return None


_lit = u64
MAX_BYTES = MAX_HEADER_BITS // 8 + 1     # bounds of a header's size and bit positions


def _slit(value: int) -> str:
    """A signed 64-bit C literal (INT64_MIN has no literal of its own)."""
    return ("(-0x7fffffffffffffffLL - 1)" if value == I64_MIN
            else f"({num(value, I64_MIN, I64_MAX + 1)}LL)")


def _w(width: int) -> str:
    """A width the C code handles: 1 to 64 bits."""
    return num(width, 1, 65)


def _cmp_code(a: Val, b: Val, op: str, where: str) -> str:
    ka, kb = a.kind(), b.kind()
    if op in ("==", "!=") and a.known and b.known and max(a.hi, b.hi) - min(a.lo, b.lo) <= U64:
        return f"(uint64_t)(({a.code}) {op} ({b.code}))"
    if ka == "u" and kb == "u":
        return f"(uint64_t)(({a.code}) {op} ({b.code}))"
    if ka and kb and a.lo >= I64_MIN and a.hi <= I64_MAX and b.lo >= I64_MIN and b.hi <= I64_MAX:
        return f"(uint64_t)((int64_t)({a.code}) {op} (int64_t)({b.code}))"
    raise NativeUnsupported(f"comparison {op} of values that may not fit in 64 bits ({where})")


class CEmitter:
    """Builds the C unit for one program."""

    def __init__(self, program: Program):
        self.prog = program
        self.lines: list[str] = []
        self.depth = 0
        self.labels = 0
        self.table_index = {name: i for i, name in enumerate(program.tables)}
        self.reg_index = {name: i for i, name in enumerate(program.registers)}
        self.ctr_index = {name: i for i, name in enumerate(program.counters)}
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

    # ------------------------------------------------------------------ values
    def fref(self, field: Field) -> str:
        return f"S->f[{num(field.id, 0, len(self.prog.field_list))}]"

    def hid(self, header: Header) -> str:
        return num(header.id, 0, len(self.prog.headers))

    def field_val(self, field: Field) -> Val:
        if field.signed:
            half = 1 << (field.width - 1)
            return Val(self.fref(field), -half, half - 1)
        return Val(self.fref(field), 0, mask(field.width))

    def valid_code(self, header: Header) -> str:
        return "1" if header.metadata else f"S->v[{self.hid(header)}]"

    @staticmethod
    def store(val: Val, width: int, signed: bool) -> str:
        """``val`` truncated to a ``width``-bit field, the way BMv2 stores a value."""
        if signed:
            half = 1 << (width - 1)
            if val.known and -half <= val.lo and val.hi < half:
                return val.code
            return f"ss_sext({val.code}, {_w(width)})"
        if val.known and 0 <= val.lo and val.hi <= mask(width):
            return val.code
        return f"(({val.code}) & {_lit(mask(width))})"

    def exact(self, val: Val, what: str) -> str:
        kind = val.kind()
        if kind is None:
            raise NativeUnsupported(f"{what} may not fit in 64 bits")
        return kind

    def expr(self, node, params=None, where="") -> Val:
        if not isinstance(node, dict):
            raise Unsupported(f"expression {node!r:.60} (expected an object) in {where}")
        kind = node.get("type")
        value = node.get("value")
        if kind == "field":
            if isinstance(value, list) and len(value) == 2 and value[1] == "$valid$":
                return Val(f"(uint64_t){self.valid_code(self.prog.header(value[0]))}", 0, 1)
            return self.field_val(self.prog.field(value))
        if kind == "hexstr":
            number = hexstr(value)
            return Val(_lit(number), number, number)
        if kind == "bool":
            return Val("1ULL" if value else "0ULL", int(bool(value)), int(bool(value)))
        if kind in ("runtime_data", "local"):
            if params is None or not isinstance(value, int) or not 0 <= value < len(params):
                raise Unsupported(f"action parameter {value!r:.20} used outside an action")
            return Val(f"ad[{num(value, 0, len(params))}]", 0, mask(params[value][1]))
        if kind == "expression":
            return self.operation(value, params, where)
        raise Unsupported(f"expression operand of type {kind!r:.40}")

    def operation(self, node, params, where) -> Val:
        if not isinstance(node, dict):
            raise Unsupported(f"expression {node!r:.60} (expected an object) in {where}")
        if node.get("type") == "expression":
            return self.operation(node["value"], params, where)
        op = node.get("op")
        left, right = node.get("left"), node.get("right")
        if op == "valid":
            return Val(f"(uint64_t){self.valid_code(self.prog.header(right['value']))}", 0, 1)
        if op in ("not", "~", "d2b", "b2d"):
            a = self.expr(right, params, where)
            if op == "not":
                return Val(f"(uint64_t)!({a.code})", 0, 1)
            if op == "~":
                return Val(f"(~({a.code}))", -a.hi - 1 if a.known else None,
                           -a.lo - 1 if a.known else None)
            if op == "b2d" or (a.known and 0 <= a.lo and a.hi <= 1):
                return a
            if not a.known or a.lo <= -(1 << 64) or a.hi >= 1 << 64:
                # Only then is "zero modulo 2^64" the same as zero.
                raise NativeUnsupported(f"d2b of a value that may not fit in 64 bits ({where})")
            return Val(f"(uint64_t)(({a.code}) != 0)", 0, 1)
        if op == "?":
            c = self.expr(node["cond"], params, where)
            a, b = self.expr(left, params, where), self.expr(right, params, where)
            lo = min(a.lo, b.lo) if a.known and b.known else None
            hi = max(a.hi, b.hi) if a.known and b.known else None
            return Val(f"(({c.code}) ? ({a.code}) : ({b.code}))", lo, hi)
        if op in ("two_comp_mod", "sat_cast", "usat_cast"):
            a = self.expr(left, params, where)
            if not isinstance(right, dict) or right.get("type") != "hexstr":
                raise Unsupported(f"{op} with a non-constant width")
            width = hexstr(right["value"])
            if width < 1:
                raise Unsupported(f"{op} to {width} bits")
            if op == "usat_cast":
                lo, hi = 0, mask(width)
            else:
                lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
            if a.known and lo <= a.lo and a.hi <= hi:
                return a
            if width > 64:
                raise NativeUnsupported(f"{op} to {width} bits ({where})")
            if op == "two_comp_mod":
                return Val(f"ss_sext({a.code}, {_w(width)})", lo, hi)
            kind = self.exact(a, f"the operand of {op} ({where})")
            x = f"(int64_t)({a.code})" if kind == "s" else f"({a.code})"
            parts = []
            if kind == "s" and (not a.known or a.lo < lo):
                parts.append(f"{x} < {_slit(lo)} ? (uint64_t){_slit(lo)}")
            if hi <= I64_MAX or kind == "u":
                hi_c = _slit(hi) if kind == "s" else _lit(hi)
                parts.append(f"{x} > {hi_c} ? (uint64_t){hi_c}")
            code = "(" + " : ".join(parts + [f"(uint64_t){x}"]) + ")"
            return Val(code, lo, hi)
        if op in ("==", "!=", ">", "<", ">=", "<="):
            a, b = self.expr(left, params, where), self.expr(right, params, where)
            return Val(_cmp_code(a, b, op, where), 0, 1)
        if op in ("and", "or"):
            a, b = self.expr(left, params, where), self.expr(right, params, where)
            c_op = "&&" if op == "and" else "||"
            return Val(f"(uint64_t)(({a.code}) {c_op} ({b.code}))", 0, 1)
        if op in ("+", "-", "*", "&", "|", "^"):
            a, b = self.expr(left, params, where), self.expr(right, params, where)
            return Val(f"(({a.code}) {op} ({b.code}))", *_bounds(op, a, b))
        if op == "<<":
            a, b = self.expr(left, params, where), self.expr(right, params, where)
            if self.exact(b, f"a shift amount ({where})") != "u":
                raise NativeUnsupported(f"shift by a possibly negative amount ({where})")
            lo = hi = None
            if a.known and b.hi < 256:
                corners = [a.lo << b.lo, a.lo << b.hi, a.hi << b.lo, a.hi << b.hi]
                lo, hi = min(corners), max(corners)
            return Val(f"(({b.code}) >= 64 ? 0ULL : ({a.code}) << ({b.code}))", lo, hi)
        if op == ">>":
            a, b = self.expr(left, params, where), self.expr(right, params, where)
            kind = self.exact(a, f"the left operand of >> ({where})")
            if self.exact(b, f"a shift amount ({where})") != "u":
                raise NativeUnsupported(f"shift by a possibly negative amount ({where})")
            bmax = min(b.hi, 4096)
            corners = [a.lo >> b.lo, a.lo >> bmax, a.hi >> b.lo, a.hi >> bmax]
            if kind == "u":
                code = f"(({b.code}) >= 64 ? 0ULL : ({a.code}) >> ({b.code}))"
            else:
                code = (f"(uint64_t)((int64_t)({a.code}) >> "
                        f"(({b.code}) >= 63 ? 63 : ({b.code})))")
            return Val(code, min(corners), max(corners))
        if op in ("/", "%"):
            a, b = self.expr(left, params, where), self.expr(right, params, where)
            if self.exact(a, f"{op} ({where})") != "u" or self.exact(b, f"{op} ({where})") != "u":
                raise NativeUnsupported(f"{op} of a possibly negative value ({where})")
            hi = a.hi if op == "/" else max(min(a.hi, b.hi - 1), 0)
            return Val(f"ss_div(S, {a.code}, {b.code}, {int(op == '%')})", 0, hi)
        raise Unsupported(f"expression operator {op!r:.40}")

    # ------------------------------------------------------------------ primitives
    def guarded(self, idx: str, test: str, stmt: str, prelude: str = "") -> None:
        """``stmt`` on element ``_ix`` = ``idx`` only if ``test`` (BMv2 skips an
        out-of-range register or counter access); ``prelude`` runs either way."""
        self.add(f"{{ uint64_t _ix = {idx}; {prelude}if ({test}) {stmt} }}")

    def index(self, node, params, size: int, where: str) -> tuple[str, str]:
        """(index code, bounds test on ``_ix``): BMv2 skips an out-of-range access."""
        val = self.expr(node, params, where)
        kind = self.exact(val, f"an index ({where})")
        if val.known and 0 <= val.lo and val.hi < size:
            return val.code, "1"
        if kind == "u":
            return val.code, f"_ix < {num(size, 1, MAX_CELLS + 1)}ULL"
        return val.code, f"(int64_t)_ix >= 0 && (int64_t)_ix < {num(size, 1, MAX_CELLS + 1)}LL"

    def primitive(self, prim: dict, params, where: str, exit_label: str,
                  return_label: str | None) -> None:
        if not isinstance(prim, dict):
            raise Unsupported(f"primitive {prim!r:.40} in {where}")
        op = prim.get("op")
        args = prim.get("parameters", [])
        prog = self.prog
        if op in ("assign", "modify_field"):
            if args[0].get("type") != "field":
                raise Unsupported(f"{op} to a {args[0].get('type')!r:.30} in {where}")
            field = prog.field(args[0]["value"])
            val = self.expr(args[1], params, where)
            self.add(f"{self.fref(field)} = {self.store(val, field.width, field.signed)};")
        elif op in ("assign_header", "copy_header"):
            dst = prog.header(args[0]["value"])
            self.copy_header(dst, prog.header_choice(args[1]), params, where)
        elif op in ("add_header", "add_header_fast"):
            header = prog.header(args[0]["value"])
            if header.metadata:
                return
            self.add(f"if (!S->v[{self.hid(header)}]) {{")
            if op == "add_header":
                for f in header.fields:
                    self.add(f"    {self.fref(f)} = 0;")
                self.add(f"    S->plen_reg += {num(header.nbytes, 0, MAX_BYTES)};")
            self.add(f"    S->v[{self.hid(header)}] = 1;")
            self.add("}")
        elif op == "remove_header":
            header = prog.header(args[0]["value"])
            if header.metadata:
                return
            self.add(f"if (S->v[{self.hid(header)}]) {{ S->v[{self.hid(header)}] = 0; "
                     f"S->plen_reg -= {num(header.nbytes, 0, MAX_BYTES)}; }}")
        elif op in ("mark_to_drop", "drop"):
            for field, value in prog.drop_stores(op):
                self.add(f"{self.fref(field)} = {num(value, 0, MAX_ID)};")
        elif op == "register_read":
            field = prog.field(args[0]["value"])
            reg = prog.register(args[1]["value"])
            r = num(self.reg_index[reg.name], 0, len(self.reg_index))
            idx, test = self.index(args[2], params, reg.size, where)
            val = self.store(Val(f"c->reg[{r}][_ix]", 0, mask(reg.width)), field.width,
                             field.signed)
            self.guarded(idx, test, f"{self.fref(field)} = {val};")
        elif op == "register_write":
            reg = prog.register(args[0]["value"])
            r = num(self.reg_index[reg.name], 0, len(self.reg_index))
            idx, test = self.index(args[1], params, reg.size, where)
            val = self.store(self.expr(args[2], params, where), reg.width, False)
            self.guarded(idx, test, f"c->reg[{r}][_ix] = _vx;", f"uint64_t _vx = {val}; ")
        elif op == "count":
            ctr = prog.counter(args[0]["value"])
            n = num(self.ctr_index[ctr.name], 0, len(self.ctr_index))
            idx, test = self.index(args[1], params, ctr.size, where)
            self.guarded(idx, test, f"{{ c->cpk[{n}][_ix]++; c->cby[{n}][_ix] += S->in_len; }}")
        elif op == "modify_field_rng_uniform":
            field = prog.field(args[0]["value"])
            lo, hi = self.expr(args[1], params, where), self.expr(args[2], params, where)
            if self.exact(lo, where) != "u" or self.exact(hi, where) != "u":
                raise NativeUnsupported(f"random bounds that may be negative ({where})")
            val = self.store(Val("ss_random(c, _lo, _hi)", lo.lo, hi.hi), field.width,
                             field.signed)
            self.add(f"{{ uint64_t _lo = {lo.code}, _hi = {hi.code}; "
                     f"if (_lo <= _hi) {self.fref(field)} = {val}; }}")
        elif op == "exit":
            self.add(f"goto {exit_label};")
        elif op in ("no_op", "log_msg"):
            pass
        elif op in ("assert", "assume"):
            cond = self.expr(args[0], params, where)
            self.add(f"if (!({cond.code})) c->stat_asserts++;")
        elif op in ("_jump", "_jump_if_zero"):
            raise AssertionError("jumps are handled by statements()")
        else:
            raise Unsupported(f"primitive {op!r:.40} (in {where})")

    def copy_header(self, dst: Header, src, params, where: str) -> None:
        """``dst = src``; a (cond, then, else) source picks at run time."""
        if isinstance(src, tuple):
            cond, left, right = src
            self.add(f"if ({self.expr(cond, params, where).code}) {{")
            self.depth += 1
            self.copy_header(dst, left, params, where)
            self.depth -= 1
            self.add("} else {")
            self.depth += 1
            self.copy_header(dst, right, params, where)
            self.depth -= 1
            self.add("}")
            return
        if [f.width for f in dst.fields] != [f.width for f in src.fields]:
            raise Unsupported(f"header copy between different header types in {where}")
        self.add(f"if ({self.valid_code(src)}) {{")
        for d, s in zip(dst.fields, src.fields):
            self.add(f"    {self.fref(d)} = {self.store(self.field_val(s), d.width, d.signed)};")
        if not dst.metadata:
            self.add(f"    S->v[{self.hid(dst)}] = 1;")
        self.add("}")
        if not dst.metadata:
            self.add(f"else S->v[{self.hid(dst)}] = 0;")

    def statements(self, prims: list, params, where: str, exit_label: str) -> None:
        """An action's primitives, p4c's forward ``_jump``s turned back into if/else."""
        end = len(prims)
        ret = self.label("ret")
        used = []

        def target(prim, pos):
            value = prim["parameters"][pos]
            if value.get("type") != "hexstr":
                raise Unsupported(f"{prim['op']} to a computed offset (in {where})")
            return hexstr(value["value"])

        def region(i, stop):
            while i < stop:
                prim = prims[i]
                op = prim.get("op") if isinstance(prim, dict) else None
                if op == "_jump_if_zero":
                    cond = self.expr(prim["parameters"][0], params, where)
                    dest = target(prim, 1)
                    if not i < dest <= stop:
                        raise Unsupported(f"_jump_if_zero backwards or out of its block ({where})")
                    last = prims[dest - 1]
                    has_else = (dest - 1 > i and last.get("op") == "_jump"
                                and dest <= target(last, 0) <= stop)
                    self.add(f"if ({cond.code}) {{")
                    self.depth += 1
                    region(i + 1, dest - 1 if has_else else dest)
                    self.depth -= 1
                    if has_else:
                        self.add("} else {")
                        self.depth += 1
                        region(dest, target(last, 0))
                        self.depth -= 1
                        i = target(last, 0)
                    else:
                        i = dest
                    self.add("}")
                elif op == "_jump":
                    if target(prim, 0) != end:
                        raise Unsupported(f"_jump that is not an if/else or a return ({where})")
                    self.add(f"goto {ret};")
                    used.append(ret)
                    i += 1
                else:
                    self.primitive(prim, params, where, exit_label, ret)
                    i += 1

        region(0, end)
        if used:
            self.add(f"{ret}: ;")

    # ------------------------------------------------------------------ parser
    def parser(self) -> None:
        prog = self.prog
        done = self.label("parsed")
        nstates = len(prog.parser_states)
        self.add(f"int st = {num(prog.parser_init, 0, nstates)};")
        self.add("for (int _guard = 0; st >= 0; _guard++) {")
        self.depth += 1
        # A parser loop that extracts nothing would spin for ever: give up as too short.
        self.add(f"if (_guard > 100000) {{ perr = {num(prog.too_short, 0, MAX_ID)}; "
                 f"goto {done}; }}")
        self.add("switch (st) {")
        for i in prog.parser_order:
            state = prog.parser_states[i]
            where = f"parser state {i}"
            self.add(f"case {num(i, 0, nstates)}: {{")
            self.depth += 1
            for op in state.get("parser_ops", []):
                self.parser_op(op, where, done)
            self.transitions(state, where, done)
            self.add("break;")
            self.depth -= 1
            self.add("}")
        self.add("default: st = -1;")
        self.add("}")
        self.depth -= 1
        self.add("}")
        self.add(f"{done}: ;")

    def too_short(self, need: str, done: str) -> None:
        self.add(f"if (S->plen - S->off < (uint64_t)({num(need, 0, MAX_LOOKAHEAD + MAX_BYTES)})) "
                 f"{{ perr = {num(self.prog.too_short, 0, MAX_ID)}; goto {done}; }}")

    def lookahead(self, bit_offset: int, width: int, where: str, done: str) -> Val:
        if width > 64 or bit_offset < 0:
            raise NativeUnsupported(f"lookahead of {width} bits ({where})")
        self.too_short((bit_offset + width + 7) // 8, done)
        return Val(f"ss_get(S->pkt + S->off, {num(bit_offset, 0, MAX_LOOKAHEAD)}, {_w(width)})",
                   0, mask(width))

    def parser_op(self, op: dict, where: str, done: str) -> None:
        kind = op.get("op")
        params = op.get("parameters", [])
        prog = self.prog
        if kind == "extract":
            if params[0].get("type") != "regular":
                raise Unsupported(f"extract to a {params[0].get('type')!r:.30} ({where})")
            header = prog.header(params[0]["value"])
            self.too_short(header.nbytes, done)
            self.add("{ const uint8_t *_p = S->pkt + S->off;")
            pos = 0
            for f in header.fields:
                if pos % 8 == 0 and f.width in (8, 16, 32, 64):
                    code = f"ss_ld{_w(f.width)}(_p + {num(pos // 8, 0, MAX_BYTES)})"
                else:
                    code = f"ss_get(_p, {num(pos, 0, MAX_HEADER_BITS)}, {_w(f.width)})"
                if f.signed:
                    code = f"ss_sext({code}, {_w(f.width)})"
                self.add(f"  {self.fref(f)} = {code};")
                pos += f.width
            self.add(f"  S->off += {num(header.nbytes, 0, MAX_BYTES)}; "
                     f"S->v[{self.hid(header)}] = 1; }}")
        elif kind == "set":
            field = prog.field(params[0]["value"])
            if params[1].get("type") == "lookahead":
                bit_offset, width = params[1]["value"]
                val = self.lookahead(bit_offset, width, where, done)
            else:
                val = self.expr(params[1], None, where)
            self.add(f"{self.fref(field)} = {self.store(val, field.width, field.signed)};")
        elif kind == "verify":
            cond = self.expr(params[0], None, where)
            err = self.expr(params[1], None, where)
            self.add(f"if (!({cond.code})) {{ perr = {err.code}; goto {done}; }}")
        elif kind in ("advance", "shift"):
            amount = self.expr(params[0], None, where)
            if self.exact(amount, where) != "u":
                raise NativeUnsupported(f"{kind} by a possibly negative amount ({where})")
            nbytes = amount.code if kind == "shift" else f"(({amount.code}) >> 3)"
            self.add(f"{{ uint64_t _adv = {nbytes};")
            self.add(f"  if (S->plen - S->off < _adv) {{ perr = {num(prog.too_short, 0, MAX_ID)}; "
                     f"goto {done}; }}")
            self.add("  S->off += _adv; }")
        elif kind == "primitive":
            self.primitive(params[0], None, where, done, None)
        else:
            raise Unsupported(f"parser operation {kind!r:.40} ({where})")

    def transitions(self, state: dict, where: str, done: str) -> None:
        key_parts, cases, default = self.prog.transitions(state)
        nstates = len(self.prog.parser_states)
        default = num(default, -1, nstates)
        if not key_parts:
            self.add(f"st = {default};")
            return
        codes, total = [], 0
        for part in reversed(key_parts):
            if part.get("type") == "field":
                field = self.prog.field(part["value"])
                width = field.width
                code = f"({self.fref(field)} & {_lit(mask(width))})"
            elif part.get("type") == "lookahead":
                bit_offset, width = part["value"]
                code = self.lookahead(bit_offset, width, where, done).code
            else:
                raise Unsupported(f"parser transition key of type {part.get('type')!r:.30}")
            nbits = (width + 7) // 8 * 8
            if total + nbits > 64:
                raise NativeUnsupported(f"a select key of more than 64 bits ({where})")
            codes.append(f"(({code}) << {num(total, 0, 64)})" if total else f"({code})")
            total += nbits
        self.add(f"{{ uint64_t _key = {' | '.join(reversed(codes))};")
        for i, (value, case_mask, nxt) in enumerate(cases):
            if case_mask is not None:
                if (value & case_mask) >> total:
                    continue          # bits the key does not have: never matches
                cond = f"(_key & {_lit(case_mask)}) == {_lit(value & case_mask)}"
            else:
                if value >> total:
                    continue          # a value wider than the key never matches
                cond = f"_key == {_lit(value)}"
            self.add(f"  {'else ' if i else ''}if ({cond}) st = {num(nxt, -1, nstates)};")
        self.add(f"  {'else ' if cases else ''}st = {default}; }}")

    # ------------------------------------------------------------------ checksums
    def checksums(self, verify: bool) -> None:
        prog = self.prog
        for checksum, calc, does_verify, does_update in prog.checksums:
            if not (does_verify if verify else does_update):
                continue
            where = "a checksum"
            target = prog.field(checksum["target"])
            groups = prog.calc_groups(calc)
            nbits = sum(sum(f.width for f in fields) if header is not None else fields[1]
                        for header, fields in groups)
            cond = checksum.get("if_cond")
            self.add("{")
            self.depth += 1
            if cond is not None:
                self.add(f"if ({self.expr(cond, None, where).code}) {{")
            self.add(f"uint8_t _cb[{num((nbits + 7) // 8 + 16, 16, MAX_CHECKSUM_BITS // 8 + 17)}] "
                     "= {0}; uint32_t _cn = 0;")
            for header, fields in groups:
                if header is None:
                    value, width = fields
                    if width > 64:
                        raise NativeUnsupported(f"a {width}-bit constant in a checksum")
                    self.add(f"ss_put(_cb, _cn, {_w(width)}, {_lit(value)}); _cn += {_w(width)};")
                    continue
                test = "" if header.metadata else f"if (S->v[{self.hid(header)}]) "
                puts = " ".join(f"ss_put(_cb, _cn, {_w(f.width)}, {self.fref(f)}); "
                                f"_cn += {_w(f.width)};" for f in fields)
                self.add(f"{test}{{ {puts} }}")
            self.add("uint64_t _csum = ss_csum16(_cb, (_cn + 7) >> 3);")
            if verify:
                err = prog.std("checksum_error")
                if err is not None:
                    self.add(f"if (_csum != {self.fref(target)}) {self.fref(err)} = 1;")
            else:
                val = self.store(Val("_csum", 0, 0xFFFF), target.width, target.signed)
                self.add(f"{self.fref(target)} = {val};")
            if cond is not None:
                self.add("}")
            self.depth -= 1
            self.add("}")

    # ------------------------------------------------------------------ controls
    def control(self, name: str) -> None:
        exit_label = self.label(f"exit_{name}")
        self.block(self.prog.controls[name], exit_label)
        self.add(f"{exit_label}: ;")

    def block(self, nodes: list, exit_label: str) -> None:
        for node in nodes:
            if isinstance(node, If):
                cond = self.expr(node.expression, None, "a conditional")
                self.add(f"if ({cond.code}) {{")
                self.depth += 1
                self.block(node.then, exit_label)
                self.depth -= 1
                self.add("} else {")
                self.depth += 1
                self.block(node.orelse, exit_label)
                self.depth -= 1
                self.add("}")
            else:
                self.apply(node, exit_label)

    def apply(self, node: Apply, exit_label: str) -> None:
        spec = node.table
        ti = num(self.table_index[spec.name], 0, len(self.table_index))
        self.add("{")
        self.depth += 1
        self.add(f"ss_table *_t = &c->t[{ti}]; int _hit = 0; int32_t _a; const uint64_t *ad;")
        if spec.key_refs:
            keys = []
            for kind, target, key_mask in spec.key_refs:
                if kind == "valid":
                    code = f"(uint64_t){self.valid_code(self.prog.header(target))}"
                else:
                    code = f"({self.fref(target)} & {_lit(mask(target.width))})"
                if key_mask is not None:
                    code = f"({code} & {_lit(key_mask)})"
                keys.append(code)
            self.add(f"uint64_t _k[{num(len(keys), 1, MAX_ID)}] = {{{', '.join(keys)}}};")
            self.add("int32_t _e = ss_lookup(_t, _k);")
            self.add("if (_e >= 0) {")
            self.add("    _hit = 1; _a = _t->action[_e]; ad = _t->data + (size_t)_e * (_t->nd + 1);")
            if spec.direct_counter:
                self.add("    _t->pkts[_e]++; _t->bytes[_e] += S->in_len;")
            self.add("} else { _a = _t->def_action; ad = _t->def_data; }")
        else:
            self.add("_a = _t->def_action; ad = _t->def_data;")
        self.add("(void)_hit; (void)ad; (void)_a;")
        action_ids = spec.applied_actions
        for i, aid in enumerate(action_ids):
            action = self.prog.action(aid)
            if len(action_ids) == 1:
                self.add("{")
            else:
                self.add(f"{'else ' if i else ''}if (_a == {num(aid, 0, MAX_ID)}) {{")
            self.depth += 1
            self.statements(action.primitives, action.params, f"action {aid}", exit_label)
            self.depth -= 1
            self.add("}")
        for i, (cond, body) in enumerate(node.branches or ()):
            test = ("_hit" if cond == "hit" else "!_hit" if cond == "miss"
                    else " || ".join(f"_a == {num(aid, 0, MAX_ID)}" for aid in cond) or "0")
            self.add(f"{'else ' if i else ''}if ({test}) {{")
            self.depth += 1
            self.block(body, exit_label)
            self.depth -= 1
            self.add("}")
        self.depth -= 1
        self.add("}")

    # ------------------------------------------------------------------ unit
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
        for name, spec in prog.registers.items():
            self.add(f"    ss_reg_init(c, {num(self.reg_index[name], 0, len(prog.registers))}, "
                     f"{num(spec.size, 1, MAX_CELLS + 1)}U);")
        for name, spec in prog.counters.items():
            self.add(f"    ss_ctr_init(c, {num(self.ctr_index[name], 0, len(prog.counters))}, "
                     f"{num(spec.size, 1, MAX_CELLS + 1)}U);")
        self.add("}")

    def unit(self, runtime_path: str) -> str:
        prog = self.prog
        std = {n: prog.std(n) for n in ("ingress_port", "packet_length", "instance_type",
                                         "parser_error", "egress_spec", "egress_port",
                                         "mcast_grp", "egress_rid")}
        maxhdr = sum(h.nbytes for h in prog.deparse_order) + 64
        head = [
            "/* Generated by softswitch.emit_c from a BMv2 JSON: do not edit. */",
            f"#define SS_NFIELDS {num(len(prog.field_list), 0, MAX_ID)}",
            f"#define SS_NHEADERS {num(len(prog.headers), 0, MAX_ID)}",
            f"#define SS_NTABLES {num(len(prog.tables), 0, MAX_ID)}",
            f"#define SS_NREGS {num(len(prog.registers), 0, MAX_ID)}",
            f"#define SS_NCTRS {num(len(prog.counters), 0, MAX_ID)}",
            f"#define SS_MAXHDR {num(maxhdr, 64, MAX_ID)}",
            f"#define SS_MAXCELLS {num(MAX_CELLS, 1, MAX_CELLS + 1)}",
            f"#define SS_INGRESS_PORT {num(std['ingress_port'].id, 0, len(prog.field_list))}",
            f"#include {_c_string(runtime_path)}",
            "",
            f"static uint64_t ss_spec(const ss_state *S) {{ return {self.fref(std['egress_spec'])}; }}",
            "static uint64_t ss_mcast(const ss_state *S) { return "
            + (self.fref(std["mcast_grp"]) if std["mcast_grp"] else "0") + "; }",
            "",
        ]
        self.setup()
        self.add("")
        self.add("static void ss_ingress(ss_ctx *c, ss_state *S) {")
        self.depth = 1
        self.add(f"uint64_t perr = {num(prog.no_error, 0, MAX_ID)}; (void)perr;")
        if std["packet_length"] is not None:
            self.add(f"{self.fref(std['packet_length'])} = S->plen;")
        self.parser()
        if std["parser_error"] is not None:
            self.add(f"{self.fref(std['parser_error'])} = perr;")
        self.checksums(verify=True)
        self.control("ingress")
        self.depth = 0
        self.add("}")
        self.add("")
        self.add("static int64_t ss_egress(ss_ctx *c, ss_state *S, uint32_t port, int has_rid, "
                 "uint32_t rid, uint32_t instance, uint8_t *out, uint32_t cap) {")
        self.depth = 1
        self.add("(void)rid; (void)has_rid; (void)instance;")
        self.add(f"{self.fref(std['egress_port'])} = port;")
        self.add(f"{self.fref(std['egress_spec'])} = {num(prog.drop_port + 1, 1, MAX_ID + 1)};")
        if std["instance_type"] is not None:
            self.add(f"{self.fref(std['instance_type'])} = instance;")
        if std["egress_rid"] is not None:
            self.add(f"if (has_rid) {self.fref(std['egress_rid'])} = rid;")
        if std["packet_length"] is not None:
            self.add(f"{self.fref(std['packet_length'])} = S->plen_reg;")
        self.control("egress")
        self.add(f"if ({self.fref(std['egress_spec'])} == {num(prog.drop_port, 0, MAX_ID)} "
                 "|| S->abort) "
                 "return -1;")
        self.checksums(verify=False)
        self.add("uint32_t o = 0;")
        for header in prog.deparse_order:
            test = "" if header.metadata else f"if (S->v[{self.hid(header)}]) "
            nbytes = num(header.nbytes, 0, MAX_BYTES)
            self.add(f"{test}{{")
            self.add(f"    if (o + {nbytes} > cap) return -1;")
            self.add(f"    uint8_t *_p = out + o; memset(_p, 0, {nbytes});")
            pos = 0
            for f in header.fields:
                if pos % 8 == 0 and f.width in (8, 16, 32, 64):
                    self.add(f"    ss_st{_w(f.width)}(_p + {num(pos // 8, 0, MAX_BYTES)}, "
                             f"{self.fref(f)});")
                else:
                    self.add(f"    ss_put(_p, {num(pos, 0, MAX_HEADER_BITS)}, {_w(f.width)}, "
                             f"{self.fref(f)});")
                pos += f.width
            self.add(f"    o += {nbytes};")
            self.add("}")
        self.add("if (o + (S->plen - S->off) > cap) return -1;")
        self.add("memcpy(out + o, S->pkt + S->off, S->plen - S->off);")
        self.add("return o + (S->plen - S->off);")
        self.depth = 0
        self.add("}")
        return "\n".join(head + self.lines) + "\n"


def _bounds(op: str, a: Val, b: Val):
    if not (a.known and b.known):
        return None, None
    if op == "+":
        return a.lo + b.lo, a.hi + b.hi
    if op == "-":
        return a.lo - b.hi, a.hi - b.lo
    if op == "*":
        corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        return min(corners), max(corners)
    if op == "&" and (a.lo >= 0 or b.lo >= 0):
        return 0, min(x.hi for x in (a, b) if x.lo >= 0)
    if a.lo >= 0 and b.lo >= 0:
        return 0, mask(max(a.hi.bit_length(), b.hi.bit_length()))
    # Two's complement: values in [-2^k, 2^k) stay there under & | ^.
    k = max(max(abs(x.lo), abs(x.hi) + 1).bit_length() for x in (a, b))
    return -(1 << k), (1 << k) - 1


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
        return CEmitter(program).unit(runtime_path)
    except RecursionError:
        raise NativeUnsupported("the program's controls are nested too deeply") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:   # a gap in validate
        raise ValueError(f"malformed BMv2 JSON: {type(exc).__name__}: {exc}") from None
