"""Python emitter: a checked ``frontend.Program`` as two Python functions.

Every header field becomes a local variable of ``ingress`` (parser, verify
checksums, ingress control) and ``egress`` (egress control, update checksums,
deparser); the state between them is one tuple, so a multicast copy is free.
Actions are inlined where their table is applied and each control is nested
``if`` blocks, so no packet ever walks the JSON. Values follow BMv2: expressions
use unbounded integers (p4c inserts the masks it needs), and a value is truncated
to the field's width only when it is stored. This backend runs every program the
front half accepts; the C emitter falls back to it. Names become identifiers of
``[A-Za-z0-9_]`` only, and every number goes through ``validate.num`` (an int in
range, or refused).
"""

from __future__ import annotations

import keyword
import logging
import random
import re
import struct

from innet_aggregation.softswitch.frontend.program import Field, Header, If, Program, Unsupported, hexstr, mask
from innet_aggregation.softswitch.frontend.validate import MAX_BITS, MAX_HEADER_BITS, MAX_ID, MAX_LOOKAHEAD, num


class ParserError(Exception):
    """Raised by generated parser code; carries the P4 error code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _Exit(Exception):
    """The P4 ``exit`` statement: leaves the current control."""


class _Return(Exception):
    """A ``return`` inside a conditional of an action: leaves the action."""


def csum16(data: bytes) -> int:
    """The one's complement checksum BMv2 computes for HashAlgorithm.csum16."""
    if len(data) & 1:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


_STRUCT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
_BIG = 1 << (MAX_BITS + 1)               # bounds every constant and mask of a program
MAX_BYTES = MAX_HEADER_BITS // 8 + 1


def _lit(value: int) -> str:
    return num(value, -_BIG, _BIG)


def _id(value: int) -> str:
    return num(value, 0, MAX_ID)


def _ident(text: str) -> str:
    out = re.sub(r"\W", "_", text)
    return out if out and not out[0].isdigit() and not keyword.iskeyword(out) else f"x{out}"


# Typing of generated expressions: ("b",) bool, ("u", w) unsigned < 2^w,
# ("s", w) signed w-bit, ("i",) any integer.
BOOL = ("b",)
ANY = ("i",)


def _fits(info, width: int, signed: bool) -> bool:
    kind = info[0]
    if signed:
        return (kind == "s" and info[1] <= width) or (kind == "u" and info[1] < width)
    return kind == "u" and info[1] <= width


def store_code(code: str, info, width: int, signed: bool) -> str:
    """``code`` truncated to a ``width``-bit field, the way BMv2 stores a value."""
    if info == BOOL:
        code = f"(1 if {code} else 0)"
        info = ("u", 1)
    if _fits(info, width, signed):
        return code
    if signed:
        half = 1 << (width - 1)
        return f"((({code}) + {_lit(half)}) & {_lit(mask(width))}) - {_lit(half)}"
    return f"({code}) & {_lit(mask(width))}"


