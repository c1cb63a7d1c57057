"""Lowering: a described ``Program`` into the ``ir`` both backends print.

Everything a backend would otherwise rebuild from the JSON happens once here:
if/else from the controls' jumps (post-dominators) and from actions' forward
``_jump``s, parser states with their select key as one integer, checksum inputs,
table keys and the actions each table runs, the stores of ``mark_to_drop``, and
the bounds of every expression. What neither backend runs raises ``Unsupported``
naming the construct; what only one lacks is that printer's to refuse.
"""

from __future__ import annotations

from innet_aggregation.softswitch.frontend import ir, widths
from innet_aggregation.softswitch.frontend.program import (Field, Header, Program, RegisterSpec,
                                                          hexstr, mask)
from innet_aggregation.softswitch.frontend.validate import Unsupported


SPECIAL_OPS = ("clone_ingress_pkt_to_egress", "clone_egress_pkt_to_egress", "resubmit",
               "recirculate")


class Lowering:
    def __init__(self, program: Program):
        self.prog = program
        self.actions: dict[int, ir.Action] = {}
        self.special_ops = False        # a clone, resubmit or recirculate was lowered

    # ------------------------------------------------------------------ expressions
    def expr(self, node, params, where: str) -> ir.Expr:
        if not isinstance(node, dict):
            raise Unsupported(f"expression {node!r:.60} (expected an object) in {where}")
        kind, value = node.get("type"), node.get("value")
        if kind == "field":
            if isinstance(value, list) and len(value) == 2 and value[1] == "$valid$":
                return ir.Unary("b2d", self.valid(self.prog.header(value[0])))
            return ir.FieldRef(self.prog.field(value))     # a varbit reads as its value now
        if kind == "hexstr":
            return ir.Const(hexstr(value))
        if kind == "stack_field":
            return self.last_field(self.prog.stack(value[0]), value[1])
        if kind == "bool":
            return ir.Const(int(bool(value)), boolean=True)
        if kind in ("runtime_data", "local"):
            if params is None or not isinstance(value, int) or not 0 <= value < len(params):
                raise Unsupported(f"action parameter {value!r:.20} used outside an action")
            return ir.Param(value, params[value][1])
        if kind == "expression":
            return self.operation(value, params, where)
        raise Unsupported(f"expression operand of type {kind!r:.40}")

    def fixed_field(self, ref, where: str):
        field = self.prog.field(ref)
        if field.varbit:
            raise Unsupported(f"varbit field {field.header}.{field.name} written or used as a "
                              f"select key (in {where})")
        return field

    def last_field(self, stack, name: str) -> ir.Expr:
        """``stack.last.name``: the field of element next - 1 (next is 0: BMv2 leaves
        that undefined; here it reads element 0)."""
        fields = [next(f for f in h.fields if f.name == name) for h in stack.headers]
        out: ir.Expr = ir.FieldRef(fields[0])
        for i, field in enumerate(fields[1:], start=2):
            out = ir.Cond(ir.Binary("==", ir.FieldRef(stack.next), ir.Const(i)),
                          ir.FieldRef(field), out)
        return out

    def extract_next(self, name: str, headers: list, next_field,
                     nbits: ir.Expr | None = None) -> list:
        """``extract(stack.next)`` (of a union stack: ``stack.next.member``, ``headers``
        that member of each element): StackOutOfBounds when full, else element next,
        next + 1 (with ``nbits``, the extract_VL of a stack of varbit headers)."""
        if "StackOutOfBounds" not in self.prog.errors:
            raise Unsupported(f"extract to header stack {name} without the "
                              "StackOutOfBounds error")
        nxt = ir.FieldRef(next_field)
        out = [ir.Verify(ir.Binary("<", nxt, ir.Const(len(headers))),
                         ir.Const(self.prog.errors["StackOutOfBounds"]))]
        chain: list = self.extract(headers[-1], nbits) + self.union_rest(headers[-1])
        for i in range(len(headers) - 2, -1, -1):
            chain = [ir.If(ir.Binary("==", nxt, ir.Const(i)),
                           self.extract(headers[i], nbits) + self.union_rest(headers[i]), chain)]
        return out + chain + [ir.Assign(next_field, ir.Binary("+", nxt, ir.Const(1)))]

    def extract(self, header: Header, nbits: ir.Expr | None) -> list:
        """One header's extract, with a length for a varbit one (``nbits``)."""
        if nbits is None:
            return [ir.Extract(header)]
        return [ir.ExtractVL(header, nbits, self.prog.errors["ParserInvalidArgument"],
                             self.prog.errors["HeaderTooShort"])]

    @staticmethod
    def shift(elements: list, next_field, count: int, push: bool, invalidate: bool) -> list:
        """push_front/pop_front by ``count`` as BMv2 (P4_16 stacks) does them: the same
        swaps, then the emptied elements invalid (``invalidate``: BMv2 leaves a union
        stack's as the swaps left them), and next moved within [0, size]. ``elements``:
        each element's headers (one, or a union's members)."""
        size = len(elements)
        if count == 0:
            return []
        nxt = ir.FieldRef(next_field)

        def swap(i, j):
            return [ir.SwapHeaders(a, b) for a, b in zip(elements[i], elements[j])]
        if push:
            out = [s for i in range(size - 1, count - 1, -1) for s in swap(i, i - count)]
            emptied = elements[:min(size, count)]
            moved = ir.Binary("+", nxt, ir.Const(count))
            new = ir.Cond(ir.Binary("<", moved, ir.Const(size)), moved, ir.Const(size))
        else:
            out = [s for i in range(0, size - count) for s in swap(i, i + count)]
            emptied = elements[max(size - count, 0):]
            new = ir.Cond(ir.Binary(">=", nxt, ir.Const(count)),
                          ir.Binary("-", nxt, ir.Const(count)), ir.Const(0))
        if invalidate:
            out += [ir.SetValid(h, False) for element in emptied for h in element]
        return out + [ir.Assign(next_field, new)]

    def assign_stack(self, dst: list, src: list, dst_next, src_next, params, where: str) -> list:
        """``dst = src`` of whole stacks (BMv2's assign_header_stack and
        assign_union_stack): next, then each element header by header as assign_header."""
        if [len(d) for d in dst] != [len(s) for s in src]:
            raise Unsupported(f"stack assignment between stacks of different sizes or union "
                              f"types in {where}")
        out = [ir.Assign(dst_next, ir.FieldRef(src_next))]
        for d, s in zip(dst, src):
            for dh, sh in zip(d, s):
                out += self.copy_header(dh, sh, params, where)
        return out

    def stack_element(self, node, params, where: str):
        """``hs[i].f`` (checked access_field): field f of every element, and i."""
        while node.get("type") == "expression":
            node = node["value"]
        deref = node["left"]["value"]
        stack = self.prog.stack(deref["left"]["value"])
        fields = [h.fields[node["right"]] for h in stack.headers]
        return fields, self.expr(deref["right"], params, where)

    def valid(self, header: Header) -> ir.Expr:
        return ir.Const(1, boolean=True) if header.metadata else ir.Valid(header)

    def operation(self, node, params, where: str) -> ir.Expr:
        if not isinstance(node, dict):
            raise Unsupported(f"expression {node!r:.60} (expected an object) in {where}")
        if node.get("type") == "expression":     # p4c nests {"type": "expression", "value": ...}
            return self.operation(node["value"], params, where)
        if "type" in node:                       # and wraps an operand at times
            return self.expr(node, params, where)
        op = node.get("op")
        left, right = node.get("left"), node.get("right")
        if op == "valid":
            return self.valid(self.prog.header(right["value"]))
        if op == "valid_union":
            members = [ir.Valid(h) for h in self.prog.union(right["value"])]
            out = members[0]
            for member in members[1:]:
                out = ir.Binary("or", out, member)
            return out
        if op == "access_field":
            fields, index = self.stack_element(node, params, where)
            return ir.StackField(fields, index)
        if op in ("not", "~", "d2b", "b2d"):
            a = self.expr(right, params, where)
            if op == "d2b" and a.boolean:
                return a
            if op == "d2b" and isinstance(a, ir.Unary) and a.op == "b2d":
                return a.a
            if op == "b2d" and not a.boolean:
                return a
            return ir.Unary(op, a)
        if op == "?":
            return ir.Cond(self.expr(node["cond"], params, where),
                           self.expr(left, params, where), self.expr(right, params, where))
        if op in ("two_comp_mod", "sat_cast", "usat_cast"):
            a = self.expr(left, params, where)
            if not isinstance(right, dict) or right.get("type") != "hexstr":
                raise Unsupported(f"{op} with a non-constant width")
            width = hexstr(right["value"])
            if width < 1:
                raise Unsupported(f"{op} to {width} bits")
            if a.fits(width, op != "usat_cast"):
                return a
            return ir.Cast(op, a, width)
        if op in ir.COMPARISONS or op in ("and", "or", "+", "-", "*", "/", "%", "&", "|", "^",
                                          "<<", ">>"):
            return ir.Binary(op, self.expr(left, params, where), self.expr(right, params, where))
        raise Unsupported(f"expression operator {op!r:.40}")

    # ------------------------------------------------------------------ primitives
    def primitive(self, prim, params, where: str) -> list:
        if not isinstance(prim, dict):
            raise Unsupported(f"primitive {prim!r:.40} in {where}")
        op = prim.get("op")
        args = prim.get("parameters", [])
        prog = self.prog
        if op in ("assign", "modify_field"):
            if op == "assign" and args[0].get("type") == "expression":
                fields, index = self.stack_element(args[0], params, where)
                return [ir.AssignStackField(fields, index, self.expr(args[1], params, where))]
            if args[0].get("type") != "field":
                raise Unsupported(f"{op} to a {args[0].get('type')!r:.30} in {where}")
            return [ir.Assign(self.fixed_field(args[0]["value"], where),
                              self.expr(args[1], params, where))]
        if op in ("assign_header", "copy_header"):
            return self.copy_header(prog.header(args[0]["value"]),
                                    prog.header_choice(args[1]), params, where)
        if op in ("add_header", "add_header_fast", "remove_header"):
            header = prog.header(args[0]["value"])
            if header.metadata:
                return []
            if op == "remove_header":
                return [ir.RemoveHeader(header)]
            return [ir.AddHeader(header, op == "add_header")] + self.union_rest(header)
        if op in ("mark_to_drop", "drop"):
            return [ir.Assign(field, ir.Const(value)) for field, value in prog.drop_stores(op)]
        if op == "register_read":
            return [ir.RegisterRead(self.fixed_field(args[0]["value"], where),
                                    prog.register(args[1]["value"]),
                                    self.expr(args[2], params, where))]
        if op == "register_write":
            return [ir.RegisterWrite(prog.register(args[0]["value"]),
                                     self.expr(args[1], params, where),
                                     self.expr(args[2], params, where))]
        if op == "count":
            return [ir.Count(prog.counter(args[0]["value"]), self.expr(args[1], params, where))]
        if op == "modify_field_rng_uniform":
            return [ir.Random(self.fixed_field(args[0]["value"], where),
                              self.expr(args[1], params, where), self.expr(args[2], params, where))]
        if op == "assign_union":
            dst, src = prog.union(args[0]["value"]), prog.union(args[1]["value"])
            if len(dst) != len(src):
                raise Unsupported(f"assign_union between different union types in {where}")
            out = []
            for d, s in zip(dst, src):     # BMv2: assign_header member by member
                out += self.copy_header(d, s, params, where)
            return out
        if op in ("push", "pop") and args[0].get("type") == "header_union_stack":
            stack = prog.union_stack(args[0]["value"])
            return self.shift(stack.unions, stack.next, hexstr(args[1]["value"]),
                              op == "push", invalidate=False)
        if op in ("push", "pop"):
            stack = prog.stack(args[0]["value"])
            if stack.headers[0].length is not None:
                raise Unsupported(f"push_front/pop_front of stack {stack.name} of varbit headers")
            return self.shift([[h] for h in stack.headers], stack.next,
                              hexstr(args[1]["value"]), op == "push", invalidate=True)
        if op == "assign_header_stack":
            dst, src = prog.stack(args[0]["value"]), prog.stack(args[1]["value"])
            return self.assign_stack([[h] for h in dst.headers], [[h] for h in src.headers],
                                     dst.next, src.next, params, where)
        if op == "assign_union_stack":
            dst, src = prog.union_stack(args[0]["value"]), prog.union_stack(args[1]["value"])
            return self.assign_stack(dst.unions, src.unions, dst.next, src.next, params, where)
        if op == "exit":
            return [ir.Exit()]
        if op == "modify_field_with_hash_based_offset":
            return [self.hash_offset(args, params, where)]
        if op in ("no_op", "log_msg"):
            return []
        if op in ("assert", "assume"):
            return [ir.Assert(self.expr(args[0], params, where))]
        if op in SPECIAL_OPS:
            return self.special(op, args, params, where)
        raise Unsupported(f"primitive {op!r:.40} (in {where})")

    def hash_offset(self, args, params, where: str) -> ir.HashOffset:
        base, size = self.expr(args[1], params, where), self.expr(args[3], params, where)
        for what, value in (("base", base), ("size", size)):
            if not value.known or value.lo < 0 or value.hi >> 64:
                raise Unsupported(f"hash-based offset with a {what} that may not fit in "
                                  f"64 bits ({where})")
        return ir.HashOffset(self.fixed_field(args[0]["value"], where), base,
                             self.calculation(self.prog.calculations[args[2]["value"]]), size)

    def special(self, op: str, args: list, params, where: str) -> list:
        """clone, resubmit, recirculate: what the packet does after its pipeline."""
        if params is None:
            raise Unsupported(f"{op} in a parser ({where})")
        self.special_ops = True
        fl = hexstr(args[-1]["value"])
        if op == "resubmit":
            return [ir.Resubmit(fl)]
        if op == "recirculate":
            return [ir.Recirculate(fl)]
        return [ir.Clone(self.expr(args[0], params, where), fl)]

    def copy_header(self, dst: Header, src, params, where: str) -> list:
        """``dst = src``; a (cond, then, else) source (p4c's ``?:`` of headers) picks at run time."""
        if isinstance(src, tuple):
            cond, left, right = src
            return [ir.If(self.expr(cond, params, where),
                          self.copy_header(dst, left, params, where),
                          self.copy_header(dst, right, params, where))]
        if [f.width for f in dst.fields] != [f.width for f in src.fields]:
            raise Unsupported(f"header copy between different header types in {where}")
        rest = self.union_rest(dst)
        if dst.length is not None:          # BMv2's assign_VL: the varbit's length too
            rest.append(ir.Assign(dst.length, ir.FieldRef(src.length)))
        return [ir.CopyHeader(dst, src)] + ([ir.If(ir.Valid(dst), rest, [])] if rest else [])

    @staticmethod
    def union_rest(header: Header) -> list:
        """What BMv2 does when a union member becomes valid: the other members become
        invalid (so at most one is valid, and the union is valid when one is). A member
        made valid again was the valid one already, so this is right either way."""
        return [ir.SetValid(peer, False) for peer in header.peers]

    def statements(self, prims: list, params, where: str) -> list:
        """A primitive list, p4c's forward ``_jump``s turned back into if/else and return."""
        end = len(prims)

        def target(prim, pos):
            value = prim["parameters"][pos]
            if value.get("type") != "hexstr":
                raise Unsupported(f"{prim['op']} to a computed offset (in {where})")
            return hexstr(value["value"])

        def region(i, stop) -> list:
            out = []
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
                    then = region(i + 1, dest - 1 if has_else else dest)
                    orelse = region(dest, target(last, 0)) if has_else else []
                    out.append(ir.If(cond, then, orelse))
                    i = target(last, 0) if has_else else dest
                elif op == "_jump":
                    if target(prim, 0) != end:
                        raise Unsupported(f"_jump that is not an if/else or a return ({where})")
                    out.append(ir.Return())
                    i += 1
                else:
                    out += self.primitive(prim, params, where)
                    i += 1
            return out
        return region(0, end)

    def action(self, action_id) -> ir.Action:
        if action_id not in self.actions:
            spec = self.prog.action(action_id)
            self.actions[action_id] = ir.Action(
                spec.id, spec.name, spec.params,
                reroll(self.statements(spec.primitives, spec.params, f"action {spec.name}")))
        return self.actions[action_id]

    # ------------------------------------------------------------------ parser
    def parser(self) -> tuple[list, int, bool]:
        prog = self.prog
        parser = {p["name"]: p for p in prog.doc["parsers"]}["parser"]
        states = parser["parse_states"]
        self.state_ids = {s["name"]: i for i, s in enumerate(states)}
        order = _topological(states, self.state_ids)
        lowered = [self.state(i, states[i]) for i in order]
        position = {state.index: pos for pos, state in enumerate(lowered)}
        loops = any(nxt >= 0 and position[nxt] <= position[s.index]
                    for s in lowered for nxt in [c[2] for c in s.cases] + [s.default])
        return lowered, self.state_ids[parser["init_state"]], loops

    def state(self, index: int, state: dict) -> ir.ParserState:
        where = f"parser state {index}"
        ops = []
        for op in state.get("parser_ops", []):
            ops += self.parser_op(op, where)
        key_parts, cases, default = self.transitions(state)
        key, total = None, 0
        for part in reversed(key_parts):
            if part.get("type") == "field":
                field = self.fixed_field(part["value"], where)
                width, code = field.width, ir.FieldRef(field)
                if field.signed:
                    code = ir.Binary("&", code, ir.Const(mask(width)))
            elif part.get("type") == "stack_field":
                code = self.last_field(self.prog.stack(part["value"][0]), part["value"][1])
                field = next(f for f in self.prog.stack(part["value"][0]).headers[0].fields
                             if f.name == part["value"][1])
                if field.varbit:
                    raise Unsupported(f"varbit field {part['value'][0]}.last.{field.name} used "
                                      f"as a select key (in {where})")
                width = field.width
                if code.lo < 0:
                    code = ir.Binary("&", code, ir.Const(mask(width)))
            elif part.get("type") == "lookahead":
                bit_offset, width = part["value"]
                ops.append(ir.Require((bit_offset + width + 7) // 8))
                code = ir.Lookahead(bit_offset, width)
            else:
                raise Unsupported(f"parser transition key of type {part.get('type')!r:.30}")
            if total:
                code = ir.Binary("<<", code, ir.Const(total))
            key = code if key is None else ir.Binary("|", code, key)
            total += (width + 7) // 8 * 8
        if key is not None:
            # A value with bits the key does not have never matches.
            cases = [(v, m, n) for v, m, n in cases
                     if not ((v & m) if m is not None else v) >> total]
        return ir.ParserState(index, ops, key, total, cases if key is not None else [], default)

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

    def parser_op(self, op: dict, where: str) -> list:
        kind = op.get("op")
        params = op.get("parameters", [])
        prog = self.prog
        if kind == "extract" and params[0].get("type") == "stack":
            stack = prog.stack(params[0]["value"])
            return self.extract_next(stack.name, stack.headers, stack.next)
        if kind == "extract" and params[0].get("type") == "union_stack":
            stack = prog.union_stack(params[0]["value"][0])
            return self.extract_next(stack.name, stack.member(params[0]["value"][1]), stack.next)
        if kind == "extract_VL":
            for name in ("ParserInvalidArgument", "HeaderTooShort"):
                if name not in prog.errors:
                    raise Unsupported(f"extract with a length without the {name} error")
            nbits = self.expr(params[1], None, where)
            if not nbits.known or nbits.lo < 0 or nbits.hi >= 1 << 32:
                raise Unsupported(f"extract with a length that may not fit in 32 bits ({where})")
            if params[0]["type"] == "stack":
                stack = prog.stack(params[0]["value"])
                return self.extract_next(stack.name, stack.headers, stack.next, nbits)
            header = prog.header(params[0]["value"])
            return self.extract(header, nbits) + self.union_rest(header)
        if kind == "extract":
            if params[0].get("type") != "regular":
                raise Unsupported(f"extract to a {params[0].get('type')!r:.30} ({where})")
            header = prog.header(params[0]["value"])
            return [ir.Extract(header)] + self.union_rest(header)
        if kind == "set":
            field = self.fixed_field(params[0]["value"], where)
            if params[1].get("type") == "lookahead":
                bit_offset, width = params[1]["value"]
                return [ir.Require((bit_offset + width + 7) // 8),
                        ir.Assign(field, ir.Lookahead(bit_offset, width))]
            return [ir.Assign(field, self.expr(params[1], None, where))]
        if kind == "verify":
            return [ir.Verify(self.expr(params[0], None, where), self.expr(params[1], None, where))]
        if kind in ("advance", "shift"):
            amount = self.expr(params[0], None, where)
            return [ir.Advance(amount if kind == "shift"
                               else ir.Binary(">>", amount, ir.Const(3)))]
        if kind == "primitive":
            return self.primitive(params[0], None, where)
        raise Unsupported(f"parser operation {kind!r:.40} ({where})")

    # ------------------------------------------------------------------ checksums
    def checksums(self, verify: bool) -> list:
        out = []
        for checksum in self.prog.doc["checksums"]:
            if not checksum["verify" if verify else "update"]:
                continue
            cond = checksum.get("if_cond")
            calc = self.prog.calculations[checksum["calculation"]]
            out.append(ir.Checksum(self.fixed_field(checksum["target"], "a checksum"),
                                   None if cond is None else self.expr(cond, None, "a checksum"),
                                   self.calculation(calc)))
        return out

    def calculation(self, calc: dict) -> ir.Calculation:
        """A calculation's inputs grouped by header; BMv2 appends the payload last
        wherever the JSON lists it."""
        groups: list = []
        payload = False
        for item in calc["input"]:
            kind = item["type"]
            if kind == "payload":
                payload = True
            elif kind == "field":
                field = self.prog.field(item["value"])
                header = self.prog.header(field.header)
                if groups and groups[-1][0] is header:
                    groups[-1][1].append(field)
                else:
                    groups.append((header, [field]))
            elif kind == "header":
                header = self.prog.header(item["value"])
                groups.append((header, list(header.fields)))
            else:
                width = item["bitwidth"]
                groups.append((None, (hexstr(item["value"]) & mask(width), width)))
        return ir.Calculation(calc["algo"], groups, payload)

    # ------------------------------------------------------------------ controls
    def control(self, name: str) -> list:
        """The pipeline ``name`` as structured If/Apply nodes."""
        pipe = {p["name"]: p for p in self.prog.doc["pipelines"]}[name]
        nodes = {t["name"]: ("table", t, self.prog.tables[t["name"]]) for t in pipe["tables"]}
        nodes.update({c["name"]: ("cond", c, None) for c in pipe["conditionals"]})
        init = pipe["init_table"]
        if init is None:
            return []
        succ = {n: self.successors(kind, obj, spec) for n, (kind, obj, spec) in nodes.items()}
        return self.region(init, None, nodes, succ, _post_dominators(succ, init))

    def successors(self, kind: str, obj: dict, spec) -> list:
        if kind == "cond":
            return [obj["true_next"], obj["false_next"]]
        nexts = obj["next_tables"]
        if spec.hit_miss:
            return [nexts["__HIT__"], nexts["__MISS__"]]
        out = [nexts[self.prog.action(aid).name] for aid in obj["action_ids"]]
        return out or [obj["base_default_next"]]

    def region(self, node, stop, nodes, succ, ipdom) -> list:
        """Nodes from ``node`` up to (not including) ``stop``."""
        out = []
        while node is not None and node != stop:
            kind, obj, spec = nodes[node]
            targets = succ[node]
            merge = ipdom.get(node)
            if kind == "cond":
                out.append(ir.If(self.expr(obj["expression"], None, "a conditional"),
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
                out.append(self.apply(spec, [(c, self.region(t, merge, nodes, succ, ipdom))
                                             for c, t in zip(conds, targets)]))
            else:
                out.append(self.apply(spec, []))
                merge = targets[0] if targets else None
            node = merge
        return out

    def apply(self, spec, branches) -> ir.Apply:
        keys = []
        for kind, target, key_mask in spec.key_refs:
            if kind == "valid":
                key = ir.Unary("b2d", self.valid(self.prog.header(target)))
            else:
                key = ir.FieldRef(target)
                if target.signed:
                    key = ir.Binary("&", key, ir.Const(mask(target.width)))
            if key_mask is not None:
                key = ir.Binary("&", key, ir.Const(key_mask))
            keys.append(key)
        return ir.Apply(spec, keys, [self.action(aid) for aid in spec.applied_actions], branches)

    def lower(self) -> ir.Lowered:
        states, init, loops = self.parser()
        out = ir.Lowered(states, init, loops, self.checksums(True), self.checksums(False),
                         self.control("ingress"), self.control("egress"),
                         self.prog.deparse_order)
        out.actions = self.actions
        out.special = self.special_ops and self.check_special(out)
        out.register_groups = register_groups(self.prog, self.actions.values())
        return out

    @staticmethod
    def check_special(out: ir.Lowered) -> bool:
        """Whether the program clones, resubmits or recirculates. simple_switch reads
        the resubmit flag only after ingress and the recirculate flag only after egress
        (one set in ingress rides along to egress unless the packet is copied): both
        of those are refused, naming them."""
        found = False
        for pipe, nodes, wrong, name in (("ingress", out.ingress, ir.Recirculate, "recirculate"),
                                         ("egress", out.egress, ir.Resubmit, "resubmit")):
            for node in walk_actions(nodes):
                if isinstance(node, wrong):
                    raise Unsupported(f"{name} in {pipe}")
                found |= isinstance(node, (ir.Clone, ir.Resubmit, ir.Recirculate))
        return found


def lower(program: Program) -> ir.Lowered:
    return Lowering(program).lower()


def register_groups(program: Program, actions) -> list:
    """Registers of one size and width that exactly the same actions touch, in
    groups of two or more. P4 has no arrays of externs, so a program that keeps a
    vector per index (the aggregation program's one register per value) declares a
    register per element; an action then touches each of them at one index, and
    stored apart that is one cache line (and, for large registers, one page) per
    element. Any grouping computes the same: this only chooses memory layout."""
    touched: dict[str, set] = {}
    for action in actions:
        for node in walk(action.body):
            if isinstance(node, (ir.RegisterRead, ir.RegisterWrite)):
                touched.setdefault(node.register.name, set()).add(action.id)
    groups: dict[tuple, list] = {}
    for name, spec in program.registers.items():
        if name in touched:
            groups.setdefault((spec.size, spec.width, frozenset(touched[name])), []).append(spec)
    return [group for group in groups.values() if len(group) > 1]


REROLL_MIN = 8            # iterations; a shorter run stays as it is
REROLL_PERIOD = 8         # statements in one iteration, at most
REROLLABLE = (ir.Assign, ir.RegisterRead, ir.RegisterWrite)
PLAIN_EXPRS = (ir.Const, ir.FieldRef, ir.Param, ir.Unary, ir.Binary, ir.Cond, ir.Cast)


def reroll(body: list) -> list:
    """``body`` with each run of like statements as one ir.Repeat. P4 has no loops and
    no arrays of externs, so a register per element is spelled out: the aggregation
    program's add is a read, an add and a write for each of its K values, 3 x K
    statements that differ only in the field and the register they name. As one
    Repeat a printer can print them as a loop (code that fits the instruction cache,
    and that a C compiler may vectorize). Order and meaning are unchanged."""
    shapes = [_shape(s) if isinstance(s, REROLLABLE) else None for s in body]
    out, i = [], 0
    while i < len(body):
        best = (1, 1)                                   # (iterations, period)
        for period in range(1, REROLL_PERIOD + 1):
            head = shapes[i:i + period]
            if len(head) < period or None in head:
                break
            n = 1
            while shapes[i + n * period:i + (n + 1) * period] == head:
                n += 1
            if n >= REROLL_MIN and n * period > best[0] * best[1]:
                best = (n, period)
        n, period = best
        if n > 1:
            widths.mark(body[i:i + n * period])
            out.append(ir.Repeat([body[i + k * period:i + (k + 1) * period] for k in range(n)]))
        else:
            out.append(body[i])
        i += n * period
    return out


def _shape(node, names: list | None = None):
    """``node`` with its fields and registers reduced to what their use depends on
    (width and sign; size and width): equal shapes print alike but for those names,
    which go to ``names`` in the order visited."""
    if isinstance(node, (Field, RegisterSpec)):
        if names is not None:
            names.append(node)
        return (("field", node.width, node.signed, node.varbit) if isinstance(node, Field)
                else ("register", node.size, node.width))
    if isinstance(node, (int, str, bool)) or node is None:
        return node
    if isinstance(node, list):
        return tuple(_shape(x, names) for x in node)
    if isinstance(node, PLAIN_EXPRS):
        slots = [n for cls in type(node).__mro__ for n in getattr(cls, "__slots__", ())]
        return (type(node).__name__,) + tuple(_shape(getattr(node, n), names) for n in slots)
    if isinstance(node, REROLLABLE):
        return (type(node).__name__,) + tuple(_shape(v, names) for v in vars(node).values())
    return ("object", id(node))                         # the same object, or unlike


def named(node) -> list:
    """The fields and registers ``node`` names, in the order ``_shape`` visits them:
    position j of two like statements is the same use of each one's j-th name."""
    names: list = []
    _shape(node, names)
    return names


def walk(nodes):
    """Every statement in ``nodes``, nested ones included."""
    for node in nodes:
        yield node
        if isinstance(node, ir.If):
            yield from walk(node.then)
            yield from walk(node.orelse)
        elif isinstance(node, ir.Repeat):
            for iteration in node.iterations:
                yield from walk(iteration)
        elif isinstance(node, ir.Apply):
            for _, body in node.branches:
                yield from walk(body)


def walk_actions(nodes):
    """Every statement in ``nodes``, those of the actions an Apply runs included."""
    for node in walk(nodes):
        yield node
        if isinstance(node, ir.Apply):
            for action in node.actions:
                yield from walk(action.body)


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

    def walk_graph(n):
        if n is None or n in seen:
            return
        seen.add(n)
        for s in succ[n]:
            walk_graph(s)
        nodes.append(n)          # post-order: successors first
    walk_graph(init)
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
