"""A pipeline config's P4Info joined to its BMv2 JSON: checked without compiling
anything (all that VERIFY does); ``PipelineConfig.build`` makes the running pipeline."""

from __future__ import annotations

import logging

import grpc
from finsy.proto import p4i as p4info_pb2
from finsy.proto import p4r as p4runtime_pb2

from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends import load_pipeline
from innet_aggregation.softswitch.frontend import Unsupported

log = logging.getLogger("softswitch")


class RpcError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


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
        for pos, (finfo, (kind, width, _)) in enumerate(zip(self.fields, spec.keys)):
            # A range entry holds its bounds where other kinds hold value and mask.
            if (finfo.match_type == p4info_pb2.MatchField.RANGE) != (kind == "range"):
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"table {self.name}: match field {finfo.name} is "
                               f"{p4info_pb2.MatchField.MatchType.Name(finfo.match_type)} in "
                               f"the P4Info, {kind} in the JSON")
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


