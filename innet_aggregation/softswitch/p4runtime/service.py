"""The P4Runtime gRPC service: the subset simple_switch_grpc (PI) serves, plus register writes.

Status codes follow PI: a failed Write is UNKNOWN with one p4.v1.Error per update
in the details (what PI clients parse), everything else
fails with its own code and a message.

Who may change the switch is ``device.Device``'s to say, what a config is
``p4info.PipelineConfig``'s, how entities map to the pipeline ``codec``'s.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures

import grpc
from finsy.proto import p4r as p4runtime_pb2
from finsy.proto import p4r_grpc as p4runtime_pb2_grpc
from finsy.proto import rpc_code as code_pb2
from finsy.proto import rpc_status as status_pb2

from innet_aggregation.softswitch.p4runtime.device import Connection, Device, u128
from innet_aggregation.softswitch.p4runtime.p4info import RpcError

log = logging.getLogger("softswitch")

API_VERSION = "1.4.1"


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
                        election = u128(arb.election_id) if arb.HasField("election_id") else (0, 0)
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
