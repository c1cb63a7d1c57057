"""P4Runtime entities to and from the running pipeline: table entries (default and
const ones included), multicast groups, clone sessions, counters, direct counters and
registers.
Each function takes the committed ``PipelineConfig``; the caller holds the
pipeline's lock."""

from __future__ import annotations

import grpc
from finsy.proto import p4i as p4info_pb2
from finsy.proto import p4r as p4runtime_pb2

from innet_aggregation.softswitch.backends.tables import Entry, TableError
from innet_aggregation.softswitch.frontend import mask
from innet_aggregation.softswitch.p4runtime.p4info import PipelineConfig, RpcError, TableInfo


def to_bytes(value: int, width: int) -> bytes:
    return value.to_bytes((width + 7) // 8, "big")


def from_bytes(data: bytes, width: int, what: str) -> int:
    value = int.from_bytes(data, "big")
    if value >> width:
        raise TableError("INVALID_ARGUMENT",
                         f"{what}: value 0x{data.hex()} does not fit in {width} bits")
    return value


def write_one(config: PipelineConfig, update) -> None:
    U = p4runtime_pb2.Update
    if update.type == U.UNSPECIFIED:
        raise TableError("INVALID_ARGUMENT", "Update type is not set")
    kind = update.entity.WhichOneof("entity")
    if kind == "table_entry":
        write_table(config, update.type, update.entity.table_entry)
    elif kind == "packet_replication_engine_entry":
        write_pre(config, update.type, update.entity.packet_replication_engine_entry)
    elif kind == "counter_entry":
        write_counter(config, update.type, update.entity.counter_entry)
    elif kind == "register_entry":
        write_register(config, update.type, update.entity.register_entry)
    elif kind == "direct_counter_entry":
        write_direct_counter(config, update.type, update.entity.direct_counter_entry)
    else:
        raise TableError("UNIMPLEMENTED", f"writing {kind or 'an empty entity'} is not supported")

def table_info(config: PipelineConfig, table_id: int) -> TableInfo:
    info = config.tables.get(table_id)
    if info is None and table_id in config.unapplied:
        raise TableError("NOT_FOUND", f"table {config.unapplied[table_id]} is not in the "
                         "compiled program: p4c removed it because nothing applies it")
    if info is None:
        raise TableError("NOT_FOUND", f"unknown table id {table_id}")
    return info

def convert_action(config: PipelineConfig, tinfo: TableInfo, entry, default: bool):
    which = entry.action.WhichOneof("type")
    if which != "action":
        raise TableError("UNIMPLEMENTED" if which else "INVALID_ARGUMENT",
                         f"table {tinfo.name}: " + (f"{which} is not supported" if which
                                                     else "'action' field must be set"))
    action = entry.action.action
    if action.action_id not in tinfo.to_json:
        raise TableError("INVALID_ARGUMENT",
                         f"action id {action.action_id} is not an action of table {tinfo.name}")
    scope = tinfo.scope[action.action_id]
    if default and scope == p4info_pb2.ActionRef.TABLE_ONLY:
        raise TableError("PERMISSION_DENIED",
                         f"table {tinfo.name}: this action cannot be the default action")
    if not default and scope == p4info_pb2.ActionRef.DEFAULT_ONLY:
        raise TableError("PERMISSION_DENIED",
                         f"table {tinfo.name}: this action can only be the default action")
    params = config.action_params[action.action_id]
    given = {p.param_id: p.value for p in action.params}
    if len(given) != len(action.params) or set(given) != {p.id for p in params}:
        raise TableError("INVALID_ARGUMENT",
                         f"action {config.actions[action.action_id].preamble.name}: expected "
                         f"params {[p.name for p in params]}, got ids {sorted(given)}")
    data = tuple(from_bytes(given[p.id], p.bitwidth, f"param {p.name}") for p in params)
    return (tinfo.to_json[action.action_id], data)

def convert_match(tinfo: TableInfo, entry):
    n = len(tinfo.fields)
    values, masks = [0] * n, [0] * n
    prefix = 0
    seen = set()
    MF = p4info_pb2.MatchField
    for fm in entry.match:
        pos = tinfo.field_pos.get(fm.field_id)
        if pos is None:
            raise TableError("INVALID_ARGUMENT",
                             f"table {tinfo.name}: unknown match field id {fm.field_id}")
        if pos in seen:
            raise TableError("INVALID_ARGUMENT",
                             f"table {tinfo.name}: match field {fm.field_id} given twice")
        seen.add(pos)
        finfo = tinfo.fields[pos]
        width = tinfo.widths[pos]
        kind = fm.WhichOneof("field_match_type")
        expected = MF.MatchType.Name(finfo.match_type).lower()
        if kind != expected:
            raise TableError("INVALID_ARGUMENT",
                             f"table {tinfo.name}: field {finfo.name} is {expected}, got {kind}")
        what = f"field {finfo.name}"
        if pos in tinfo.names and kind in ("exact", "optional"):
            name = getattr(fm, kind).value.decode(errors="replace")
            if name not in tinfo.names[pos][0]:
                raise TableError("INVALID_ARGUMENT",
                                 f"{what}: {name!r} is not an error of this program")
            values[pos], masks[pos] = tinfo.names[pos][0][name], mask(width)
        elif pos in tinfo.names:
            raise TableError("UNIMPLEMENTED", f"{what}: {kind} match on an error value")
        elif kind == "exact":
            values[pos], masks[pos] = from_bytes(fm.exact.value, width, what), mask(width)
        elif kind == "optional":
            values[pos], masks[pos] = from_bytes(fm.optional.value, width, what), mask(width)
        elif kind == "ternary":
            value = from_bytes(fm.ternary.value, width, what)
            m = from_bytes(fm.ternary.mask, width, what)
            if m == 0:
                raise TableError("INVALID_ARGUMENT",
                                 f"{what}: a ternary don't-care must be omitted, not mask 0")
            if value & ~m:
                raise TableError("INVALID_ARGUMENT",
                                 f"{what}: value has bits set outside the mask")
            values[pos], masks[pos] = value, m
        elif kind == "lpm":
            value = from_bytes(fm.lpm.value, width, what)
            plen = fm.lpm.prefix_len
            if not 0 < plen <= width:
                raise TableError("INVALID_ARGUMENT",
                                 f"{what}: prefix length {plen} outside 1..{width}")
            m = mask(width) ^ mask(width - plen)
            if value & ~m:
                raise TableError("INVALID_ARGUMENT",
                                 f"{what}: value has bits set beyond the prefix")
            values[pos], masks[pos] = value, m
            prefix = plen
        elif kind == "range":
            low = from_bytes(fm.range.low, width, what)
            high = from_bytes(fm.range.high, width, what)
            if low > high:
                raise TableError("INVALID_ARGUMENT",
                                 f"{what}: range low {low} is above high {high}")
            values[pos], masks[pos] = low, high     # the full range: as if omitted, as PI
        else:
            raise TableError("UNIMPLEMENTED", f"{kind} match is not supported")
    for pos, finfo in enumerate(tinfo.fields):
        if pos not in seen and finfo.match_type in (MF.EXACT,):
            raise TableError("INVALID_ARGUMENT",
                             f"table {tinfo.name}: exact field {finfo.name} is missing")
        if pos not in seen and finfo.match_type == MF.RANGE:
            masks[pos] = mask(tinfo.widths[pos])        # an omitted range: all of it
    match_type = tinfo.table.spec.match_type
    if match_type in ("ternary", "range"):
        if entry.priority <= 0:
            raise TableError("INVALID_ARGUMENT",
                             f"table {tinfo.name}: a {match_type} entry needs a priority > 0")
        priority = entry.priority
    else:
        if entry.priority != 0:
            raise TableError("INVALID_ARGUMENT",
                             f"table {tinfo.name}: priority must be 0 for a {match_type} table")
        priority = prefix if match_type == "lpm" else 0
    return tuple(values), tuple(masks), priority

def write_table(config: PipelineConfig, utype, entry) -> None:
    U = p4runtime_pb2.Update
    tinfo = table_info(config, entry.table_id)
    table = tinfo.table
    if entry.is_default_action:
        if utype != U.MODIFY:
            raise TableError("INVALID_ARGUMENT",
                             "the default entry can only be modified, not inserted or deleted")
        if entry.match:
            raise TableError("INVALID_ARGUMENT", "a default entry has no match fields")
        if tinfo.const_default:
            raise TableError("PERMISSION_DENIED",
                             f"table {tinfo.name} has a const default action")
        if entry.HasField("action"):
            table.set_default(convert_action(config, tinfo, entry, default=True))
        else:
            table.set_default(table.initial_default)
        return
    if tinfo.is_const or any(e.const for e in table.entries.values()):
        raise TableError("PERMISSION_DENIED", f"table {tinfo.name} has const entries")
    values, masks, priority = convert_match(tinfo, entry)
    ident = (values, masks, priority)
    if utype == U.DELETE:
        table.delete(ident)
        return
    action = convert_action(config, tinfo, entry, default=False)
    new = Entry(values, masks, priority, action, metadata=entry.metadata)
    if utype == U.INSERT:
        table.insert(new)
    else:
        table.modify(new)
    if entry.HasField("counter_data") and table.counted:
        counter = table.entries[ident].counter
        counter[:] = [entry.counter_data.packet_count, entry.counter_data.byte_count]

def direct_entry(config: PipelineConfig, query):
    tinfo = table_info(config, query.table_entry.table_id)
    if not tinfo.table.counted:
        raise TableError("INVALID_ARGUMENT", f"table {tinfo.name} has no direct counter")
    return tinfo

def write_direct_counter(config: PipelineConfig, utype, entry) -> None:
    if utype != p4runtime_pb2.Update.MODIFY:
        raise TableError("INVALID_ARGUMENT", "direct counter entries can only be modified")
    tinfo = direct_entry(config, entry)
    ident = convert_match(tinfo, entry.table_entry)
    found = tinfo.table.entries.get(ident)
    if found is None:
        raise TableError("NOT_FOUND", f"table {tinfo.name}: no such entry")
    found.counter[:] = [entry.data.packet_count, entry.data.byte_count]

def write_pre(config: PipelineConfig, utype, pre) -> None:
    which = pre.WhichOneof("type")
    if which == "clone_session_entry":
        write_clone_session(config, utype, pre.clone_session_entry)
        return
    if which != "multicast_group_entry":
        raise TableError("INVALID_ARGUMENT", "a PacketReplicationEngineEntry without a "
                         "multicast group or clone session")
    U = p4runtime_pb2.Update
    group = pre.multicast_group_entry
    gid = group.multicast_group_id
    groups = config.pipeline.groups
    if gid == 0:
        raise TableError("INVALID_ARGUMENT", "0 is not a valid group id")
    if gid >= 1 << 16:
        raise TableError("OUT_OF_RANGE", "Group id value is too high")
    if utype == U.DELETE:
        if gid not in groups:
            raise TableError("NOT_FOUND", f"multicast group {gid} does not exist")
        del groups[gid]
        del config.pipeline.group_replicas[gid]
        return
    replicas, kinds = _replicas(group.replicas, f"group {gid}")
    if utype == U.INSERT and gid in groups:
        raise TableError("ALREADY_EXISTS", f"multicast group {gid} already exists")
    if utype == U.MODIFY and gid not in groups:
        raise TableError("NOT_FOUND", f"multicast group {gid} does not exist")
    groups[gid] = _sending_order(replicas)
    config.pipeline.group_replicas[gid] = list(zip(replicas, kinds))

def _replicas(entries, what: str, checked: bool = False) -> tuple[list, list]:
    """[(port, instance)] and how each port was written ("port" bytes or "egress_port")."""
    replicas, kinds = [], []
    for r in entries:
        if r.WhichOneof("port_kind") == "port":
            port = int.from_bytes(r.port, "big")
            kinds.append("port")
        else:
            port = r.egress_port
            kinds.append("egress_port")
        if checked and (port >> 16 or r.instance >> 16):
            raise TableError("INVALID_ARGUMENT", f"{what}: replica (port {port}, instance "
                             f"{r.instance}) does not fit in 16 bits")
        if (port, r.instance) in replicas:
            raise TableError("INVALID_ARGUMENT",
                             f"{what}: replica (port {port}, instance {r.instance}) "
                             "given twice")
        replicas.append((port, r.instance))
    return replicas, kinds

def _sending_order(replicas: list) -> list:
    """BMv2's PRE (as PI programs it) has one node per replica id, in order of first
    appearance, and sends a node's copies in ascending port order."""
    rid_order: dict = {}
    for _, rid in replicas:
        rid_order.setdefault(rid, len(rid_order))
    return sorted(replicas, key=lambda r: (rid_order[r[1]], r[0]))

CLONE_SESSIONS = 1 << 15      # PI's ids: 1 to 32767 (simple_switch keeps 15 bits)

def write_clone_session(config: PipelineConfig, utype, entry) -> None:
    """A clone session is a multicast group the clones go to, as PI programs BMv2 (its
    replicas' instance is the copies' egress_rid). Truncation and a class of service
    are refused: BMv2 runs neither."""
    U = p4runtime_pb2.Update
    sid = entry.session_id
    sessions = config.pipeline.sessions
    if not 1 <= sid < CLONE_SESSIONS:
        raise TableError("INVALID_ARGUMENT", f"clone session id {sid} is out of range "
                         f"(1 to {CLONE_SESSIONS - 1})")
    if utype == U.DELETE:
        if sid not in sessions:
            raise TableError("NOT_FOUND", f"clone session {sid} does not exist")
        del sessions[sid]
        del config.pipeline.session_entries[sid]
        return
    if entry.packet_length_bytes:
        raise TableError("INVALID_ARGUMENT", f"clone session {sid}: packet_length_bytes "
                         f"{entry.packet_length_bytes} (truncation) is not supported; "
                         "0 sends whole packets")
    if entry.class_of_service:
        raise TableError("INVALID_ARGUMENT", f"clone session {sid}: class_of_service "
                         f"{entry.class_of_service} is not supported (no egress queues); "
                         "use 0")
    replicas, kinds = _replicas(entry.replicas, f"clone session {sid}", checked=True)
    if utype == U.INSERT and sid in sessions:
        raise TableError("ALREADY_EXISTS", f"clone session {sid} already exists")
    if utype == U.MODIFY and sid not in sessions:
        raise TableError("NOT_FOUND", f"clone session {sid} does not exist")
    sessions[sid] = _sending_order(replicas)
    config.pipeline.session_entries[sid] = list(zip(replicas, kinds))

def counter(config: PipelineConfig, counter_id: int):
    if counter_id not in config.counters:
        raise TableError("NOT_FOUND", f"unknown counter id {counter_id}")
    return config.counters[counter_id]

def register(config: PipelineConfig, register_id: int):
    if register_id not in config.registers:
        raise TableError("NOT_FOUND", f"unknown register id {register_id}")
    return config.registers[register_id]

def indices(msg, size: int, what: str):
    if not msg.HasField("index"):
        return range(size)
    index = msg.index.index
    if not 0 <= index < size:
        raise TableError("OUT_OF_RANGE", f"{what}: index {index} outside 0..{size - 1}")
    return [index]

def write_counter(config: PipelineConfig, utype, entry) -> None:
    if utype != p4runtime_pb2.Update.MODIFY:
        raise TableError("INVALID_ARGUMENT", "counter entries can only be modified")
    info, spec = counter(config, entry.counter_id)
    for i in indices(entry, spec.size, info.preamble.name):
        spec.packets[i] = entry.data.packet_count
        spec.bytes[i] = entry.data.byte_count

def write_register(config: PipelineConfig, utype, entry) -> None:
    if utype != p4runtime_pb2.Update.MODIFY:
        raise TableError("INVALID_ARGUMENT", "register entries can only be modified")
    info, spec = register(config, entry.register_id)
    if entry.data.WhichOneof("data") != "bitstring":
        raise TableError("INVALID_ARGUMENT", f"register {info.preamble.name}: data must be "
                         "a bitstring")
    value = from_bytes(entry.data.bitstring, spec.width, f"register {info.preamble.name}")
    for i in indices(entry, spec.size, info.preamble.name):
        spec.cells[i] = value

def read_one(config: PipelineConfig, entity) -> list:
    kind = entity.WhichOneof("entity")
    if kind == "table_entry":
        return read_tables(config, entity.table_entry)
    if kind == "packet_replication_engine_entry":
        return read_pre(config, entity.packet_replication_engine_entry)
    if kind == "counter_entry":
        return read_counters(config, entity.counter_entry)
    if kind == "register_entry":
        return read_registers(config, entity.register_entry)
    if kind == "direct_counter_entry":
        return read_direct_counters(config, entity.direct_counter_entry)
    raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                   f"reading {kind or 'an empty entity'} is not supported")

