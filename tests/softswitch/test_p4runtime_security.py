"""Who may change the switch over P4Runtime, and what a pipeline config may do to it.

Against the softswitch as a process (``python -m innet_aggregation.softswitch``) over real gRPC: only
the primary controller (the highest election id on an open StreamChannel) writes
or sets the pipeline; VERIFY compiles nothing; a JSON that smuggles C into the
generated source is refused with a clean status and leaves no file holding it. The
compile cache is a directory of the test's own (XDG_CACHE_HOME).
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path

import grpc
import pytest
from finsy.proto import p4r
from finsy.proto import p4r_grpc
from google.protobuf import text_format

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.client import P4RuntimeError, P4TableEntry, SwitchConnection
from innet_aggregation.testbed.targets import SwitchProcess, unavailable
from tests.softswitch.conftest import connect, program_files

PAYLOAD = "INJECTED_C_CODE"
Request = p4r.SetForwardingPipelineConfigRequest


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """The softswitch's compile cache for this test: $XDG_CACHE_HOME/innet-softswitch."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "innet-softswitch"


@pytest.fixture(params=["softswitch", "softswitch-python"])
def switch(request, cache, tmp_path):
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    with SwitchProcess(request.param, {}, log_path=tmp_path / "switch.log") as process:
        channel = grpc.insecure_channel(process.grpc_addr)
        process.stub = p4r_grpc.P4RuntimeStub(channel)
        yield process
        channel.close()


def pipeline_request(json_text: bytes, p4info: Path, action=Request.VERIFY_AND_COMMIT,
                     election: int | None = None, cookie: int = 0) -> Request:
    req = Request(device_id=0, action=action)
    if election is not None:
        req.election_id.low = election
    text_format.Parse(p4info.read_text(), req.config.p4info)
    req.config.p4_device_config = json_text
    req.config.cookie.cookie = cookie
    return req


def refusal(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(request)
    assert "Exception calling application" not in (err.value.details() or "")
    return err.value


def no_pipeline(stub) -> bool:
    try:
        stub.GetForwardingPipelineConfig(p4r.GetForwardingPipelineConfigRequest(device_id=0))
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    return False


def files_holding(directory: Path, text: str) -> list[Path]:
    if not directory.exists():
        return []
    return [p for p in directory.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def mac_entry(port: int, mac: str = "02:00:00:00:00:02") -> P4TableEntry:
    return SwitchConnection.table_entry("Ing.mac_table", "Ing.forward", {"dst": mac},
                                        {"port": port})


def entries(conn) -> list:
    return [e.table_entry for e in conn.read_raw(P4TableEntry("Ing.mac_table"))]


def write_request(election: int | None) -> p4r.WriteRequest:
    write = p4r.WriteRequest(device_id=0)
    if election is not None:
        write.election_id.low = election
    return write


# ---------------------------------------------------------------------- arbitration
def test_nothing_changes_the_switch_while_no_controller_holds_a_stream(switch):
    json_path, p4info = program_files("forwarding")
    for election in (None, 1):
        err = refusal(switch.stub.SetForwardingPipelineConfig,
                      pipeline_request(json_path.read_bytes(), p4info, election=election))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "no controller holds a StreamChannel" in err.details()
    assert no_pipeline(switch.stub)
    log = switch.log_path.read_text()
    assert "SetForwardingPipelineConfig from ipv4:127.0.0.1" in log and "refused" in log


def test_only_the_primary_writes_or_sets_the_pipeline(switch):
    json_path, p4info = program_files("forwarding")
    primary = connect(switch.grpc_addr, "forwarding")        # election id 1, on a stream
    backup = SwitchConnection(switch.grpc_addr, 0, (0, 0)).connect()
    try:
        assert primary.is_primary and not backup.is_primary
        primary.insert(mac_entry(2))
        backup.load_p4info()
        before = entries(primary)
        cookie = switch.stub.GetForwardingPipelineConfig(p4r.GetForwardingPipelineConfigRequest(
            device_id=0)).config.cookie.cookie
        # A backup on a stream, with its own (lower) election id.
        with pytest.raises(P4RuntimeError, match="PERMISSION_DENIED: Not primary"):
            backup.insert(mac_entry(3, "02:00:00:00:00:03"))
        with pytest.raises(P4RuntimeError, match="PERMISSION_DENIED: Not primary"):
            backup.modify(mac_entry(3))
        with pytest.raises(P4RuntimeError, match="PERMISSION_DENIED: Not primary"):
            backup.push_pipeline(*program_files("primitives"))
        # A client with no stream at all, without or with an election id of its own.
        update = p4r.Update(type=p4r.Update.DELETE, entity=primary.encode(mac_entry(2)))
        for election in (None, 0, 7):
            write = write_request(election)
            write.updates.append(update)
            assert refusal(switch.stub.Write, write).code() == grpc.StatusCode.PERMISSION_DENIED
            req = pipeline_request(program_files("primitives")[0].read_bytes(),
                                   program_files("primitives")[1], election=election, cookie=99)
            err = refusal(switch.stub.SetForwardingPipelineConfig, req)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        # Nothing changed; the primary still writes.
        assert entries(primary) == before
        assert switch.stub.GetForwardingPipelineConfig(p4r.GetForwardingPipelineConfigRequest(
            device_id=0)).config.cookie.cookie == cookie
        primary.modify(mac_entry(4))
        (entry,) = entries(primary)
        assert entry.action.action.params[0].value == b"\x00\x04"
        primary.push_pipeline(json_path, p4info)
    finally:
        backup.close()
        primary.close()


# ---------------------------------------------------------------------- pipeline configs
def test_verify_compiles_nothing(switch, cache):
    primary = SwitchConnection(switch.grpc_addr, 0, (0, 1)).connect()
    try:
        req = pipeline_request(protocol.PROGRAM_JSON.read_bytes(), protocol.P4INFO,
                               Request.VERIFY, election=1)
        switch.stub.SetForwardingPipelineConfig(req)
        assert no_pipeline(switch.stub)
        assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))
        # The cache watched is the switch's: committing builds into it (native backend).
        json_path, p4info = program_files("forwarding")
        switch.stub.SetForwardingPipelineConfig(pipeline_request(json_path.read_bytes(), p4info,
                                                                 election=1))
        assert not no_pipeline(switch.stub)
        built = list(cache.glob("pipeline-*.so")) if cache.exists() else []
        assert bool(built) == (switch.target == "softswitch"), built
    finally:
        primary.close()


