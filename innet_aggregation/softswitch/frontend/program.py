"""The half of the BMv2 JSON translator both backends share: load, check, describe.

``Program`` reads a p4c-bm2-ss JSON document once and hands the emitters plain
descriptions: headers and fields (each with a numeric id), errors, registers,
counters, actions, table specs, the parser's states in a forward order, and each
control as a tree of ``If``/``Apply`` nodes rebuilt from post-dominators. An
emitter turns those into code and never looks at the control graph itself.

The document is first checked by ``validate.document`` (the trust boundary: types,
ranges, arity, ids, references, sizes), and only its clean copy is read here.
Anything BMv2 supports but this switch does not raises ``Unsupported``, naming the
construct, so both backends refuse the same programs.
"""

from __future__ import annotations

import json

from innet_aggregation.softswitch.frontend import validate
from innet_aggregation.softswitch.frontend.validate import Unsupported

DROP_PORT = 511          # simple_switch's default --drop-port
INSTANCE_NORMAL = 0
INSTANCE_REPLICATION = 5


def hexstr(value: str) -> int:
    return int(value, 16)


def mask(width: int) -> int:
    return (1 << width) - 1


class Field:
    __slots__ = ("header", "name", "width", "signed", "id")

    def __init__(self, header, name, width, signed, fid):
        self.header, self.name, self.width, self.signed, self.id = (
            header, name, width, signed, fid)


class Header:
    """A header or metadata instance with its fields (in wire order for packets)."""

    def __init__(self, name, metadata, fields, hid):
        self.name = name
        self.metadata = metadata
        self.fields = fields
        self.id = hid
        self.nbits = sum(f.width for f in fields)
        self.nbytes = (self.nbits + 7) // 8


class ActionSpec:
    def __init__(self, name, aid, params, primitives):
        self.name, self.id, self.params = name, aid, params   # params: [(name, width)]
        self.primitives = primitives


class TableSpec:
    def __init__(self, name, tid, match_type, keys, action_ids, max_size):
        self.name = name
        self.id = tid
        self.match_type = match_type   # exact | ternary | lpm
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


class RegisterSpec:
    def __init__(self, name, rid, size, width):
        self.name, self.id, self.size, self.width = name, rid, size, width
        self.cells = [0] * size


class CounterSpec:
    def __init__(self, name, cid, size):
        self.name, self.id, self.size = name, cid, size
        self.packets = [0] * size
        self.bytes = [0] * size


class If:
    """A conditional of a control: ``expression`` picks ``then`` or ``orelse``."""

    def __init__(self, name, expression, then, orelse):
        self.name, self.expression, self.then, self.orelse = name, expression, then, orelse


