"""What a table is to the control plane, whichever backend runs it."""

from __future__ import annotations

from innet_aggregation.softswitch.frontend import TableSpec, mask


class TableError(Exception):
    """A control-plane request the table refuses; ``code`` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Entry:
    """One match-action entry; ``values`` are already masked. For a range key,
    ``values`` holds its low bound and ``masks`` its high bound (both inclusive).
    ``metadata``: the controller's opaque cookie (P4Runtime TableEntry.metadata),
    kept and read back as written."""

    __slots__ = ("values", "masks", "priority", "action", "const", "counter", "metadata")

    def __init__(self, values, masks, priority, action, const=False, metadata=b""):
        self.values, self.masks, self.priority, self.action, self.const = (
            values, masks, priority, action, const)
        self.metadata = metadata
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
            elif spec.match_type in ("ternary", "range"):
                # BMv2: a smaller number wins; P4Runtime: a larger one does.
                priority = (1 << 24) - bmv2_priority
            else:
                priority = 0
            values = tuple(v if mt == "range" else v & m
                           for v, m, (mt, _, _) in zip(values, masks, spec.keys))
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
        old.metadata = entry.metadata
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
