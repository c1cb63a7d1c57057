"""Translate a BMv2 JSON (p4c-bm2-ss output) into Python source, once, at load time.

Every header field becomes a local variable of two generated functions, ``ingress``
(parser, verify checksums, ingress control) and ``egress`` (egress control, update
checksums, deparser); the state between them is one tuple, so a multicast copy is
free. Actions are inlined where their table is applied, and the control graph is
rebuilt into nested ``if`` blocks from post-dominators, so no packet ever walks the
JSON. Value semantics follow BMv2: expressions are evaluated with unbounded integers
(p4c already inserts the masks it needs), and a value is truncated to the field's
width only when it is stored.

Anything BMv2 supports but this translator does not raises ``Unsupported`` at load,
naming the construct.
"""

from __future__ import annotations

import json
import keyword
import logging
import random
import re
import struct

DROP_PORT = 511          # simple_switch's default --drop-port
INSTANCE_NORMAL = 0
INSTANCE_REPLICATION = 5


class Unsupported(Exception):
    """A JSON construct this switch cannot run; the message names it."""


class ParserError(Exception):
    """Raised by generated parser code; carries the P4 error code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _Exit(Exception):
    """The P4 ``exit`` statement: leaves the current control."""


class _Return(Exception):
    """A ``return`` inside a conditional of an action: leaves the action."""


# ----------------------------------------------------------------------------- helpers

def hexstr(value: str) -> int:
    return int(value, 16)


def mask(width: int) -> int:
    return (1 << width) - 1


def csum16(data: bytes) -> int:
    """The one's complement checksum BMv2 computes for HashAlgorithm.csum16."""
    if len(data) & 1:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


_STRUCT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


class Field:
    __slots__ = ("header", "name", "width", "signed", "var")

    def __init__(self, header, name, width, signed, var):
        self.header, self.name, self.width, self.signed, self.var = (
            header, name, width, signed, var)


class Header:
    """A header or metadata instance with its fields and (for packets) its wire layout."""

    def __init__(self, name, metadata, fields, var_prefix):
        self.name = name
        self.metadata = metadata
        self.fields = fields
        self.valid_var = f"V_{var_prefix}"
        self.nbits = sum(f.width for f in fields)
        self.nbytes = (self.nbits + 7) // 8


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
        return f"((({code}) + {half}) & {mask(width)}) - {half}"
    return f"({code}) & {mask(width)}"


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


# ----------------------------------------------------------------------------- program

class Compiled:
    """What the generator hands the runtime: generated functions and the JSON objects they use."""

    def __init__(self):
        self.source = ""
        self.ingress = None
        self.egress = None
        self.tables = {}        # name -> TableSpec
        self.registers = {}     # name -> RegisterSpec
        self.counters = {}      # name -> CounterSpec
        self.actions = {}       # id -> ActionSpec
        self.errors = {}        # name -> code
        self.namespace = {}     # globals of the generated functions


class ActionSpec:
    def __init__(self, name, aid, params):
        self.name, self.id, self.params = name, aid, params   # params: [(name, width)]


class TableSpec:
    def __init__(self, name, tid, match_type, keys, action_ids, max_size):
        self.name = name
        self.id = tid
        self.match_type = match_type   # exact | ternary | lpm
        self.keys = keys               # [(match_type, width, name)]
        self.action_ids = action_ids
        self.max_size = max_size
        self.default = None            # (action_id, data) from the JSON
        self.const_entries = []        # [(key_values, masks, prefix_or_priority, aid, data)]
        self.direct_counter = None     # name of the direct counter bound to this table


class RegisterSpec:
    def __init__(self, name, size, width):
        self.name, self.size, self.width = name, size, width
        self.cells = [0] * size


class CounterSpec:
    def __init__(self, name, size):
        self.name, self.size = name, size
        self.packets = [0] * size
        self.bytes = [0] * size


def _require_empty(doc: dict, key: str, what: str) -> None:
    if doc.get(key):
        names = ", ".join(str(item.get("name", item)) if isinstance(item, dict) else str(item)
                          for item in doc[key][:3])
        raise Unsupported(f"{what} ({key}: {names}) are not supported")


