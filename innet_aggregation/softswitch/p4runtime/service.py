"""P4Runtime server: the subset simple_switch_grpc (PI) serves, plus register writes.

Status codes follow PI: a failed Write is UNKNOWN with one p4.v1.Error per update
in the details (what PI clients parse), everything else
fails with its own code and a message.

Arbitration is stricter than PI's: only the primary (the highest election id on an
open StreamChannel, named in the request) may Write or SetForwardingPipelineConfig,
also while no stream is open. A pipeline config is checked against its P4Info
without generating code (all that VERIFY does); only a commit builds and loads it.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent import futures

import grpc
from finsy.proto import p4i as p4info_pb2
from finsy.proto import p4r as p4runtime_pb2
from finsy.proto import p4r_grpc as p4runtime_pb2_grpc
from finsy.proto import rpc_code as code_pb2
from finsy.proto import rpc_status as status_pb2

from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.frontend import DROP_PORT, Unsupported, mask
from innet_aggregation.softswitch.backends import load_pipeline
from innet_aggregation.softswitch.backends.tables import Entry, TableError

log = logging.getLogger("softswitch")

API_VERSION = "1.4.1"


class RpcError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def _u128(msg) -> tuple[int, int]:
    return (msg.high, msg.low)


def to_bytes(value: int, width: int) -> bytes:
    return value.to_bytes((width + 7) // 8, "big")


def from_bytes(data: bytes, width: int, what: str) -> int:
    value = int.from_bytes(data, "big")
    if value >> width:
        raise TableError("INVALID_ARGUMENT",
                         f"{what}: value 0x{data.hex()} does not fit in {width} bits")
    return value


class TableInfo:
    """A P4Info table joined to its JSON table spec; ``table`` (the running table)
    is attached when the config is built."""

    def __init__(self, info: p4info_pb2.Table, spec, actions_by_id: dict, json_actions: dict,
                 errors: dict):
        self.info = info
        self.spec = spec
        self.table = None
        self.name = info.preamble.name
        self.fields = sorted(info.match_fields, key=lambda f: f.id)
        if len(self.fields) != len(spec.keys):
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"table {self.name}: P4Info has {len(self.fields)} match fields, "
                           f"the JSON {len(spec.keys)}")
        # p4c gives an ``error`` field width 0 in the P4Info: P4Runtime carries it as the
        # error's name, the JSON as its code. pos -> (name -> code, code -> name).
        self.names = {}
        self.widths = [width for _, width, _ in spec.keys]
        for pos, (finfo, (_, width, _)) in enumerate(zip(self.fields, spec.keys)):
            if finfo.bitwidth == 0:
                self.names[pos] = (errors, {code: n for n, code in errors.items()})
            elif finfo.bitwidth != width:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"table {self.name}: match field {finfo.name} is {finfo.bitwidth} "
                               f"bits in the P4Info, {width} in the JSON")
        self.field_pos = {f.id: i for i, f in enumerate(self.fields)}
        # P4Info action id <-> JSON action id, by name among this table's JSON actions.
        json_ids = {}
        for aid in list(spec.action_ids) + [spec.default[0] if spec.default else None]:
            if aid is not None:
                json_ids.setdefault(json_actions[aid].name, aid)
        self.scope = {}
        self.to_json = {}
        self.to_p4info = {}
        for ref in info.action_refs:
            action = actions_by_id.get(ref.id)
            if action is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"table {self.name} refers to unknown action id {ref.id}")
            jid = json_ids.get(action.preamble.name)
            if jid is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"table {self.name}: action {action.preamble.name} is not in the JSON")
            _check_params(action, json_actions[jid])
            self.to_json[ref.id] = jid
            self.to_p4info[jid] = ref.id
            self.scope[ref.id] = ref.scope
        self.const_default = info.const_default_action_id != 0
        self.is_const = info.is_const_table


def _check_params(action: p4info_pb2.Action, spec) -> None:
    """The P4Info's parameters are the JSON's, width for width: a value P4Runtime
    accepts then always fits the action data the pipeline was built for."""
    params = sorted(action.params, key=lambda p: p.id)
    name = action.preamble.name
    if len(params) != len(spec.params):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"action {name}: P4Info has {len(params)} parameters, "
                       f"the JSON {len(spec.params)}")
    for param, (_, width) in zip(params, spec.params):
        if param.bitwidth != width:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"action {name}: parameter {param.name} is {param.bitwidth} bits "
                           f"in the P4Info, {width} in the JSON")


class PipelineConfig:
    """A pipeline config checked against its P4Info without compiling or loading
    anything (all that VERIFY does); ``build`` then makes the running pipeline."""

    def __init__(self, request_config: p4runtime_pb2.ForwardingPipelineConfig, drop_port: int,
                 backend: str | None = None):
        self.proto = p4runtime_pb2.ForwardingPipelineConfig()
        self.proto.CopyFrom(request_config)
        self.drop_port = drop_port
        self.backend = backend
        self.pipeline = None
        p4info = request_config.p4info
        if not request_config.HasField("p4info"):
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "the config has no P4Info")
        if not request_config.p4_device_config:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           "p4_device_config is empty (it must hold the BMv2 JSON)")
        try:
            program = frontend.load(request_config.p4_device_config, drop_port)
        except Unsupported as exc:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, f"unsupported P4 program: {exc}") from None
        except ValueError as exc:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        self.actions = {a.preamble.id: a for a in p4info.actions}
        # The packet_out controller header's fields, (id, bitwidth) in P4Info order.
        self.packet_out = [(f.id, f.bitwidth) for h in p4info.controller_packet_metadata
                           if h.preamble.name == "packet_out" for f in h.metadata]
        self.action_params = {a.preamble.id: sorted(a.params, key=lambda p: p.id)
                              for a in p4info.actions}
        self.tables = {}
        # Tables p4c removed from the JSON because nothing can apply them (e.g. behind
        # a return): id -> name. They have no entries; writes to them are refused.
        self.unapplied = {}
        for t in p4info.tables:
            spec = program.tables.get(t.preamble.name)
            if spec is None:
                self.unapplied[t.preamble.id] = t.preamble.name
                log.info("P4Info table %s is not in the JSON: p4c removed it, nothing applies it",
                         t.preamble.name)
                continue
            self.tables[t.preamble.id] = TableInfo(t, spec, self.actions, program.actions,
                                                   program.errors)
        # id -> (P4Info entry, spec); the spec is the running pipeline's once built.
        self.counters = {}
        for c in p4info.counters:
            spec = program.counters.get(c.preamble.name)
            if spec is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"P4Info counter {c.preamble.name} is not in the JSON")
            self.counters[c.preamble.id] = (c, spec)
        self.registers = {}
        for r in p4info.registers:
            spec = program.registers.get(r.preamble.name)
            if spec is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"P4Info register {r.preamble.name} is not in the JSON")
            self.registers[r.preamble.id] = (r, spec)
        for dc in p4info.direct_counters:
            tinfo = self.tables.get(dc.direct_table_id)
            if tinfo is None or tinfo.spec.direct_counter is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"P4Info direct counter {dc.preamble.name} has no counted table "
                               "in the JSON")
        if p4info.meters or p4info.direct_meters or p4info.action_profiles \
                or p4info.value_sets or p4info.digests:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                           "P4Info declares meters, action profiles, value sets or digests, "
                           "which this switch does not support")

    def build(self) -> None:
        """Compile and load the verified program (the one step that makes code)."""
        try:
            pipe = load_pipeline(self.proto.p4_device_config, self.drop_port, self.backend)
        except Unsupported as exc:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, f"unsupported P4 program: {exc}") from None
        except ValueError as exc:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except Exception as exc:     # the backends' own failures; details only in our log
            log.exception("the verified program could not be built")
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"the switch could not build this program ({type(exc).__name__}); "
                           "its log has the details") from None
        for tinfo in self.tables.values():
            tinfo.table = pipe.tables[tinfo.spec.name]
        self.counters = {cid: (info, pipe.counters[spec.name])
                         for cid, (info, spec) in self.counters.items()}
        self.registers = {rid: (info, pipe.registers[spec.name])
                          for rid, (info, spec) in self.registers.items()}
        self.pipeline = pipe


class Connection:
    def __init__(self, election_id):
        self.election_id = election_id
        self.outbox: queue.Queue = queue.Queue()


class Device:
    """The switch as P4Runtime sees it: config, arbitration, entities."""

    def __init__(self, device_id: int, on_pipeline=None, drop_port: int = DROP_PORT,
                 backend: str | None = None, on_packet_out=None):
        self.device_id = device_id
        self.drop_port = drop_port
        # PacketOut frames (the packet_out header, then the payload) go here; None: no CPU port.
        self.on_packet_out = on_packet_out
        self.backend = backend
        self.config: PipelineConfig | None = None
        self.saved: PipelineConfig | None = None
        self.connections: list[Connection] = []
        self.lock = threading.RLock()
        # Serializes pipeline changes, which may compile for seconds, apart from self.lock.
        self.config_lock = threading.Lock()
        self.on_pipeline = on_pipeline or (lambda pipeline: None)

    # ------------------------------------------------------------------ arbitration
    def primary(self) -> Connection | None:
        live = [c for c in self.connections if c.election_id is not None]
        return max(live, key=lambda c: c.election_id, default=None)

    def notify(self, conn: Connection) -> None:
        primary = self.primary()
        resp = p4runtime_pb2.StreamMessageResponse()
        arb = resp.arbitration
        arb.device_id = self.device_id
        if primary is not None:
            arb.election_id.high, arb.election_id.low = primary.election_id
        if conn is primary:
            arb.status.code = code_pb2.OK
            arb.status.message = "Is primary"
        else:
            arb.status.code = code_pb2.ALREADY_EXISTS
            arb.status.message = "Is backup"
        conn.outbox.put(resp)

    def arbitrate(self, conn: Connection, election_id, is_new: bool) -> None:
        with self.lock:
            if any(c is not conn and c.election_id == election_id for c in self.connections):
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               "Election id already exists")
            before = self.primary()
            conn.election_id = election_id
            if is_new:
                self.connections.append(conn)
            after = self.primary()
            if after is not before:
                for c in self.connections:
                    self.notify(c)
            else:
                self.notify(conn)

    def disconnect(self, conn: Connection) -> None:
        with self.lock:
            if conn not in self.connections:
                return
            was_primary = conn is self.primary()
            self.connections.remove(conn)
            if was_primary:
                for c in self.connections:
                    self.notify(c)

    def check_primary(self, request, what: str) -> None:
        """Only the primary changes the switch: the client whose StreamChannel holds
        the highest election id, naming that id in the request. With no stream open
        nothing may (PI lets a request without an election id through then)."""
        with self.lock:
            primary = self.primary()
            if primary is None:
                raise RpcError(grpc.StatusCode.PERMISSION_DENIED,
                               f"Not primary: no controller holds a StreamChannel for device "
                               f"{self.device_id}; open one and win arbitration before {what}")
            if _u128(request.election_id) != primary.election_id:
                high, low = _u128(request.election_id)
                raise RpcError(grpc.StatusCode.PERMISSION_DENIED,
                               f"Not primary: election id {high << 64 | low} is not the "
                               f"primary controller's")

    def check_device(self, device_id: int) -> None:
        if device_id != self.device_id:
            raise RpcError(grpc.StatusCode.NOT_FOUND,
                           f"unknown device id {device_id} (this switch is device {self.device_id})")

    def need_config(self) -> PipelineConfig:
        if self.config is None:
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                           "No forwarding pipeline config set for this device")
        return self.config

    def packet_out(self, conn: Connection, packet) -> None:
        """A PacketOut from the primary enters the pipeline at the CPU port, its
        metadata serialized first as the program's packet_out header (as PI does:
        the fields in P4Info order, bit-packed, big-endian)."""
        with self.lock:
            if self.on_packet_out is None or self.config is None or conn is not self.primary():
                log.debug("packet-out dropped: no CPU port, no pipeline, or not from the primary")
                return
            fields = self.config.packet_out
        value, bits = 0, 0
        given = {m.metadata_id: int.from_bytes(m.value, "big") for m in packet.metadata}
        for field_id, width in fields:
            value = (value << width) | (given.get(field_id, 0) & mask(width))
            bits += width
        self.on_packet_out(value.to_bytes((bits + 7) // 8, "big") + packet.payload)

    # ------------------------------------------------------------------ pipeline config
    def set_pipeline(self, request) -> None:
        """VERIFY checks the config and keeps nothing; only COMMIT and
        VERIFY_AND_COMMIT build the program into code and load it."""
        Action = p4runtime_pb2.SetForwardingPipelineConfigRequest
        action = request.action
        with self.config_lock:
            if action == Action.COMMIT:
                if self.saved is None:
                    raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, "no saved config to commit")
                self.saved.build()
                self._commit(self.saved)
                self.saved = None
                return
            if action == Action.RECONCILE_AND_COMMIT:
                raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                               "RECONCILE_AND_COMMIT is not supported")
            if action not in (Action.VERIFY, Action.VERIFY_AND_SAVE, Action.VERIFY_AND_COMMIT):
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"invalid SetForwardingPipelineConfig action {action}")
            config = PipelineConfig(request.config, self.drop_port, self.backend)
            if action == Action.VERIFY_AND_SAVE:
                self.saved = config
            elif action == Action.VERIFY_AND_COMMIT:
                config.build()
                self._commit(config)

    def _commit(self, config: PipelineConfig) -> None:
        with self.lock:
            self.config = config
        self.on_pipeline(config.pipeline)
        log.info("pipeline committed (%d tables, %d registers, %d counters)",
                 len(config.tables), len(config.registers), len(config.counters))

    def get_pipeline(self, response_type) -> p4runtime_pb2.ForwardingPipelineConfig:
        config = self.need_config()
        RT = p4runtime_pb2.GetForwardingPipelineConfigRequest
        out = p4runtime_pb2.ForwardingPipelineConfig()
        out.cookie.CopyFrom(config.proto.cookie)
        if response_type in (RT.ALL, RT.P4INFO_AND_COOKIE):
            out.p4info.CopyFrom(config.proto.p4info)
        if response_type in (RT.ALL, RT.DEVICE_CONFIG_AND_COOKIE):
            out.p4_device_config = config.proto.p4_device_config
        return out

    # ------------------------------------------------------------------ write
    def write(self, request) -> list[tuple[int, str]]:
        """Apply every update; the (code, message) of each, code 0 for success."""
        config = self.need_config()
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                           "only CONTINUE_ON_ERROR atomicity is supported")
        results = []
        with config.pipeline.lock:
            for update in request.updates:
                try:
                    self.write_one(config, update)
                    results.append((code_pb2.OK, ""))
                except TableError as exc:
                    results.append((code_pb2.Code.Value(exc.code), str(exc)))
                except RpcError as exc:
                    results.append((exc.code.value[0], str(exc)))
        return results

    def write_one(self, config: PipelineConfig, update) -> None:
        U = p4runtime_pb2.Update
        if update.type == U.UNSPECIFIED:
            raise TableError("INVALID_ARGUMENT", "Update type is not set")
        kind = update.entity.WhichOneof("entity")
        if kind == "table_entry":
            self.write_table(config, update.type, update.entity.table_entry)
        elif kind == "packet_replication_engine_entry":
            self.write_pre(config, update.type, update.entity.packet_replication_engine_entry)
        elif kind == "counter_entry":
            self.write_counter(config, update.type, update.entity.counter_entry)
        elif kind == "register_entry":
            self.write_register(config, update.type, update.entity.register_entry)
        elif kind == "direct_counter_entry":
            self.write_direct_counter(config, update.type, update.entity.direct_counter_entry)
        else:
            raise TableError("UNIMPLEMENTED", f"writing {kind or 'an empty entity'} is not supported")

    def table_info(self, config: PipelineConfig, table_id: int) -> TableInfo:
        info = config.tables.get(table_id)
        if info is None and table_id in config.unapplied:
            raise TableError("NOT_FOUND", f"table {config.unapplied[table_id]} is not in the "
                             "compiled program: p4c removed it because nothing applies it")
        if info is None:
            raise TableError("NOT_FOUND", f"unknown table id {table_id}")
        return info

    def convert_action(self, config: PipelineConfig, tinfo: TableInfo, entry, default: bool):
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

    def convert_match(self, tinfo: TableInfo, entry):
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
            else:
                raise TableError("UNIMPLEMENTED", f"{kind} match is not supported")
        for pos, finfo in enumerate(tinfo.fields):
            if pos not in seen and finfo.match_type in (MF.EXACT,):
                raise TableError("INVALID_ARGUMENT",
                                 f"table {tinfo.name}: exact field {finfo.name} is missing")
        match_type = tinfo.table.spec.match_type
        if match_type == "ternary":
            if entry.priority <= 0:
                raise TableError("INVALID_ARGUMENT",
                                 f"table {tinfo.name}: a ternary entry needs a priority > 0")
            priority = entry.priority
        else:
            if entry.priority != 0:
                raise TableError("INVALID_ARGUMENT",
                                 f"table {tinfo.name}: priority must be 0 for a {match_type} table")
            priority = prefix if match_type == "lpm" else 0
        return tuple(values), tuple(masks), priority

    def write_table(self, config: PipelineConfig, utype, entry) -> None:
        U = p4runtime_pb2.Update
        tinfo = self.table_info(config, entry.table_id)
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
                table.set_default(self.convert_action(config, tinfo, entry, default=True))
            else:
                table.set_default(table.initial_default)
            return
        if tinfo.is_const or any(e.const for e in table.entries.values()):
            raise TableError("PERMISSION_DENIED", f"table {tinfo.name} has const entries")
        values, masks, priority = self.convert_match(tinfo, entry)
        ident = (values, masks, priority)
        if utype == U.DELETE:
            table.delete(ident)
            return
        action = self.convert_action(config, tinfo, entry, default=False)
        new = Entry(values, masks, priority, action)
        if utype == U.INSERT:
            table.insert(new)
        else:
            table.modify(new)
        if entry.HasField("counter_data") and table.counted:
            counter = table.entries[ident].counter
            counter[:] = [entry.counter_data.packet_count, entry.counter_data.byte_count]

    def direct_entry(self, config: PipelineConfig, query):
        tinfo = self.table_info(config, query.table_entry.table_id)
        if not tinfo.table.counted:
            raise TableError("INVALID_ARGUMENT", f"table {tinfo.name} has no direct counter")
        return tinfo

    def write_direct_counter(self, config: PipelineConfig, utype, entry) -> None:
        if utype != p4runtime_pb2.Update.MODIFY:
            raise TableError("INVALID_ARGUMENT", "direct counter entries can only be modified")
        tinfo = self.direct_entry(config, entry)
        ident = self.convert_match(tinfo, entry.table_entry)
        found = tinfo.table.entries.get(ident)
        if found is None:
            raise TableError("NOT_FOUND", f"table {tinfo.name}: no such entry")
        found.counter[:] = [entry.data.packet_count, entry.data.byte_count]

    def write_pre(self, config: PipelineConfig, utype, pre) -> None:
        U = p4runtime_pb2.Update
        if pre.WhichOneof("type") != "multicast_group_entry":
            raise TableError("UNIMPLEMENTED", "clone sessions are not supported")
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
        replicas = []
        kinds = []
        for r in group.replicas:
            if r.WhichOneof("port_kind") == "port":
                port = int.from_bytes(r.port, "big")
                kinds.append("port")
            else:
                port = r.egress_port
                kinds.append("egress_port")
            if (port, r.instance) in replicas:
                raise TableError("INVALID_ARGUMENT",
                                 f"group {gid}: replica (port {port}, instance {r.instance}) "
                                 "given twice")
            replicas.append((port, r.instance))
        if utype == U.INSERT and gid in groups:
            raise TableError("ALREADY_EXISTS", f"multicast group {gid} already exists")
        if utype == U.MODIFY and gid not in groups:
            raise TableError("NOT_FOUND", f"multicast group {gid} does not exist")
        # BMv2's PRE (as PI programs it) has one node per replica id, in order of first
        # appearance, and sends a node's copies in ascending port order.
        rid_order = {}
        for _, rid in replicas:
            rid_order.setdefault(rid, len(rid_order))
        groups[gid] = sorted(replicas, key=lambda r: (rid_order[r[1]], r[0]))
        config.pipeline.group_replicas[gid] = list(zip(replicas, kinds))

    def counter(self, config: PipelineConfig, counter_id: int):
        if counter_id not in config.counters:
            raise TableError("NOT_FOUND", f"unknown counter id {counter_id}")
        return config.counters[counter_id]

    def register(self, config: PipelineConfig, register_id: int):
        if register_id not in config.registers:
            raise TableError("NOT_FOUND", f"unknown register id {register_id}")
        return config.registers[register_id]

    @staticmethod
    def indices(msg, size: int, what: str):
        if not msg.HasField("index"):
            return range(size)
        index = msg.index.index
        if not 0 <= index < size:
            raise TableError("OUT_OF_RANGE", f"{what}: index {index} outside 0..{size - 1}")
        return [index]

    def write_counter(self, config: PipelineConfig, utype, entry) -> None:
        if utype != p4runtime_pb2.Update.MODIFY:
            raise TableError("INVALID_ARGUMENT", "counter entries can only be modified")
        info, spec = self.counter(config, entry.counter_id)
        for i in self.indices(entry, spec.size, info.preamble.name):
            spec.packets[i] = entry.data.packet_count
            spec.bytes[i] = entry.data.byte_count

    def write_register(self, config: PipelineConfig, utype, entry) -> None:
        if utype != p4runtime_pb2.Update.MODIFY:
            raise TableError("INVALID_ARGUMENT", "register entries can only be modified")
        info, spec = self.register(config, entry.register_id)
        if entry.data.WhichOneof("data") != "bitstring":
            raise TableError("INVALID_ARGUMENT", f"register {info.preamble.name}: data must be "
                             "a bitstring")
        value = from_bytes(entry.data.bitstring, spec.width, f"register {info.preamble.name}")
        for i in self.indices(entry, spec.size, info.preamble.name):
            spec.cells[i] = value

    # ------------------------------------------------------------------ read
    def read(self, entities) -> list:
        """Every entity asked for, all read under one hold of the pipeline's lock (the
        data plane's too), so a Read is one snapshot."""
        config = self.need_config()
        out = []
        try:
            with config.pipeline.lock:
                for entity in entities:
                    out += self.read_one(config, entity)
        except TableError as exc:
            raise RpcError(getattr(grpc.StatusCode, exc.code), str(exc)) from None
        return out

    def read_one(self, config: PipelineConfig, entity) -> list:
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            return self.read_tables(config, entity.table_entry)
        if kind == "packet_replication_engine_entry":
            return self.read_pre(config, entity.packet_replication_engine_entry)
        if kind == "counter_entry":
            return self.read_counters(config, entity.counter_entry)
        if kind == "register_entry":
            return self.read_registers(config, entity.register_entry)
        if kind == "direct_counter_entry":
            return self.read_direct_counters(config, entity.direct_counter_entry)
        raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                       f"reading {kind or 'an empty entity'} is not supported")

    def action_msg(self, config: PipelineConfig, tinfo: TableInfo, action, msg) -> None:
        aid, data = action
        pid = tinfo.to_p4info.get(aid)
        if pid is None:
            return
        msg.action.action_id = pid
        for p, value in zip(config.action_params[pid], data):
            param = msg.action.params.add()
            param.param_id = p.id
            param.value = to_bytes(value, p.bitwidth)

    def read_tables(self, config: PipelineConfig, query) -> list:
        out = []
        if query.table_id in config.unapplied:
            return []
        if query.table_id:
            tinfos = [self.table_info(config, query.table_id)]
        else:
            tinfos = list(config.tables.values())
        MF = p4info_pb2.MatchField
        for tinfo in tinfos:
            if query.is_default_action:
                ent = p4runtime_pb2.Entity()
                te = ent.table_entry
                te.table_id = tinfo.info.preamble.id
                te.is_default_action = True
                self.action_msg(config, tinfo, tinfo.table.default[0], te.action)
                out.append(ent)
                continue
            wanted = None
            if query.match:
                wanted = self.convert_match(tinfo, query)
            for e in list(tinfo.table.entries.values()):
                if wanted is not None and e.ident != wanted:
                    continue
                ent = p4runtime_pb2.Entity()
                te = ent.table_entry
                te.table_id = tinfo.info.preamble.id
                for pos, (finfo, value, m) in enumerate(zip(tinfo.fields, e.values, e.masks)):
                    if m == 0:
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
                    else:
                        fm.ternary.value = to_bytes(value, width)
                        fm.ternary.mask = to_bytes(m, width)
                if tinfo.table.spec.match_type == "ternary":
                    te.priority = e.priority
                te.is_const = e.const
                self.action_msg(config, tinfo, e.action, te.action)
                if query.HasField("counter_data") and tinfo.table.counted:
                    te.counter_data.packet_count, te.counter_data.byte_count = e.counter
                out.append(ent)
        return out

    def read_direct_counters(self, config: PipelineConfig, query) -> list:
        self.direct_entry(config, query)
        listing = p4runtime_pb2.TableEntry()
        listing.CopyFrom(query.table_entry)
        listing.counter_data.SetInParent()
        out = []
        for ent in self.read_tables(config, listing):
            dce = p4runtime_pb2.Entity()
            dce.direct_counter_entry.table_entry.CopyFrom(ent.table_entry)
            dce.direct_counter_entry.table_entry.ClearField("counter_data")
            dce.direct_counter_entry.data.CopyFrom(ent.table_entry.counter_data)
            out.append(dce)
        return out

    def read_pre(self, config: PipelineConfig, query) -> list:
        if query.WhichOneof("type") != "multicast_group_entry":
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, "clone sessions are not supported")
        gid = query.multicast_group_entry.multicast_group_id
        groups = config.pipeline.groups
        out = []
        for g in ([gid] if gid else sorted(groups)):
            if g not in groups:
                continue
            ent = p4runtime_pb2.Entity()
            mg = ent.packet_replication_engine_entry.multicast_group_entry
            mg.multicast_group_id = g
            for (port, rid), kind in config.pipeline.group_replicas[g]:
                r = mg.replicas.add()
                if kind == "port":
                    r.port = to_bytes(port, 32).lstrip(b"\0") or b"\0"
                else:
                    r.egress_port = port
                r.instance = rid
            out.append(ent)
        return out

    def read_counters(self, config: PipelineConfig, query) -> list:
        ids = [query.counter_id] if query.counter_id else sorted(config.counters)
        out = []
        for cid in ids:
            info, spec = self.counter(config, cid)
            unit = info.spec.unit
            for i in self.indices(query, spec.size, info.preamble.name):
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

    def read_registers(self, config: PipelineConfig, query) -> list:
        ids = [query.register_id] if query.register_id else sorted(config.registers)
        out = []
        for rid in ids:
            info, spec = self.register(config, rid)
            for i in self.indices(query, spec.size, info.preamble.name):
                ent = p4runtime_pb2.Entity()
                re_ = ent.register_entry
                re_.register_id = rid
                re_.index.index = i
                re_.data.bitstring = to_bytes(spec.cells[i], spec.width)
                out.append(ent)
        return out


