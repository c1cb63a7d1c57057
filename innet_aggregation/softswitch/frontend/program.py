"""The declarations of a checked BMv2 JSON document, described once.

``Program`` reads the clean copy ``validate.document`` made and describes its
declarations: headers and fields (each with a numeric id), errors, registers,
counters, actions, and table specs (keys, const and default entries), which the
lowering, the backends' tables and the P4Runtime server share. Anything BMv2
supports but this switch does not raises ``Unsupported``, naming the construct.
"""

from __future__ import annotations

import json

from innet_aggregation.softswitch.frontend.validate import Unsupported

DROP_PORT = 511          # simple_switch's default --drop-port
INSTANCE_NORMAL = 0
INSTANCE_I2E_CLONE = 1       # simple_switch's instance_type values
INSTANCE_E2E_CLONE = 2
INSTANCE_RECIRC = 4
INSTANCE_REPLICATION = 5
INSTANCE_RESUBMIT = 6


def hexstr(value: str) -> int:
    return int(value, 16)


def mask(width: int) -> int:
    return (1 << width) - 1


class Field:
    __slots__ = ("header", "name", "width", "signed", "id", "varbit")

    def __init__(self, header, name, width, signed, fid, varbit=False):
        self.header, self.name, self.width, self.signed, self.id = (
            header, name, width, signed, fid)
        self.varbit = varbit           # width is then its most bits; the length field has its bits


class Header:
    """A header or metadata instance with its fields (in wire order for packets)."""

    def __init__(self, name, metadata, fields, hid):
        self.name = name
        self.metadata = metadata
        self.fields = fields
        self.id = hid
        self.varbit = next((f for f in fields if f.varbit), None)
        self.length = None             # with a varbit field: the field holding its bits now
        self.nbits = sum(f.width for f in fields if not f.varbit)   # the fixed part
        self.nbytes = (self.nbits + 7) // 8
        self.max_nbytes = (sum(f.width for f in fields) + 7) // 8
        self.peers: list = []          # the other members of its header union, if any


class ActionSpec:
    def __init__(self, name, aid, params, primitives):
        self.name, self.id, self.params = name, aid, params   # params: [(name, width)]
        self.primitives = primitives


class TableSpec:
    def __init__(self, name, tid, match_type, keys, action_ids, max_size):
        self.name = name
        self.id = tid
        self.match_type = match_type   # exact | ternary | lpm | range
        self.keys = keys               # [(match_type, width, name)]
        self.key_refs = []             # [(kind, target, mask or None)], kind: field | valid
        self.action_ids = action_ids
        self.max_size = max_size
        self.default = None            # (action_id, data) from the JSON
        self.const_entries = []        # [(values, masks, bmv2_priority, prefix, aid, data)]
        self.direct_counter = None     # name of the direct counter bound to this table
        self.hit_miss = False          # next_tables keyed by __HIT__/__MISS__

    @property
    def applied_actions(self) -> list[int]:
        """The action ids the table can run: its own, then the default if it is not one."""
        ids = list(dict.fromkeys(self.action_ids))
        if self.default and self.default[0] not in ids:
            ids.append(self.default[0])
        return ids


class Stack:
    """A header stack: its elements (packet headers) and the field holding its next
    index, a field of a header no JSON can name, so it travels with the packet."""

    def __init__(self, name, headers, next_field):
        self.name, self.headers, self.next = name, headers, next_field


class UnionStack:
    """A header union stack: its elements (each a union's member headers, in the union
    type's order), the members' names, and the field holding its next index (as Stack)."""

    def __init__(self, name, unions, members, next_field):
        self.name, self.unions, self.members, self.next = name, unions, members, next_field

    def member(self, name: str) -> list:
        """That member of every element, as a stack of headers."""
        return [union[self.members.index(name)] for union in self.unions]


STACKS_HEADER = "header stacks"   # not a JSON name (those have no spaces)
VARBIT_HEADER = "varbit lengths"


class RegisterSpec:
    def __init__(self, name, rid, size, width):
        self.name, self.id, self.size, self.width = name, rid, size, width
        self.cells = [0] * size


class CounterSpec:
    def __init__(self, name, cid, size):
        self.name, self.id, self.size = name, cid, size
        self.packets = [0] * size
        self.bytes = [0] * size