class Source:
    """Indented Python source being generated."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0
        self.counter = 0

    def add(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def temp(self, stem: str = "t") -> str:
        self.counter += 1
        return f"_{stem}{self.counter}"

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Compiled:
    """What the generator hands the runtime: generated functions and the specs they use."""

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


class Generator:
    """Builds the two packet functions for one checked program."""

    def __init__(self, program: Program):
        self.prog = program
        self.drop_port = program.drop_port
        self.out = Compiled(program)
        self.ns: dict = {"ParserError": ParserError, "_Exit": _Exit, "_Return": _Return,
                         "csum16": csum16,
                         "_randint": random.Random().randint}
        self.std, self.field, self.header = program.std, program.field, program.header
        self.structs: dict[str, tuple] = {}
        self.hoist = None
        # Python names: one local per field, one per header validity bit.
        self.vars: dict[int, str] = {}
        self.valid_vars: dict[int, str] = {}
        used_prefixes, used_vars = set(), set()
        for header in program.headers.values():
            prefix = _ident(header.name)
            while prefix in used_prefixes:
                prefix += "_"
            used_prefixes.add(prefix)
            self.valid_vars[header.id] = f"V_{prefix}"
            for field in header.fields:
                var = f"F_{prefix}__{_ident(field.name)}"
                while var in used_vars:
                    var += "_"
                used_vars.add(var)
                self.vars[field.id] = var
        for spec in program.registers.values():
            self.ns[f"R{_id(spec.id)}"] = spec.cells
        for spec in program.counters.values():
            self.ns[f"CP{_id(spec.id)}"] = spec.packets
            self.ns[f"CB{_id(spec.id)}"] = spec.bytes
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
        return f"({self.v(field)} & {_lit(mask(field.width))})" if field.signed else self.v(field)


    def valid_code(self, header: Header) -> str:
        return "True" if header.metadata else self.vv(header)

    # ------------------------------------------------------------------ expressions
    def expr(self, node, src: Source, params=None):
        """Python source and type for a JSON type/value object."""
        kind = node.get("type")
        value = node.get("value")
        if kind == "field":
            if value[1] == "$valid$":
                return f"(1 if {self.valid_code(self.header(value[0]))} else 0)", ("u", 1)
            field = self.field(value)
            return self.v(field), (("s", field.width) if field.signed else ("u", field.width))
        if kind == "hexstr":
            number = hexstr(value)
            return (_lit(number), ("u", number.bit_length()) if number >= 0 else ANY)
        if kind == "bool":
            return ("True" if value else "False"), BOOL
        if kind in ("runtime_data", "local"):
            if params is None or value >= len(params):
                raise Unsupported(f"action parameter {value} used outside an action")
            return f"ad{num(value, 0, len(params))}", ("u", params[value][1])
        if kind == "expression":
            return self.operation(value, src, params)
        raise Unsupported(f"expression operand of type {kind!r}")

    def operation(self, node, src: Source, params):
        if node.get("type") == "expression":    # p4c nests {"type": "expression", "value": {...}}
            return self.operation(node["value"], src, params)
        op = node["op"]
        left, right = node.get("left"), node.get("right")
        if op == "valid":
            header = self.header(right["value"])
            return self.valid_code(header), BOOL
        if op == "d2b" and right.get("type") == "field" and right["value"][1] == "$valid$":
            return self.valid_code(self.header(right["value"][0])), BOOL
        if op in ("not", "~", "d2b", "b2d"):
            code, info = self.expr(right, src, params)
            if op == "not":
                return f"(not {code})", BOOL
            if op == "~":
                return f"(~{code})", ANY
            if op == "d2b":
                return (code, BOOL) if info == BOOL else (f"({code} != 0)", BOOL)
            return f"(1 if {code} else 0)", ("u", 1)
        if op == "?":
            cond, _ = self.expr(node["cond"], src, params)
            lcode, linfo = self.expr(left, src, params)
            rcode, rinfo = self.expr(right, src, params)
            return f"({lcode} if {cond} else {rcode})", _union(linfo, rinfo)
        if op in ("two_comp_mod", "sat_cast", "usat_cast"):
            lcode, linfo = self.expr(left, src, params)
            if right.get("type") != "hexstr":
                raise Unsupported(f"{op} with a non-constant width")
            width = hexstr(right["value"])
            if op == "two_comp_mod":
                half = 1 << (width - 1)
                if _fits(linfo, width, True):
                    return lcode, ("s", width)
                if linfo[0] == "u" and linfo[1] == width and re.fullmatch(r"\w+", lcode):
                    return (f"({lcode} - {_lit(1 << width)} if {lcode} >= {_lit(half)} "
                            f"else {lcode})", ("s", width))
                return (f"((({lcode}) + {_lit(half)}) & {_lit(mask(width))}) - {_lit(half)}",
                        ("s", width))
            tmp = src.temp()
            if op == "sat_cast":
                lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
                info = ("s", width)
            else:
                lo, hi = 0, mask(width)
                info = ("u", width)
            lo, hi = _lit(lo), _lit(hi)
            return (f"({lo} if ({tmp} := {lcode}) < {lo} else {hi} if {tmp} > {hi} else {tmp})",
                    info)
        binary = {"+": "+", "-": "-", "*": "*", "/": "//", "%": "%", ">>": ">>",
                  "&": "&", "|": "|", "^": "^", "==": "==", "!=": "!=", ">": ">", "<": "<",
                  ">=": ">=", "<=": "<=", "and": "and", "or": "or"}
        if op == "<<":
            lcode, _ = self.expr(left, src, params)
            rcode, rinfo = self.expr(right, src, params)
            if right.get("type") == "hexstr" and hexstr(right["value"]) < 4096:
                return f"({lcode} << {rcode})", ANY
            # A shift by a runtime amount is bounded so a huge count cannot exhaust memory.
            return f"({lcode} << {rcode} if {rcode} < 4096 else 0)", ANY
        if op in binary:
            lcode, linfo = self.expr(left, src, params)
            rcode, rinfo = self.expr(right, src, params)
            code = f"({lcode} {binary[op]} {rcode})"
            if op in ("==", "!=", ">", "<", ">=", "<=", "and", "or"):
                return code, BOOL
            if linfo[0] == "u" and rinfo[0] == "u":
                lw, rw = linfo[1], rinfo[1]
                if op == "&":
                    return code, ("u", min(lw, rw))
                if op in ("|", "^"):
                    return code, ("u", max(lw, rw))
                if op == "+":
                    return code, ("u", max(lw, rw) + 1)
                if op == "*":
                    return code, ("u", lw + rw)
                if op in ("//", "%", ">>"):
                    return code, ("u", lw)
            if op == "&" and (linfo[0] == "u" or rinfo[0] == "u"):
                return code, ("u", linfo[1] if linfo[0] == "u" else rinfo[1])
            return code, ANY
        raise Unsupported(f"expression operator {op!r}")

    # ------------------------------------------------------------------ primitives
    def primitive(self, prim: dict, src: Source, params, where: str) -> None:
        start = len(src.lines)
        self.emit_primitive(prim, src, params, where)
        if self.hoist is None:
            return
        # Values known to sit in fields (p4c copies an index into a temporary field
        # right before using it): forget what this primitive overwrote.
        known = self.hoist["known"]
        for var in set(re.findall(r"^\s*(F_\w+) = ", "\n".join(src.lines[start:]), re.M)):
            for name, code in list(known.items()):
                if name == var or re.search(rf"\b{var}\b", code):
                    del known[name]
        if prim["op"] in ("assign", "modify_field") and len(src.lines) == start + 1:
            target, _, code = src.lines[start].strip().partition(" = ")
            if ":=" not in code and "_randint" not in code and target not in code:
                known[target] = code

    def emit_primitive(self, prim: dict, src: Source, params, where: str) -> None:
        op = prim["op"]
        args = prim.get("parameters", [])
        if op in ("assign", "modify_field"):
            dst = args[0]
            if dst["type"] != "field":
                raise Unsupported(f"{op} to a {dst['type']} in {where}")
            field = self.field(dst["value"])
            code, info = self.expr(args[1], src, params)
            value = store_code(code, info, field.width, field.signed)
            if self.hoist is not None and not self.hoist["check"]:
                value = self.hoist["indices"].get(value, value)   # already computed
            src.add(f"{self.v(field)} = {value}")
        elif op in ("assign_header", "copy_header"):
            dst = self.header(args[0]["value"])
            self.copy_header(dst, self.prog.header_choice(args[1]), src, params, where)
        elif op in ("add_header", "add_header_fast"):
            header = self.header(args[0]["value"])
            if header.metadata:
                return
            src.add(f"if not {self.vv(header)}:")
            src.depth += 1
            if op == "add_header":
                for f in header.fields:
                    src.add(f"{self.v(f)} = 0")
                src.add(f"plen_reg += {num(header.nbytes, 0, MAX_BYTES)}")
            src.add(f"{self.vv(header)} = True")
            src.depth -= 1
        elif op == "remove_header":
            header = self.header(args[0]["value"])
            if header.metadata:
                return
            src.add(f"if {self.vv(header)}:")
            src.add(f"    {self.vv(header)} = False")
            src.add(f"    plen_reg -= {num(header.nbytes, 0, MAX_BYTES)}")
        elif op in ("mark_to_drop", "drop"):
            for field, value in self.prog.drop_stores(op):
                src.add(f"{self.v(field)} = {_id(value)}")
        elif op == "register_read":
            field = self.field(args[0]["value"])
            reg = self.prog.register(args[1]["value"])
            index = self.index(args[2], src, params)
            value = store_code(f"R{_id(reg.id)}[{index[0]}]", ("u", reg.width),
                               field.width, field.signed)
            self.guarded(src, index, reg.size, f"{self.v(field)} = {value}")
        elif op == "register_write":
            reg = self.prog.register(args[0]["value"])
            index = self.index(args[1], src, params)
            code, info = self.expr(args[2], src, params)
            value = store_code(code, info, reg.width, False)
            self.guarded(src, index, reg.size, f"R{_id(reg.id)}[{index[0]}] = {value}")
        elif op == "count":
            ctr = self.prog.counter(args[0]["value"])
            index = self.index(args[1], src, params)
            self.guarded(src, index, ctr.size,
                         f"CP{_id(ctr.id)}[{index[0]}] += 1",
                         f"CB{_id(ctr.id)}[{index[0]}] += in_len")
        elif op == "modify_field_rng_uniform":
            field = self.field(args[0]["value"])
            lo, _ = self.expr(args[1], src, params)
            hi, _ = self.expr(args[2], src, params)
            lo_var, hi_var = src.temp("lo"), src.temp("hi")
            src.add(f"{lo_var} = {lo}")
            src.add(f"{hi_var} = {hi}")
            src.add(f"if {lo_var} <= {hi_var}:")
            src.add(f"    {self.v(field)} = "
                    + store_code(f"_randint({lo_var}, {hi_var})", ANY, field.width, field.signed))
        elif op == "exit":
            src.add("raise _Exit")
        elif op in ("no_op", "log_msg"):
            src.add("pass")
        elif op in ("assert", "assume"):
            cond, _ = self.expr(args[0], src, params)
            src.add(f"if not {cond}:")
            src.add(f"    _log_assert({where!r})")
        else:
            raise Unsupported(f"primitive {op!r} (in {where})")

    def copy_header(self, dst: Header, source, src: Source, params, where: str) -> None:
        """``dst = source``; a (cond, then, else) source picks at run time."""
        if isinstance(source, tuple):
            cond, left, right = source
            code, _ = self.expr(cond, src, params)
            src.add(f"if {code}:")
            for branch in (left, right):
                src.depth += 1
                self.copy_header(dst, branch, src, params, where)
                src.depth -= 1
                if branch is left:
                    src.add("else:")
            return
        if [f.width for f in dst.fields] != [f.width for f in source.fields]:
            raise Unsupported(f"header copy between different header types in {where}")
        src.add(f"if {self.valid_code(source)}:")
        src.depth += 1
        for d, s in zip(dst.fields, source.fields):
            src.add(f"{self.v(d)} = {self.v(s)}")
        if not dst.metadata:
            src.add(f"{self.vv(dst)} = True")
        src.depth -= 1
        src.add("else:")
        src.add(f"    {self.vv(dst)} = False" if not dst.metadata else "    pass")

    def index(self, node, src: Source, params):
        code, info = self.expr(node, src, params)
        if self.hoist is not None:
            code = self.hoist["known"].get(code, code)
        if re.fullmatch(r"[A-Za-z_]\w*|\d+", code):
            return code, info
        if self.hoist is not None:
            if ":=" in code:
                self.hoist["unstable"] = True
            var = self.hoist["indices"].get(code)
            if var is None:
                if not self.hoist["check"]:
                    raise AssertionError(f"index {code} was not hoisted in the first pass")
                var = src.temp("ix")
                self.hoist["indices"][code] = var
            return var, info
        var = src.temp("ix")
        src.add(f"{var} = {code}")
        return var, info

    def guarded(self, src: Source, index, size: int, *stmts: str) -> None:
        """Statements indexing an array: BMv2 skips an out-of-range access (a negative
        index too, which Python would take from the end)."""
        idx, info = index
        safe = info[0] == "u" and (1 << info[1]) <= size
        if safe or (self.hoist is not None and not self.hoist["check"]):
            for stmt in stmts:
                src.add(stmt)
            return
        test = _in_range(idx, size, info[0] == "u")
        if self.hoist is not None:
            self.hoist["guards"][test] = None
        src.add(f"if {test}:")
        for stmt in stmts:
            src.add(f"    {stmt}")

    def action_body(self, action_id: int, src: Source) -> None:
        """An action inlined at ``src``.

        Array indices that nothing in the action changes are computed once, up front;
        when they are all in range (the normal case) a copy of the body without
        per-access bounds checks runs, otherwise the checked copy.
        """
        action = self.prog.action(action_id)
        params, prims = action.params, action.primitives
        where = f"action {action.name}"
        if not prims:
            src.add("pass")
            return
        self.hoist = {"indices": {}, "guards": {}, "check": True, "known": {},
                      "unstable": False}
        checked = self._body(prims, src, params, where)
        hoist, self.hoist = self.hoist, None
        assigned = set(re.findall(r"^\s*(F_\w+) = ", "\n".join(checked.lines), re.M))
        used = list(hoist["indices"]) + list(hoist["guards"])
        stable = not hoist["unstable"] and all(
            not set(re.findall(r"\bF_\w+", code)) & assigned for code in used)
        if not stable:
            self.statements(prims, src, params, where)
            return
        for code, var in hoist["indices"].items():
            src.add(f"{var} = {code}")
        if not hoist["guards"]:
            src.add("if True:")
            src.lines += checked.lines
            return
        self.hoist = {"indices": dict(hoist["indices"]), "guards": {}, "check": False,
                      "known": {}, "unstable": False}
        fast = self._body(prims, src, params, where)
        self.hoist = None
        src.add("if " + " and ".join(hoist["guards"]) + ":")
        src.lines += fast.lines
        src.add("else:")
        src.lines += checked.lines

    def _body(self, prims, src: Source, params, where: str) -> Source:
        body = Source()
        body.depth = src.depth + 1
        body.counter = src.counter
        self.statements(prims, body, params, where)
        src.counter = body.counter
        return body

    def statements(self, prims, src: Source, params, where: str) -> None:
        """An action's primitives, p4c's forward ``_jump``s turned back into if/else."""
        def target(prim, pos):
            value = prim["parameters"][pos]
            if value.get("type") != "hexstr":
                raise Unsupported(f"{prim['op']} to a computed offset (in {where})")
            return hexstr(value["value"])

        end = len(prims)
        returns = False

        def region(i, stop):
            nonlocal returns
            while i < stop:
                prim = prims[i]
                if prim["op"] == "_jump_if_zero":
                    cond, _ = self.expr(prim["parameters"][0], src, params)
                    dest = target(prim, 1)
                    if not i < dest <= stop:
                        raise Unsupported(f"_jump_if_zero backwards or out of its block ({where})")
                    last = prims[dest - 1]
                    has_else = (dest - 1 > i and last["op"] == "_jump"
                                and dest <= target(last, 0) <= stop)
                    src.add(f"if {cond}:")
                    src.depth += 1
                    src.add("pass")
                    region(i + 1, dest - 1 if has_else else dest)
                    src.depth -= 1
                    if has_else:
                        src.add("else:")
                        src.depth += 1
                        src.add("pass")
                        region(dest, target(last, 0))
                        src.depth -= 1
                        i = target(last, 0)
                    else:
                        i = dest
                elif prim["op"] == "_jump":
                    if target(prim, 0) != end:
                        raise Unsupported(f"_jump that is not an if/else or a return ({where})")
                    src.add("raise _Return")
                    returns = True
                    i += 1
                else:
                    self.primitive(prim, src, params, where)
                    i += 1

        if not any(p["op"] in ("_jump", "_jump_if_zero") for p in prims):
            for prim in prims:
                self.primitive(prim, src, params, where)
            return
        start = len(src.lines)
        src.depth += 1
        region(0, end)
        src.depth -= 1
        if returns:
            src.lines.insert(start, "    " * src.depth + "try:")
            src.add("except _Return:")
            src.add("    pass")
        else:
            src.lines.insert(start, "    " * src.depth + "if True:")

    # ------------------------------------------------------------------ parser
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
                joined.append(f"({var} << {_lit(shift)})" if shift else var)
            seg_expr = " | ".join(joined)
            unpack_lines.append(("_seg", seg_expr))
            shift = total_bits
            fields_expr = []
            for f in seg:
                shift -= f.width
                part = (f"(_seg >> {_lit(shift)}) & {_lit(mask(f.width))}" if shift
                        else f"_seg & {_lit(mask(f.width))}")
                if f.signed:
                    half = 1 << (f.width - 1)
                    part = f"((({part}) + {_lit(half)}) & {_lit(mask(f.width))}) - {_lit(half)}"
                unpack_lines.append((self.v(f), part))
                fields_expr.append((f, shift))
            packed = " | ".join(f"({self.bits(f)} << {_lit(s)})" if s else self.bits(f)
                                for f, s in fields_expr)
            shift = total_bits
            for var, size in piece_vars:
                shift -= size * 8
                if shift == total_bits - size * 8:    # the top piece: already in range
                    pack_args.append(f"({packed}) >> {_lit(shift)}" if shift else f"({packed})")
                else:
                    part = f"(({packed}) >> {_lit(shift)})" if shift else f"({packed})"
                    pack_args.append(f"{part} & {_lit(mask(size * 8))}")
        struct_obj = struct.Struct(fmt)
        name = f"S_{num(header.id, 0, len(self.prog.headers))}"
        self.ns[name] = struct_obj
        layout = (name, pieces, unpack_lines, pack_args)
        self.structs[header.name] = layout
        return layout

    def emit_extract(self, header: Header, src: Source, too_short: int) -> None:
        name, pieces, unpack_lines, _ = self.header_struct(header)
        nbytes = num(header.nbytes, 0, MAX_BYTES)
        src.add(f"if plen - off < {nbytes}:")
        src.add(f"    raise ParserError({_id(too_short)})")
        simple = all(target.startswith("F_") and value.startswith("_p")
                     for target, value in unpack_lines)
        if simple:
            targets = ", ".join(target for target, _ in unpack_lines)
            src.add(f"{targets}, = {name}.unpack_from(pkt, off)")
        else:
            piece_names = ", ".join(f"_p{i}" for i in range(pieces))
            src.add(f"{piece_names}, = {name}.unpack_from(pkt, off)")
            for target, value in unpack_lines:
                src.add(f"{target} = {value}")
        src.add(f"off += {nbytes}")
        src.add(f"{self.vv(header)} = True")

    def transition_key(self, parts, src: Source) -> tuple[str, int]:
        """The select key as one integer: each field padded to whole bytes, as BMv2 does."""
        codes = []
        total = 0
        for part in reversed(parts):
            if part["type"] == "field":
                field = self.field(part["value"])
                width = field.width
                code = (f"({self.v(field)} & {_lit(mask(width))})" if field.signed
                        else self.v(field))
            elif part["type"] == "lookahead":
                bit_offset, width = part["value"]
                code = _lookahead_code(bit_offset, width, self.prog.too_short)
                self.ns["_lookahead"] = _lookahead
            else:
                raise Unsupported(f"parser transition key of type {part['type']!r}")
            padded = (width + 7) // 8 * 8
            codes.append(f"({code} << {num(total, 0, _BIG)})" if total else code)
            total += padded
        return " | ".join(reversed(codes)), total

    def parser(self, src: Source) -> None:
        prog = self.prog
        nstates = len(prog.parser_states)
        src.add("try:")
        src.depth += 1
        src.add(f"st = {num(prog.parser_init, 0, nstates)}")
        loops = self.parser_loops()
        if loops:
            src.add("_guard = 0")
        src.add("while True:")
        src.depth += 1
        if loops:
            # A loop that extracts nothing would spin for ever: give up as too short.
            src.add("_guard += 1")
            src.add("if _guard > 100000:")
            src.add(f"    raise ParserError({_id(prog.too_short)})")
        for i in prog.parser_order:
            state = prog.parser_states[i]
            src.add(f"if st == {num(i, 0, nstates)}:")
            src.depth += 1
            for op in state.get("parser_ops", []):
                self.parser_op(op, src, prog.too_short, state["name"])
            self.transitions(state, src)
            src.depth -= 1
        src.add("if st < 0:")
        src.add("    break")
        src.depth -= 2
        src.add("except ParserError as _e:")
        src.add("    perr = _e.code")

    def parser_loops(self) -> bool:
        """Whether a transition goes back in the parse order (each pass of the
        generated loop runs the states in that order)."""
        position = {state: pos for pos, state in enumerate(self.prog.parser_order)}
        for i in self.prog.parser_order:
            _, cases, default = self.prog.transitions(self.prog.parser_states[i])
            for nxt in [nxt for _, _, nxt in cases] + [default]:
                if nxt >= 0 and position[nxt] <= position[i]:
                    return True
        return False

    def parser_op(self, op: dict, src: Source, too_short: int, state: str) -> None:
        kind = op["op"]
        params = op.get("parameters", [])
        if kind == "extract":
            if params[0]["type"] != "regular":
                raise Unsupported(f"extract to a {params[0]['type']} (state {state})")
            self.emit_extract(self.header(params[0]["value"]), src, too_short)
        elif kind == "set":
            field = self.field(params[0]["value"])
            if params[1]["type"] == "lookahead":
                bit_offset, width = params[1]["value"]
                self.ns["_lookahead"] = _lookahead
                code, info = _lookahead_code(bit_offset, width, too_short), ("u", width)
            else:
                code, info = self.expr(params[1], src)
            src.add(f"{self.v(field)} = {store_code(code, info, field.width, field.signed)}")
        elif kind == "verify":
            cond, _ = self.expr(params[0], src)
            err, _ = self.expr(params[1], src)
            src.add(f"if not {cond}:")
            src.add(f"    raise ParserError({err})")
        elif kind in ("advance", "shift"):
            amount, _ = self.expr(params[0], src)
            nbytes = f"{amount}" if kind == "shift" else f"(({amount}) >> 3)"
            var = src.temp("adv")
            src.add(f"{var} = {nbytes}")
            src.add(f"if plen - off < {var}:")
            src.add(f"    raise ParserError({_id(too_short)})")
            src.add(f"off += {var}")
        elif kind == "primitive":
            self.primitive(params[0], src, None, f"parser state {state}")
        else:
            raise Unsupported(f"parser operation {kind!r} (state {state})")

    def transitions(self, state: dict, src: Source) -> None:
        key_parts, cases, default = self.prog.transitions(state)
        default = num(default, -1, len(self.prog.parser_states))
        if not key_parts:
            src.add(f"st = {default}")
            return
        key_code, _ = self.transition_key(key_parts, src)
        src.add(f"_key = {key_code}")
        first = True
        for value, case_mask, nxt in cases:
            if case_mask is not None:
                cond = f"(_key & {_lit(case_mask)}) == {_lit(value & case_mask)}"
            else:
                cond = f"_key == {_lit(value)}"
            src.add(f"{'if' if first else 'elif'} {cond}:")
            src.add(f"    st = {num(nxt, -1, len(self.prog.parser_states))}")
            first = False
        src.add("else:" if cases else "if True:")
        src.add(f"    st = {default}")
    # ------------------------------------------------------------------ checksums
    def checksums(self, src: Source, verify: bool) -> None:
        for checksum, calc, does_verify, does_update in self.prog.checksums:
            if not (does_verify if verify else does_update):
                continue
            target = self.field(checksum["target"])
            cond = checksum.get("if_cond")
            if cond is not None:
                code, _ = self.expr(cond, src)
                src.add(f"if {code}:")
                src.depth += 1
            src.add("_cbits = 0")
            src.add("_cn = 0")
            self.calc_inputs(calc, src)
            src.add("_cbits <<= (-_cn) & 7")
            src.add("_csum = csum16(_cbits.to_bytes((_cn + 7) >> 3, 'big'))")
            if verify:
                err = self.std("checksum_error")
                src.add(f"if _csum != {self.v(target)}:")
                src.add(f"    {self.v(err)} = 1" if err is not None else "    pass")
            else:
                src.add(f"{self.v(target)} = "
                        f"{store_code('_csum', ('u', 16), target.width, target.signed)}")
            if cond is not None:
                src.depth -= 1

    def calc_inputs(self, calc: dict, src: Source) -> None:
        """Append a calculation's inputs to _cbits; fields of an invalid header are skipped."""
        for header, fields in self.prog.calc_groups(calc):
            if header is None:
                value, width = fields
                src.add(f"_cbits = (_cbits << {num(width, 1, MAX_BITS + 1)}) | {_lit(value)}")
                src.add(f"_cn += {num(width, 1, MAX_BITS + 1)}")
                continue
            width = num(sum(f.width for f in fields), 0, MAX_HEADER_BITS + 1)
            parts = " | ".join(f"({self.bits(f)} << {num(s, 0, MAX_HEADER_BITS)})" if s
                               else self.bits(f) for f, s in _shifts(fields))
            prefix = ""
            if not header.metadata:
                src.add(f"if {self.vv(header)}:")
                prefix = "    "
            src.add(f"{prefix}_cbits = (_cbits << {width}) | {parts}")
            src.add(f"{prefix}_cn += {width}")

    # ------------------------------------------------------------------ controls
    def pipeline(self, name: str, src: Source) -> None:
        nodes = self.prog.controls[name]
        if not nodes:
            src.add("pass")
            return
        src.add("try:")
        src.depth += 1
        self.block(nodes, src)
        src.add("pass")
        src.depth -= 1
        src.add("except _Exit:")
        src.add("    pass")

    def block(self, nodes: list, src: Source) -> None:
        for node in nodes:
            if isinstance(node, If):
                code, _ = self.expr(node.expression, src)
                src.add(f"if {code}:")
                for body in (node.then, node.orelse):
                    src.depth += 1
                    src.add("pass")
                    self.block(body, src)
                    src.depth -= 1
                    if body is node.then:
                        src.add("else:")
                continue
            self.apply_table(node.table, src)
            for i, (cond, body) in enumerate(node.branches or ()):
                test = ("_hit" if cond == "hit" else "not _hit" if cond == "miss"
                        else f"_a in ({''.join(_id(aid) + ', ' for aid in cond)})")
                src.add(f"{'elif' if i else 'if'} {test}:")
                src.depth += 1
                src.add("pass")
                self.block(body, src)
                src.depth -= 1

    def key_code(self, ref) -> str:
        kind, target, key_mask = ref
        if kind == "valid":
            code = f"(1 if {self.valid_code(self.header(target))} else 0)"
        else:
            code = self.bits(target)
        if key_mask is not None:
            code = f"({code} & {_lit(key_mask)})"
        return code

    def apply_table(self, spec, src: Source) -> None:
        tid = _id(spec.id)
        keys = [self.key_code(ref) for ref in spec.key_refs]
        if not keys:
            src.add("_hit = False")
            src.add(f"_a, _d = D{tid}[0]")
        else:
            key = keys[0] if len(keys) == 1 else "(" + ", ".join(keys) + ",)"
            if spec.match_type == "exact":
                src.add(f"_e = E{tid}.get({key})")
            else:
                src.add(f"_k = {key}")
                src.add(f"_e = C{tid}.get(_k, _NOTCACHED)")
                src.add("if _e is _NOTCACHED:")
                src.add(f"    _e = L{tid}(_k)")
            src.add("if _e is None:")
            src.add("    _hit = False")
            src.add(f"    _a, _d = D{tid}[0]")
            src.add("else:")
            src.add("    _hit = True")
            if spec.direct_counter:
                # Entries of a table with a direct counter carry it: [packets, bytes].
                src.add("    _a, _d, _c = _e")
                src.add("    _c[0] += 1")
                src.add("    _c[1] += in_len")
            else:
                src.add("    _a, _d = _e")
        action_ids = spec.applied_actions
        first = True
        for aid in action_ids:
            nparams = len(self.prog.action(aid).params)
            if len(action_ids) == 1:
                src.add("if True:")
            else:
                src.add(f"{'if' if first else 'elif'} _a == {_id(aid)}:")
            src.depth += 1
            if nparams == 1:
                src.add("ad0, = _d")
            elif nparams:
                src.add(", ".join(f"ad{i}" for i in range(nparams)) + " = _d")
            self.action_body(aid, src)
            src.depth -= 1
            first = False

    def generate(self) -> Compiled:
        std = {n: self.std(n) for n in ("ingress_port", "packet_length", "instance_type",
                                         "parser_error", "egress_spec", "egress_port",
                                         "mcast_grp", "egress_rid")}

        ingress = Source()
        ingress.depth = 1
        ingress.add("plen = in_len = plen_reg = len(pkt)")
        ingress.add("off = 0")
        ingress.add(f"perr = {_id(self.prog.no_error)}")
        ingress.add(f"{self.v(std['ingress_port'])} = ingress_port")
        if std["packet_length"] is not None:
            ingress.add(f"{self.v(std['packet_length'])} = plen")
        self.parser(ingress)
        if std["parser_error"] is not None:
            ingress.add(f"{self.v(std['parser_error'])} = perr")
        self.checksums(ingress, verify=True)
        self.pipeline("ingress", ingress)
        grp = self.v(std["mcast_grp"]) if std["mcast_grp"] is not None else "0"

        egress = Source()
        egress.depth = 1
        egress.counter = ingress.counter
        egress.add(f"{self.v(std['egress_port'])} = egress_port")
        egress.add(f"{self.v(std['egress_spec'])} = {num(self.drop_port + 1, 1, MAX_ID + 1)}")
        if std["instance_type"] is not None:
            egress.add(f"{self.v(std['instance_type'])} = instance_type")
        if std["egress_rid"] is not None:
            egress.add("if rid is not None:")
            egress.add(f"    {self.v(std['egress_rid'])} = rid")
        if std["packet_length"] is not None:
            egress.add(f"{self.v(std['packet_length'])} = plen_reg")
        self.pipeline("egress", egress)
        egress.add(f"if {self.v(std['egress_spec'])} == {_id(self.drop_port)}:")
        egress.add("    return None")
        self.checksums(egress, verify=False)
        egress.add("_out = []")
        for header in self.prog.deparse_order:
            sname, _, _, pack_args = self.header_struct(header)
            line = f"_out.append({sname}.pack({', '.join(pack_args)}))"
            if header.metadata:
                egress.add(line)
            else:
                egress.add(f"if {self.vv(header)}:")
                egress.add(f"    {line}")
        egress.add("_out.append(pkt[off:])")
        egress.add("return b''.join(_out)")

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

        src = Source()
        src.add("def ingress(pkt, ingress_port):")
        src.add('    """Parse and run ingress: (egress_spec, mcast_grp, state)."""')
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