def action_msg(config: PipelineConfig, tinfo: TableInfo, action, msg) -> None:
    aid, data = action
    pid = tinfo.to_p4info.get(aid)
    if pid is None:
        return
    msg.action.action_id = pid
    for p, value in zip(config.action_params[pid], data):
        param = msg.action.params.add()
        param.param_id = p.id
        param.value = to_bytes(value, p.bitwidth)

def read_tables(config: PipelineConfig, query) -> list:
    out = []
    if query.table_id in config.unapplied:
        return []
    if query.table_id:
        tinfos = [table_info(config, query.table_id)]
    else:
        tinfos = list(config.tables.values())
    MF = p4info_pb2.MatchField
    for tinfo in tinfos:
        if query.is_default_action:
            ent = p4runtime_pb2.Entity()
            te = ent.table_entry
            te.table_id = tinfo.info.preamble.id
            te.is_default_action = True
            action_msg(config, tinfo, tinfo.table.default[0], te.action)
            out.append(ent)
            continue
        wanted = None
        if query.match:
            wanted = convert_match(tinfo, query)
        for e in list(tinfo.table.entries.values()):
            if wanted is not None and e.ident != wanted:
                continue
            ent = p4runtime_pb2.Entity()
            te = ent.table_entry
            te.table_id = tinfo.info.preamble.id
            for pos, (finfo, value, m) in enumerate(zip(tinfo.fields, e.values, e.masks)):
                ranged = finfo.match_type == MF.RANGE
                if (value == 0 and m == mask(tinfo.widths[pos])) if ranged else m == 0:
                    continue
                fm = te.match.add()
                fm.field_id = finfo.id
                width = finfo.bitwidth
                if pos in tinfo.names:
                    name = tinfo.names[pos][1].get(value, str(value)).encode()
                    getattr(fm, "exact" if finfo.match_type == MF.EXACT else "optional"
                            ).value = name
                elif finfo.match_type == MF.EXACT:
                    fm.exact.value = to_bytes(value, width)
                elif finfo.match_type == MF.OPTIONAL:
                    fm.optional.value = to_bytes(value, width)
                elif finfo.match_type == MF.LPM:
                    fm.lpm.value = to_bytes(value, width)
                    fm.lpm.prefix_len = bin(m).count("1")
                elif ranged:
                    fm.range.low = to_bytes(value, width)
                    fm.range.high = to_bytes(m, width)
                else:
                    fm.ternary.value = to_bytes(value, width)
                    fm.ternary.mask = to_bytes(m, width)
            if tinfo.table.spec.match_type in ("ternary", "range"):
                te.priority = e.priority
            te.is_const = e.const
            te.metadata = e.metadata
            action_msg(config, tinfo, e.action, te.action)
            if query.HasField("counter_data") and tinfo.table.counted:
                te.counter_data.packet_count, te.counter_data.byte_count = e.counter
            out.append(ent)
    return out

