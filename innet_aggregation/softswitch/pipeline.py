"""A loaded program's run-time state (tables, registers, counters, PRE) and packet path."""

from __future__ import annotations

import threading

from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.emit_python import compile_program
from innet_aggregation.softswitch.frontend import DROP_PORT, INSTANCE_NORMAL, INSTANCE_REPLICATION, TableSpec, mask
from innet_aggregation.softswitch.validate import MAX_ID, num

CACHE_LIMIT = 4096


class TableError(Exception):
    """A control-plane request the table refuses; ``code`` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Entry:
    """One match-action entry; ``values`` are already masked."""

    __slots__ = ("values", "masks", "priority", "action", "const", "counter")

    def __init__(self, values, masks, priority, action, const=False):
        self.values, self.masks, self.priority, self.action, self.const = (
            values, masks, priority, action, const)
        self.counter = [0, 0]    # direct counter: packets, bytes

    @property
    def ident(self):
        return (self.values, self.masks, self.priority)


class TableEntries:
    """What a table is to the control plane, whichever backend runs it: its entries
    by identity, the checks of insert, modify, delete and the default action, and
    the JSON's const entries (BMv2's priorities turned into P4Runtime's). Every
    action enters with one datum per parameter, masked to the parameter's width
    (both emitters rely on that). A backend puts the entries where its packet path
    reads them: ``_add``, ``_changed``, ``_removed``, ``_set_default``."""

    def __init__(self, spec: TableSpec, actions: dict):
        self.spec = spec
        self.actions = actions             # id -> ActionSpec
        self.counted = spec.direct_counter is not None
        self.entries: dict = {}            # ident -> Entry

    def _add_const_entries(self) -> None:
        spec = self.spec
        for values, masks, bmv2_priority, prefix, aid, data in spec.const_entries:
            if spec.match_type == "lpm":
                priority = prefix
            elif spec.match_type == "ternary":
                # BMv2: a smaller number wins; P4Runtime: a larger one does.
                priority = (1 << 24) - bmv2_priority
            else:
                priority = 0
            values = tuple(v & m for v, m in zip(values, masks))
            self._add(self._checked(Entry(values, masks, priority, (aid, data), const=True)))

    def _action(self, action) -> tuple:
        """(action id, data) with the data masked to its parameters' widths."""
        aid, data = action
        if aid not in self.spec.applied_actions:
            raise TableError("INVALID_ARGUMENT", f"table {self.spec.name}: action {aid} "
                             "is not one of the table's")
        params = self.actions[aid].params
        if len(data) != len(params):
            raise TableError("INVALID_ARGUMENT", f"table {self.spec.name}: action "
                             f"{self.actions[aid].name} takes {len(params)} parameters, "
                             f"got {len(data)}")
        return aid, tuple(value & mask(width) for value, (_, width) in zip(data, params))

    def _checked(self, entry: Entry) -> Entry:
        """``entry`` with as many values and masks as the table has keys, its action checked."""
        nkeys = len(self.spec.keys)
        if len(entry.values) != nkeys or len(entry.masks) != nkeys:
            raise TableError("INVALID_ARGUMENT", f"table {self.spec.name}: {nkeys} keys, "
                             f"got {len(entry.values)} values and {len(entry.masks)} masks")
        entry.action = self._action(entry.action)
        return entry

    def insert(self, entry: Entry) -> None:
        if entry.ident in self.entries:
            raise TableError("ALREADY_EXISTS", f"table {self.spec.name}: entry already exists")
        if len(self.entries) >= self.spec.max_size:
            raise TableError("RESOURCE_EXHAUSTED", f"table {self.spec.name} is full "
                             f"({self.spec.max_size} entries)")
        self._add(self._checked(entry))

    def modify(self, entry: Entry) -> None:
        old = self.entries.get(entry.ident)
        if old is None:
            raise TableError("NOT_FOUND", f"table {self.spec.name}: no such entry")
        old.action = self._checked(entry).action
        self._changed(old)

    def set_default(self, action) -> None:
        self._set_default(self._action(action))

    def delete(self, ident) -> None:
        if ident not in self.entries:
            raise TableError("NOT_FOUND", f"table {self.spec.name}: no such entry")
        self._removed(self.entries.pop(ident))

    def _add(self, entry: Entry) -> None:
        raise NotImplementedError

    def _changed(self, entry: Entry) -> None:
        raise NotImplementedError

    def _removed(self, entry: Entry) -> None:
        raise NotImplementedError

    def _set_default(self, action) -> None:
        raise NotImplementedError