def _union(a, b):
    if a == b:
        return a
    if a[0] == b[0] == "u":
        return ("u", max(a[1], b[1]))
    if a[0] == b[0] == "s":
        return ("s", max(a[1], b[1]))
    return ANY


def _shifts(fields):
    shift = sum(f.width for f in fields)
    for f in fields:
        shift -= f.width
        yield f, shift


def _in_range(idx: str, size: int, nonnegative: bool) -> str:
    size = num(size, 1, MAX_ID)
    return f"{idx} < {size}" if nonnegative else f"0 <= {idx} < {size}"


def _lookahead_code(bit_offset: int, width: int, too_short: int) -> str:
    return (f"_lookahead(pkt, off, {num(bit_offset, 0, MAX_LOOKAHEAD)}, "
            f"{num(width, 1, MAX_BITS + 1)}, {_id(too_short)})")


def _lookahead(pkt, off, bit_offset, width, too_short):
    end = off + (bit_offset + width + 7) // 8
    if end > len(pkt):
        raise ParserError(too_short)
    total = (end - off) * 8
    return (int.from_bytes(pkt[off:end], "big") >> (total - bit_offset - width)) & mask(width)



def compile_program(program: Program) -> Compiled:
    """The Python functions for a checked program."""
    gen = Generator(program)
    try:
        out = gen.generate()
    except RecursionError:
        raise Unsupported("the program's controls are nested too deeply") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:   # a gap in validate
        raise ValueError(f"malformed BMv2 JSON: {type(exc).__name__}: {exc}") from None
    gen.ns["_NOTCACHED"] = _NOTCACHED
    gen.ns["_log_assert"] = _log_assert
    out.namespace = gen.ns
    try:
        code = compile(out.source, "<softswitch pipeline>", "exec")
    except (SyntaxError, RecursionError, MemoryError) as exc:   # Python's own nesting limits
        raise Unsupported(f"the program is nested too deeply for Python ({exc})") from None
    exec(code, gen.ns)
    out.ingress = gen.ns["ingress"]
    out.egress = gen.ns["egress"]
    return out


_NOTCACHED = object()


def _log_assert(where: str) -> None:
    logging.getLogger("softswitch").error("assert/assume failed in %s", where)
