"""The softswitch's trust boundary: a BMv2 JSON is checked here before anything is built.

``document(doc)`` walks a parsed p4c-bm2-ss document and returns a clean copy that
holds exactly what the translator reads: every int an int (never a bool) in its
range, every name a short string of ``NAME`` characters, every hex string a hex
string, every fixed-size list of its size (a const entry has one key per table key
and one datum per action parameter), every id and error code unique, every
reference resolved, every size within the limits below. Keys the translator does
not read (``source_info``, ``pi_omit``, ...) are left out of the copy, so they cannot
change what runs, and p4c's ``isValid()`` of a ?: choosing between headers (the field
[<the ?:>, "$valid$"]) is written there as a ?: of the headers' validity bits, which
both emitters handle. Anything else is refused with one line naming the JSON path:
``ValueError`` for a malformed document, ``Unsupported`` for a construct this switch
does not run.

The emitters read only the clean copy and write numbers into generated C or
Python only through ``num`` and ``u64``, which accept nothing but an int in range,
so even a bug in the checks above cannot put text into generated source.
"""

from __future__ import annotations

import json
import re

MAX_BITS = 2048              # a field, action parameter, register cell, constant or cast
MAX_HEADER_BITS = 1 << 18    # one header (p4c's scalars of a 1024-value program: 132,664 bits)
MAX_HEADERS = 1 << 12
MAX_STACK = 1 << 8           # elements of a header stack
MAX_FIELDS = 1 << 16
MAX_CELLS = 1 << 24          # one register or counter array
MAX_TOTAL_CELLS = 1 << 26    # all register and counter arrays together
MAX_TABLE_SIZE = 1 << 24     # a table's max_size
MAX_ID = 1 << 31             # ids, action ids, error codes (int32 in the C runtime)
MAX_PRIORITY = 1 << 24       # a const entry's priority (P4Runtime's is 2^24 minus it)
MAX_DEPTH = 128              # nested expressions (two for each operator)
MAX_LOOKAHEAD = 1 << 16      # bit offset of a lookahead
MAX_CHECKSUM_BITS = 1 << 16  # the input of one checksum
NAME = re.compile(r"[A-Za-z0-9_.$\[\]]{1,256}")
HEX = re.compile(r"-?0x[0-9a-fA-F]{1,%d}" % (MAX_BITS // 4 + 8))

UNSUPPORTED_LISTS = (("parse_vsets", "parser value sets"), ("meter_arrays", "meters"),
                     ("learn_lists", "digests"), ("extern_instances", "extern instances"))
MATCH_TYPES = ("exact", "ternary", "lpm", "range")
UNARY = ("not", "~", "d2b", "b2d")
BINARY = ("+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "==", "!=", ">", "<", ">=",
          "<=", "and", "or")
CASTS = ("two_comp_mod", "sat_cast", "usat_cast")
# A primitive's parameters: F a field, E an expression, H a header, R a register array,
# C a counter array, J a jump offset, S a header stack, U a header union, V a header union
# stack, X a header stack or a union stack, K a constant count, N a calculation, L a field
# list's id; log_msg's are not read.
PRIMITIVES = {
    "assign": "FE", "modify_field": "FE", "assign_header": "HE", "copy_header": "HE",
    "add_header": "H", "add_header_fast": "H", "remove_header": "H",
    "mark_to_drop": "H", "drop": "", "register_read": "FRE", "register_write": "REE",
    "count": "CE", "modify_field_rng_uniform": "FEE", "exit": "", "no_op": "",
    "assert": "E", "assume": "E", "_jump": "J", "_jump_if_zero": "EJ",
    "push": "XK", "pop": "XK", "assign_union": "UU",
    "assign_header_stack": "SS", "assign_union_stack": "VV",
    "modify_field_with_hash_based_offset": "FENE",
    "clone_ingress_pkt_to_egress": "EL", "clone_egress_pkt_to_egress": "EL",
    "resubmit": "L", "recirculate": "L",
}
MAX_FIELD_LIST = 1 << 16     # simple_switch keeps a field list's id in 16 bits
# BMv2's hash algorithms both backends compute (the custom CRCs with BMv2's default
# parameters, which only BMv2's runtime CLI changes); xxh64, toeplitz and the round
# robins are refused.
HASH_ALGORITHMS = {   # name -> bits of its value (the printers' order is this one)
    "csum16": 16, "cksum16": 16, "crc16": 16, "crc16_custom": 16, "crc32": 32,
    "crc32_custom": 32, "crcCCITT": 16, "crc8_custom": 8, "crc64_custom": 64, "identity": 64,
    "xor16": 16, "xor32": 32}


def _declared(value, path: str, declared, what: str) -> str:
    """A name the document declared (a key of ``declared``), else one line saying which."""
    name = _name(value, path)
    if name not in declared:
        raise ValueError(f"{path}: unknown {what} {name!r}")
    return name


def _unwrap(node: dict) -> dict:
    """The operation inside a checked expression's {"type": "expression"} wrappers."""
    while node.get("type") == "expression":
        node = node["value"]
    return node


class Unsupported(Exception):
    """A JSON construct this switch cannot run; the message names it."""


# ---------------------------------------------------------------------- literals
def num(value, lo: int, hi: int) -> str:
    """``value`` as a decimal literal for generated C or Python: an int in [lo, hi), or refused."""
    if type(value) is not int or not lo <= value < hi:
        raise ValueError(f"internal error: {_short(value)} is no int in [{lo}, {hi})")
    return str(value)


def u64(value) -> str:
    """``value`` modulo 2^64 as a C literal (``value`` an int of at most MAX_BITS bits)."""
    if type(value) is not int or value.bit_length() > MAX_BITS:
        raise ValueError(f"internal error: {_short(value)} is no int of {MAX_BITS} bits")
    return f"0x{value & 0xFFFFFFFFFFFFFFFF:x}ULL"


# ---------------------------------------------------------------------- the checks
def document(doc) -> dict:
    """The clean copy of a parsed BMv2 JSON document; raises ValueError or Unsupported."""
    if type(doc) is not dict:
        raise ValueError(f"(document): expected a BMv2 JSON object, got {_short(doc)}")
    return _Checker(doc).run()


def _short(value) -> str:
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _range(lo: int, hi: int) -> str:
    top = hi - 1
    if top > 1024 and top & (top - 1) == 0:
        return f"[{lo}, 2^{top.bit_length() - 1}]"
    if hi > 1024 and hi & (hi - 1) == 0:
        return f"[{lo}, 2^{hi.bit_length() - 1})"
    return f"[{lo}, {hi})"


def _int(value, path: str, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value < hi:
        raise ValueError(f"{path}: expected an int in {_range(lo, hi)}, got {_short(value)}")
    return value


def _bool(value, path: str) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{path}: expected true or false, got {_short(value)}")
    return value


def _flag(value, path: str) -> bool:
    """A field's signed flag: true or false, or 1 or 0, which p4c writes at times."""
    if type(value) is int and value in (0, 1):
        return bool(value)
    return _bool(value, path)


def _name(value, path: str) -> str:
    if type(value) is not str or not NAME.fullmatch(value):
        raise ValueError(f"{path}: expected a name (1 to 256 of A-Z a-z 0-9 _ . $ [ ]), "
                         f"got {_short(value)}")
    return value


def _str(value, path: str) -> str:
    if type(value) is not str or len(value) > 256:
        raise ValueError(f"{path}: expected a string, got {_short(value)}")
    return value


def _hex(value, path: str, negative: bool = True) -> int:
    """A hex string's value (kept as the string in the clean copy)."""
    if type(value) is not str or not HEX.fullmatch(value) or (not negative and value[0] == "-"):
        raise ValueError(f"{path}: expected a {'' if negative else 'non-negative '}hex string "
                         f"(0x...), got {_short(value)}")
    number = int(value, 16)
    if number.bit_length() > MAX_BITS:
        raise ValueError(f"{path}: {_short(value)} is wider than {MAX_BITS} bits")
    return number


def _list(value, path: str, size: int | None = None, what: str = "") -> list:
    if type(value) is not list:
        raise ValueError(f"{path}: expected a list, got {_short(value)}")
    if size is not None and len(value) != size:
        raise ValueError(f"{path}: expected {what or f'{size} items'}, got {len(value)} items")
    return value


def _obj(value, path: str, *keys: str) -> dict:
    if type(value) is not dict:
        raise ValueError(f"{path}: expected an object, got {_short(value)}")
    for key in keys:
        if key not in value:
            raise ValueError(f"{path}.{key}: missing")
    return value


def _unique(seen: dict, key, path: str, what: str) -> None:
    if key in seen:
        raise ValueError(f"{path}: {what} {_short(key)} already used at {seen[key]}")
    seen[key] = path


class _Checker:
    """One walk over a document: definitions first, then what refers to them."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.types: dict[str, list] = {}        # header type -> [(field, width, signed)]
        self.headers: dict[str, tuple] = {}     # header -> (metadata, {field: width})
        self.header_ids: dict[int, str] = {}
        self.stacks: dict[str, str] = {}        # header stack -> its header type
        self.unions: dict[str, list] = {}       # header union -> its member headers
        self.union_ids: dict[int, str] = {}
        self.union_stacks: dict[str, list] = {}  # header union stack -> its member names
        self.varbit_types: dict[str, str] = {}  # header type -> its varbit field
        self.varbit_headers: set[str] = set()
        self.aliases: dict[str, tuple] = {}
        self.registers: set[str] = set()
        self.counters: set[str] = set()         # counter arrays (not direct)
        self.direct: dict[str, str] = {}        # table -> direct counter
        self.actions: dict[int, list] = {}      # id -> [param width]
        self.action_names: dict[int, str] = {}
        self.calculations: dict[str, dict] = {}
        self.calculation_paths: dict[str, str] = {}
        self.tables: dict[str, dict] = {}       # every table, by name (its JSON)
        self.field_list_ids: set[int] = set()

    def top(self, key: str, required: bool = True) -> list:
        """A top-level list; one of unsupported things may be left out (none of them)."""
        if required and key not in self.doc:
            raise ValueError(f"{key}: missing")
        return _list(self.doc.get(key, []), key)

    def run(self) -> dict:
        doc = self.doc
        if "__meta__" not in doc:
            raise ValueError("__meta__: missing")
        meta = _obj(doc["__meta__"], "__meta__", "version")
        version = _list(meta["version"], "__meta__.version", 2, "[major, minor]")
        _int(version[1], "__meta__.version[1]", 0, MAX_ID)
        if _int(version[0], "__meta__.version[0]", 0, MAX_ID) != 2:
            raise Unsupported(f"__meta__.version: BMv2 JSON format version {version} "
                              "(expected 2.x)")
        for key, what in UNSUPPORTED_LISTS:
            items = self.top(key, required=False)
            if items:
                names = ", ".join(_short(i.get("name", i) if type(i) is dict else i)
                                  for i in items[:3])
                raise Unsupported(f"{key}: {what} ({names}) are not supported")
        out = {"header_types": self.header_types(), "headers": self.header_instances()}
        taken: dict = {}                         # header -> the path that made it an element
        out["header_stacks"] = self.header_stacks(out["headers"], taken)
        out["header_unions"] = self.header_unions(taken)
        out["header_union_stacks"] = self.header_union_stacks(out["headers"])
        out["field_aliases"] = self.field_aliases()
        out["field_lists"] = self.field_lists()
        out["errors"] = self.errors()
        out["register_arrays"], out["counter_arrays"] = self.arrays()
        actions = self.action_declarations()
        out["calculations"] = self.calculation_list()
        pipelines = [self.pipeline_declarations(p, f"pipelines[{i}]")
                     for i, p in enumerate(self.top("pipelines"))]
        self.bind_counters(out["counter_arrays"])
        out["actions"] = [dict(a, primitives=self.primitives(
            self.doc["actions"][i]["primitives"], f"actions[{i}].primitives", a["id"]))
            for i, a in enumerate(actions)]
        out["pipelines"] = [self.pipeline_bodies(p, f"pipelines[{i}]", pipelines[i])
                            for i, p in enumerate(self.top("pipelines"))]
        out["parsers"] = self.parsers()
        out["deparsers"] = self.deparsers()
        out["checksums"] = self.checksums()
        for key, wanted in (("pipelines", ("ingress", "egress")), ("parsers", ("parser",)),
                            ("deparsers", ("deparser",))):
            names: dict = {}
            for i, item in enumerate(out[key]):
                _unique(names, item["name"], f"{key}[{i}].name", key[:-1])
            for name in wanted:
                if name not in names:
                    raise Unsupported(f"{key}: no {key[:-1]} named {name!r}")
        return out

    # ------------------------------------------------------------------ declarations
    def header_types(self) -> list:
        out, names, ids = [], {}, {}
        for i, item in enumerate(self.top("header_types")):
            path = f"header_types[{i}]"
            item = _obj(item, path, "name", "id", "fields")
            name = _name(item["name"], f"{path}.name")
            _unique(names, name, f"{path}.name", "header type")
            _unique(ids, _int(item["id"], f"{path}.id", 0, MAX_ID), f"{path}.id", "id")
            fields, seen, varbit = [], {}, None
            for j, spec in enumerate(_list(item["fields"], f"{path}.fields")):
                fpath = f"{path}.fields[{j}]"
                is_varbit = type(spec) is list and len(spec) == 2 and spec[1] == "*"
                if not is_varbit:
                    _list(spec, fpath, 3, "[name, bitwidth, signed]")
                fname = _name(spec[0], f"{fpath}[0]")
                if fname == "$valid$":
                    raise ValueError(f"{fpath}[0]: $valid$ is reserved")
                _unique(seen, fname, f"{fpath}[0]", "field")
                if is_varbit:
                    if varbit is not None:
                        raise ValueError(f"{fpath}: a second variable-length field in {name}")
                    varbit = j
                    fields.append([fname, 0, False])      # its width: below
                    continue
                width = _int(spec[1], f"{fpath}[1]", 1, MAX_BITS + 1)
                fields.append([fname, width, _flag(spec[2], f"{fpath}[2]")])
            clean = {"name": name, "fields": fields}
            if varbit is not None:
                # The varbit field's width is what max_length (bytes) leaves it.
                fixed = sum(w for _, w, _ in fields)
                if fixed % 8:
                    raise Unsupported(f"{path}: header type {name} with a varbit field and "
                                      f"{fixed} other bits, not whole bytes")
                _obj(item, path, "max_length")
                max_length = _int(item["max_length"], f"{path}.max_length", fixed // 8 + 1,
                                  (fixed + MAX_BITS) // 8 + 1)
                fields[varbit][1] = max_length * 8 - fixed
                clean.update(varbit=fields[varbit][0], max_length=max_length)
                self.varbit_types[name] = fields[varbit][0]
            if sum(w for _, w, _ in fields) > MAX_HEADER_BITS:
                raise ValueError(f"{path}.fields: more than {MAX_HEADER_BITS} bits")
            self.types[name] = fields
            out.append(clean)
        return out

    def header_instances(self) -> list:
        out, ids, nfields = [], {}, 0
        items = self.top("headers")
        if len(items) > MAX_HEADERS:
            raise ValueError(f"headers: more than {MAX_HEADERS} headers")
        for i, item in enumerate(items):
            path = f"headers[{i}]"
            item = _obj(item, path, "name", "id", "header_type", "metadata")
            name = _name(item["name"], f"{path}.name")
            if name in self.headers:
                raise ValueError(f"{path}.name: header {name!r} is declared twice")
            hid = _int(item["id"], f"{path}.id", 0, MAX_ID)
            _unique(ids, hid, f"{path}.id", "id")
            self.header_ids[hid] = name
            htype = _name(item["header_type"], f"{path}.header_type")
            if htype not in self.types:
                raise ValueError(f"{path}.header_type: unknown header type {htype!r}")
            metadata = _bool(item["metadata"], f"{path}.metadata")
            fields = self.types[htype]
            if htype in self.varbit_types:
                if metadata:
                    raise Unsupported(f"{path}: metadata {name} with a varbit field")
                self.varbit_headers.add(name)
            bits = sum(w for _, w, _ in fields)
            if not metadata and bits % 8:
                raise Unsupported(f"{path}: header {name} is {bits} bits, "
                                  "not a whole number of bytes")
            nfields += len(fields)
            if nfields > MAX_FIELDS:
                raise ValueError(f"{path}: more than {MAX_FIELDS} fields in all headers")
            self.headers[name] = (metadata, {f: w for f, w, _ in fields})
            out.append({"name": name, "header_type": htype, "metadata": metadata})
        return out

    def header_stacks(self, headers: list, taken: dict) -> list:
        """Each stack: its elements, distinct packet headers of the stack's type."""
        out, names, ids = [], {}, {}
        htypes = {h["name"]: h["header_type"] for h in headers}
        for i, item in enumerate(self.top("header_stacks", required=False)):
            path = f"header_stacks[{i}]"
            item = _obj(item, path, "name", "id", "header_type", "size", "header_ids")
            name = _name(item["name"], f"{path}.name")
            _unique(names, name, f"{path}.name", "header stack")
            _unique(ids, _int(item["id"], f"{path}.id", 0, MAX_ID), f"{path}.id", "id")
            htype = _name(item["header_type"], f"{path}.header_type")
            size = _int(item["size"], f"{path}.size", 1, MAX_STACK + 1)
            elements = []
            for j, hid in enumerate(_list(item["header_ids"], f"{path}.header_ids", size,
                                          "one header id per element")):
                epath = f"{path}.header_ids[{j}]"
                header = self.header_ids.get(_int(hid, epath, 0, MAX_ID))
                if header is None:
                    raise ValueError(f"{epath}: unknown header id {hid}")
                if htypes[header] != htype or self.headers[header][0]:
                    raise ValueError(f"{epath}: header {header!r} is no {htype} packet header")
                _unique(taken, header, epath, "stack element")
                elements.append(header)
            self.stacks[name] = htype
            out.append({"name": name, "headers": elements})
        return out

    def header_unions(self, taken: dict) -> list:
        """Each union: its members, packet headers in no stack and no other union."""
        out, names, ids = [], {}, {}
        for i, item in enumerate(self.top("header_unions", required=False)):
            path = f"header_unions[{i}]"
            item = _obj(item, path, "name", "id", "header_ids")
            name = _name(item["name"], f"{path}.name")
            _unique(names, name, f"{path}.name", "header union")
            _unique(ids, _int(item["id"], f"{path}.id", 0, MAX_ID), f"{path}.id", "id")
            members = []
            for j, hid in enumerate(_list(item["header_ids"], f"{path}.header_ids")):
                mpath = f"{path}.header_ids[{j}]"
                header = self.header_ids.get(_int(hid, mpath, 0, MAX_ID))
                if header is None:
                    raise ValueError(f"{mpath}: unknown header id {hid}")
                if self.headers[header][0]:
                    raise ValueError(f"{mpath}: header {header!r} is metadata")
                _unique(taken, header, mpath, "stack element or union member")
                members.append(header)
            if not members or len(members) > MAX_STACK:
                raise ValueError(f"{path}.header_ids: expected 1 to {MAX_STACK} members, "
                                 f"got {len(members)}")
            self.unions[name] = members
            self.union_ids[item["id"]] = name
            out.append({"name": name, "headers": members})
        return out

    def header_union_stacks(self, headers: list) -> list:
        """Each union stack: distinct unions whose members have the types of its union
        type's members, in order (so elements can be swapped and copied member by member),
        and those members' names (what an extract to the stack's next element names)."""
        out, names, ids, taken = [], {}, {}, {}
        items = self.top("header_union_stacks", required=False)
        if not items:
            return out
        htypes = {h["name"]: h["header_type"] for h in headers}
        utypes = {}
        for i, item in enumerate(self.top("header_union_types")):
            path = f"header_union_types[{i}]"
            item = _obj(item, path, "name", "headers")
            members, seen = [], {}
            for j, member in enumerate(_list(item["headers"], f"{path}.headers")):
                mpath = f"{path}.headers[{j}]"
                _list(member, mpath, 2, "[member, header type]")
                _unique(seen, _name(member[0], f"{mpath}[0]"), f"{mpath}[0]", "member")
                htype = _name(member[1], f"{mpath}[1]")
                if htype not in self.types:
                    raise ValueError(f"{mpath}[1]: unknown header type {htype!r}")
                members.append((member[0], htype))
            _unique(utypes, _name(item["name"], f"{path}.name"), f"{path}.name", "union type")
            utypes[item["name"]] = members
        for i, item in enumerate(items):
            path = f"header_union_stacks[{i}]"
            item = _obj(item, path, "name", "id", "union_type", "size", "header_union_ids")
            name = _name(item["name"], f"{path}.name")
            _unique(names, name, f"{path}.name", "header union stack")
            _unique(ids, _int(item["id"], f"{path}.id", 0, MAX_ID), f"{path}.id", "id")
            utype = _name(item["union_type"], f"{path}.union_type")
            if utype not in utypes:
                raise ValueError(f"{path}.union_type: unknown union type {utype!r}")
            size = _int(item["size"], f"{path}.size", 1, MAX_STACK + 1)
            elements = []
            for j, uid in enumerate(_list(item["header_union_ids"], f"{path}.header_union_ids",
                                          size, "one header union id per element")):
                epath = f"{path}.header_union_ids[{j}]"
                union = self.union_ids.get(_int(uid, epath, 0, MAX_ID))
                if union is None:
                    raise ValueError(f"{epath}: unknown header union id {uid}")
                if [htypes[h] for h in self.unions[union]] != [t for _, t in utypes[utype]]:
                    raise ValueError(f"{epath}: header union {union!r} is no {utype}")
                if any(h in self.varbit_headers for h in self.unions[union]):
                    raise Unsupported(f"{epath}: a header union stack with a varbit field")
                _unique(taken, union, epath, "union stack element")
                elements.append(union)
            self.union_stacks[name] = [m for m, _ in utypes[utype]]
            out.append({"name": name, "unions": elements, "members": self.union_stacks[name]})
        return out

    def field_aliases(self) -> list:
        out = []
        for i, item in enumerate(self.top("field_aliases")):
            path = f"field_aliases[{i}]"
            _list(item, path, 2, "[alias, [header, field]]")
            alias = _name(item[0], f"{path}[0]")
            target = self.real_field(item[1], f"{path}[1]")
            self.aliases[alias] = tuple(target)
            out.append([alias, target])
        return out

    def field_lists(self) -> list:
        """What clone, resubmit and recirculate keep of a packet's metadata (p4c writes
        one per ``@field_list`` index): metadata fields only."""
        out = []
        seen: dict = {}
        for i, item in enumerate(self.top("field_lists", required=False)):
            path = f"field_lists[{i}]"
            item = _obj(item, path, "id", "name", "elements")
            fl_id = _int(item["id"], f"{path}.id", 0, MAX_FIELD_LIST)
            _unique(seen, fl_id, f"{path}.id", "field list id")
            fields = []
            for j, element in enumerate(_list(item["elements"], f"{path}.elements")):
                epath = f"{path}.elements[{j}]"
                if type(element) is dict and element.get("type") == "hexstr":
                    _hex(element.get("value"), f"{epath}.value")   # BMv2 copies nothing for it
                    continue
                ref = self.real_field(self.typed(element, epath, "field"), f"{epath}.value")
                header = self.aliases.get(".".join(ref), ref)[0]
                if not self.headers[header][0]:
                    raise Unsupported(f"{epath}: field list element {'.'.join(ref)} is a "
                                      "header field (only metadata is kept)")
                fields.append(ref)
            self.field_list_ids.add(fl_id)
            out.append({"id": fl_id, "name": _name(item["name"], f"{path}.name"),
                        "elements": fields})
        return out

    def errors(self) -> list:
        out, names, codes = [], {}, {}
        for i, item in enumerate(self.top("errors")):
            path = f"errors[{i}]"
            _list(item, path, 2, "[name, code]")
            name = _name(item[0], f"{path}[0]")
            _unique(names, name, f"{path}[0]", "error")
            code = _int(item[1], f"{path}[1]", 0, MAX_ID)
            _unique(codes, code, f"{path}[1]", "error code")
            out.append([name, code])
        return out

    def arrays(self) -> tuple[list, list]:
        registers, counters, total = [], [], 0
        names: dict = {"register": {}, "counter": {}}
        ids: dict = {"register": {}, "counter": {}}
        for i, item in enumerate(self.top("register_arrays")):
            path = f"register_arrays[{i}]"
            item = _obj(item, path, "name", "id", "size", "bitwidth")
            name = _name(item["name"], f"{path}.name")
            _unique(names["register"], name, f"{path}.name", "register")
            _unique(ids["register"], _int(item["id"], f"{path}.id", 0, MAX_ID), f"{path}.id",
                    "register id")
            size = _int(item["size"], f"{path}.size", 1, MAX_CELLS + 1)
            total += size
            registers.append({"name": name, "id": item["id"], "size": size,
                              "bitwidth": _int(item["bitwidth"], f"{path}.bitwidth", 1,
                                               MAX_BITS + 1)})
            self.registers.add(name)
        for i, item in enumerate(self.top("counter_arrays")):
            path = f"counter_arrays[{i}]"
            item = _obj(item, path, "name", "id", "is_direct")
            name = _name(item["name"], f"{path}.name")
            _unique(names["counter"], name, f"{path}.name", "counter")
            _unique(ids["counter"], _int(item["id"], f"{path}.id", 0, MAX_ID), f"{path}.id",
                    "counter id")
            if _bool(item["is_direct"], f"{path}.is_direct"):
                _obj(item, path, "binding")
                counters.append({"name": name, "id": item["id"], "is_direct": True,
                                 "binding": _name(item["binding"], f"{path}.binding")})
                continue
            _obj(item, path, "size")
            size = _int(item["size"], f"{path}.size", 1, MAX_CELLS + 1)
            total += 2 * size
            counters.append({"name": name, "id": item["id"], "is_direct": False, "size": size})
            self.counters.add(name)
        if total > MAX_TOTAL_CELLS:
            raise ValueError(f"register_arrays: {total} cells with the counters' "
                             f"(at most {MAX_TOTAL_CELLS})")
        return registers, counters

    def action_declarations(self) -> list:
        out = []
        for i, item in enumerate(self.top("actions")):
            path = f"actions[{i}]"
            item = _obj(item, path, "name", "id", "runtime_data", "primitives")
            name = _name(item["name"], f"{path}.name")
            aid = _int(item["id"], f"{path}.id", 0, MAX_ID)
            if aid in self.actions:
                raise ValueError(f"{path}.id: action id {aid} is used twice")
            params = []
            for j, param in enumerate(_list(item["runtime_data"], f"{path}.runtime_data")):
                ppath = f"{path}.runtime_data[{j}]"
                param = _obj(param, ppath, "name", "bitwidth")
                params.append({"name": _name(param["name"], f"{ppath}.name"),
                               "bitwidth": _int(param["bitwidth"], f"{ppath}.bitwidth", 1,
                                                MAX_BITS + 1)})
            _list(item["primitives"], f"{path}.primitives")
            self.actions[aid] = [p["bitwidth"] for p in params]
            self.action_names[aid] = name
            out.append({"name": name, "id": aid, "runtime_data": params})
        return out

    def calculation_list(self) -> list:
        out = []
        for i, item in enumerate(self.top("calculations")):
            path = f"calculations[{i}]"
            item = _obj(item, path, "name", "id", "algo", "input")
            name = _name(item["name"], f"{path}.name")
            if name in self.calculations:
                raise ValueError(f"{path}.name: calculation {name!r} is declared twice")
            _int(item["id"], f"{path}.id", 0, MAX_ID)
            inputs, bits = [], 0
            for j, part in enumerate(_list(item["input"], f"{path}.input")):
                ipath = f"{path}.input[{j}]"
                part = _obj(part, ipath, "type", "value")
                kind = _str(part["type"], f"{ipath}.type")
                if kind == "field":
                    value = self.real_field(part["value"], f"{ipath}.value")
                    bits += self.field_width(value)
                    inputs.append({"type": kind, "value": value})
                elif kind == "header":
                    header = self.header(part["value"], f"{ipath}.value")
                    bits += sum(self.headers[header][1].values())
                    inputs.append({"type": kind, "value": header})
                elif kind == "hexstr":
                    _obj(part, ipath, "bitwidth")
                    width = _int(part["bitwidth"], f"{ipath}.bitwidth", 1, MAX_BITS + 1)
                    _hex(part["value"], f"{ipath}.value")
                    bits += width
                    inputs.append({"type": kind, "value": part["value"], "bitwidth": width})
                elif kind == "payload":
                    inputs.append({"type": kind})
                else:
                    raise Unsupported(f"{ipath}.type: calculation input of type {kind!r}")
            if bits > MAX_CHECKSUM_BITS:
                raise ValueError(f"{path}.input: more than {MAX_CHECKSUM_BITS} bits")
            clean = {"name": name, "algo": _name(item["algo"], f"{path}.algo"), "input": inputs}
            self.calculations[name] = clean
            self.calculation_paths[name] = path
            out.append(clean)
        return out

    def algorithm(self, calc: str, path: str) -> None:
        """A calculation used by a checksum or a hash: its algorithm must be one we compute."""
        algo = self.calculations[calc]["algo"]
        if algo not in HASH_ALGORITHMS:
            raise Unsupported(f"{path}: hash algorithm {algo!r} "
                              f"({self.calculation_paths[calc]}.algo)")

    # ------------------------------------------------------------------ references
    def header(self, value, path: str) -> str:
        return _declared(value, path, self.headers, "header")

    def real_field(self, value, path: str) -> list:
        """[header, field] naming a declared field (or an alias of one), not $valid$."""
        ref = self.field_ref(value, path)
        if ref[1] == "$valid$":
            raise Unsupported(f"{path}: {ref[0]}.$valid$ used where only a real field can be")
        return ref

    def field_ref(self, value, path: str) -> list:
        _list(value, path, 2, "[header, field]")
        fname = _name(value[1], f"{path}[1]")
        header = _name(value[0], f"{path}[0]")
        if fname == "$valid$":
            return [self.header(header, f"{path}[0]"), fname]
        if fname in self.headers.get(header, (None, {}))[1] or f"{header}.{fname}" in self.aliases:
            return [header, fname]
        raise ValueError(f"{path}: unknown field {header}.{fname}")

    def stack(self, value, path: str) -> str:
        return _declared(value, path, self.stacks, "header stack")

    def union(self, value, path: str) -> str:
        return _declared(value, path, self.unions, "header union")

    def union_stack(self, value, path: str) -> str:
        return _declared(value, path, self.union_stacks, "header union stack")

    def stack_field(self, value, path: str) -> list:
        """[stack, field]: the field of the stack's last element."""
        _list(value, path, 2, "[stack, field]")
        stack = self.stack(value[0], f"{path}[0]")
        fname = _name(value[1], f"{path}[1]")
        if fname not in {f for f, _, _ in self.types[self.stacks[stack]]}:
            raise ValueError(f"{path}: unknown field {stack}.last.{fname}")
        return [stack, fname]

    def stack_element_field(self, node, path: str, params, depth: int) -> dict:
        """``hs[i].f``: access_field (the field's offset in the header type) of a
        dereference_header_stack by an index expression; nothing else has fields."""
        left = _obj(node["left"], f"{path}.left", "type", "value")
        deref, dpath = left["value"], f"{path}.left.value"
        if left["type"] != "expression" or type(deref) is not dict \
                or deref.get("op") != "dereference_header_stack":
            raise Unsupported(f"{path}.left: access_field of {_short(left)}")
        _obj(deref, dpath, "op", "left", "right")
        stack = self.stack(self.typed(deref["left"], f"{dpath}.left", "header_stack"),
                           f"{dpath}.left.value")
        offset = _int(node["right"], f"{path}.right", 0, len(self.types[self.stacks[stack]]))
        index = self.expr(deref["right"], f"{dpath}.right", params, depth + 1)
        return {"op": "access_field", "right": offset, "left": {"type": "expression", "value": {
            "op": "dereference_header_stack", "left": {"type": "header_stack", "value": stack},
            "right": index}}}

    def validity(self, node, path: str, depth: int) -> dict:
        """The validity bit of what p4c puts before "$valid$" when it is no header name (a
        ?: choosing between headers), as an expression over real headers' validity bits."""
        if depth > MAX_DEPTH:
            raise ValueError(f"{path}: expressions nested more than {MAX_DEPTH // 2} deep")
        if type(node) is dict and node.get("type") == "header":
            return {"type": "field",
                    "value": [self.header(node.get("value"), f"{path}.value"), "$valid$"]}
        if type(node) is dict and node.get("type") == "expression":
            return self.validity(node.get("value"), f"{path}.value", depth + 1)
        if type(node) is dict and "type" not in node and node.get("op") == "?":
            _obj(node, path, "cond", "left", "right")
            return {"type": "expression", "value": {
                "op": "?", "cond": self.expr(node["cond"], f"{path}.cond", None, depth + 1),
                "left": self.validity(node["left"], f"{path}.left", depth + 1),
                "right": self.validity(node["right"], f"{path}.right", depth + 1)}}
        raise Unsupported(f"{path}: isValid() of the computed header {_short(node)}")

    # ------------------------------------------------------------------ expressions
    def expr(self, node, path: str, params, depth: int = 0) -> dict:
        """An operand {"type", "value"}; ``params``: the action's parameter widths, if any."""
        if depth > MAX_DEPTH:
            raise ValueError(f"{path}: expressions nested more than {MAX_DEPTH // 2} deep")
        node = _obj(node, path, "type", "value")
        kind, value, vpath = node["type"], node["value"], f"{path}.value"
        if kind == "field":
            if type(value) is list and len(value) == 2 and type(value[0]) is not str \
                    and value[1] == "$valid$":      # p4c's isValid() of a ?: of headers
                return self.validity(value[0], f"{vpath}[0]", depth + 1)
            return {"type": kind, "value": self.field_ref(value, vpath)}
        if kind == "hexstr":
            _hex(value, vpath)
            return {"type": kind, "value": value}
        if kind == "bool":
            return {"type": kind, "value": _bool(value, vpath)}
        if kind in ("runtime_data", "local"):
            if params is None:
                raise ValueError(f"{path}: an action parameter outside an action")
            return {"type": kind, "value": _int(value, vpath, 0, len(params))}
        if kind == "header":
            return {"type": kind, "value": self.header(value, vpath)}
        if kind == "stack_field":
            return {"type": kind, "value": self.stack_field(value, vpath)}
        if kind == "header_union":
            return {"type": kind, "value": self.union(value, vpath)}
        if kind == "expression":
            return {"type": kind, "value": self.operation(value, vpath, params, depth + 1)}
        _str(kind, f"{path}.type")
        raise Unsupported(f"{path}.type: expression operand of type {kind!r}")

    def operation(self, node, path: str, params, depth: int) -> dict:
        if depth > MAX_DEPTH:
            raise ValueError(f"{path}: expressions nested more than {MAX_DEPTH // 2} deep")
        node = _obj(node, path)
        if "op" not in node and "type" not in node:
            raise ValueError(f"{path}: expected an operation or an expression, got "
                             f"{_short(node)}")
        if "type" in node:      # p4c nests {"type": "expression", "value": {...}}, and
            return self.expr(node, path, params, depth)     # wraps an operand at times
        op = _obj(node, path, "op", "right")["op"]

        def sub(key):
            return self.expr(node[key], f"{path}.{key}", params, depth + 1)
        if op in UNARY:
            return {"op": op, "left": None, "right": sub("right")}
        if op == "valid":
            right = _obj(node["right"], f"{path}.right", "type", "value")
            if right["type"] != "header":
                raise Unsupported(f"{path}.right: valid() of {_short(right)}")
            return {"op": op, "left": None, "right": sub("right")}
        if op == "valid_union":
            right = _obj(node["right"], f"{path}.right", "type", "value")
            if right["type"] != "header_union":
                raise Unsupported(f"{path}.right: valid_union() of {_short(right)}")
            return {"op": op, "left": None, "right": sub("right")}
        _obj(node, path, "left")
        if op == "access_field":
            return self.stack_element_field(node, path, params, depth)
        if op == "?":
            _obj(node, path, "cond")
            return {"op": op, "cond": sub("cond"), "left": sub("left"), "right": sub("right")}
        if op in CASTS:
            right = _obj(node["right"], f"{path}.right", "type", "value")
            if right["type"] != "hexstr":
                raise Unsupported(f"{path}.right: {op} with a non-constant width")
            width = _hex(right["value"], f"{path}.right.value")
            if not 1 <= width <= MAX_BITS:
                raise ValueError(f"{path}.right.value: {op} to {width} bits "
                                 f"(expected 1 to {MAX_BITS})")
            return {"op": op, "left": sub("left"), "right": sub("right")}
        if op in BINARY:
            return {"op": op, "left": sub("left"), "right": sub("right")}
        _str(op, f"{path}.op")
        raise Unsupported(f"{path}.op: expression operator {op!r}")

    def typed(self, node, path: str, kind: str) -> str:
        """The value of a {"type": kind, "value": name} parameter."""
        node = _obj(node, path, "type", "value")
        if node["type"] != kind:
            raise ValueError(f"{path}.type: expected {kind!r}, got {_short(node['type'])}")
        return node["value"]

    # ------------------------------------------------------------------ primitives
    def primitives(self, prims: list, path: str, action_id) -> list:
        params = self.actions[action_id] if action_id is not None else None
        return [self.primitive(p, f"{path}[{i}]", params, len(prims))
                for i, p in enumerate(prims)]

    def primitive(self, prim, path: str, params, nprims: int) -> dict:
        prim = _obj(prim, path, "op", "parameters")
        op, args = prim["op"], _list(prim["parameters"], f"{path}.parameters")
        if op == "log_msg":
            return {"op": op, "parameters": []}
        kinds = PRIMITIVES.get(op) if type(op) is str else None
        if kinds is None:
            _str(op, f"{path}.op")
            raise Unsupported(f"{path}.op: primitive {op!r}")
        if op == "mark_to_drop" and not args:
            kinds = ""                  # v1model's older form has no parameter
        if len(args) != len(kinds):
            raise ValueError(f"{path}.parameters: {op} takes {len(kinds)} parameters, "
                             f"got {len(args)}")
        out = []
        for j, (kind, arg) in enumerate(zip(kinds, args)):
            apath = f"{path}.parameters[{j}]"
            if kind == "F" and op == "assign" and j == 0 and type(arg) is dict \
                    and arg.get("type") == "expression":
                dst = self.expr(arg, apath, params)
                if _unwrap(dst).get("op") != "access_field":
                    raise Unsupported(f"{apath}: assign to {_short(arg)}")
                out.append(dst)
            elif kind == "F":
                out.append({"type": "field",
                            "value": self.real_field(self.typed(arg, apath, "field"),
                                                     f"{apath}.value")})
            elif kind == "H":
                out.append({"type": "header",
                            "value": self.header(self.typed(arg, apath, "header"),
                                                 f"{apath}.value")})
            elif kind == "R":
                out.append({"type": "register_array", "value": _declared(
                    self.typed(arg, apath, "register_array"), f"{apath}.value", self.registers, "register")})
            elif kind == "C":
                out.append({"type": "counter_array", "value": _declared(
                    self.typed(arg, apath, "counter_array"), f"{apath}.value", self.counters, "counter")})
            elif kind == "V" or (kind == "X" and type(arg) is dict
                                 and arg.get("type") == "header_union_stack"):
                out.append({"type": "header_union_stack",
                            "value": self.union_stack(
                                self.typed(arg, apath, "header_union_stack"), f"{apath}.value")})
            elif kind in ("S", "X"):
                out.append({"type": "header_stack",
                            "value": self.stack(self.typed(arg, apath, "header_stack"),
                                                f"{apath}.value")})
            elif kind == "U":
                out.append({"type": "header_union",
                            "value": self.union(self.typed(arg, apath, "header_union"),
                                                f"{apath}.value")})
            elif kind == "K":
                count = _hex(self.typed(arg, apath, "hexstr"), f"{apath}.value")
                out.append({"type": "hexstr", "value": hex(_int(count, f"{apath}.value", 0,
                                                               MAX_ID))})
            elif kind == "N":
                name = _declared(self.typed(arg, apath, "calculation"), f"{apath}.value",
                                 self.calculations, "calculation")
                self.algorithm(name, f"{apath}.value")
                out.append({"type": "calculation", "value": name})
            elif kind == "L":
                fl_id = _hex(self.typed(arg, apath, "hexstr"), f"{apath}.value")
                if fl_id not in self.field_list_ids:
                    raise ValueError(f"{apath}.value: no field list with id {fl_id}")
                out.append({"type": "hexstr", "value": hex(fl_id)})
            elif kind == "J":
                offset = _hex(self.typed(arg, apath, "hexstr"), f"{apath}.value")
                if not 0 <= offset <= nprims:
                    raise ValueError(f"{apath}.value: jump to {offset}, outside the "
                                     f"{nprims} primitives")
                out.append({"type": "hexstr", "value": arg["value"]})
            else:
                out.append(self.expr(arg, apath, params))
        return {"op": op, "parameters": out}

    # ------------------------------------------------------------------ parser
    def parsers(self) -> list:
        out = []
        for i, parser in enumerate(self.top("parsers")):
            path = f"parsers[{i}]"
            parser = _obj(parser, path, "name", "id", "init_state", "parse_states")
            states, ids = {}, {}
            raw = _list(parser["parse_states"], f"{path}.parse_states")
            for j, state in enumerate(raw):
                spath = f"{path}.parse_states[{j}]"
                state = _obj(state, spath, "name", "id", "parser_ops", "transitions",
                             "transition_key")
                name = _name(state["name"], f"{spath}.name")
                _unique(states, name, f"{spath}.name", "parse state")
                _unique(ids, _int(state["id"], f"{spath}.id", 0, MAX_ID), f"{spath}.id", "id")
            clean = []
            for j, state in enumerate(raw):
                spath = f"{path}.parse_states[{j}]"
                ops = [self.parser_op(op, f"{spath}.parser_ops[{k}]")
                       for k, op in enumerate(_list(state["parser_ops"], f"{spath}.parser_ops"))]
                key, nbits = self.transition_key(state["transition_key"],
                                                 f"{spath}.transition_key")
                transitions = [self.transition(t, f"{spath}.transitions[{k}]",
                                               (nbits, f"{spath}.transition_key"), states)
                               for k, t in enumerate(_list(state["transitions"],
                                                           f"{spath}.transitions"))]
                clean.append({"name": state["name"], "parser_ops": ops,
                              "transitions": transitions, "transition_key": key})
            init = self.state_ref(_name(parser["init_state"], f"{path}.init_state"),
                                  f"{path}.init_state", states)
            out.append({"name": _name(parser["name"], f"{path}.name"),
                        "init_state": init, "parse_states": clean})
            _int(parser["id"], f"{path}.id", 0, MAX_ID)
        return out

    @staticmethod
    def state_ref(value, path: str, states: dict):
        if value is None:
            return None
        if _name(value, path) not in states:
            raise ValueError(f"{path}: unknown parse state {value!r}")
        return value

    def parser_op(self, op, path: str) -> dict:
        op = _obj(op, path, "op", "parameters")
        kind, args = op["op"], _list(op["parameters"], f"{path}.parameters")
        arity = {"extract": 1, "extract_VL": 2, "set": 2, "verify": 2, "advance": 1, "shift": 1,
                 "primitive": 1}
        if type(kind) is not str or kind not in arity:
            _str(kind, f"{path}.op")
            raise Unsupported(f"{path}.op: parser operation {kind!r}")
        if len(args) != arity[kind]:
            raise ValueError(f"{path}.parameters: {kind} takes {arity[kind]} parameters, "
                             f"got {len(args)}")
        apath = f"{path}.parameters"
        if kind == "extract_VL":
            arg = _obj(args[0], f"{apath}[0]", "type", "value")
            if arg["type"] == "stack":
                name = self.stack(arg["value"], f"{apath}[0].value")
                target, varbit = {"type": "stack", "value": name}, \
                    self.stacks[name] in self.varbit_types
            elif arg["type"] == "regular":
                name = self.header(arg["value"], f"{apath}[0].value")
                target, varbit = {"type": "regular", "value": name}, name in self.varbit_headers
            else:
                raise Unsupported(f"{apath}[0].type: extract_VL to a {_short(arg['type'])}")
            if not varbit:
                raise ValueError(f"{apath}[0].value: extract_VL to {name!r}, which has no "
                                 "varbit field")
            length, lpath = _obj(args[1], f"{apath}[1]", "type", "value"), f"{apath}[1]"
            if length["type"] == "expression" and type(length["value"]) is dict \
                    and length["value"].get("type") not in (None, "expression"):
                length, lpath = length["value"], f"{lpath}.value"   # p4c wraps an operand
            return {"op": kind, "parameters": [target, self.expr(length, lpath, None)]}
        if kind == "extract":
            arg = _obj(args[0], f"{apath}[0]", "type", "value")
            if arg["type"] == "stack":
                name = self.stack(arg["value"], f"{apath}[0].value")
                if self.stacks[name] in self.varbit_types:
                    raise Unsupported(f"{apath}[0].value: extract of stack {name!r} (a varbit "
                                      "field) without a length")
                return {"op": kind, "parameters": [{"type": "stack", "value": name}]}
            if arg["type"] == "union_stack":
                return {"op": kind, "parameters": [self.union_stack_member(arg["value"],
                                                                           f"{apath}[0].value")]}
            if arg["type"] != "regular":
                raise Unsupported(f"{apath}[0].type: extract to a {_short(arg['type'])}")
            header = self.header(arg["value"], f"{apath}[0].value")
            if self.headers[header][0]:
                raise ValueError(f"{apath}[0].value: extract to metadata {header!r}")
            if header in self.varbit_headers:
                raise Unsupported(f"{apath}[0].value: extract of {header!r} (a varbit field) "
                                  "without a length")
            return {"op": kind, "parameters": [{"type": "regular", "value": header}]}
        if kind == "set":
            field = self.real_field(self.typed(args[0], f"{apath}[0]", "field"),
                                    f"{apath}[0].value")
            arg = _obj(args[1], f"{apath}[1]", "type", "value")
            value = (self.lookahead(arg["value"], f"{apath}[1].value")
                     if arg["type"] == "lookahead" else self.expr(arg, f"{apath}[1]", None))
            return {"op": kind, "parameters": [{"type": "field", "value": field}, value]}
        if kind == "primitive":
            return {"op": kind, "parameters": [self.primitive(args[0], f"{apath}[0]", None, 0)]}
        return {"op": kind, "parameters": [self.expr(a, f"{apath}[{j}]", None)
                                           for j, a in enumerate(args)]}

    def union_stack_member(self, value, path: str) -> dict:
        """[union stack, member]: that member of the stack's next element."""
        _list(value, path, 2, "[union stack, member]")
        stack = self.union_stack(value[0], f"{path}[0]")
        member = _name(value[1], f"{path}[1]")
        if member not in self.union_stacks[stack]:
            raise ValueError(f"{path}[1]: {stack}'s unions have no member {member!r}")
        return {"type": "union_stack", "value": [stack, member]}

    @staticmethod
    def lookahead(value, path: str) -> dict:
        _list(value, path, 2, "[bit offset, bitwidth]")
        return {"type": "lookahead",
                "value": [_int(value[0], f"{path}[0]", 0, MAX_LOOKAHEAD),
                          _int(value[1], f"{path}[1]", 1, MAX_BITS + 1)]}

    def transition_key(self, parts, path: str) -> tuple[list, int]:
        """The key's parts and its width in bits (each part padded to whole bytes)."""
        out, nbits = [], 0
        for k, part in enumerate(_list(parts, path)):
            ppath = f"{path}[{k}]"
            part = _obj(part, ppath, "type", "value")
            if part["type"] == "field":
                ref = self.real_field(part["value"], f"{ppath}.value")
                width = self.field_width(ref)
                out.append({"type": "field", "value": ref})
            elif part["type"] == "stack_field":
                ref = self.stack_field(part["value"], f"{ppath}.value")
                width = {f: w for f, w, _ in self.types[self.stacks[ref[0]]]}[ref[1]]
                out.append({"type": "stack_field", "value": ref})
            elif part["type"] == "lookahead":
                clean = self.lookahead(part["value"], f"{ppath}.value")
                width = clean["value"][1]
                out.append(clean)
            else:
                _str(part["type"], f"{ppath}.type")
                raise Unsupported(f"{ppath}.type: parser transition key of type "
                                  f"{part['type']!r}")
            nbits += (width + 7) // 8 * 8
        return out, nbits

    def field_width(self, ref: list) -> int:
        header, fname = ref
        if fname not in self.headers[header][1]:
            header, fname = self.aliases[f"{header}.{fname}"]
        return self.headers[header][1][fname]

    @staticmethod
    def transition(item, path: str, key: tuple, states: dict) -> dict:
        """A case of a select; ``key``: the key's width in bits and its path."""
        item = _obj(item, path, "type", "value", "mask", "next_state")
        kind = item["type"]
        nxt = _Checker.state_ref(item["next_state"], f"{path}.next_state", states)
        if kind == "default":
            return {"type": kind, "value": None, "mask": None, "next_state": nxt}
        if kind != "hexstr":
            _str(kind, f"{path}.type")
            raise Unsupported(f"{path}.type: parser transition of type {kind!r}")
        clean = {"type": kind, "next_state": nxt}
        nbits, key_path = key
        for part in ("value", "mask"):
            value = item[part]
            if value is None and part == "mask":
                clean[part] = None
                continue
            _hex(value, f"{path}.{part}", negative=False)
            if len(value) - 2 != nbits // 4:
                raise ValueError(f"{path}.{part}: {value} is not as wide as {key_path} "
                                 f"({nbits} bits)")
            clean[part] = value
        return clean

    def deparsers(self) -> list:
        out = []
        for i, item in enumerate(self.top("deparsers")):
            path = f"deparsers[{i}]"
            item = _obj(item, path, "name", "id", "order")
            _int(item["id"], f"{path}.id", 0, MAX_ID)
            if item.get("primitives"):
                raise Unsupported(f"{path}.primitives: deparser primitives")
            out.append({"name": _name(item["name"], f"{path}.name"),
                        "order": [self.header(h, f"{path}.order[{j}]")
                                  for j, h in enumerate(_list(item["order"], f"{path}.order"))]})
        return out

    # ------------------------------------------------------------------ pipelines
    def pipeline_declarations(self, pipe, path: str) -> dict:
        """Node name -> kind of one pipeline (tables and conditionals, checked for uniqueness)."""
        pipe = _obj(pipe, path, "name", "id", "init_table", "tables", "conditionals")
        _name(pipe["name"], f"{path}.name")
        _int(pipe["id"], f"{path}.id", 0, MAX_ID)
        for key, what in (("action_profiles", "action profiles"),
                          ("action_calls", "pipeline action_calls")):
            if _list(pipe.get(key, []), f"{path}.{key}"):
                raise Unsupported(f"{path}.{key}: {what} are not supported")
        nodes: dict = {}
        for key in ("tables", "conditionals"):
            for j, item in enumerate(_list(pipe[key], f"{path}.{key}")):
                npath = f"{path}.{key}[{j}]"
                item = _obj(item, npath, "name", "id")
                name = _name(item["name"], f"{npath}.name")
                _unique(nodes, name, f"{npath}.name", "node")
                _int(item["id"], f"{npath}.id", 0, MAX_ID)
                if key == "tables":
                    if name in self.tables:
                        raise ValueError(f"{npath}.name: table {name!r} is declared twice")
                    self.tables[name] = item
        return nodes

    def bind_counters(self, counters: list) -> None:
        for i, counter in enumerate(counters):
            if not counter["is_direct"]:
                continue
            table = counter["binding"]
            if table not in self.tables:
                raise ValueError(f"counter_arrays[{i}].binding: unknown table {table!r}")
            if table in self.direct:
                raise ValueError(f"counter_arrays[{i}].binding: table {table!r} has two "
                                 "direct counters")
            self.direct[table] = counter["name"]

    def pipeline_bodies(self, pipe: dict, path: str, nodes: dict) -> dict:
        def node_ref(value, npath):
            if value is not None and _name(value, npath) not in nodes:
                raise ValueError(f"{npath}: unknown table or conditional {value!r}")
            return value
        tables = [self.table(t, f"{path}.tables[{j}]", node_ref)
                  for j, t in enumerate(pipe["tables"])]
        conditionals = []
        for j, cond in enumerate(pipe["conditionals"]):
            cpath = f"{path}.conditionals[{j}]"
            cond = _obj(cond, cpath, "expression", "true_next", "false_next")
            conditionals.append({
                "name": cond["name"],
                "expression": self.expr(cond["expression"], f"{cpath}.expression", None),
                "true_next": node_ref(cond["true_next"], f"{cpath}.true_next"),
                "false_next": node_ref(cond["false_next"], f"{cpath}.false_next")})
        clean = {"name": pipe["name"], "init_table": node_ref(pipe["init_table"],
                                                              f"{path}.init_table"),
                 "tables": tables, "conditionals": conditionals}
        _acyclic(clean, path)
        return clean

    def table(self, table: dict, path: str, node_ref) -> dict:
        table = _obj(table, path, "type", "match_type", "key", "action_ids", "max_size",
                     "with_counters", "support_timeout", "direct_meters", "next_tables",
                     "base_default_next", "default_entry")
        name = table["name"]
        if table["type"] != "simple":
            _str(table["type"], f"{path}.type")
            raise Unsupported(f"{path}.type: table {name} of type {table['type']!r} "
                              "(action profiles)")
        if table["direct_meters"] is not None:
            raise Unsupported(f"{path}.direct_meters: direct meters on table {name}")
        if _bool(table["support_timeout"], f"{path}.support_timeout"):
            raise Unsupported(f"{path}.support_timeout: idle timeout on table {name}")
        counted = _bool(table["with_counters"], f"{path}.with_counters")
        if counted and name not in self.direct:
            raise ValueError(f"{path}.with_counters: no direct counter is bound to table {name}")
        match_type = self.match_type(table["match_type"], f"{path}.match_type", name)
        keys = [self.table_key(k, f"{path}.key[{j}]", name)
                for j, k in enumerate(_list(table["key"], f"{path}.key"))]
        for j, key in enumerate(keys):
            if key["match_type"] == "range" and match_type != "range":
                raise ValueError(f"{path}.match_type: a {match_type} table with a range key "
                                 f"at {path}.key[{j}].match_type")
        action_ids = []
        for j, aid in enumerate(_list(table["action_ids"], f"{path}.action_ids")):
            action_ids.append(self.action_ref(aid, f"{path}.action_ids[{j}]"))
        if len(set(action_ids)) != len(action_ids):
            raise ValueError(f"{path}.action_ids: an action is listed twice")
        max_size = _int(table["max_size"], f"{path}.max_size", 1, MAX_TABLE_SIZE + 1)
        nexts = _obj(table["next_tables"], f"{path}.next_tables")
        hit_miss = "__HIT__" in nexts or "__MISS__" in nexts
        expected = ({"__HIT__", "__MISS__"} if hit_miss
                    else {self.action_names[a] for a in action_ids})
        for key in expected:
            _obj(nexts, f"{path}.next_tables", key)
        if set(nexts) != expected:
            extra = sorted(set(nexts) - expected)[0]
            raise ValueError(f"{path}.next_tables: {extra!r} is no action of table {name}")
        default = self.action_call(table["default_entry"], f"{path}.default_entry")
        clean = {"name": name, "id": table["id"], "match_type": match_type, "key": keys,
                 "action_ids": action_ids, "max_size": max_size, "with_counters": counted,
                 "next_tables": {k: node_ref(v, f"{path}.next_tables.{k}")
                                 for k, v in nexts.items()},
                 "base_default_next": node_ref(table["base_default_next"],
                                               f"{path}.base_default_next"),
                 "default_entry": default}
        entries = _list(table.get("entries", []), f"{path}.entries")
        if len(entries) > max_size:
            raise ValueError(f"{path}.entries: {len(entries)} const entries in a table of "
                             f"{max_size}")
        clean["entries"] = [self.const_entry(e, f"{path}.entries[{j}]", keys, action_ids)
                            for j, e in enumerate(entries)]
        return clean

    @staticmethod
    def match_type(value, path: str, table: str) -> str:
        if value in MATCH_TYPES:
            return value
        _str(value, path)
        raise Unsupported(f"{path}: {_short(value)} match (table {table})")

    def table_key(self, key, path: str, table: str) -> dict:
        if type(key) is dict and "name" not in key:
            key = {**key, "name": None}     # p4c leaves it out at times; BMv2 takes that
        key = _obj(key, path, "match_type", "target", "mask", "name")
        mt = key["match_type"]
        if mt == "valid":
            width, target = 1, self.header(key["target"], f"{path}.target")
        else:
            self.match_type(mt, f"{path}.match_type", table)
            target = self.field_ref(key["target"], f"{path}.target")
            width = 1 if target[1] == "$valid$" else self.field_width(target)
        mask = key["mask"]
        if mask is not None:
            _hex(mask, f"{path}.mask", negative=False)
        label = key["name"]
        if label is None:       # a label only (P4Info's fields join by position): the field
            label = ".".join(target) if mt != "valid" else f"{target}.$valid$"
        if type(label) is not str or len(label) > 256 or not label.isprintable():
            raise ValueError(f"{path}.name: expected a printable string, got {_short(label)}")
        return {"match_type": mt, "target": target, "mask": mask, "name": label,
                "width": width}

    def action_ref(self, value, path: str) -> int:
        aid = _int(value, path, 0, MAX_ID)
        if aid not in self.actions:
            raise ValueError(f"{path}: unknown action id {aid}")
        return aid

    def action_call(self, call, path: str) -> dict:
        """{action_id, action_data}: one datum (a hex string) per parameter of the action."""
        call = _obj(call, path, "action_id", "action_data")
        aid = self.action_ref(call["action_id"], f"{path}.action_id")
        params = self.actions[aid]
        data = _list(call["action_data"], f"{path}.action_data", len(params),
                     f"{len(params)} items (one per parameter of action {aid})")
        for j, value in enumerate(data):
            _hex(value, f"{path}.action_data[{j}]", negative=False)
        return {"action_id": aid, "action_data": list(data)}

    def const_entry(self, entry, path: str, keys: list, action_ids: list) -> dict:
        entry = _obj(entry, path, "match_key", "action_entry", "priority")
        match = _list(entry["match_key"], f"{path}.match_key", len(keys),
                      f"{len(keys)} items (one per key of the table)")
        clean_keys = []
        for j, (mk, key) in enumerate(zip(match, keys)):
            kpath = f"{path}.match_key[{j}]"
            mk = _obj(mk, kpath, "match_type")
            if mk["match_type"] != key["match_type"]:
                raise ValueError(f"{kpath}.match_type: expected {key['match_type']!r} as the "
                                 f"table's key, got {_short(mk['match_type'])}")
            clean = {"match_type": mk["match_type"]}
            if mk["match_type"] == "valid":
                _obj(mk, kpath, "key")
                clean["key"] = _bool(mk["key"], f"{kpath}.key")
            else:
                parts = (("start", "end") if mk["match_type"] == "range"
                         else ("key", "mask") if mk["match_type"] == "ternary" else ("key",))
                for part in parts:
                    _obj(mk, kpath, part)
                    if _hex(mk[part], f"{kpath}.{part}", negative=False) >> key["width"]:
                        raise ValueError(f"{kpath}.{part}: {mk[part]} is wider than the key "
                                         f"({key['width']} bits)")
                    clean[part] = mk[part]
                if mk["match_type"] == "lpm":
                    _obj(mk, kpath, "prefix_length")
                    clean["prefix_length"] = _int(mk["prefix_length"], f"{kpath}.prefix_length",
                                                  0, key["width"] + 1)
            clean_keys.append(clean)
        action = self.action_call(entry["action_entry"], f"{path}.action_entry")
        if action["action_id"] not in action_ids:
            raise ValueError(f"{path}.action_entry.action_id: action {action['action_id']} "
                             "is not one of the table's")
        return {"match_key": clean_keys, "action_entry": action,
                "priority": _int(entry["priority"], f"{path}.priority", 0, MAX_PRIORITY)}

    # ------------------------------------------------------------------ checksums
    def checksums(self) -> list:
        out = []
        for i, item in enumerate(self.top("checksums")):
            path = f"checksums[{i}]"
            item = _obj(item, path, "name", "id", "target", "type", "calculation", "verify",
                        "update", "if_cond")
            _int(item["id"], f"{path}.id", 0, MAX_ID)
            if item["type"] not in ("generic", "ipv4"):
                _str(item["type"], f"{path}.type")
                raise Unsupported(f"{path}.type: checksum type {item['type']!r}")
            calc = _name(item["calculation"], f"{path}.calculation")
            if calc not in self.calculations:
                raise ValueError(f"{path}.calculation: unknown calculation {calc!r}")
            self.algorithm(calc, f"{path}.calculation")
            cond = item["if_cond"]
            out.append({"name": _name(item["name"], f"{path}.name"),
                        "target": self.real_field(item["target"], f"{path}.target"),
                        "calculation": calc,
                        "verify": _bool(item["verify"], f"{path}.verify"),
                        "update": _bool(item["update"], f"{path}.update"),
                        "if_cond": None if cond is None else self.expr(cond, f"{path}.if_cond",
                                                                       None)})
        return out


def _acyclic(pipe: dict, path: str) -> None:
    """A control is a DAG of tables and conditionals (BMv2 has no loops there)."""
    succ = {}
    for table in pipe["tables"]:
        succ[table["name"]] = list(table["next_tables"].values()) + [table["base_default_next"]]
    for cond in pipe["conditionals"]:
        succ[cond["name"]] = [cond["true_next"], cond["false_next"]]
    state: dict = {}                     # node -> "open" while on the stack, then "done"
    for root in succ:
        if root in state:
            continue
        state[root] = "open"
        stack = [(root, iter(succ[root]))]
        while stack:
            node, successors = stack[-1]
            for nxt in successors:
                if nxt is None or state.get(nxt) == "done":
                    continue
                if state.get(nxt) == "open":
                    raise ValueError(f"{path}: the control loops back to {nxt!r}")
                state[nxt] = "open"
                stack.append((nxt, iter(succ[nxt])))
                break
            else:
                state[node] = "done"
                stack.pop()