class Program:
    """One BMv2 JSON document, checked and described for the emitters."""

    def __init__(self, doc: dict, drop_port: int = DROP_PORT):
        """``doc``: the clean copy ``validate.document`` made of the JSON."""
        self.doc = doc
        self.drop_port = drop_port
        self.headers: dict[str, Header] = {}
        self.fields: dict[tuple[str, str], Field] = {}
        self.field_list: list[Field] = []
        self.aliases: dict[str, tuple[str, str]] = {}
        self.errors: dict[str, int] = {}
        self.registers: dict[str, RegisterSpec] = {}
        self.counters: dict[str, CounterSpec] = {}
        self.actions: dict[int, ActionSpec] = {}
        self.tables: dict[str, TableSpec] = {}
        self.direct_counters: dict[str, str] = {}   # table -> direct counter
        self.load_declarations()
        for pipe in doc["pipelines"]:
            for table in pipe["tables"]:
                self.table_spec(table)
        deparsers = {d["name"]: d for d in doc["deparsers"]}
        self.deparse_order = [self.header(n) for n in deparsers["deparser"]["order"]]
        for name in ("ingress_port", "egress_spec", "egress_port"):
            if self.std(name) is None:
                raise Unsupported(f"standard_metadata.{name} is missing")
        self.ir = None                              # the lowered program, set by load()

    # ------------------------------------------------------------------ declarations
    def load_declarations(self) -> None:
        doc = self.doc
        types = {htype["name"]: htype["fields"] for htype in doc["header_types"]}
        varbits = {htype["name"]: htype.get("varbit") for htype in doc["header_types"]}
        for inst in doc["headers"]:
            fields = []
            for fname, width, signed in types[inst["header_type"]]:
                field = Field(inst["name"], fname, width, signed, len(self.field_list),
                              fname == varbits[inst["header_type"]])
                self.field_list.append(field)
                fields.append(field)
                self.fields[(inst["name"], fname)] = field
            self.headers[inst["name"]] = Header(inst["name"], inst["metadata"], fields,
                                                len(self.headers))
        self.stacks: dict[str, Stack] = {}
        nexts = []
        for stack in doc["header_stacks"]:
            field = Field(STACKS_HEADER, stack["name"], 32, False, len(self.field_list))
            self.field_list.append(field)
            nexts.append(field)
            self.stacks[stack["name"]] = Stack(
                stack["name"], [self.headers[h] for h in stack["headers"]], field)
        self.union_stacks: dict[str, UnionStack] = {}
        unions = {u["name"]: u["headers"] for u in doc["header_unions"]}
        for stack in doc["header_union_stacks"]:
            field = Field(STACKS_HEADER, stack["name"], 32, False, len(self.field_list))
            self.field_list.append(field)
            nexts.append(field)
            self.union_stacks[stack["name"]] = UnionStack(
                stack["name"], [[self.headers[h] for h in unions[u]] for u in stack["unions"]],
                stack["members"], field)
        if nexts:
            self.headers[STACKS_HEADER] = Header(STACKS_HEADER, True, nexts, len(self.headers))
        lengths = []
        for header in list(self.headers.values()):
            if header.varbit is not None:
                header.length = Field(VARBIT_HEADER, header.name, 32, False,
                                      len(self.field_list))
                self.field_list.append(header.length)
                lengths.append(header.length)
        if lengths:
            self.headers[VARBIT_HEADER] = Header(VARBIT_HEADER, True, lengths, len(self.headers))
        self.unions: dict[str, list[Header]] = {}
        for union in doc["header_unions"]:
            members = [self.headers[h] for h in union["headers"]]
            for member in members:
                member.peers = [m for m in members if m is not member]
            self.unions[union["name"]] = members
        for alias, target in doc["field_aliases"]:
            self.aliases[alias] = tuple(target)
        for err_name, code in doc["errors"]:
            self.errors[err_name] = code
        for reg in doc["register_arrays"]:
            self.registers[reg["name"]] = RegisterSpec(reg["name"], reg["id"], reg["size"],
                                                       reg["bitwidth"])
        for ctr in doc["counter_arrays"]:
            if ctr["is_direct"]:
                self.direct_counters[ctr["binding"]] = ctr["name"]
                continue
            self.counters[ctr["name"]] = CounterSpec(ctr["name"], ctr["id"], ctr["size"])
        for action in doc["actions"]:
            params = [(p["name"], p["bitwidth"]) for p in action["runtime_data"]]
            self.actions[action["id"]] = ActionSpec(action["name"], action["id"], params,
                                                    action["primitives"])
        self.calculations = {c["name"]: c for c in doc["calculations"]}
        self.field_lists = {fl["id"]: [self.field(ref) for ref in fl["elements"]]
                            for fl in doc["field_lists"]}
        self.too_short = self.errors.get("PacketTooShort", 1)
        self.no_error = self.errors.get("NoError", 0)

    @property
    def metadata_fields(self) -> list[Field]:
        """What simple_switch's reset_metadata zeroes: the fields of metadata instances
        (not a stack's next index or a varbit's length, which BMv2 keeps in the header)."""
        return [f for h in self.headers.values() if h.metadata
                and h.name not in (STACKS_HEADER, VARBIT_HEADER) for f in h.fields]

    def std(self, name: str) -> Field | None:
        """A standard_metadata field (or its intrinsic_metadata alias), if the program has it."""
        for key in (f"standard_metadata.{name}", f"intrinsic_metadata.{name}",
                    f"queueing_metadata.{name}"):
            if key in self.aliases:
                return self.fields.get(self.aliases[key])
        return self.fields.get(("standard_metadata", name))

    def drop_stores(self, op: str) -> list[tuple[Field, int]]:
        """What ``mark_to_drop``/``drop`` stores, as simple_switch does: the drop
        port in egress_spec, and no multicast group."""
        spec, grp = self.std("egress_spec"), self.std("mcast_grp")
        if spec is None:
            raise Unsupported(f"{op} without standard_metadata.egress_spec")
        return [(spec, self.drop_port)] + ([(grp, 0)] if grp is not None else [])

    def field(self, ref) -> Field:
        header, name = _pair(ref, "field reference")
        if name == "$valid$":
            raise Unsupported(f"{header}.$valid$ used where only a real field can be")
        try:
            return self.fields[(header, name)]
        except KeyError:
            alias = self.aliases.get(f"{header}.{name}")
            if alias and alias in self.fields:
                return self.fields[alias]
            raise Unsupported(f"reference to unknown field {header}.{name}") from None

    def header(self, name) -> Header:
        if not isinstance(name, str):
            raise Unsupported(f"header reference {_short(name)} (expected a header name)")
        try:
            return self.headers[name]
        except KeyError:
            raise Unsupported(f"reference to unknown header {name}") from None

    def header_choice(self, node):
        """A header operand: a Header, or (cond, then, else) for p4c's ``?:`` of headers
        (what predication makes of ``if (c) { h = x; }`` in an action)."""
        if isinstance(node, dict) and node.get("type") == "header":
            return self.header(node.get("value"))
        if isinstance(node, dict) and node.get("type") == "expression":
            value = node.get("value")
            if isinstance(value, dict) and value.get("type") == "expression":
                return self.header_choice(value)
            if isinstance(value, dict) and value.get("op") == "?":
                return (value.get("cond"), self.header_choice(value.get("left")),
                        self.header_choice(value.get("right")))
        raise Unsupported(f"header operand {_short(node)}")

    def stack(self, name) -> Stack:
        stack = self.stacks.get(name) if isinstance(name, str) else None
        if stack is None:
            raise Unsupported(f"unknown header stack {_short(name)}")
        return stack

    def union_stack(self, name) -> UnionStack:
        stack = self.union_stacks.get(name) if isinstance(name, str) else None
        if stack is None:
            raise Unsupported(f"unknown header union stack {_short(name)}")
        return stack

    def union(self, name) -> list[Header]:
        members = self.unions.get(name) if isinstance(name, str) else None
        if members is None:
            raise Unsupported(f"unknown header union {_short(name)}")
        return members

    def action(self, action_id) -> ActionSpec:
        action = self.actions.get(action_id) if isinstance(action_id, int) else None
        if action is None:
            raise Unsupported(f"reference to unknown action id {_short(action_id)}")
        return action

    def register(self, name) -> RegisterSpec:
        spec = self.registers.get(name) if isinstance(name, str) else None
        if spec is None:
            raise Unsupported(f"unknown register {_short(name)}")
        return spec

    def counter(self, name) -> CounterSpec:
        spec = self.counters.get(name) if isinstance(name, str) else None
        if spec is None:
            raise Unsupported(f"unknown counter {_short(name)}")
        return spec

    # ------------------------------------------------------------------ tables
    def table_spec(self, table: dict) -> TableSpec:
        name = table["name"]
        if name in self.tables:
            return self.tables[name]
        keys, refs = [], []
        for key in table["key"]:
            mt, target, width = key["match_type"], key["target"], key["width"]
            if mt == "valid" or target[1] == "$valid$":
                ref = ("valid", self.header(target if mt == "valid" else target[0]).name)
            else:
                ref = ("field", self.field(target))
                if ref[1].varbit:
                    raise Unsupported(f"varbit field {ref[1].header}.{ref[1].name} as a key "
                                      f"of table {name}")
            refs.append((*ref, hexstr(key["mask"]) if key["mask"] is not None else None))
            keys.append((mt if mt != "valid" else "exact", width, key["name"]))
        spec = TableSpec(name, table["id"], table["match_type"] if keys else "exact", keys,
                         list(table["action_ids"]), table["max_size"])
        spec.key_refs = refs
        spec.hit_miss = "__HIT__" in table["next_tables"]
        default = table["default_entry"]
        spec.default = (default["action_id"], tuple(hexstr(v) for v in default["action_data"]))
        for entry in table["entries"]:
            values, masks, prefixes = [], [], []
            for (mt, width, _), mk in zip(keys, entry["match_key"]):
                if mk["match_type"] == "valid":
                    values.append(1 if mk["key"] else 0)
                    masks.append(1)
                    continue
                if mk["match_type"] == "range":
                    values.append(hexstr(mk["start"]))
                    masks.append(hexstr(mk["end"]))
                    continue
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
            spec.const_entries.append((tuple(values), tuple(masks), entry["priority"],
                                       sum(prefixes), ae["action_id"],
                                       tuple(hexstr(v) for v in ae["action_data"])))
        spec.direct_counter = self.direct_counters[name] if table["with_counters"] else None
        self.tables[name] = spec
        return spec


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _pair(ref, what: str) -> tuple[str, str]:
    if (not isinstance(ref, (list, tuple)) or len(ref) != 2
            or not all(isinstance(x, str) for x in ref)):
        raise Unsupported(f"{what} {_short(ref)} (expected [header, field])")
    return ref[0], ref[1]