class Generator:
    """Builds the two packet functions for one BMv2 JSON document."""

    SUPPORTED_MATCH = ("exact", "ternary", "lpm")

    def __init__(self, doc: dict, drop_port: int = DROP_PORT):
        self.doc = doc
        self.drop_port = drop_port
        self.out = Compiled()
        self.ns: dict = {"ParserError": ParserError, "_Exit": _Exit, "_Return": _Return,
                         "csum16": csum16,
                         "_randint": random.Random().randint}
        self.headers: dict[str, Header] = {}
        self.fields: dict[tuple[str, str], Field] = {}
        self.aliases: dict[str, tuple[str, str]] = {}
        self.structs: dict[str, tuple] = {}
        self.state_vars: list[str] = []
        self.hoist = None
        self.direct_counters: dict[str, str] = {}   # table -> direct counter

    # ------------------------------------------------------------------ declarations
    def load_declarations(self) -> None:
        doc = self.doc
        version = doc.get("__meta__", {}).get("version", [2, 0])
        if version[0] != 2:
            raise Unsupported(f"BMv2 JSON format version {version} (expected 2.x)")
        for key, what in (("header_stacks", "header stacks"), ("header_unions", "header unions"),
                          ("header_union_stacks", "header union stacks"),
                          ("parse_vsets", "parser value sets"), ("meter_arrays", "meters"),
                          ("learn_lists", "digests"), ("extern_instances", "extern instances")):
            _require_empty(doc, key, what)
        types = {}
        for htype in doc.get("header_types", []):
            fields = []
            for spec in htype["fields"]:
                name, width = spec[0], spec[1]
                if width == "*" or not isinstance(width, int):
                    raise Unsupported(f"variable-length field {htype['name']}.{name}")
                fields.append((name, width, bool(spec[2]) if len(spec) > 2 else False))
            types[htype["name"]] = fields
        used_prefixes, used_vars = set(), set()
        for inst in doc.get("headers", []):
            prefix = _ident(inst["name"])
            while prefix in used_prefixes:
                prefix += "_"
            used_prefixes.add(prefix)
            fields = []
            for fname, width, signed in types[inst["header_type"]]:
                var = f"F_{prefix}__{_ident(fname)}"
                while var in used_vars:
                    var += "_"
                used_vars.add(var)
                field = Field(inst["name"], fname, width, signed, var)
                fields.append(field)
                self.fields[(inst["name"], fname)] = field
            header = Header(inst["name"], bool(inst.get("metadata")), fields, prefix)
            if not header.metadata and header.nbits % 8:
                raise Unsupported(f"header {inst['name']} is {header.nbits} bits, "
                                  "not a whole number of bytes")
            self.headers[inst["name"]] = header
        for alias, target in doc.get("field_aliases", []):
            self.aliases[alias] = tuple(target)
        for err_name, code in doc.get("errors", []):
            self.out.errors[err_name] = code
        for reg in doc.get("register_arrays", []):
            spec = RegisterSpec(reg["name"], reg["size"], reg["bitwidth"])
            self.out.registers[reg["name"]] = spec
            self.ns[f"R{reg['id']}"] = spec.cells
        for ctr in doc.get("counter_arrays", []):
            if ctr.get("is_direct"):
                self.direct_counters[ctr["binding"]] = ctr["name"]
                continue
            spec = CounterSpec(ctr["name"], ctr["size"])
            self.out.counters[ctr["name"]] = spec
            self.ns[f"CP{ctr['id']}"] = spec.packets
            self.ns[f"CB{ctr['id']}"] = spec.bytes
        for action in doc.get("actions", []):
            params = [(p["name"], p["bitwidth"]) for p in action.get("runtime_data", [])]
            self.out.actions[action["id"]] = ActionSpec(action["name"], action["id"], params)
        self.registers_by_name = {r["name"]: r for r in doc.get("register_arrays", [])}
        self.counters_by_name = {c["name"]: c for c in doc.get("counter_arrays", [])}
        self.calculations = {c["name"]: c for c in doc.get("calculations", [])}
        self.actions_json = {a["id"]: a for a in doc.get("actions", [])}
        # Every field, validity bit and bookkeeping value that crosses ingress -> egress.
        for header in self.headers.values():
            self.state_vars += [f.var for f in header.fields]
            if not header.metadata:
                self.state_vars.append(header.valid_var)
        self.state_vars += ["pkt", "off", "plen_reg", "in_len"]

    def std(self, name: str) -> Field | None:
        """A standard_metadata field (or its intrinsic_metadata alias), if the program has it."""
        for key in (f"standard_metadata.{name}", f"intrinsic_metadata.{name}",
                    f"queueing_metadata.{name}"):
            if key in self.aliases:
                return self.fields.get(self.aliases[key])
        return self.fields.get(("standard_metadata", name))

    def field(self, ref) -> Field:
        header, name = ref
        if name == "$valid$":
            raise Unsupported(f"{header}.$valid$ used where only a real field can be")
        try:
            return self.fields[(header, name)]
        except KeyError:
            alias = self.aliases.get(f"{header}.{name}")
            if alias and alias in self.fields:
                return self.fields[alias]
            raise Unsupported(f"reference to unknown field {header}.{name}") from None

    def header(self, name: str) -> Header:
        try:
            return self.headers[name]
        except KeyError:
            raise Unsupported(f"reference to unknown header {name}") from None

    def valid_code(self, header: Header) -> str:
        return "True" if header.metadata else header.valid_var

    # ------------------------------------------------------------------ expressions
    def expr(self, node, src: Source, params=None):
        """Python source and type for a JSON type/value object."""
        kind = node.get("type")
        value = node.get("value")
        if kind == "field":
            if value[1] == "$valid$":
                return f"(1 if {self.valid_code(self.header(value[0]))} else 0)", ("u", 1)
            field = self.field(value)
            return field.var, (("s", field.width) if field.signed else ("u", field.width))
        if kind == "hexstr":
            number = hexstr(value)
            return (str(number), ("u", number.bit_length()) if number >= 0 else ANY)
        if kind == "bool":
            return ("True" if value else "False"), BOOL
        if kind in ("runtime_data", "local"):
            if params is None or value >= len(params):
                raise Unsupported(f"action parameter {value} used outside an action")
            return f"ad{value}", ("u", params[value][1])
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
                    return f"({lcode} - {1 << width} if {lcode} >= {half} else {lcode})", ("s", width)
                return f"((({lcode}) + {half}) & {mask(width)}) - {half}", ("s", width)
            tmp = src.temp()
            if op == "sat_cast":
                lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
                info = ("s", width)
            else:
                lo, hi = 0, mask(width)
                info = ("u", width)
            return (f"({lo} if ({tmp} := {lcode}) < {lo} else {hi} if {tmp} > {hi} else {tmp})",
                    info)
        binary = {"+": "+", "-": "-", "*": "*", "/": "//", "%": "%", ">>": ">>",
                  "&": "&", "|": "|", "^": "^", "==": "==", "!=": "!=", ">": ">", "<": "<",
                  ">=": ">=", "<=": "<=", "and": "and", "or": "or"}
        if op == "<<":
            lcode, _ = self.expr(left, src, params)
            rcode, rinfo = self.expr(right, src, params)
            if right.get("type") == "hexstr":
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
            src.add(f"{field.var} = {value}")
        elif op in ("assign_header", "copy_header"):
            dst, source = self.header(args[0]["value"]), self.header(args[1]["value"])
            if [f.width for f in dst.fields] != [f.width for f in source.fields]:
                raise Unsupported(f"{op} between different header types in {where}")
            src.add(f"if {self.valid_code(source)}:")
            src.depth += 1
            for d, s in zip(dst.fields, source.fields):
                src.add(f"{d.var} = {s.var}")
            if not dst.metadata:
                src.add(f"{dst.valid_var} = True")
            src.depth -= 1
            if not dst.metadata:
                src.add("else:")
                src.add(f"    {dst.valid_var} = False")
        elif op in ("add_header", "add_header_fast"):
            header = self.header(args[0]["value"])
            if header.metadata:
                return
            src.add(f"if not {header.valid_var}:")
            src.depth += 1
            if op == "add_header":
                for f in header.fields:
                    src.add(f"{f.var} = 0")
                src.add(f"plen_reg += {header.nbytes}")
            src.add(f"{header.valid_var} = True")
            src.depth -= 1
        elif op == "remove_header":
            header = self.header(args[0]["value"])
            if header.metadata:
                return
            src.add(f"if {header.valid_var}:")
            src.add(f"    {header.valid_var} = False")
            src.add(f"    plen_reg -= {header.nbytes}")
        elif op in ("mark_to_drop", "drop"):
            spec, grp = self.std("egress_spec"), self.std("mcast_grp")
            if spec is None:
                raise Unsupported(f"{op} without standard_metadata.egress_spec")
            src.add(f"{spec.var} = {self.drop_port}")
            if grp is not None:
                src.add(f"{grp.var} = 0")
        elif op == "register_read":
            field = self.field(args[0]["value"])
            reg = self.registers_by_name.get(args[1]["value"])
            if reg is None:
                raise Unsupported(f"unknown register {args[1]['value']} in {where}")
            index = self.index(args[2], src, params)
            value = store_code(f"R{reg['id']}[{index[0]}]", ("u", reg["bitwidth"]),
                               field.width, field.signed)
            self.guarded(src, index, reg["size"], f"{field.var} = {value}")
        elif op == "register_write":
            reg = self.registers_by_name.get(args[0]["value"])
            if reg is None:
                raise Unsupported(f"unknown register {args[0]['value']} in {where}")
            index = self.index(args[1], src, params)
            code, info = self.expr(args[2], src, params)
            value = store_code(code, info, reg["bitwidth"], False)
            self.guarded(src, index, reg["size"], f"R{reg['id']}[{index[0]}] = {value}")
        elif op == "count":
            ctr = self.counters_by_name.get(args[0]["value"])
            if ctr is None:
                raise Unsupported(f"unknown counter {args[0]['value']} in {where}")
            index = self.index(args[1], src, params)
            self.guarded(src, index, ctr["size"],
                         f"CP{ctr['id']}[{index[0]}] += 1", f"CB{ctr['id']}[{index[0]}] += in_len")
        elif op == "modify_field_rng_uniform":
            field = self.field(args[0]["value"])
            lo, _ = self.expr(args[1], src, params)
            hi, _ = self.expr(args[2], src, params)
            lo_var, hi_var = src.temp("lo"), src.temp("hi")
            src.add(f"{lo_var} = {lo}")
            src.add(f"{hi_var} = {hi}")
            src.add(f"if {lo_var} <= {hi_var}:")
            src.add(f"    {field.var} = "
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
        """Statements indexing an array: BMv2 skips an out-of-range access."""
        idx, info = index
        safe = info[0] == "u" and (1 << info[1]) <= size
        if safe or (self.hoist is not None and not self.hoist["check"]):
            for stmt in stmts:
                src.add(stmt)
            return
        if self.hoist is not None:
            self.hoist["guards"][(idx, size)] = None
        src.add(f"if {idx} < {size}:")
        for stmt in stmts:
            src.add(f"    {stmt}")

    def action_body(self, action_id: int, src: Source) -> None:
        """An action inlined at ``src``.

        Array indices that nothing in the action changes are computed once, up front;
        when they are all in range (the normal case) a copy of the body without
        per-access bounds checks runs, otherwise the checked copy.
        """
        action = self.actions_json.get(action_id)
        if action is None:
            raise Unsupported(f"table refers to unknown action id {action_id}")
        params = [(p["name"], p["bitwidth"]) for p in action.get("runtime_data", [])]
        prims = action.get("primitives", [])
        where = f"action {action['name']}"
        if not prims:
            src.add("pass")
            return
        self.hoist = {"indices": {}, "guards": {}, "check": True, "known": {},
                      "unstable": False}
        checked = self._body(prims, src, params, where)
        hoist, self.hoist = self.hoist, None
        assigned = set(re.findall(r"^\s*(F_\w+) = ", "\n".join(checked.lines), re.M))
        used = list(hoist["indices"]) + [var for var, _ in hoist["guards"]]
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
        self.direct_counters: dict[str, str] = {}   # table -> direct counter
        src.add("if " + " and ".join(f"{var} < {size}" for var, size in hoist["guards"]) + ":")
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
                unpack_lines.append((seg[0].var, f"_p{pieces}"))
                pack_args.append(seg[0].var)
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
                joined.append(f"({var} << {shift})" if shift else var)
            seg_expr = " | ".join(joined)
            unpack_lines.append(("_seg", seg_expr))
            shift = total_bits
            fields_expr = []
            for f in seg:
                shift -= f.width
                part = f"(_seg >> {shift}) & {mask(f.width)}" if shift else f"_seg & {mask(f.width)}"
                if f.signed:
                    half = 1 << (f.width - 1)
                    part = f"((({part}) + {half}) & {mask(f.width)}) - {half}"
                unpack_lines.append((f.var, part))
                fields_expr.append((f, shift))
            packed = " | ".join(f"({_bits(f)} << {s})" if s else _bits(f)
                                for f, s in fields_expr)
            shift = total_bits
            for var, size in piece_vars:
                shift -= size * 8
                if shift == total_bits - size * 8:    # the top piece: already in range
                    pack_args.append(f"({packed}) >> {shift}" if shift else f"({packed})")
                else:
                    part = f"(({packed}) >> {shift})" if shift else f"({packed})"
                    pack_args.append(f"{part} & {mask(size * 8)}")
        struct_obj = struct.Struct(fmt)
        name = f"S_{_ident(header.name)}"
        self.ns[name] = struct_obj
        layout = (name, pieces, unpack_lines, pack_args)
        self.structs[header.name] = layout
        return layout

    def emit_extract(self, header: Header, src: Source, too_short: int) -> None:
        name, pieces, unpack_lines, _ = self.header_struct(header)
        src.add(f"if plen - off < {header.nbytes}:")
        src.add(f"    raise ParserError({too_short})")
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
        src.add(f"off += {header.nbytes}")
        src.add(f"{header.valid_var} = True")

    def transition_key(self, parts, src: Source) -> tuple[str, int]:
        """The select key as one integer: each field padded to whole bytes, as BMv2 does."""
        codes = []
        total = 0
        for part in reversed(parts):
            if part["type"] == "field":
                field = self.field(part["value"])
                width = field.width
                code = f"({field.var} & {mask(width)})" if field.signed else field.var
            elif part["type"] == "lookahead":
                bit_offset, width = part["value"]
                too_short = self.out.errors.get("PacketTooShort", 1)
                code = f"_lookahead(pkt, off, {bit_offset}, {width}, {too_short})"
                self.ns["_lookahead"] = _lookahead
            else:
                raise Unsupported(f"parser transition key of type {part['type']!r}")
            padded = (width + 7) // 8 * 8
            codes.append(f"({code} << {total})" if total else code)
            total += padded
        return " | ".join(reversed(codes)), total

    def parser(self, src: Source) -> None:
        parsers = {p["name"]: p for p in self.doc.get("parsers", [])}
        if "parser" not in parsers:
            raise Unsupported("no parser named 'parser'")
        parser = parsers["parser"]
        too_short = self.out.errors.get("PacketTooShort", 1)
        states = parser["parse_states"]
        ids = {s["name"]: i for i, s in enumerate(states)}
        order = _topological(states, ids)
        init = parser.get("init_state")
        if init is None:
            return
        src.add("try:")
        src.depth += 1
        src.add(f"st = {ids[init]}")
        src.add("while True:")
        src.depth += 1
        for i in order:
            state = states[i]
            src.add(f"if st == {i}:  # {state['name']}")
            src.depth += 1
            for op in state.get("parser_ops", []):
                self.parser_op(op, src, too_short, state["name"])
            self.transitions(state, ids, src)
            src.depth -= 1
        src.add("if st < 0:")
        src.add("    break")
        src.depth -= 2
        src.add("except ParserError as _e:")
        src.add("    perr = _e.code")

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
                code, info = (f"_lookahead(pkt, off, {bit_offset}, {width}, {too_short})",
                              ("u", width))
            else:
                code, info = self.expr(params[1], src)
            src.add(f"{field.var} = {store_code(code, info, field.width, field.signed)}")
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
            src.add(f"    raise ParserError({too_short})")
            src.add(f"off += {var}")
        elif kind == "primitive":
            self.primitive(params[0], src, None, f"parser state {state}")
        else:
            raise Unsupported(f"parser operation {kind!r} (state {state})")

    def transitions(self, state: dict, ids: dict, src: Source) -> None:
        def target(name):
            return ids[name] if name is not None else -1
        cases = state.get("transitions", [])
        key_parts = state.get("transition_key", [])
        if not key_parts or all(c.get("type", c.get("value")) == "default" for c in cases):
            nxt = cases[0]["next_state"] if cases else None
            src.add(f"st = {target(nxt)}")
            return
        key_code, _ = self.transition_key(key_parts, src)
        src.add(f"_key = {key_code}")
        first = True
        default = None
        for case in cases:
            if "type" not in case:     # JSON before 2.x named the default by its value
                case = dict(case, type="default" if case.get("value") == "default" else "hexstr")
            if case["type"] == "default":
                default = case["next_state"]
                break   # BMv2 stops at the default transition
            if case["type"] != "hexstr":
                raise Unsupported(f"parser transition of type {case['type']!r} "
                                  f"(state {state['name']})")
            value = hexstr(case["value"])
            if case.get("mask") is not None:
                case_mask = hexstr(case["mask"])
                cond = f"(_key & {case_mask}) == {value & case_mask}"
            else:
                cond = f"_key == {value}"
            src.add(f"{'if' if first else 'elif'} {cond}:")
            src.add(f"    st = {target(case['next_state'])}")
            first = False
        src.add("else:")
        src.add(f"    st = {target(default)}")

    # ------------------------------------------------------------------ checksums
    def checksums(self, src: Source, verify: bool) -> None:
        for checksum in self.doc.get("checksums", []):
            if not checksum.get("verify" if verify else "update", True):
                continue
            if checksum.get("type", "generic") not in ("generic", "ipv4"):
                raise Unsupported(f"checksum type {checksum.get('type')!r}")
            calc = self.calculations.get(checksum["calculation"])
            if calc is None:
                raise Unsupported(f"unknown calculation {checksum['calculation']}")
            if calc.get("algo") != "csum16":
                raise Unsupported(f"hash algorithm {calc.get('algo')!r} "
                                  f"(calculation {calc['name']})")
            target = self.field(checksum["target"])
            cond = checksum.get("if_cond")
            if cond is not None:
                code, _ = self.expr(cond, src)
                src.add(f"if {code}:")
                src.depth += 1
            src.add("_cbits = 0")
            src.add("_cn = 0")
            self.calc_inputs(calc["input"], src, calc["name"])
            src.add("_cbits <<= (-_cn) & 7")
            src.add("_csum = csum16(_cbits.to_bytes((_cn + 7) >> 3, 'big'))")
            if verify:
                err = self.std("checksum_error")
                src.add(f"if _csum != {target.var}:")
                src.add(f"    {err.var} = 1" if err is not None else "    pass")
            else:
                src.add(f"{target.var} = {store_code('_csum', ('u', 16), target.width, target.signed)}")
            if cond is not None:
                src.depth -= 1

    def calc_inputs(self, items: list, src: Source, calc: str) -> None:
        """Append a calculation's inputs to _cbits; fields of an invalid header are skipped."""
        groups: list = []    # [header or None, [fields] or (value, width)]
        for item in items:
            kind = item["type"]
            if kind == "field":
                field = self.field(item["value"])
                header = self.header(field.header)
                if groups and groups[-1][0] is header:
                    groups[-1][1].append(field)
                else:
                    groups.append([header, [field]])
            elif kind == "header":
                groups.append([self.header(item["value"]), list(self.header(item["value"]).fields)])
            elif kind == "hexstr":
                width = item["bitwidth"]
                groups.append([None, (hexstr(item["value"]) & mask(width), width)])
            else:
                raise Unsupported(f"calculation input of type {kind!r} (calculation {calc})")
        for header, fields in groups:
            if header is None:
                value, width = fields
                src.add(f"_cbits = (_cbits << {width}) | {value}")
                src.add(f"_cn += {width}")
                continue
            width = sum(f.width for f in fields)
            parts = " | ".join(f"({_bits(f)} << {s})" if s else _bits(f)
                               for f, s in _shifts(fields))
            prefix = ""
            if not header.metadata:
                src.add(f"if {header.valid_var}:")
                prefix = "    "
            src.add(f"{prefix}_cbits = (_cbits << {width}) | {parts}")
            src.add(f"{prefix}_cn += {width}")

    # ------------------------------------------------------------------ controls
    def pipeline(self, name: str, src: Source) -> None:
        pipes = {p["name"]: p for p in self.doc.get("pipelines", [])}
        if name not in pipes:
            raise Unsupported(f"no pipeline named {name!r}")
        pipe = pipes[name]
        if pipe.get("action_profiles"):
            raise Unsupported(f"action profiles ({pipe['action_profiles'][0]['name']})")
        if pipe.get("action_calls"):
            raise Unsupported("pipeline action_calls")
        nodes = {}
        for table in pipe.get("tables", []):
            self.table_spec(table)
            nodes[table["name"]] = ("table", table)
        for cond in pipe.get("conditionals", []):
            nodes[cond["name"]] = ("cond", cond)
        init = pipe.get("init_table")
        if init is None:
            src.add("pass")
            return
        succ = {n: self.successors(kind, obj) for n, (kind, obj) in nodes.items()}
        ipdom = _post_dominators(succ, init)
        src.add("try:")
        src.depth += 1
        self.region(init, None, nodes, succ, ipdom, src)
        src.add("pass")
        src.depth -= 1
        src.add("except _Exit:")
        src.add("    pass")

    def successors(self, kind: str, obj: dict) -> list:
        if kind == "cond":
            return [obj.get("true_next"), obj.get("false_next")]
        nexts = obj.get("next_tables", {})
        if "__HIT__" in nexts or "__MISS__" in nexts:
            return [nexts.get("__HIT__"), nexts.get("__MISS__")]
        out = [nexts.get(self.actions_json[aid]["name"], obj.get("base_default_next"))
               for aid in obj.get("action_ids", [])]
        return out or [obj.get("base_default_next")]

    def region(self, node, stop, nodes, succ, ipdom, src: Source) -> None:
        """Code for every node from ``node`` up to (not including) ``stop``."""
        while node is not None and node != stop:
            kind, obj = nodes[node]
            targets = succ[node]
            merge = ipdom.get(node)
            if kind == "cond":
                code, _ = self.expr(obj["expression"], src)
                src.add(f"if {code}:  # {obj['name']}")
                src.depth += 1
                src.add("pass")
                self.region(targets[0], merge, nodes, succ, ipdom, src)
                src.depth -= 1
                src.add("else:")
                src.depth += 1
                src.add("pass")
                self.region(targets[1], merge, nodes, succ, ipdom, src)
                src.depth -= 1
            else:
                self.apply_table(obj, src)
                if len(set(targets)) > 1:
                    self.table_branches(obj, targets, merge, nodes, succ, ipdom, src)
                else:
                    merge = targets[0] if targets else None
            node = merge

    def table_branches(self, obj, targets, merge, nodes, succ, ipdom, src: Source) -> None:
        nexts = obj.get("next_tables", {})
        if "__HIT__" in nexts or "__MISS__" in nexts:
            branches = [("_hit", targets[0]), ("not _hit", targets[1])]
        else:
            by_target: dict = {}
            for aid, tgt in zip(obj["action_ids"], targets):
                by_target.setdefault(tgt, []).append(aid)
            branches = [(f"_a in {tuple(aids)!r}", tgt) for tgt, aids in by_target.items()]
        first = True
        for cond, tgt in branches:
            src.add(f"{'if' if first else 'elif'} {cond}:")
            src.depth += 1
            src.add("pass")
            self.region(tgt, merge, nodes, succ, ipdom, src)
            src.depth -= 1
            first = False

    def table_spec(self, table: dict) -> TableSpec:
        name = table["name"]
        if table.get("type", "simple") != "simple":
            raise Unsupported(f"table {name} of type {table['type']!r} (action profiles)")
        if table.get("with_counters") and name not in self.direct_counters:
            raise Unsupported(f"table {name} has counters but no direct counter is bound to it")
        if table.get("direct_meters"):
            raise Unsupported(f"direct meters on table {name}")
        if table.get("support_timeout"):
            raise Unsupported(f"idle timeout on table {name}")
        match_type = table.get("match_type", "exact")
        keys = []
        for key in table.get("key", []):
            mt = key["match_type"]
            if mt not in self.SUPPORTED_MATCH + ("valid",):
                raise Unsupported(f"{mt} match (table {name})")
            if mt == "valid":
                width = 1
            else:
                width = self.field(key["target"]).width if key["target"][1] != "$valid$" else 1
            keys.append((mt if mt != "valid" else "exact", width, key.get("name", "")))
        if match_type not in self.SUPPORTED_MATCH:
            raise Unsupported(f"{match_type} match (table {name})")
        if not keys:
            match_type = "exact"
        spec = TableSpec(name, table["id"], match_type, keys, list(table.get("action_ids", [])),
                         table.get("max_size", 0))
        default = table.get("default_entry")
        if default is not None:
            data = tuple(hexstr(v) for v in default.get("action_data", []))
            spec.default = (default["action_id"], data)
        elif spec.action_ids:
            spec.default = (spec.action_ids[0], ())
        for entry in table.get("entries", []):
            values, masks, prefixes = [], [], []
            for (mt, width, _), mk in zip(keys, entry["match_key"]):
                if mk["match_type"] == "valid":
                    values.append(1 if mk["key"] else 0)
                    masks.append(1)
                elif mk["match_type"] == "range":
                    raise Unsupported(f"range entry in table {name}")
                else:
                    values.append(hexstr(mk["key"]))
                    if mk["match_type"] == "ternary":
                        masks.append(hexstr(mk["mask"]))
                    elif mk["match_type"] == "lpm":
                        plen = mk["prefix_length"]
                        masks.append(mask(width) ^ mask(width - plen))
                        prefixes.append(plen)
                    else:
                        masks.append(mask(width))
            ae = entry["action_entry"]
            spec.const_entries.append((tuple(values), tuple(masks),
                                       entry.get("priority", 0), sum(prefixes),
                                       ae["action_id"],
                                       tuple(hexstr(v) for v in ae.get("action_data", []))))
        spec.direct_counter = self.direct_counters.get(name) if table.get("with_counters") else None
        self.out.tables[name] = spec
        return spec

    def key_code(self, key: dict) -> str:
        mt = key["match_type"]
        target = key["target"]
        if mt == "valid":
            code = f"(1 if {self.valid_code(self.header(target))} else 0)"
        elif target[1] == "$valid$":
            code = f"(1 if {self.valid_code(self.header(target[0]))} else 0)"
        else:
            field = self.field(target)
            code = f"({field.var} & {mask(field.width)})" if field.signed else field.var
        if key.get("mask"):
            code = f"({code} & {hexstr(key['mask'])})"
        return code

    def apply_table(self, table: dict, src: Source) -> None:
        tid = table["id"]
        spec = self.out.tables[table["name"]]
        src.add(f"# table {table['name']}")
        keys = [self.key_code(k) for k in table.get("key", [])]
        if not keys:
            src.add(f"_hit = False")
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
        action_ids = list(dict.fromkeys(table.get("action_ids", [])))
        if spec.default and spec.default[0] not in action_ids:
            action_ids.append(spec.default[0])
        first = True
        for aid in action_ids:
            action = self.actions_json[aid]
            nparams = len(action.get("runtime_data", []))
            if len(action_ids) == 1:
                src.add(f"if True:  # {action['name']}")
            else:
                src.add(f"{'if' if first else 'elif'} _a == {aid}:  # {action['name']}")
            src.depth += 1
            if nparams == 1:
                src.add("ad0, = _d")
            elif nparams:
                src.add(", ".join(f"ad{i}" for i in range(nparams)) + " = _d")
            self.action_body(aid, src)
            src.depth -= 1
            first = False

    # ------------------------------------------------------------------ top level
    def generate(self) -> Compiled:
        self.load_declarations()
        for name in ("ingress", "egress"):
            if name not in {p["name"] for p in self.doc.get("pipelines", [])}:
                raise Unsupported(f"no pipeline named {name!r}")
        deparsers = {d["name"]: d for d in self.doc.get("deparsers", [])}
        if "deparser" not in deparsers:
            raise Unsupported("no deparser named 'deparser'")
        for name in ("ingress_port", "egress_spec", "egress_port"):
            if self.std(name) is None:
                raise Unsupported(f"standard_metadata.{name} is missing")
        std = {n: self.std(n) for n in ("ingress_port", "packet_length", "instance_type",
                                         "parser_error", "egress_spec", "egress_port",
                                         "mcast_grp", "egress_rid")}

        ingress = Source()
        ingress.depth = 1
        ingress.add("plen = in_len = plen_reg = len(pkt)")
        ingress.add("off = 0")
        ingress.add(f"perr = {self.out.errors.get('NoError', 0)}")
        ingress.add(f"{std['ingress_port'].var} = ingress_port")
        if std["packet_length"] is not None:
            ingress.add(f"{std['packet_length'].var} = plen")
        self.parser(ingress)
        if std["parser_error"] is not None:
            ingress.add(f"{std['parser_error'].var} = perr")
        self.checksums(ingress, verify=True)
        self.pipeline("ingress", ingress)
        grp = std["mcast_grp"].var if std["mcast_grp"] is not None else "0"

        egress = Source()
        egress.depth = 1
        egress.counter = ingress.counter
        egress.add(f"{std['egress_port'].var} = egress_port")
        egress.add(f"{std['egress_spec'].var} = {self.drop_port + 1}")
        if std["instance_type"] is not None:
            egress.add(f"{std['instance_type'].var} = instance_type")
        if std["egress_rid"] is not None:
            egress.add("if rid is not None:")
            egress.add(f"    {std['egress_rid'].var} = rid")
        if std["packet_length"] is not None:
            egress.add(f"{std['packet_length'].var} = plen_reg")
        self.pipeline("egress", egress)
        egress.add(f"if {std['egress_spec'].var} == {self.drop_port}:")
        egress.add("    return None")
        self.checksums(egress, verify=False)
        egress.add("_out = []")
        for name in deparsers["deparser"].get("order", []):
            header = self.header(name)
            sname, _, _, pack_args = self.header_struct(header)
            line = f"_out.append({sname}.pack({', '.join(pack_args)}))"
            if header.metadata:
                egress.add(line)
            else:
                egress.add(f"if {header.valid_var}:")
                egress.add(f"    {line}")
        egress.add("_out.append(pkt[off:])")
        egress.add("return b''.join(_out)")

        # Only what egress uses crosses over, and ingress zeroes only what is read
        # before it is written (p4c's many write-only temporaries cost nothing).
        egress_names = set(re.findall(r"\b\w+\b", "\n".join(egress.lines)))
        state = [v for v in self.state_vars if v in egress_names]
        live = _read_names(ingress.lines) | _read_names(egress.lines) | set(state)
        live |= {std["egress_spec"].var, grp}
        _drop_dead_stores(ingress.lines, live)
        _drop_dead_stores(egress.lines, live)
        needed = _read_names(ingress.lines) | set(state) | {std["egress_spec"].var, grp}
        init = [(f.var, 0) for h in self.headers.values() for f in h.fields]
        init += [(h.valid_var, False) for h in self.headers.values() if not h.metadata]
        init = [(var, value) for var, value in init if var in needed]
        self.ns["_INIT"] = tuple(value for _, value in init)

        src = Source()
        src.add("def ingress(pkt, ingress_port):")
        src.add('    """Parse and run ingress: (egress_spec, mcast_grp, state)."""')
        if init:
            src.add("    " + ", ".join(var for var, _ in init) + ", = _INIT")
        src.lines += ingress.lines
        src.add(f"    return {std['egress_spec'].var}, {grp}, ({', '.join(state)},)")
        src.add("")
        src.add("def egress(state, egress_port, rid, instance_type):")
        src.add('    """Run egress and deparse: the frame to send, or None if dropped."""')
        if state:
            src.add(f"    {', '.join(state)}, = state")
        src.lines += egress.lines
        self.out.source = src.text()
        return self.out


def _read_names(lines: list[str]) -> set[str]:
    """Names a block of generated code reads (an assignment's targets do not count)."""
    names = set()
    for line in lines:
        line = re.sub(r"^\s*[\w\s,]+?,?\s=(?!=)", "", line)
        names.update(re.findall(r"\b\w+\b", line))
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


def _bits(field: Field) -> str:
    """A field's bits as a non-negative integer (unsigned fields always are)."""
    return f"({field.var} & {mask(field.width)})" if field.signed else field.var


def _shifts(fields):
    shift = sum(f.width for f in fields)
    for f in fields:
        shift -= f.width
        yield f, shift


def _lookahead(pkt, off, bit_offset, width, too_short):
    end = off + (bit_offset + width + 7) // 8
    if end > len(pkt):
        raise ParserError(too_short)
    total = (end - off) * 8
    return (int.from_bytes(pkt[off:end], "big") >> (total - bit_offset - width)) & mask(width)


def _topological(states, ids) -> list[int]:
    """Parse states in an order where every acyclic transition goes forward."""
    order, seen = [], set()

    def visit(i, stack):
        if i in seen or i in stack:
            return
        stack.add(i)
        for t in states[i].get("transitions", []):
            if t.get("next_state") is not None:
                visit(ids[t["next_state"]], stack)
        stack.discard(i)
        seen.add(i)
        order.append(i)
    for i in range(len(states)):
        visit(i, set())
    return order[::-1]


def _post_dominators(succ: dict, init) -> dict:
    """Immediate post-dominator of every node of the control graph (None: the exit)."""
    nodes = []
    seen = set()

    def walk(n):
        if n is None or n in seen:
            return
        seen.add(n)
        for s in succ[n]:
            walk(s)
        nodes.append(n)          # post-order: successors first
    walk(init)
    exit_ = "<exit>"
    pdom = {exit_: {exit_}}
    every = set(nodes) | {exit_}
    for n in nodes:
        pdom[n] = set(every)
    changed = True
    while changed:
        changed = False
        for n in nodes:
            targets = [s if s is not None else exit_ for s in succ[n]]
            new = set.intersection(*(pdom[t] for t in targets)) | {n}
            if new != pdom[n]:
                pdom[n] = new
                changed = True
    ipdom = {}
    for n in nodes:
        strict = pdom[n] - {n}
        # The immediate one is the strict post-dominator that all others post-dominate.
        for cand in strict:
            if all(other in pdom[cand] for other in strict):
                ipdom[n] = None if cand == exit_ else cand
                break
    return ipdom


def compile_json(text: str | bytes, drop_port: int = DROP_PORT) -> Compiled:
    """Compile a BMv2 JSON document; raises Unsupported or ValueError on bad input."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"device config is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("device config is not a BMv2 JSON object")
    gen = Generator(doc, drop_port)
    try:
        out = gen.generate()
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"malformed BMv2 JSON: {type(exc).__name__}: {exc}") from None
    for name, spec in out.tables.items():
        gen.ns[f"T_{spec.id}"] = spec
    gen.ns["_NOTCACHED"] = _NOTCACHED
    gen.ns["_log_assert"] = _log_assert
    out.namespace = gen.ns
    code = compile(out.source, "<softswitch pipeline>", "exec")
    exec(code, gen.ns)
    out.ingress = gen.ns["ingress"]
    out.egress = gen.ns["egress"]
    return out


_NOTCACHED = object()


def _log_assert(where: str) -> None:
    logging.getLogger("softswitch").error("assert/assume failed in %s", where)
