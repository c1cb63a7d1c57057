"""Python printer, the packet's bytes: the parser (extracts, varbit fields, the state
machine), the checksums and hashes over a packet's fields, and each header's
``struct`` layout that the parser unpacks and the deparser packs. A mixin of
``PyPrinter`` (printer.py), which prints the controls and puts the two functions
together; every number goes through ``validate.num`` there as here.
"""

from __future__ import annotations

import struct

from innet_aggregation.softswitch.frontend import ir
from innet_aggregation.softswitch.frontend.program import Field, Header, mask
from innet_aggregation.softswitch.frontend.validate import HASH_ALGORITHMS, MAX_BITS, \
    MAX_HEADER_BITS, MAX_LOOKAHEAD, num

from .literals import MAX_BYTES, id_lit, lit

_STRUCT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
HASH_CODES = {algo: i for i, algo in enumerate(HASH_ALGORITHMS)}   # runtime.hash_value's


class PacketPrinter:
    """The parser's, the checksums' and the headers' code of ``PyPrinter``."""

    # ------------------------------------------------------------------ parser
    def s_Require(self, s: ir.Require) -> None:
        self.add(f"if plen - off < {num(s.nbytes, 0, MAX_LOOKAHEAD + MAX_BYTES)}:")
        self.add(f"    raise ParserError({id_lit(self.prog.too_short)})")

    def s_ExtractVL(self, s: ir.ExtractVL) -> None:
        header = s.header
        n, fixed = self.temp("n"), num(header.nbytes, 0, MAX_BYTES)
        self.add(f"{n} = {self.expr(s.nbits)}")
        self.add(f"if {n} & 7:")
        self.add(f"    raise ParserError({id_lit(s.invalid_argument)})")
        self.add(f"if {n} >= 2147483648 or plen - off < {fixed} + ({n} >> 3):")
        self.add(f"    raise ParserError({id_lit(self.prog.too_short)})")
        self.add(f"if {fixed} + ({n} >> 3) > {num(header.max_nbytes, 0, MAX_BYTES)}:")
        self.add(f"    raise ParserError({id_lit(s.too_long)})")
        self.add(f"_bits = int.from_bytes(pkt[off:off + {fixed} + ({n} >> 3)], 'big')")
        for f, after, width in self.varbit_layout(header, n):
            part = f"(_bits >> {after}) & {width}"
            if f.signed:
                half = 1 << (f.width - 1)
                part = f"((({part}) + {lit(half)}) & {lit(mask(f.width))}) - {lit(half)}"
            self.add(f"{self.v(f)} = {part}")
        self.add(f"{self.v(header.length)} = {n}")
        self.add(f"off += {fixed} + ({n} >> 3)")
        self.add(f"{self.vv(header)} = True")

    def varbit_layout(self, header: Header, n: str):
        """(field, its shift from the header's end, its mask) as code; ``n``: the varbit's bits."""
        rest = sum(f.width for f in header.fields if not f.varbit)
        for f in header.fields:
            if f.varbit:
                yield f, num(rest, 0, MAX_HEADER_BITS + 1), f"((1 << {n}) - 1)"
                continue
            rest -= f.width
            varbit_after = any(g.varbit for g in header.fields[header.fields.index(f):])
            shift = num(rest, 0, MAX_HEADER_BITS + 1)
            yield f, f"({shift} + {n})" if varbit_after else shift, lit(mask(f.width))

    def s_Verify(self, s: ir.Verify) -> None:
        self.add(f"if not {self.expr(s.cond)}:")
        self.add(f"    raise ParserError({self.expr(s.error)})")

    def s_Advance(self, s: ir.Advance) -> None:
        var = self.temp("adv")
        self.add(f"{var} = {self.expr(s.nbytes)}")
        self.add(f"if plen - off < {var}:")
        self.add(f"    raise ParserError({id_lit(self.prog.too_short)})")
        self.add(f"off += {var}")

    def parser(self) -> None:
        lowered = self.ir
        nstates = len(lowered.states)
        self.add("try:")
        self.src.depth += 1
        self.add(f"st = {num(lowered.init, 0, nstates)}")
        if lowered.parser_loops:
            self.add("_guard = 0")
        self.add("while True:")
        self.src.depth += 1
        if lowered.parser_loops:
            # A loop that extracts nothing would spin for ever: give up as too short.
            self.add("_guard += 1")
            self.add("if _guard > 100000:")
            self.add(f"    raise ParserError({id_lit(self.prog.too_short)})")
        for state in lowered.states:
            self.add(f"if st == {num(state.index, 0, nstates)}:")
            self.src.depth += 1
            self.where = f"parser state {state.index}"
            self.add("pass")
            self.block(state.ops)
            self.transitions(state)
            self.src.depth -= 1
        self.add("if st < 0:")
        self.add("    break")
        self.src.depth -= 2
        self.add("except ParserError as _e:")
        self.add("    perr = _e.code")

    def transitions(self, state: ir.ParserState) -> None:
        nstates = len(self.ir.states)
        default = num(state.default, -1, nstates)
        if state.key is None:
            self.add(f"st = {default}")
            return
        self.add(f"_key = {self.expr(state.key)}")
        for i, (value, case_mask, nxt) in enumerate(state.cases):
            cond = (f"(_key & {lit(case_mask)}) == {lit(value & case_mask)}"
                    if case_mask is not None else f"_key == {lit(value)}")
            self.add(f"{'elif' if i else 'if'} {cond}:")
            self.add(f"    st = {num(nxt, -1, nstates)}")
        self.add("else:" if state.cases else "if True:")
        self.add(f"    st = {default}")

    # ------------------------------------------------------------------ checksums
    def checksums(self, checksums: list, verify: bool) -> None:
        for cs in checksums:
            if cs.cond is not None:
                self.add(f"if {self.expr(cs.cond)}:")
                self.src.depth += 1
            self.add(f"_csum = {self.calculation(cs.calc)}")
            target = cs.target
            if verify:
                err = self.std("checksum_error")
                self.add(f"if _csum != {self.v(target)}:")
                self.add(f"    {self.v(err)} = 1" if err is not None else "    pass")
            else:
                value = ir.Const(0).bounded(0, mask(HASH_ALGORITHMS[cs.calc.algo]))
                self.add(f"{self.v(target)} = "
                         f"{self.store(value, '_csum', target.width, target.signed)}")
            if cs.cond is not None:
                self.src.depth -= 1

    def s_HashOffset(self, s: ir.HashOffset) -> None:
        base, size = self.temp("hb"), self.temp("hs")
        self.add(f"{base} = {self.expr(s.base)}")
        self.add(f"{size} = {self.expr(s.size)}")
        value = self.calculation(s.calc)
        code = f"(({value}) % ({size} or 1) + {base}) & {lit(mask(64))}"   # uint64_t, as BMv2
        f = s.field
        self.add(f"{self.v(f)} = "
                 f"{self.store(ir.Const(0).bounded(0, mask(64)), code, f.width, f.signed)}")

    def calculation(self, calc: ir.Calculation) -> str:
        """Prints the lines that gather ``calc``'s input bits into ``_cbits`` (``_cn`` of
        them); returns the code of its value."""
        self.add("_cbits = 0")
        self.add("_cn = 0")
        for header, fields in calc.inputs:
            self.checksum_input(header, fields)
        self.add("_cbits <<= (-_cn) & 7")
        data = "_cbits.to_bytes((_cn + 7) >> 3, 'big')"
        if calc.payload:
            data += " + bytes(pkt[off:])"
        if calc.algo == "csum16":
            return f"csum16({data})"
        return f"_hash({lit(HASH_CODES[calc.algo])}, {data})"

    def checksum_input(self, header, fields) -> None:
        """Append one input to _cbits; the fields of an invalid header are skipped, a
        varbit field is as long as it is now."""
        if header is None:
            value, width = fields
            self.add(f"_cbits = (_cbits << {num(width, 1, MAX_BITS + 1)}) | {lit(value)}")
            self.add(f"_cn += {num(width, 1, MAX_BITS + 1)}")
            return
        prefix = ""
        if not header.metadata:
            self.add(f"if {self.vv(header)}:")
            prefix = "    "
        runs: list = [[]]                 # fixed-width runs, split at the varbit field
        for f in fields:
            if f.varbit:
                runs += [f, []]
            else:
                runs[-1].append(f)
        for run in runs:
            if isinstance(run, Field):
                n = self.v(header.length)
                self.add(f"{prefix}_cbits = (_cbits << {n}) | {self.v(run)}")
                self.add(f"{prefix}_cn += {n}")
            elif run:
                width = num(sum(f.width for f in run), 0, MAX_HEADER_BITS + 1)
                parts = " | ".join(f"({self.bits(f)} << {num(s, 0, MAX_HEADER_BITS)})" if s
                                   else self.bits(f) for f, s in _shifts(run))
                self.add(f"{prefix}_cbits = (_cbits << {width}) | {parts}")
                self.add(f"{prefix}_cn += {width}")
        if prefix and not any(runs):
            self.add(f"{prefix}pass")

    # ------------------------------------------------------------------ headers
    def header_struct(self, header: Header):
        """struct layout for one header: format, how to split it into fields and back."""
        if header.name in self.structs:
            return self.structs[header.name]
        fmt = "!"
        unpack_lines = []   # statements turning piece vars p0.. into field vars
        pack_args = []      # expressions of field vars for each struct piece
        pieces = 0
        group: list[Field] = []
        bits = 0
        segments = []
        for field in header.fields:
            group.append(field)
            bits += field.width
            if bits % 8 == 0:
                segments.append(group)
                group, bits = [], 0
        for seg in segments:
            nbytes = sum(f.width for f in seg) // 8
            if len(seg) == 1 and nbytes in _STRUCT_CODES:
                code = _STRUCT_CODES[nbytes]
                fmt += code.lower() if seg[0].signed else code
                unpack_lines.append((self.v(seg[0]), f"_p{pieces}"))
                pack_args.append(self.v(seg[0]))
                pieces += 1
                continue
            # Split the segment into standard struct sizes, big-endian.
            sizes = []
            rest = nbytes
            for size in (8, 4, 2, 1):
                while rest >= size:
                    sizes.append(size)
                    rest -= size
            piece_vars = []
            for size in sizes:
                fmt += _STRUCT_CODES[size]
                piece_vars.append((f"_p{pieces}", size))
                pieces += 1
            total_bits = nbytes * 8
            joined = []
            shift = total_bits
            for var, size in piece_vars:
                shift -= size * 8
                joined.append(f"({var} << {lit(shift)})" if shift else var)
            seg_expr = " | ".join(joined)
            unpack_lines.append(("_seg", seg_expr))
            shift = total_bits
            fields_expr = []
            for f in seg:
                shift -= f.width
                part = (f"(_seg >> {lit(shift)}) & {lit(mask(f.width))}" if shift
                        else f"_seg & {lit(mask(f.width))}")
                if f.signed:
                    half = 1 << (f.width - 1)
                    part = f"((({part}) + {lit(half)}) & {lit(mask(f.width))}) - {lit(half)}"
                unpack_lines.append((self.v(f), part))
                fields_expr.append((f, shift))
            packed = " | ".join(f"({self.bits(f)} << {lit(s)})" if s else self.bits(f)
                                for f, s in fields_expr)
            shift = total_bits
            for var, size in piece_vars:
                shift -= size * 8
                if shift == total_bits - size * 8:    # the top piece: already in range
                    pack_args.append(f"({packed}) >> {lit(shift)}" if shift else f"({packed})")
                else:
                    part = f"(({packed}) >> {lit(shift)})" if shift else f"({packed})"
                    pack_args.append(f"{part} & {lit(mask(size * 8))}")
        struct_obj = struct.Struct(fmt)
        name = f"S_{num(header.id, 0, len(self.prog.headers))}"
        self.ns[name] = struct_obj
        layout = (name, pieces, unpack_lines, pack_args)
        self.structs[header.name] = layout
        return layout

    def s_Extract(self, s: ir.Extract) -> None:
        header = s.header
        name, pieces, unpack_lines, _ = self.header_struct(header)
        nbytes = num(header.nbytes, 0, MAX_BYTES)
        self.add(f"if plen - off < {nbytes}:")
        self.add(f"    raise ParserError({id_lit(self.prog.too_short)})")
        simple = all(target.startswith("F_") and value.startswith("_p")
                     for target, value in unpack_lines)
        if simple:
            targets = ", ".join(target for target, _ in unpack_lines)
            self.add(f"{targets}, = {name}.unpack_from(pkt, off)")
        else:
            piece_names = ", ".join(f"_p{i}" for i in range(pieces))
            self.add(f"{piece_names}, = {name}.unpack_from(pkt, off)")
            for target, value in unpack_lines:
                self.add(f"{target} = {value}")
        self.add(f"off += {nbytes}")
        self.add(f"{self.vv(header)} = True")

    def deparse_varbit(self, header: Header) -> None:
        n = self.v(header.length)
        self.add(f"if {self.vv(header)}:")
        parts = [f"({self.bits(f)} << {shift})" for f, shift, _ in self.varbit_layout(header, n)]
        self.add(f"    _out.append(({' | '.join(parts)}).to_bytes({self.size(header)}, 'big'))")


def _shifts(fields):
    shift = sum(f.width for f in fields)
    for f in fields:
        shift -= f.width
        yield f, shift
