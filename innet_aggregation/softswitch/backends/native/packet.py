"""C printer, the packet's bytes: the parser (extracts, varbit fields, the state
machine), the checksums and hashes over a packet's fields, and the deparser. A mixin
of ``CPrinter`` (printer.py), which prints the controls and the unit; every number
goes through ``validate.num`` there as here (literals.py).
"""

from __future__ import annotations

from innet_aggregation.softswitch.frontend import ir
from innet_aggregation.softswitch.frontend.program import Header, mask
from innet_aggregation.softswitch.frontend.validate import HASH_ALGORITHMS, MAX_CHECKSUM_BITS, \
    MAX_HEADER_BITS, MAX_ID, MAX_LOOKAHEAD, num

from .literals import MAX_BYTES, U64, NativeUnsupported, exact_kind, lit, wlit

HASH_CODES = {algo: i for i, algo in enumerate(HASH_ALGORITHMS)}   # runtime.c's ss_calc


class PacketPrinter:
    """The parser's, the checksums' and the deparser's code of ``CPrinter``."""

    # ------------------------------------------------------------------ parser
    def fail(self, code: str) -> str:
        return f"{{ perr = {code}; goto {self.parsed}; }}"

    def too_short(self, nbytes: str) -> None:
        self.add(f"if (S->plen - S->off < (uint64_t)({nbytes})) "
                 f"{self.fail(num(self.prog.too_short, 0, MAX_ID))}")

    def s_Require(self, s: ir.Require) -> None:
        self.too_short(num(s.nbytes, 0, MAX_LOOKAHEAD + MAX_BYTES))

    def s_Extract(self, s: ir.Extract) -> None:
        header = s.header
        self.too_short(num(header.nbytes, 0, MAX_BYTES))
        self.add("{ const uint8_t *_p = S->pkt + S->off;")
        for f, pos, n in self.runs(header):
            if n > 1:
                self.add(f"  ss_ld{wlit(f.width)}n({self.run_ref(f, n)}, "
                         f"_p + {num(pos // 8, 0, MAX_BYTES)}, {num(n, 2, MAX_ID)}U);")
                continue
            if pos % 8 == 0 and f.width in (8, 16, 32, 64):
                code = f"ss_ld{wlit(f.width)}(_p + {num(pos // 8, 0, MAX_BYTES)})"
            else:
                code = f"ss_get(_p, {num(pos, 0, MAX_HEADER_BITS)}, {wlit(f.width)})"
            if f.signed:
                code = f"ss_sext({code}, {wlit(f.width)})"
            self.add(f"  {self.fref(f)} = {code};")
        self.add(f"  S->off += {num(header.nbytes, 0, MAX_BYTES)}; "
                 f"S->v[{self.hid(header)}] = 1; }}")

    def s_ExtractVL(self, s: ir.ExtractVL) -> None:
        header = s.header
        fixed = num(header.nbytes, 0, MAX_BYTES)
        if exact_kind(s.nbits, "a varbit length") != "u":
            raise NativeUnsupported("a varbit length that may be negative")
        self.add(f"{{ uint64_t _n = {self.expr(s.nbits)};")
        self.add(f"  if (_n & 7) {self.fail(num(s.invalid_argument, 0, MAX_ID))}")
        self.add(f"  if (_n >= 2147483648ULL || S->plen - S->off < {fixed} + (_n >> 3)) "
                 f"{self.fail(num(self.prog.too_short, 0, MAX_ID))}")
        self.add(f"  if ({fixed} + (_n >> 3) > {num(header.max_nbytes, 0, MAX_BYTES)}) "
                 f"{self.fail(num(s.too_long, 0, MAX_ID))}")
        self.add("  const uint8_t *_p = S->pkt + S->off;")
        for f, pos, width in self.varbit_layout(header, "_n"):
            code = f"ss_get(_p, {pos}, {width})"
            if f.signed:
                code = f"ss_sext({code}, {wlit(f.width)})"
            self.add(f"  {self.fref(f)} = {code};")
        self.add(f"  {self.fref(header.length)} = _n; S->off += {fixed} + (_n >> 3); "
                 f"S->v[{self.hid(header)}] = 1; }}")

    def s_Verify(self, s: ir.Verify) -> None:
        self.add(f"if (!({self.expr(s.cond)})) {self.fail(self.expr(s.error))}")

    def s_Advance(self, s: ir.Advance) -> None:
        if exact_kind(s.nbytes, "an advance") != "u":
            raise NativeUnsupported("advance by a possibly negative amount")
        self.add(f"{{ uint64_t _adv = {self.expr(s.nbytes)};")
        self.add(f"  if (S->plen - S->off < _adv) {self.fail(num(self.prog.too_short, 0, MAX_ID))}")
        self.add("  S->off += _adv; }")

    def parser(self) -> None:
        lowered, prog = self.ir, self.prog
        self.parsed = self.label("parsed")
        nstates = len(lowered.states)
        self.add(f"int st = {num(lowered.init, 0, nstates)};")
        self.add("for (int _guard = 0; st >= 0; _guard++) {")
        self.depth += 1
        # A parser loop that extracts nothing would spin for ever: give up as too short.
        self.add(f"if (_guard > 100000) {self.fail(num(prog.too_short, 0, MAX_ID))}")
        self.add("switch (st) {")
        for state in lowered.states:
            self.nested(f"case {num(state.index, 0, nstates)}: {{", self.state, state)
        self.add("default: st = -1;")
        self.add("}")
        self.depth -= 1
        self.add("}")
        self.add(f"{self.parsed}: ;")

    def state(self, state: ir.ParserState) -> None:
        nstates = len(self.ir.states)
        self.block(state.ops)
        default = num(state.default, -1, nstates)
        if state.key is None:
            self.add(f"st = {default};")
        else:
            if state.key_bits > 64:
                raise NativeUnsupported(f"a select key of more than 64 bits "
                                        f"(parser state {state.index})")
            self.add(f"{{ uint64_t _key = {self.expr(state.key)};")
            for i, (value, case_mask, nxt) in enumerate(state.cases):
                cond = (f"(_key & {lit(case_mask)}) == {lit(value & case_mask)}"
                        if case_mask is not None else f"_key == {lit(value)}")
                self.add(f"  {'else ' if i else ''}if ({cond}) st = {num(nxt, -1, nstates)};")
            self.add(f"  {'else ' if state.cases else ''}st = {default}; }}")
        self.add("break;")

    # ------------------------------------------------------------------ checksums
    def calculation(self, calc: ir.Calculation) -> str:
        """Prints the lines that gather ``calc``'s input into ``_cb`` (``_cn`` bits);
        returns the C expression of its value."""
        nbits = sum(sum(f.width for f in fields) if header is not None else fields[1]
                    for header, fields in calc.inputs)
        self.add(f"uint8_t _cb[{num((nbits + 7) // 8 + 16, 16, MAX_CHECKSUM_BITS // 8 + 17)}] "
                 "= {0}; uint32_t _cn = 0;")
        for header, fields in calc.inputs:
            if header is None:
                value, width = fields
                if width > 64:
                    raise NativeUnsupported(f"a {width}-bit constant in a checksum")
                self.add(f"ss_put(_cb, _cn, {wlit(width)}, {lit(value)}); _cn += {wlit(width)};")
                continue
            test = "" if header.metadata else f"if (S->v[{self.hid(header)}]) "
            puts = " ".join(self.calc_put(header, f) for f in fields)
            self.add(f"{test}{{ {puts} }}")
        payload = ("S->pkt + S->off, S->plen - S->off" if calc.payload else "0, 0")
        return (f"ss_calc({num(HASH_CODES[calc.algo], 0, len(HASH_CODES))}, _cb, "
                f"(_cn + 7) >> 3, {payload})")

    def calc_put(self, header: Header, f) -> str:
        """One field into ``_cb``: a varbit one as many bits as it holds now."""
        width = f"(int){self.fref(header.length)}" if f.varbit else wlit(f.width)
        return f"ss_put(_cb, _cn, {width}, {self.fref(f)}); _cn += {width};"

    def checksum(self, cs: ir.Checksum, verify: bool) -> None:
        self.add(f"uint64_t _csum = {self.calculation(cs.calc)};")
        target = cs.target
        if verify:
            err = self.prog.std("checksum_error")
            if err is not None:
                self.add(f"if (_csum != {self.fref(target)}) {self.fref(err)} = 1;")
        else:
            value = ir.Const(0).bounded(0, mask(HASH_ALGORITHMS[cs.calc.algo]))
            self.add(f"{self.fref(target)} = "
                     f"{self.store(value, '_csum', target.width, target.signed)};")

    def s_HashOffset(self, s: ir.HashOffset) -> None:
        self.add("{")
        self.depth += 1
        self.add(f"uint64_t _hb = {self.expr(s.base)}, _hs = {self.expr(s.size)};")
        value = self.calculation(s.calc)
        f = s.field
        code = f"({value} % (_hs ? _hs : 1) + _hb)"       # uint64_t, as BMv2
        self.add(f"{self.fref(f)} = "
                 f"{self.store(ir.Const(0).bounded(0, U64), code, f.width, f.signed)};")
        self.depth -= 1
        self.add("}")

    def checksums(self, checksums: list, verify: bool) -> None:
        for cs in checksums:
            if cs.cond is None:
                self.nested("{", self.checksum, cs, verify)
            else:
                self.nested(f"if ({self.expr(cs.cond)}) {{", self.checksum, cs, verify)

    # ------------------------------------------------------------------ deparser
    def varbit_layout(self, header: Header, n: str):
        """(field, its bit position, its width) as C code; ``n``: the varbit's bits now."""
        pos, after = 0, False
        for f in header.fields:
            at = num(pos, 0, MAX_HEADER_BITS)
            yield f, f"({at} + {n})" if after else at, f"(int){n}" if f.varbit else wlit(f.width)
            if f.varbit:
                after = True
            else:
                pos += f.width

    def deparse_varbit(self, header: Header) -> None:
        self.add(f"if (S->v[{self.hid(header)}]) {{")
        self.add(f"    uint64_t _n = {self.fref(header.length)}; uint64_t _nb = {self.size(header)};")
        self.add("    if (o + _nb > cap) return -1;")
        self.add("    uint8_t *_p = out + o; memset(_p, 0, _nb);")
        for f, pos, width in self.varbit_layout(header, "_n"):
            self.add(f"    ss_put(_p, {pos}, {width}, {self.fref(f)});")
        self.add("    o += _nb;")
        self.add("}")

    def deparser(self) -> None:
        """The valid headers' bytes into ``out`` from offset ``o``, in deparse order; a
        multicast copy (``S->prep`` set) copies the headers every copy deparses alike
        (frontend/prepared.py) from the bytes ``ss_prepare`` made once."""
        self.add("uint32_t o = 0;")
        shared = self.prepared.shared
        self.deparse(self.ir.deparse[:len(self.ir.deparse) - len(shared)])
        if not shared:
            return
        self.add("if (S->prep) {")
        self.add("    if (o + S->nprep > cap) return -1;")
        self.add("    memcpy(out + o, S->prep, S->nprep); o += S->nprep;")
        self.add("} else {")
        own, self.touched = self.touched, set()
        self.depth += 1
        self.deparse(shared)
        self.depth -= 1
        self.shared_fields, self.touched = self.touched - own, own
        self.add("}")

    def prepare(self) -> None:
        """ss_prepare: the headers every copy of a multicast deparses alike, once."""
        self.add("static int64_t ss_prepare(const ss_state *S, uint8_t *out, uint32_t cap) {")
        self.depth = 1
        self.add("uint32_t o = 0;")
        self.deparse(self.prepared.shared)
        self.add("return o;")
        self.depth = 0
        self.add("}")

    def deparse(self, headers: list) -> None:
        for header in headers:
            if header.length is not None:
                self.deparse_varbit(header)
                continue
            test = "" if header.metadata else f"if (S->v[{self.hid(header)}]) "
            nbytes = num(header.nbytes, 0, MAX_BYTES)
            self.add(f"{test}{{")
            self.add(f"    if (o + {nbytes} > cap) return -1;")
            whole = all(pos % 8 == 0 and f.width in (8, 16, 32, 64)
                        for f, pos, _ in self.runs(header))
            # Every byte written by a field: nothing to clear first.
            self.add(f"    uint8_t *_p = out + o;{'' if whole else f' memset(_p, 0, {nbytes});'}")
            for f, pos, n in self.runs(header):
                at = num(pos // 8, 0, MAX_BYTES)
                if n > 1:
                    self.add(f"    ss_st{wlit(f.width)}n(_p + {at}, {self.run_ref(f, n)}, "
                             f"{num(n, 2, MAX_ID)}U);")
                elif pos % 8 == 0 and f.width in (8, 16, 32, 64):
                    self.add(f"    ss_st{wlit(f.width)}(_p + {at}, {self.fref(f)});")
                else:
                    self.add(f"    ss_put(_p, {num(pos, 0, MAX_HEADER_BITS)}, {wlit(f.width)}, "
                             f"{self.fref(f)});")
            self.add(f"    o += {nbytes};")
            self.add("}")

    # ------------------------------------------------------------------ runs
    RUN = 8     # like fields side by side from which one loop moves them

    def runs(self, header: Header):
        """(field, its bit position, n): n > 1 where the field starts a run of n unsigned
        whole-byte fields of one width, side by side in the packet and by id (a header
        of values), which one loop the C compiler vectorizes moves; else 1."""
        fields, pos, i = header.fields, 0, 0
        while i < len(fields):
            f, n = fields[i], 1
            if pos % 8 == 0 and f.width in (8, 16, 32, 64) and not f.signed:
                while (i + n < len(fields) and fields[i + n].width == f.width
                       and not fields[i + n].signed and fields[i + n].id == f.id + n):
                    n += 1
            n = n if n >= self.RUN else 1
            yield f, pos, n
            pos += f.width * n
            i += n

    def run_ref(self, first, n: int) -> str:
        """The fields of a run, from ``first``, as a pointer to the first's slot."""
        if self.touched is not None:
            self.touched.update(range(first.id, first.id + n))
        return f"S->f + {num(first.id, 0, len(self.prog.field_list))}"