class Service(p4runtime_pb2_grpc.P4RuntimeServicer):
    def __init__(self, device: Device):
        self.device = device

    @staticmethod
    def _fail(context, exc: RpcError):
        context.abort(exc.code, str(exc))

    def _refuse(self, what: str, context, exc: RpcError):
        """Refusals of requests that change the switch are logged, with who sent them."""
        log.warning("%s from %s refused: %s: %s", what, context.peer(), exc.code.name, exc)
        self._fail(context, exc)

    def Write(self, request, context):
        try:
            self.device.check_device(request.device_id)
            self.device.check_primary(request, "writing")
        except RpcError as exc:
            self._refuse("Write", context, exc)
        try:
            results = self.device.write(request)
        except RpcError as exc:
            self._fail(context, exc)
        if all(code == code_pb2.OK for code, _ in results):
            return p4runtime_pb2.WriteResponse()
        status = status_pb2.Status(code=code_pb2.UNKNOWN)
        failures = []
        for i, (code, message) in enumerate(results):
            error = p4runtime_pb2.Error(canonical_code=code, message=message,
                                        space="softswitch" if code else "")
            status.details.add().Pack(error)
            if code:
                failures.append(f"update {i}: {code_pb2.Code.Name(code)}: {message}")
        status.message = "; ".join(failures)
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(grpc.StatusCode.UNKNOWN, status.message)

    def Read(self, request, context):
        try:
            self.device.check_device(request.device_id)
            entities = self.device.read(request.entities)
        except RpcError as exc:
            self._fail(context, exc)
        for start in range(0, max(len(entities), 1), 1000):
            yield p4runtime_pb2.ReadResponse(entities=entities[start:start + 1000])

    def SetForwardingPipelineConfig(self, request, context):
        try:
            self.device.check_device(request.device_id)
            self.device.check_primary(request, "setting the pipeline")
            self.device.set_pipeline(request)
        except RpcError as exc:
            self._refuse("SetForwardingPipelineConfig", context, exc)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request, context):
        try:
            self.device.check_device(request.device_id)
            config = self.device.get_pipeline(request.response_type)
        except RpcError as exc:
            self._fail(context, exc)
        return p4runtime_pb2.GetForwardingPipelineConfigResponse(config=config)

    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    def StreamChannel(self, request_iterator, context):
        conn = Connection(None)
        device = self.device
        done = object()

        def reader():
            joined = False
            try:
                for request in request_iterator:
                    kind = request.WhichOneof("update")
                    if kind == "arbitration":
                        arb = request.arbitration
                        if arb.device_id != device.device_id:
                            conn.outbox.put(RpcError(grpc.StatusCode.NOT_FOUND,
                                                     f"unknown device id {arb.device_id}"))
                            return
                        election = _u128(arb.election_id) if arb.HasField("election_id") else (0, 0)
                        device.arbitrate(conn, election, is_new=not joined)
                        joined = True
                    elif kind == "packet":
                        device.packet_out(conn, request.packet)
            except RpcError as exc:
                conn.outbox.put(exc)
            except grpc.RpcError:
                pass
            finally:
                conn.outbox.put(done)

        context.add_callback(lambda: conn.outbox.put(done))
        thread = threading.Thread(target=reader, daemon=True, name="p4rt-stream")
        thread.start()
        try:
            while True:
                item = conn.outbox.get()
                if item is done:
                    break
                if isinstance(item, RpcError):
                    context.abort(item.code, str(item))
                yield item
        finally:
            device.disconnect(conn)


def serve(device: Device, address: str,
          credentials: grpc.ServerCredentials | None = None) -> grpc.Server:
    """The P4Runtime server on ``address``: TLS with ``credentials``, else plaintext."""
    # PI accepts messages up to 256 MiB: a pipeline config is the whole BMv2 JSON.
    limit = 256 << 20
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="p4rt"),
                         options=[("grpc.max_receive_message_length", limit),
                                  ("grpc.max_send_message_length", limit)])
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(Service(device), server)
    if credentials is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    return server