class Apply:
    """A table application; ``branches`` is [(condition, body)] when what follows
    depends on the outcome: condition "hit", "miss" or a tuple of action ids."""

    def __init__(self, table: TableSpec, branches):
        self.table, self.branches = table, branches


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
        self.controls = {name: self.control(name) for name in ("ingress", "egress")}
        deparsers = {d["name"]: d for d in doc["deparsers"]}
        self.deparse_order = [self.header(n) for n in deparsers["deparser"]["order"]]
        for name in ("ingress_port", "egress_spec", "egress_port"):
            if self.std(name) is None:
                raise Unsupported(f"standard_metadata.{name} is missing")
        self.parser_states, self.parser_init, self.parser_order = self.parser()
        self.checksums = self.load_checksums()

    # ------------------------------------------------------------------ declarations
    def load_declarations(self) -> None:
        doc = self.doc
        types = {htype["name"]: htype["fields"] for htype in doc["header_types"]}
        for inst in doc["headers"]:
            fields = []
            for fname, width, signed in types[inst["header_type"]]:
                field = Field(inst["name"], fname, width, signed, len(self.field_list))
                self.field_list.append(field)
                fields.append(field)
                self.fields[(inst["name"], fname)] = field
            self.headers[inst["name"]] = Header(inst["name"], inst["metadata"], fields,
                                                len(self.headers))
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
        self.too_short = self.errors.get("PacketTooShort", 1)
        self.no_error = self.errors.get("NoError", 0)

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

    # ------------------------------------------------------------------ parser
    def parser(self):
        """(states, index of the init state, states in a forward order)."""
        parser = {p["name"]: p for p in self.doc["parsers"]}["parser"]
        states = parser["parse_states"]
        ids = {s["name"]: i for i, s in enumerate(states)}
        init = parser["init_state"]
        self.state_ids = ids
        return states, ids[init], _topological(states, ids)

    def transitions(self, state: dict):
        """(key parts, [(value, mask or None, next index)], default next index); -1 accepts."""
        def target(name):
            return self.state_ids[name] if name is not None else -1
        cases = state["transitions"]
        key_parts = state["transition_key"]
        if not key_parts or all(c["type"] == "default" for c in cases):
            return [], [], target(cases[0]["next_state"] if cases else None)
        out, default = [], None
        for case in cases:
            if case["type"] == "default":
                default = case["next_state"]
                break   # BMv2 stops at the default transition
            m = hexstr(case["mask"]) if case["mask"] is not None else None
            out.append((hexstr(case["value"]), m, target(case["next_state"])))
        return key_parts, out, target(default)

    # ------------------------------------------------------------------ checksums
    def load_checksums(self) -> list:
        """[(checksum json, calculation json, verify?, update?)], csum16 only."""
        return [(checksum, self.calculations[checksum["calculation"]], checksum["verify"],
                 checksum["update"]) for checksum in self.doc["checksums"]]

    def calc_groups(self, calc: dict) -> list:
        """A calculation's inputs as [(header or None, [fields] or (value, width))]."""
        groups: list = []
        for item in calc["input"]:
            kind = item["type"]
            if kind == "field":
                field = self.field(item["value"])
                header = self.header(field.header)
                if groups and groups[-1][0] is header:
                    groups[-1][1].append(field)
                else:
                    groups.append([header, [field]])
            elif kind == "header":
                header = self.header(item["value"])
                groups.append([header, list(header.fields)])
            else:
                width = item["bitwidth"]
                groups.append([None, (hexstr(item["value"]) & mask(width), width)])
        return groups

    # ------------------------------------------------------------------ controls
    def control(self, name: str) -> list:
        """The pipeline ``name`` as a list of If/Apply nodes."""
        pipe = {p["name"]: p for p in self.doc["pipelines"]}[name]
        nodes = {}
        for table in pipe["tables"]:
            nodes[table["name"]] = ("table", table, self.table_spec(table))
        for cond in pipe["conditionals"]:
            nodes[cond["name"]] = ("cond", cond, None)
        init = pipe["init_table"]
        if init is None:
            return []
        succ = {n: self.successors(kind, obj, spec) for n, (kind, obj, spec) in nodes.items()}
        ipdom = _post_dominators(succ, init)
        return self.region(init, None, nodes, succ, ipdom)

    def successors(self, kind: str, obj: dict, spec) -> list:
        if kind == "cond":
            return [obj["true_next"], obj["false_next"]]
        nexts = obj["next_tables"]
        if spec.hit_miss:
            return [nexts["__HIT__"], nexts["__MISS__"]]
        out = [nexts[self.action(aid).name] for aid in obj["action_ids"]]
        return out or [obj["base_default_next"]]

    def region(self, node, stop, nodes, succ, ipdom) -> list:
        """Nodes from ``node`` up to (not including) ``stop``."""
        out = []
        while node is not None and node != stop:
            kind, obj, spec = nodes[node]
            targets = succ[node]
            merge = ipdom.get(node)
            if kind == "cond":
                out.append(If(obj["name"], obj["expression"],
                              self.region(targets[0], merge, nodes, succ, ipdom),
                              self.region(targets[1], merge, nodes, succ, ipdom)))
            elif len(set(targets)) > 1:
                if spec.hit_miss:
                    conds = ["hit", "miss"]
                else:
                    by_target: dict = {}
                    for aid, tgt in zip(obj["action_ids"], targets):
                        by_target.setdefault(tgt, []).append(aid)
                    conds, targets = zip(*[(tuple(a), t) for t, a in by_target.items()])
                out.append(Apply(spec, [(c, self.region(t, merge, nodes, succ, ipdom))
                                        for c, t in zip(conds, targets)]))
            else:
                out.append(Apply(spec, None))
                merge = targets[0] if targets else None
            node = merge
        return out

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


def load(text: str | bytes, drop_port: int = DROP_PORT) -> Program:
    """Parse and check a BMv2 JSON document; raises Unsupported or ValueError, each
    one line naming what was wrong (and where in the JSON, for the document)."""
    if type(drop_port) is not int or not 0 <= drop_port < validate.MAX_ID:
        raise ValueError(f"drop port {drop_port!r} is not an int in [0, 2^31)")
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"device config is not valid JSON: {exc}") from None
    try:
        return Program(validate.document(doc), drop_port)
    except RecursionError:
        raise ValueError("device config is nested too deeply") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:   # a gap in validate
        raise ValueError(f"malformed BMv2 JSON: {type(exc).__name__}: {exc}") from None


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _pair(ref, what: str) -> tuple[str, str]:
    if (not isinstance(ref, (list, tuple)) or len(ref) != 2
            or not all(isinstance(x, str) for x in ref)):
        raise Unsupported(f"{what} {_short(ref)} (expected [header, field])")
    return ref[0], ref[1]


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