def read_direct_counters(config: PipelineConfig, query) -> list:
    direct_entry(config, query)
    listing = p4runtime_pb2.TableEntry()
    listing.CopyFrom(query.table_entry)
    listing.counter_data.SetInParent()
    out = []
    for ent in read_tables(config, listing):
        dce = p4runtime_pb2.Entity()
        dce.direct_counter_entry.table_entry.CopyFrom(ent.table_entry)
        dce.direct_counter_entry.table_entry.ClearField("counter_data")
        dce.direct_counter_entry.data.CopyFrom(ent.table_entry.counter_data)
        out.append(dce)
    return out

def read_pre(config: PipelineConfig, query) -> list:
    which = query.WhichOneof("type")
    if which == "clone_session_entry":
        return read_clone_sessions(config, query.clone_session_entry.session_id)
    if which != "multicast_group_entry":
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "a PacketReplicationEngineEntry "
                       "without a multicast group or clone session")
    gid = query.multicast_group_entry.multicast_group_id
    groups = config.pipeline.groups
    out = []
    for g in ([gid] if gid else sorted(groups)):
        if g not in groups:
            continue
        ent = p4runtime_pb2.Entity()
        mg = ent.packet_replication_engine_entry.multicast_group_entry
        mg.multicast_group_id = g
        _add_replicas(mg.replicas, config.pipeline.group_replicas[g])
        out.append(ent)
    return out

