"""The switch as P4Runtime sees it: its pipeline config (verified, saved,
committed), the controllers' streams and which of them is primary, PacketOut,
and Write and Read each under one hold of the pipeline's lock.

Arbitration is stricter than PI's: only the primary (the highest election id on an
open StreamChannel, named in the request) may Write or SetForwardingPipelineConfig,
also while no stream is open."""

from __future__ import annotations

import logging
import queue
import threading

import grpc
from finsy.proto import p4r as p4runtime_pb2
from finsy.proto import rpc_code as code_pb2

from innet_aggregation.softswitch.backends.tables import TableError
from innet_aggregation.softswitch.frontend import DROP_PORT, mask
from innet_aggregation.softswitch.p4runtime import codec
from innet_aggregation.softswitch.p4runtime.p4info import PipelineConfig, RpcError

log = logging.getLogger("softswitch")


def u128(msg) -> tuple[int, int]:
    return (msg.high, msg.low)


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
            if u128(request.election_id) != primary.election_id:
                high, low = u128(request.election_id)
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
                    codec.write_one(config, update)
                    results.append((code_pb2.OK, ""))
                except TableError as exc:
                    results.append((code_pb2.Code.Value(exc.code), str(exc)))
                except RpcError as exc:
                    results.append((exc.code.value[0], str(exc)))
        return results

    # ------------------------------------------------------------------ read
    def read(self, entities) -> list:
        """Every entity asked for, all read under one hold of the pipeline's lock (the
        data plane's too), so a Read is one snapshot."""
        config = self.need_config()
        out = []
        try:
            with config.pipeline.lock:
                for entity in entities:
                    out += codec.read_one(config, entity)
        except TableError as exc:
            raise RpcError(getattr(grpc.StatusCode, exc.code), str(exc)) from None
        return out
