"""P4Runtime against the softswitch over real gRPC, driven by the controller's client.

Runs programs/forwarding.p4: exact, LPM and ternary tables, const entries, default
actions, multicast, counters, registers, checksum update. Packets go straight into
the pipeline the server committed.
"""

from __future__ import annotations

import queue

import grpc
import pytest
from finsy.proto import p4i as p4info_pb2
from finsy.proto import p4r as p4runtime_pb2
from finsy.proto import p4r_grpc as p4runtime_pb2_grpc
from google.protobuf import text_format
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.switch_ctl.client import (P4CounterEntry, P4DirectCounterEntry, P4MulticastGroupEntry,
                               P4RuntimeError, P4TableEntry)
from tests.softswitch.conftest import connect, program_files

MAC1, MAC2, MAC9 = "02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:09"


@pytest.fixture
def shell(switch):
    """The switch, with forwarding.p4 pushed by a controller session (``shell.conn``)."""
    switch.conn = connect(switch.addr, "forwarding")
    yield switch
    switch.conn.close()


def ip_frame(src="10.0.0.5", dst="10.1.2.3", proto=17, tos=0, ttl=64, dst_mac=MAC9):
    pkt = Ether(src=MAC1, dst=dst_mac) / IP(src=src, dst=dst, proto=proto, tos=tos, ttl=ttl,
                                            flags=2, frag=5)
    if proto == 17:
        pkt = pkt / UDP(sport=1, dport=2)
    return bytes(pkt / b"payload")


def checksum_ok(data: bytes) -> bool:
    ip = Ether(data)[IP]
    sent = ip.chksum
    del ip.chksum
    return IP(bytes(ip)).chksum == sent


def entries(conn, table: str, **kw) -> list:
    """What the switch holds in ``table``, as P4Runtime TableEntry messages."""
    return [e.table_entry for e in conn.read_raw(P4TableEntry(table, **kw))]


def add_route(conn, prefix, plen, port, mac):
    te = conn.table_entry("Ing.routes", "Ing.route", {"dst_addr": f"{prefix}/{plen}"},
                          {"port": port, "next_mac": mac})
    conn.insert(te)
    return te


