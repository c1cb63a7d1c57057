"""Base of the per-control classes: desired entries in, minimal writes out.

Each subclass names the P4 control it configures and says which entries a job
should have. ``sync`` reads what the switch holds and writes only the difference,
so applying a configuration twice changes nothing, and a restarted controller picks
up where the last one left off.

Names are written as the v1model program's P4Info spells them and resolved against
the program the switch runs (``SwitchConnection.resolve``), so one job file serves
the BMv2 and the Tofino build; a control whose objects a program lacks says so
(``missing``) before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .client import P4MulticastGroupEntry, P4RuntimeError, P4TableEntry, SwitchConnection
from .config import Config


@dataclass
class Changes:
    inserted: int = 0
    modified: int = 0
    deleted: int = 0
    skipped: tuple[str, ...] = ()   # optional controls the program does not have

    def __add__(self, other: "Changes") -> "Changes":
        return Changes(self.inserted + other.inserted, self.modified + other.modified,
                       self.deleted + other.deleted, self.skipped + other.skipped)

    @property
    def total(self) -> int:
        return self.inserted + self.modified + self.deleted


def _int(data: bytes) -> int:
    return int.from_bytes(data, "big")


def field_value(fm) -> tuple:
    kind = fm.WhichOneof("field_match_type")
    m = getattr(fm, kind)
    if kind in ("exact", "optional"):
        return (kind, _int(m.value))
    if kind == "ternary":
        return (kind, _int(m.value), _int(m.mask))
    if kind == "lpm":
        return (kind, _int(m.value), m.prefix_len)
    return (kind, _int(m.low), _int(m.high))


def entry_key(msg) -> tuple:
    """Identity of a table entry, independent of how bytestrings were padded."""
    return (msg.priority, tuple(sorted((fm.field_id, field_value(fm)) for fm in msg.match)))


def entry_action(msg) -> tuple:
    action = msg.action.action
    return (action.action_id, tuple(sorted((p.param_id, _int(p.value)) for p in action.params)))


def match_values(conn: SwitchConnection, table: str, msg) -> dict[str, int]:
    """Match field values (the value part) by P4Info name, for ownership tests."""
    names = {mf.id: mf.name for mf in conn.schema.tables[table].match_fields}
    return {names[fm.field_id]: field_value(fm)[1] for fm in msg.match}


def action_values(conn: SwitchConnection, msg) -> tuple[str, dict[str, int]]:
    """An entry's action and its parameter values by P4Info name."""
    action = conn.schema.actions[msg.action.action.action_id]
    names = {p.id: p.name for p in action.params}
    return action.name, {names[p.param_id]: _int(p.value) for p in msg.action.action.params}


class Control:
    """One P4 control instance: install a job's entries, clear them, read its counters."""
    TABLE = ""
    ACTIONS: tuple[str, ...] = ()
    # An optional control is left out, and named, where the program lacks it (the TNA
    # program has no SourceGuard); a job cannot run without a required one.
    OPTIONAL = False

    def __init__(self, conn: SwitchConnection):
        self.conn = conn

    def needs(self, config: Config) -> list[tuple[str, str]]:
        """(P4Info kind, name) of every object installing ``config`` writes."""
        return [("tables", self.TABLE)] + [("actions", a) for a in self.ACTIONS]

    def missing(self, config: Config) -> list[str]:
        return [name for kind, name in self.needs(config) if self.conn.resolve(kind, name) is None]

    def present(self, config: Config) -> bool:
        """The program has the control's tables, so a job may have entries in them."""
        return all(self.conn.resolve(kind, name) is not None
                   for kind, name in self.needs(config) if kind == "tables")

    def name(self, kind: str, name: str) -> str:
        full = self.conn.resolve(kind, name)
        if full is None:
            raise P4RuntimeError(f"the program on {self.conn.grpc_addr} has no "
                                 f"{kind.removesuffix('s')} {name}")
        return full

    def install(self, config: Config) -> Changes:
        return Changes()

    def clear(self, config: Config) -> Changes:
        return Changes()

    def read_counters(self) -> dict[str, dict[str, int]]:
        return {}

    # -- helpers for subclasses ----------------------------------------------
    def has(self, table: str) -> bool:
        return self.conn.resolve("tables", table) is not None

    def entries(self, table: str) -> list[tuple[dict[str, int], str, dict[str, int], int]]:
        """Every entry of ``table``, whoever wrote it: (match values, action, parameter
        values, priority), by P4Info names."""
        table = self.name("tables", table)
        return [(match_values(self.conn, table, e.table_entry),
                 *action_values(self.conn, e.table_entry), e.table_entry.priority)
                for e in self.conn.read_raw(P4TableEntry(table))]

    def entry(self, table: str, action: str, match: dict, params: dict,
              priority: int = 0, metadata: bytes = b"") -> P4TableEntry:
        return self.conn.table_entry(self.name("tables", table), self.name("actions", action),
                                     match, params, priority=priority, metadata=metadata)

    def sync(self, table: str, desired: Iterable[P4TableEntry],
             owned: Callable[[dict[str, int]], bool]) -> Changes:
        """Make the entries of ``table`` that ``owned`` selects equal ``desired``,
        in one batched write per kind of change."""
        table = self.name("tables", table)
        present = {}
        for entity in self.conn.read_raw(P4TableEntry(table)):
            if owned(match_values(self.conn, table, entity.table_entry)):
                present[entry_key(entity.table_entry)] = entity
        inserts, modifies = [], []
        for te in desired:
            entity = self.conn.encode(te)
            existing = present.pop(entry_key(entity.table_entry), None)
            if existing is None:
                inserts.append(entity)
            elif (entry_action(existing.table_entry), existing.table_entry.metadata) != (
                    entry_action(entity.table_entry), entity.table_entry.metadata):
                modifies.append(entity)
        deletes = list(present.values())
        self.conn.insert(inserts)
        self.conn.modify(modifies)
        self.conn.delete(deletes)
        return Changes(len(inserts), len(modifies), len(deletes))

    def sync_multicast_group(self, group_id: int, replicas: set[tuple[int, int]] | None) -> Changes:
        """Make PRE group ``group_id`` hold exactly ``replicas`` (port, rid); None deletes it."""
        current = None
        for entity in self.conn.read_raw(P4MulticastGroupEntry()):
            group = entity.packet_replication_engine_entry.multicast_group_entry
            if group.multicast_group_id == group_id:
                current = {(r.egress_port, r.instance) for r in group.replicas}
        wanted = P4MulticastGroupEntry(group_id, replicas=sorted(replicas or ()))
        if replicas is None:
            if current is None:
                return Changes()
            self.conn.delete(wanted)
            return Changes(deleted=1)
        if current is None:
            self.conn.insert(wanted)
            return Changes(inserted=1)
        if current != replicas:
            self.conn.modify(wanted)
            return Changes(modified=1)
        return Changes()
