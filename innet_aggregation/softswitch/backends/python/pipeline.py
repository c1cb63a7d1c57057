"""A loaded program's run-time state (tables, registers, counters, PRE) and packet path."""

from __future__ import annotations

import threading

from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends.python.printer import compile_program
from innet_aggregation.softswitch.backends.python.runtime import Dropped
from innet_aggregation.softswitch.frontend import (DROP_PORT, INSTANCE_E2E_CLONE, INSTANCE_I2E_CLONE,
                                                  INSTANCE_NORMAL, INSTANCE_RECIRC, INSTANCE_REPLICATION,
                                                  INSTANCE_RESUBMIT, TableSpec)
from innet_aggregation.softswitch.frontend.validate import MAX_ID, num
from innet_aggregation.softswitch.backends.tables import Entry, TableEntries

CACHE_LIMIT = 4096
REENTRY_LIMIT = 32       # clones, resubmits and recirculations per received frame


class Table(TableEntries):
    """Entries of one table, in the shapes the generated code reads.

    Exact tables are one dict (key -> (action id, data)); ternary, LPM and range
    tables are a priority-sorted list scanned on a miss of a per-key cache, which
    any write clears, so a steady flow costs one dict lookup.
    """

    def __init__(self, spec: TableSpec, ns: dict, actions: dict):
        super().__init__(spec, actions)
        self.single = len(spec.keys) == 1
        self.exact: dict = {}              # key -> (aid, data), exact tables
        self.scan: list = []               # [(values, masks, (aid, data))], ternary/lpm/range
        self.ranged = tuple(mt == "range" for mt, _, _ in spec.keys)
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
        """Ternary/LPM/range: the highest-priority entry matching ``key``, cached."""
        keys = (key,) if self.single else key
        found = None
        for values, masks, action in self.scan:
            for k, v, m, ranged in zip(keys, values, masks, self.ranged):
                if not (v <= k <= m if ranged else k & m == v):
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
        # Clone sessions: id -> [(port, rid)] in sending order (as a multicast group, as
        # PI programs BMv2), and as written over P4Runtime, for read-back.
        self.sessions: dict[int, list[tuple[int, int]]] = {}
        self.session_entries: dict[int, list] = {}
        ns = self.compiled.namespace
        self._spi, self._spe, self._spr = ns["_SPI"], ns["_SPE"], ns["_SPR"]
        # Packets are processed under this lock, control-plane writes take it too.
        self.lock = threading.Lock()
        self._ingress = self.compiled.ingress
        self._egress = self.compiled.egress

    def process(self, frame: bytes, port: int) -> list[tuple[int, bytes]]:
        """Ingress, PRE, egress, deparser: the frames to send, as (port, bytes)."""
        out: list = []
        self._passes = REENTRY_LIMIT
        self._run(frame, port, INSTANCE_NORMAL, None, out)
        return out

    def _run(self, frame: bytes, port: int, instance: int, kept, out: list) -> None:
        """One pass through ingress, then what simple_switch does after it, in its
        order: the I2E clone, a resubmit (instead of forwarding), multicast, unicast."""
        try:
            spec, mgid, state = self._ingress(frame, port, instance, kept)
        except Dropped:
            self._spi.clear()
            return
        if self._spi:
            clone, clone_kept, resubmit = self._spi.pop()
            if clone is not None and clone in self.sessions:
                try:
                    copy = self._ingress(frame, port, 0, clone_kept, True)[2]
                except Dropped:
                    copy = None
                for eport, rid in self.sessions[clone] if copy is not None else ():
                    if self._another_pass():
                        self._egress_out(copy, eport, rid, INSTANCE_I2E_CLONE, out)
            if resubmit is not None:
                if self._another_pass():
                    self._run(frame, 0, INSTANCE_RESUBMIT, resubmit, out)
                return
        if mgid:
            for eport, rid in self.groups.get(mgid, ()):
                self._egress_out(state, eport, rid, INSTANCE_REPLICATION, out)
            return
        if spec == self.drop_port:
            return
        self._egress_out(state, spec, None, INSTANCE_NORMAL, out)

    def _egress_out(self, state, port, rid, instance, out: list) -> None:
        """Egress, then the frame sent or recirculated, then the E2E clone (made before
        the drop check, as simple_switch does)."""
        try:
            sent = self._egress(state, port, rid, instance)
        except Dropped:
            sent = None
        spe, spr = self._spe, self._spr
        if not (spe or spr):             # neither asked for: the usual case, kept cheap
            if sent is not None:
                out.append((port, sent))
            return
        clones, recirculate = spe[:], spr[:]
        spe.clear()
        spr.clear()
        if sent is not None:
            if recirculate:
                if self._another_pass():
                    self._run(sent, 0, INSTANCE_RECIRC, recirculate[0], out)
            else:
                out.append((port, sent))
        for session, copy in clones:
            for eport, erid in self.sessions.get(session, ()):
                if self._another_pass():
                    self._egress_out(copy, eport, erid, INSTANCE_E2E_CLONE, out)

    def _another_pass(self) -> bool:
        """Clones, resubmits and recirculations of one received frame are bounded:
        simple_switch would loop for ever; here the copy past the bound is dropped."""
        self._passes -= 1
        return self._passes >= 0
