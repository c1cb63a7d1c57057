"""The one place that touches p4runtime-shell.

p4runtime-shell keeps its connection and P4Info in module globals and calls
sys.exit() on some errors; this class owns that state and turns every failure into
a P4RuntimeError with one readable line, so the rest of the controller never sees
either.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from p4runtime_sh import shell as sh
from p4runtime_sh.p4runtime import (P4RuntimeClient, P4RuntimeException,
                                    P4RuntimeWriteException)
from p4runtime_sh.shell import UserError
from google.rpc import code_pb2

from p4src import protocol


class P4RuntimeError(Exception):
    """A P4Runtime failure, already phrased for a person."""


def describe(exc: BaseException) -> str:
    if isinstance(exc, P4RuntimeWriteException):
        parts = [f"{code_pb2.Code.Name(e.canonical_code)}: {e.message}" for _, e in exc.errors]
        return "write rejected: " + "; ".join(parts)
    if isinstance(exc, P4RuntimeException):
        return f"{exc.grpc_error.code().name}: {exc.grpc_error.details()}"
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


class _Client(P4RuntimeClient):
    """p4runtime-shell's client, remembering whether arbitration made us primary."""
    is_primary = False

    def handshake(self):
        req = sh.p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high = self.election_id[0]
        req.arbitration.election_id.low = self.election_id[1]
        self.stream_out_q.put(req)
        reply = self.get_stream_packet("arbitration", timeout=5)
        if reply is None:
            raise P4RuntimeError("no arbitration reply: is the switch's P4Runtime server up, "
                                 "and is the device id right?")
        self.is_primary = reply.arbitration.status.code == code_pb2.OK


class SwitchConnection:
    """A P4Runtime session with one switch (p4runtime-shell allows one per process)."""

    _active: "SwitchConnection | None" = None

    def __init__(self, grpc_addr: str, device_id: int = 0, election_id: tuple[int, int] = (0, 1),
                 connect_timeout: float = 10.0):
        self.grpc_addr = grpc_addr
        self.connect_timeout = connect_timeout
        self.device_id = device_id
        self.election_id = election_id
        self._client: _Client | None = None

    # -- session -------------------------------------------------------------
    def connect(self) -> "SwitchConnection":
        if SwitchConnection._active is not None:
            raise P4RuntimeError("another SwitchConnection is open in this process; close it first")
        probe = grpc.insecure_channel(self.grpc_addr)
        try:
            grpc.channel_ready_future(probe).result(timeout=self.connect_timeout)
        except grpc.FutureTimeoutError:
            raise P4RuntimeError(f"cannot reach a P4Runtime server at {self.grpc_addr}") from None
        finally:
            probe.close()
        try:
            self._client = _Client(self.device_id, self.grpc_addr, self.election_id)
        except (P4RuntimeException, grpc.RpcError) as exc:
            raise P4RuntimeError(f"{self.grpc_addr}: {describe(exc)}") from None
        sh.client = self._client
        sh.global_options["verbose"] = False  # it would print every entry it builds
        SwitchConnection._active = self
        return self

    @property
    def is_primary(self) -> bool:
        return bool(self._client and self._client.is_primary)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.tear_down()
            finally:
                self._client = None
                sh.client = None
                SwitchConnection._active = None

    def __enter__(self) -> "SwitchConnection":
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- pipeline ------------------------------------------------------------
    def push_pipeline(self, bmv2_json: Path = protocol.PROGRAM_JSON,
                      p4info: Path = protocol.P4INFO) -> None:
        """Install the program (BMv2 JSON is the device config) and load its P4Info."""
        for path in (bmv2_json, p4info):
            if not Path(path).exists():
                raise P4RuntimeError(f"{path} does not exist: run 'make p4'")
        self._call(self._client.set_fwd_pipe_config, str(p4info), str(bmv2_json))
        self.load_p4info()

    def load_p4info(self) -> None:
        """Use the P4Info of the program already on the switch."""
        p4info = self._call(self._client.get_p4info)
        if not p4info.tables:
            raise P4RuntimeError(f"the switch at {self.grpc_addr} has no program: push one first")
        sh.context.set_p4info(p4info)

    # -- entities ------------------------------------------------------------
    def table_entry(self, table: str, action: str | None = None, **kw) -> sh.TableEntry:
        entry = self._call(sh.TableEntry, table)
        return entry(action=action, **kw) if action else entry

    def multicast_group(self, group_id: int) -> sh.MulticastGroupEntry:
        return sh.MulticastGroupEntry(group_id)

    def counter_entry(self, counter: str) -> sh.CounterEntry:
        return self._call(sh.CounterEntry, counter)

    def insert(self, entity) -> None:
        self._call(entity.insert)

    def modify(self, entity) -> None:
        self._call(entity.modify)

    def delete(self, entity) -> None:
        self._call(entity.delete)

    def read(self, entity) -> list:
        return self._call(lambda: list(entity.read()))

    def _call(self, fn, *args):
        if self._client is None:
            raise P4RuntimeError("not connected")
        try:
            return fn(*args)
        except (P4RuntimeException, P4RuntimeWriteException, grpc.RpcError, UserError) as exc:
            raise P4RuntimeError(describe(exc)) from None
        except SystemExit:
            raise P4RuntimeError("p4runtime-shell gave up (see the log above)") from None