def read_clone_sessions(config: PipelineConfig, sid: int) -> list:
    """Session ``sid`` (0: every one) as written; none if it does not exist."""
    entries = config.pipeline.session_entries
    out = []
    for s in ([sid] if sid else sorted(entries)):
        if s not in entries:
            continue
        ent = p4runtime_pb2.Entity()
        cs = ent.packet_replication_engine_entry.clone_session_entry
        cs.session_id = s
        _add_replicas(cs.replicas, entries[s])
        out.append(ent)
    return out

def _add_replicas(field, replicas: list) -> None:
    for (port, rid), kind in replicas:
        r = field.add()
        if kind == "port":
            r.port = to_bytes(port, 32).lstrip(b"\0") or b"\0"
        else:
            r.egress_port = port
        r.instance = rid

def read_counters(config: PipelineConfig, query) -> list:
    ids = [query.counter_id] if query.counter_id else sorted(config.counters)
    out = []
    for cid in ids:
        info, spec = counter(config, cid)
        unit = info.spec.unit
        for i in indices(query, spec.size, info.preamble.name):
            ent = p4runtime_pb2.Entity()
            ce = ent.counter_entry
            ce.counter_id = cid
            ce.index.index = i
            if unit != p4info_pb2.CounterSpec.PACKETS:
                ce.data.byte_count = spec.bytes[i]
            if unit != p4info_pb2.CounterSpec.BYTES:
                ce.data.packet_count = spec.packets[i]
            out.append(ent)
    return out

def read_registers(config: PipelineConfig, query) -> list:
    ids = [query.register_id] if query.register_id else sorted(config.registers)
    out = []
    for rid in ids:
        info, spec = register(config, rid)
        for i in indices(query, spec.size, info.preamble.name):
            ent = p4runtime_pb2.Entity()
            re_ = ent.register_entry
            re_.register_id = rid
            re_.index.index = i
            re_.data.bitstring = to_bytes(spec.cells[i], spec.width)
            out.append(ent)
    return out