def exploit_json() -> bytes:
    """The aggregation program with C pasted where an error code belongs (issue 20)."""
    doc = json.loads(protocol.PROGRAM_JSON.read_text())
    doc["errors"] = [["NoError", f"0; {PAYLOAD}(); //"]] + [e for e in doc["errors"]
                                                           if e[0] != "NoError"]
    return json.dumps(doc).encode()


def test_a_json_carrying_code_is_refused_without_a_stream(switch, cache):
    req = pipeline_request(exploit_json(), protocol.P4INFO)          # no election id
    err = refusal(switch.stub.SetForwardingPipelineConfig, req)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert no_pipeline(switch.stub)
    assert files_holding(cache, PAYLOAD) == []


@pytest.mark.parametrize("action", [Request.VERIFY, Request.VERIFY_AND_COMMIT],
                         ids=["VERIFY", "VERIFY_AND_COMMIT"])
def test_a_json_carrying_code_is_refused_from_the_primary(switch, cache, action):
    """Needs the validating loader (issue 20 item 1): it must refuse the error code
    as not an int, naming the JSON path, before anything is generated."""
    primary = SwitchConnection(switch.grpc_addr, 0, (0, 1)).connect()
    try:
        req = pipeline_request(exploit_json(), protocol.P4INFO, action, election=1)
        err = refusal(switch.stub.SetForwardingPipelineConfig, req)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert "errors" in err.details() and "\n" not in err.details()
        assert no_pipeline(switch.stub)
    finally:
        primary.close()
    assert files_holding(cache, PAYLOAD) == []


# ---------------------------------------------------------------------- action data widths
def test_parameter_widths_must_match_the_json(switch):
    json_path, p4info = program_files("forwarding")
    primary = SwitchConnection(switch.grpc_addr, 0, (0, 1)).connect()
    try:
        req = pipeline_request(json_path.read_bytes(), p4info, election=1)
        (forward,) = [a for a in req.config.p4info.actions if a.preamble.name == "Ing.forward"]
        forward.params[0].bitwidth = 16          # the JSON's runtime_data says 9
        err = refusal(switch.stub.SetForwardingPipelineConfig, req)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == ("action Ing.forward: parameter port is 16 bits in the P4Info, "
                                 "9 in the JSON")
        assert no_pipeline(switch.stub)
        forward.params.pop()                     # and as many parameters
        err = refusal(switch.stub.SetForwardingPipelineConfig, req)
        assert "action Ing.forward: P4Info has 0 parameters, the JSON 1" in err.details()
        # The real config: a value wider than the parameter is refused, per update.
        primary.push_pipeline(json_path, p4info)
        write = write_request(1)
        update = write.updates.add(type=p4r.Update.INSERT,
                                   entity=primary.encode(mac_entry(3)))
        update.entity.table_entry.action.action.params[0].value = b"\x02\x00"   # 512: 10 bits
        with pytest.raises(grpc.RpcError) as err:
            switch.stub.Write(write)
        assert err.value.code() == grpc.StatusCode.UNKNOWN       # PI's batch status
        assert "INVALID_ARGUMENT" in err.value.details()
        assert "does not fit in 9 bits" in err.value.details()
        assert entries(primary) == []
    finally:
        primary.close()


# ---------------------------------------------------------------------- reads
def test_a_read_is_one_snapshot(switch):
    """One Write puts an entry in two tables, the next takes both out: a Read of both
    tables must see both or neither, never one (each entity under its own lock did)."""
    conn = connect(switch.grpc_addr, "forwarding")
    try:
        pair = [mac_entry(2), conn.table_entry("Ing.routes", "Ing.route",
                                               {"dst_addr": "10.1.0.0/16"},
                                               {"port": 1, "next_mac": "02:00:00:00:00:0a"})]
        read = p4r.ReadRequest(device_id=0, entities=[conn.encode(P4TableEntry("Ing.mac_table")),
                                                      conn.encode(P4TableEntry("Ing.routes"))])
        stop = threading.Event()
        failures: queue.Queue = queue.Queue()

        def churn():
            try:
                while not stop.is_set():
                    conn.insert(pair)
                    conn.delete(pair)
            except Exception as exc:        # reported by the test, not lost in the thread
                failures.put(exc)

        writer = threading.Thread(target=churn)
        writer.start()
        seen = set()
        try:
            for _ in range(1000):
                seen.add(sum(len(r.entities) for r in switch.stub.Read(read)))
        finally:
            stop.set()
            writer.join()
        assert failures.empty(), failures.get()
        assert seen <= {0, 2}, f"a Read saw one table changed and not the other: {seen}"
        assert seen == {0, 2}, f"the writer never overlapped the reads: {seen}"
    finally:
        conn.close()