class Table(TableEntries):
    """Entries of one table, in the shapes the generated code reads.

    Exact tables are one dict (key -> (action id, data)); ternary and LPM tables are
    a priority-sorted list scanned on a miss of a per-key cache, which any write
    clears, so a steady flow costs one dict lookup.
    """

    def __init__(self, spec: TableSpec, ns: dict, actions: dict):
        super().__init__(spec, actions)
        self.single = len(spec.keys) == 1
        self.exact: dict = {}              # key -> (aid, data), exact tables
        self.scan: list = []               # [(values, masks, (aid, data))], ternary/lpm
        self.cache: dict = {}
        self.default = [None]
        self.initial_default = spec.default
        self.set_default(self.initial_default)
        tid = num(spec.id, 0, MAX_ID)
        ns[f"E{tid}"] = self.exact
        ns[f"C{tid}"] = self.cache
        ns[f"L{tid}"] = self.lookup
        ns[f"D{tid}"] = self.default
        self._add_const_entries()

    @property
    def is_exact(self) -> bool:
        return self.spec.match_type == "exact"

    def key(self, values):
        return values[0] if self.single else values

    def lookup(self, key):
        """Ternary/LPM: the highest-priority entry matching ``key``, cached."""
        keys = (key,) if self.single else key
        found = None
        for values, masks, action in self.scan:
            for k, v, m in zip(keys, values, masks):
                if k & m != v:
                    break
            else:
                found = action
                break
        if len(self.cache) >= CACHE_LIMIT:
            self.cache.clear()
        self.cache[key] = found
        return found

    def _target(self, entry: Entry):
        """What the generated code gets on a hit."""
        return (*entry.action, entry.counter) if self.counted else entry.action

    def _rebuild_scan(self) -> None:
        ordered = sorted(self.entries.values(), key=lambda e: -e.priority)
        self.scan[:] = [(e.values, e.masks, self._target(e)) for e in ordered]
        self.cache.clear()

    def _add(self, entry: Entry) -> None:
        self.entries[entry.ident] = entry
        if self.is_exact:
            self.exact[self.key(entry.values)] = self._target(entry)
        else:
            self._rebuild_scan()

    def _changed(self, entry: Entry) -> None:
        if self.is_exact:
            self.exact[self.key(entry.values)] = self._target(entry)
        else:
            self._rebuild_scan()

    def _removed(self, entry: Entry) -> None:
        if self.is_exact:
            del self.exact[self.key(entry.values)]
        else:
            self._rebuild_scan()

    def _set_default(self, action) -> None:
        self.default[0] = action


class Pipeline:
    """One committed forwarding pipeline: ``process`` runs a frame through it."""

    def __init__(self, json_text: str | bytes, drop_port: int = DROP_PORT,
                 program: frontend.Program | None = None):
        self.json_text = json_text
        self.drop_port = drop_port
        self.compiled = compile_program(program or frontend.load(json_text, drop_port))
        ns = self.compiled.namespace
        self.tables = {name: Table(spec, ns, self.compiled.actions)
                       for name, spec in self.compiled.tables.items()}
        self.registers = self.compiled.registers
        self.counters = self.compiled.counters
        self.actions = self.compiled.actions
        self.errors = self.compiled.errors
        self.groups: dict[int, list[tuple[int, int]]] = {}   # mgid -> [(port, rid)]
        # As written over P4Runtime, for read-back: [((port, rid), "port"|"egress_port")]
        self.group_replicas: dict[int, list] = {}
        # Packets are processed under this lock, control-plane writes take it too.
        self.lock = threading.Lock()
        self._ingress = self.compiled.ingress
        self._egress = self.compiled.egress

    def process(self, frame: bytes, port: int) -> list[tuple[int, bytes]]:
        """Ingress, PRE, egress, deparser: the frames to send, as (port, bytes)."""
        spec, mgid, state = self._ingress(frame, port)
        egress = self._egress
        if mgid:
            out = []
            for eport, rid in self.groups.get(mgid, ()):
                sent = egress(state, eport, rid, INSTANCE_REPLICATION)
                if sent is not None:
                    out.append((eport, sent))
            return out
        if spec == self.drop_port:
            return []
        sent = egress(state, spec, None, INSTANCE_NORMAL)
        return [] if sent is None else [(spec, sent)]