def test_exact_table_and_flood_through_a_multicast_group(shell):
    conn = shell.conn
    conn.insert(conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": MAC2}, {"port": 2}))
    conn.insert(P4MulticastGroupEntry(1, replicas=[(1, 0), (2, 0), (3, 0)]))
    arp = bytes(Ether(src=MAC1, dst=MAC2, type=0x0806) / (b"\0" * 28))
    assert shell.send(arp, 1) == [(2, arp)]
    unknown = bytes(Ether(src=MAC1, dst=MAC9, type=0x0806) / (b"\0" * 28))
    assert [p for p, _ in shell.send(unknown, 1)] == [2, 3]      # pruned at the ingress port
    (group,) = conn.read_raw(P4MulticastGroupEntry(1))
    replicas = group.packet_replication_engine_entry.multicast_group_entry.replicas
    assert [(r.egress_port, r.instance) for r in replicas] == [(1, 0), (2, 0), (3, 0)]
    conn.modify(conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": MAC2}, {"port": 3}))
    assert [p for p, _ in shell.send(arp, 1)] == [3]
    conn.delete(conn.table_entry("Ing.mac_table", match={"dst": MAC2}))
    assert [p for p, _ in shell.send(arp, 1)] == [2, 3]
    assert entries(conn, "Ing.mac_table") == []


def test_lpm_prefers_the_longest_prefix_and_rewrites_with_a_valid_checksum(shell):
    add_route(shell.conn, "10.0.0.0", 8, 1, "02:00:00:00:00:aa")
    add_route(shell.conn, "10.1.0.0", 16, 2, "02:00:00:00:00:bb")
    out = shell.send(ip_frame(dst="10.1.2.3", ttl=64), 5)
    assert [p for p, _ in out] == [2]
    pkt = Ether(out[0][1])
    assert (pkt.dst, pkt.src, pkt[IP].ttl) == ("02:00:00:00:00:bb", MAC9, 63)
    assert (int(pkt[IP].flags), pkt[IP].frag, pkt[IP].src) == (2, 5, "10.0.0.5")
    assert checksum_ok(out[0][1])
    assert [p for p, _ in shell.send(ip_frame(dst="10.7.0.1"), 5)] == [1]
    assert shell.send(ip_frame(dst="11.0.0.1"), 5) == []          # default: drop
    assert sorted(e.match[0].lpm.prefix_len for e in entries(shell.conn, "Ing.routes")) == [8, 16]


def test_default_action_can_be_changed_and_read_back(shell):
    conn = shell.conn
    conn.modify(conn.table_entry("Ing.routes", "Ing.route",
                                 params={"port": 4, "next_mac": "02:00:00:00:00:cc"},
                                 is_default=True))
    assert [p for p, _ in shell.send(ip_frame(dst="192.168.1.1"), 5)] == [4]
    read = entries(conn, "Ing.routes", is_default_action=True)
    assert len(read) == 1 and read[0].is_default_action
    assert read[0].action.action.params[0].value == b"\x00\x04"
    with pytest.raises(P4RuntimeError, match="PERMISSION_DENIED"):
        conn.modify(conn.table_entry("Ing.dscp", "NoAction", is_default=True))


def test_ternary_priorities(shell):
    conn = shell.conn
    add_route(conn, "10.0.0.0", 8, 1, MAC2)
    conn.insert(conn.table_entry("Ing.acl", "Ing.drop", {"src_addr": "10.0.0.0/&255.0.0.0"},
                                 priority=10))
    allow = {"src_addr": "10.0.0.5/&255.255.255.255", "protocol": "17/&0xff"}
    conn.insert(conn.table_entry("Ing.acl", "Ing.set_port", allow, {"port": 3}, priority=20))
    assert [p for p, _ in shell.send(ip_frame(src="10.0.0.5"), 5)] == [3]
    assert shell.send(ip_frame(src="10.0.0.6"), 5) == []
    assert shell.send(ip_frame(src="10.0.0.5", proto=6), 5) == []   # TCP: only deny matches
    assert [p for p, _ in shell.send(ip_frame(src="20.0.0.1"), 5)] == [1]
    # Same match, other priority: a new entry.
    conn.insert(conn.table_entry("Ing.acl", "Ing.set_port", allow, {"port": 3}, priority=5))
    assert len(entries(conn, "Ing.acl")) == 3


def test_const_entries_are_visible_and_read_only(shell):
    add_route(shell.conn, "0.0.0.0", 1, 1, MAC2)
    add_route(shell.conn, "128.0.0.0", 1, 1, MAC2)
    for tos, cls in ((0xB8, 3), (0xBB, 3), (0x04, 0), (0x24, 1), (0xC0, 2)):
        out = shell.send(ip_frame(tos=tos), 5)
        assert Ether(out[0][1])[IP].id == cls, hex(tos)
    read = entries(shell.conn, "Ing.dscp")
    assert len(read) == 4 and all(e.is_const for e in read)
    priorities = [e.priority for e in read]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == 4
    with pytest.raises(P4RuntimeError, match="PERMISSION_DENIED"):
        shell.conn.insert(shell.conn.table_entry("Ing.dscp", "Ing.classify",
                                                 {"diffserv": "0x10/&0xff"}, {"cls": 1},
                                                 priority=1))


def test_counters_read_with_and_without_index(shell):
    conn = shell.conn
    add_route(conn, "10.0.0.0", 8, 1, MAC2)
    data = ip_frame(tos=0x24)
    for _ in range(3):
        shell.send(data, 7)
    (entry,) = conn.read(P4CounterEntry("Ing.port_packets", index=7))
    assert (entry.data.packet_count, entry.data.byte_count) == (3, 3 * len(data))
    everything = conn.read(P4CounterEntry("Ing.port_packets"))
    assert len(everything) == 512 and sum(e.data.packet_count for e in everything) == 3
    classes = conn.read(P4CounterEntry("Ing.class_packets"))
    assert [e.data.packet_count for e in classes] == [0, 3, 0, 0]


def test_direct_counter_counts_hits_per_entry(shell):
    conn = shell.conn
    te = conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": MAC2}, {"port": 2})
    conn.insert(te)
    arp = bytes(Ether(src=MAC1, dst=MAC2, type=0x0806) / (b"\0" * 28))
    other = bytes(Ether(src=MAC1, dst=MAC9, type=0x0806) / (b"\0" * 28))
    shell.send(arp, 1)
    shell.send(arp, 1)
    shell.send(other, 1)                            # a miss: the default entry is not counted
    (entry,) = conn.read(P4DirectCounterEntry("Ing.mac_hits"))
    assert (entry.data.packet_count, entry.data.byte_count) == (2, 2 * len(arp))
    conn.modify(P4DirectCounterEntry("Ing.mac_hits", table_entry=te,
                                     data=type(entry.data)(packet_count=0, byte_count=0)))
    (entry,) = conn.read(P4DirectCounterEntry("Ing.mac_hits"))
    assert entry.data.packet_count == 0


def raw_stub(switch):
    channel = grpc.insecure_channel(switch.addr)
    return channel, p4runtime_pb2_grpc.P4RuntimeStub(channel)


def open_stream(stub, election: int):
    """A StreamChannel that arbitrated with ``election``: (its request queue, the stream)."""
    q: queue.Queue = queue.Queue()
    req = p4runtime_pb2.StreamMessageRequest()
    req.arbitration.device_id = 0
    req.arbitration.election_id.low = election
    q.put(req)
    return q, stub.StreamChannel(iter(q.get, None))


def p4info_ids():
    p4info = p4info_pb2.P4Info()
    text_format.Parse(program_files("forwarding")[1].read_text(), p4info)
    return {r.preamble.name: r.preamble.id for r in list(p4info.registers) + list(p4info.tables)}


def test_registers_read_and_write(shell):
    add_route(shell.conn, "10.0.0.0", 8, 1, MAC2)
    shell.send(ip_frame(ttl=42), 6)
    reg_id = p4info_ids()["Ing.last_ttl"]
    channel, stub = raw_stub(shell)
    with channel:
        req = p4runtime_pb2.ReadRequest(device_id=0)
        entry = req.entities.add().register_entry
        entry.register_id = reg_id
        entry.index.index = 6
        (resp,) = list(stub.Read(req))
        assert resp.entities[0].register_entry.data.bitstring == b"\x2a"
        write = p4runtime_pb2.WriteRequest(device_id=0)
        write.election_id.low = 1
        update = write.updates.add()
        update.type = p4runtime_pb2.Update.MODIFY
        update.entity.register_entry.register_id = reg_id
        update.entity.register_entry.index.index = 9
        update.entity.register_entry.data.bitstring = b"\x07"
        stub.Write(write)
        assert shell.pipeline.registers["Ing.last_ttl"].cells[9] == 7
        req.entities[0].register_entry.ClearField("index")
        cells = [e.register_entry.data.bitstring for r in stub.Read(req) for e in r.entities]
        assert len(cells) == 512 and cells[6] == b"\x2a" and cells[9] == b"\x07"


def test_write_errors_come_back_per_update(shell):
    conn = shell.conn
    te = conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": MAC2}, {"port": 2})
    conn.insert(te)
    with pytest.raises(P4RuntimeError, match="ALREADY_EXISTS"):
        conn.insert(te)
    missing = conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": MAC1}, {"port": 1})
    with pytest.raises(P4RuntimeError, match="NOT_FOUND"):
        conn.modify(missing)
    with pytest.raises(P4RuntimeError, match="NOT_FOUND"):
        conn.delete(missing)
    with pytest.raises(P4RuntimeError, match="INVALID_ARGUMENT"):   # ternary needs a priority
        conn.insert(conn.table_entry("Ing.acl", "Ing.drop", {"protocol": "6/&0xff"}))


def test_arbitration_only_the_primary_writes(shell):
    channel, stub = raw_stub(shell)
    with channel:
        requests = [p4runtime_pb2.StreamMessageRequest()]
        requests[0].arbitration.device_id = 0
        requests[0].arbitration.election_id.low = 0   # lower than the shell's (0, 1)
        q: queue.Queue = queue.Queue()
        q.put(requests[0])
        stream = stub.StreamChannel(iter(q.get, None))
        reply = next(stream)
        assert reply.arbitration.status.code == 6       # ALREADY_EXISTS: backup
        assert reply.arbitration.election_id.low == 1   # the primary's id
        write = p4runtime_pb2.WriteRequest(device_id=0)
        write.election_id.low = 0
        update = write.updates.add()
        update.type = p4runtime_pb2.Update.INSERT
        update.entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 3
        with pytest.raises(grpc.RpcError) as err:
            stub.Write(write)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Becoming primary with a higher id: both streams hear about it.
        upgrade = p4runtime_pb2.StreamMessageRequest()
        upgrade.arbitration.device_id = 0
        upgrade.arbitration.election_id.low = 5
        q.put(upgrade)
        reply = next(stream)
        assert reply.arbitration.status.code == 0 and reply.arbitration.election_id.low == 5
        write.election_id.low = 5
        stub.Write(write)
        q.put(None)


def test_pipeline_config_errors(switch):
    channel, stub = raw_stub(switch)
    json_path, p4info_path = program_files("forwarding")
    with channel:
        with pytest.raises(grpc.RpcError) as err:
            stub.GetForwardingPipelineConfig(
                p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        q, stream = open_stream(stub, 1)
        assert next(stream).arbitration.status.code == 0
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=0, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        req.election_id.low = 1
        text_format.Parse(p4info_path.read_text(), req.config.p4info)
        req.config.p4_device_config = b"{not json"
        with pytest.raises(grpc.RpcError) as err:
            stub.SetForwardingPipelineConfig(req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        meter_json, meter_p4info = program_files("unsupported_meter")
        req.config.p4_device_config = meter_json.read_bytes()
        req.config.ClearField("p4info")
        text_format.Parse(meter_p4info.read_text(), req.config.p4info)
        with pytest.raises(grpc.RpcError) as err:
            stub.SetForwardingPipelineConfig(req)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "meter" in err.value.details()
        req.config.ClearField("p4info")
        text_format.Parse(p4info_path.read_text(), req.config.p4info)
        req.config.p4_device_config = json_path.read_bytes()
        req.device_id = 3
        with pytest.raises(grpc.RpcError) as err:
            stub.SetForwardingPipelineConfig(req)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        req.device_id = 0
        stub.SetForwardingPipelineConfig(req)
        got = stub.GetForwardingPipelineConfig(p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=0, response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.ALL))
        assert got.config.p4_device_config == json_path.read_bytes()
        assert got.config.p4info == req.config.p4info
        read = p4runtime_pb2.ReadRequest(device_id=0)
        read.entities.add().meter_entry.meter_id = 1
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Read(read))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        caps = stub.Capabilities(p4runtime_pb2.CapabilitiesRequest())
        assert caps.p4runtime_api_version
        q.put(None)


def test_verify_save_and_commit_actions(switch):
    channel, stub = raw_stub(switch)
    json_path, p4info_path = program_files("forwarding")
    Request = p4runtime_pb2.SetForwardingPipelineConfigRequest
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=0)
    with channel:
        q, stream = open_stream(stub, 1)
        assert next(stream).arbitration.status.code == 0
        commit = Request(device_id=0, action=Request.COMMIT)
        commit.election_id.low = 1
        req = Request(device_id=0, action=Request.VERIFY)
        req.election_id.low = 1
        text_format.Parse(p4info_path.read_text(), req.config.p4info)
        req.config.p4_device_config = json_path.read_bytes()
        req.config.cookie.cookie = 42
        stub.SetForwardingPipelineConfig(req)
        with pytest.raises(grpc.RpcError) as err:     # VERIFY changes nothing
            stub.GetForwardingPipelineConfig(get)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        req.action = Request.VERIFY_AND_SAVE
        stub.SetForwardingPipelineConfig(req)
        assert switch.pipeline is None
        stub.SetForwardingPipelineConfig(commit)
        assert switch.pipeline is not None
        assert stub.GetForwardingPipelineConfig(get).config.cookie.cookie == 42
        with pytest.raises(grpc.RpcError) as err:
            stub.SetForwardingPipelineConfig(commit)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        q.put(None)


def test_backup_becomes_primary_when_the_primary_leaves(switch):
    channel, stub = raw_stub(switch)
    with channel:
        qa, a = open_stream(stub, 5)
        assert next(a).arbitration.status.code == 0            # alone: primary
        qb, b = open_stream(stub, 2)
        assert next(b).arbitration.status.code == 6            # backup
        qa.put(None)                                            # the primary hangs up
        reply = next(b)
        assert reply.arbitration.status.code == 0 and reply.arbitration.election_id.low == 2
        json_path, p4info_path = program_files("forwarding")
        Request = p4runtime_pb2.SetForwardingPipelineConfigRequest
        req = Request(device_id=0, action=Request.VERIFY_AND_COMMIT)
        req.election_id.low = 2
        text_format.Parse(p4info_path.read_text(), req.config.p4info)
        req.config.p4_device_config = json_path.read_bytes()
        stub.SetForwardingPipelineConfig(req)
        qb.put(None)
