"""clone, resubmit and recirculate (programs/special_ops.p4) as simple_switch runs them:
an I2E clone is the packet as it entered ingress, an E2E clone the packet as egress
left it, each with its metadata reset but for its field list and its instance_type
set; a resubmit runs ingress again on the original packet, a recirculation parses the
deparsed one again, each keeping its field list. Clone sessions are written, read and
deleted over P4Runtime. Both backends, and BMv2 frame by frame where it is installed;
loops no packet leaves are bounded (BMv2 would run them for ever)."""

from __future__ import annotations

import os
import struct

import pytest
from finsy import P4CloneSessionEntry

from innet_aggregation.softswitch.backends.python.pipeline import REENTRY_LIMIT
from innet_aggregation.switch_ctl.client import P4RuntimeError
from innet_aggregation.testbed.targets import bmv2_path
from tests.softswitch.conftest import connect

DST, SRC = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
REPORT = struct.Struct("!IBBHHHHH")     # the report header egress puts after the command
FORWARD = 4                             # the program's egress_spec
SESSIONS = {5: [(2, 0)], 7: [(3, 6), (2, 5)]}


def frame(op: int, arg: int = 0, value: int = 0x1234) -> bytes:
    return DST + SRC + b"\x88\xb5" + bytes([op, arg]) + value.to_bytes(2, "big") + b"payload"


def report(data: bytes) -> dict:
    """What egress saw, from the report header after Ethernet and the command."""
    names = ("instance_type", "ingress_type", "passes", "kept", "lost", "ingress_port",
             "egress_rid", "packet_length")
    out = dict(zip(names, REPORT.unpack_from(data, 18)))
    out.update(dst=data[:6], src=data[6:12], payload=data[34:])
    return out


@pytest.fixture
def shell(switch):
    """special_ops.p4 pushed and SESSIONS written over P4Runtime (``shell.conn``)."""
    switch.conn = connect(switch.addr, "special_ops")
    for sid, replicas in SESSIONS.items():
        switch.conn.insert(P4CloneSessionEntry(sid, replicas=replicas))
    yield switch
    switch.conn.close()


def by_port(out) -> dict:
    ports: dict = {}
    for port, data in out:
        ports.setdefault(port, []).append(report(data))
    return ports


def test_i2e_clone_is_the_packet_as_it_entered_with_only_its_field_list(shell):
    out = by_port(shell.send(frame(1, 5), 1))
    assert sorted(out) == [2, FORWARD]
    (orig,), (clone,) = out[FORWARD], out[2]
    assert orig["src"] == bytes.fromhex("0a0a0a0a0a0a")       # changed in ingress after the clone
    assert (orig["instance_type"], orig["kept"], orig["lost"], orig["ingress_port"]) == \
        (0, 0x1234, 0x2222, 1)
    assert clone["src"] == SRC and clone["payload"] == b"payload"
    # Metadata reset but for field list 1 (kept, passes): lost and ingress_port are 0.
    assert (clone["instance_type"], clone["kept"], clone["lost"], clone["ingress_port"],
            clone["egress_rid"], clone["packet_length"]) == (1, 0x1234, 0, 0, 0, 25)


def test_plain_clone_keeps_nothing_and_a_session_sends_one_copy_per_replica(shell):
    conn = shell.conn
    conn.insert(conn.table_entry("I.clone_table", "I.i2e_plain", {"hdr.cmd.op": 6},
                                 {"session": 7}))
    out = shell.send(frame(6), 1)
    # Session 7 as PI programs BMv2: rid 6's node first, then rid 5's.
    assert [p for p, _ in out] == [3, 2, FORWARD]
    clones = [report(d) for p, d in out if p != FORWARD]
    assert [(c["instance_type"], c["egress_rid"], c["kept"]) for c in clones] == \
        [(1, 6, 0), (1, 5, 0)]


def test_a_clone_to_a_session_that_does_not_exist_does_nothing(shell):
    assert [p for p, _ in shell.send(frame(1, 9), 1)] == [FORWARD]


def test_e2e_clone_is_the_packet_as_egress_left_it_even_when_egress_drops_it(shell):
    out = by_port(shell.send(frame(2, 7), 1))
    assert sorted(out) == [2, 3, FORWARD]
    (orig,) = out[FORWARD]
    assert (orig["src"], orig["lost"], orig["instance_type"]) == (bytes.fromhex("0c" * 6), 0x3333, 0)
    for port, rid in ((2, 5), (3, 6)):
        (clone,) = out[port]
        # Egress's change to the header is kept; its metadata is not, but for the field list.
        assert clone["src"] == bytes.fromhex("0c" * 6)
        assert (clone["instance_type"], clone["kept"], clone["lost"], clone["egress_rid"]) == \
            (2, 0x1234, 0, rid)
        assert clone["packet_length"] == 41          # the original's, its report header added
    dropped = by_port(shell.send(frame(2, 7, 0xdead), 1))
    assert sorted(dropped) == [2, 3]                  # the original dropped, its clones sent


@pytest.mark.parametrize("passes", [0, 1, 3])
def test_resubmit_runs_ingress_again_on_the_original_packet(shell, passes):
    (port, data), = shell.send(frame(3, passes), 1)
    seen = report(data)
    assert port == FORWARD
    assert seen["passes"] == passes                   # kept by field list 1 on each pass
    assert seen["ingress_type"] == (6 if passes else 0)
    assert seen["src"] == SRC                         # ingress's change before resubmit is lost
    assert (seen["kept"], seen["ingress_port"]) == (0x1234, 0 if passes else 1)


@pytest.mark.parametrize("passes", [0, 1, 3])
def test_recirculate_parses_the_deparsed_packet_again(shell, passes):
    (port, data), = shell.send(frame(4, passes), 1)
    seen = report(data)
    assert port == FORWARD
    assert seen["passes"] == passes
    assert seen["dst"] == DST[:5] + bytes([1 + passes])   # egress's change seen by each pass
    assert seen["ingress_type"] == (4 if passes else 0)
    assert (seen["kept"], seen["ingress_port"]) == (0x1234, 0 if passes else 1)


def test_fields_are_kept_as_ingress_ends_and_the_clone_goes_before_the_resubmit(shell):
    out = shell.send(frame(8, 5), 1)
    assert [p for p, _ in out] == [2, FORWARD]
    clone, resubmitted = report(out[0][1]), report(out[1][1])
    # passes = 200 is written after the clone and resubmit calls: both keep it.
    assert (clone["instance_type"], clone["passes"]) == (1, 200)
    assert (resubmitted["ingress_type"], resubmitted["passes"]) == (6, 200)


def test_loops_that_never_end_are_bounded(shell):
    assert shell.send(frame(5), 1) == []              # resubmit for ever
    assert shell.send(frame(9), 1) == []              # recirculate for ever
    out = shell.send(frame(10, 5), 1)                 # each E2E clone clones again
    assert [p for p, _ in out] == [FORWARD] + [2] * REENTRY_LIMIT
    assert [p for p, _ in shell.send(frame(0), 1)] == [FORWARD]     # and the switch goes on


def test_clone_sessions_are_written_read_back_and_deleted(shell):
    conn = shell.conn
    (one,) = conn.read_raw(P4CloneSessionEntry(7))
    cs = one.packet_replication_engine_entry.clone_session_entry
    assert (cs.session_id, [(r.egress_port, r.instance) for r in cs.replicas]) == (7, [(3, 6), (2, 5)])
    assert sorted(e.packet_replication_engine_entry.clone_session_entry.session_id
                  for e in conn.read_raw(P4CloneSessionEntry())) == [5, 7]
    conn.modify(P4CloneSessionEntry(5, replicas=[(3, 0)]))
    assert sorted(p for p, _ in shell.send(frame(1, 5), 1)) == [3, FORWARD]
    conn.delete(P4CloneSessionEntry(5))
    assert conn.read_raw(P4CloneSessionEntry(5)) == []
    assert [p for p, _ in shell.send(frame(1, 5), 1)] == [FORWARD]


@pytest.mark.parametrize("entry, code, words", [
    (P4CloneSessionEntry(7, replicas=[(1, 0)]), "ALREADY_EXISTS", "already exists"),
    (P4CloneSessionEntry(0, replicas=[(1, 0)]), "INVALID_ARGUMENT", "out of range"),
    (P4CloneSessionEntry(32768, replicas=[(1, 0)]), "INVALID_ARGUMENT", "out of range"),
    (P4CloneSessionEntry(9, packet_length_bytes=64, replicas=[(1, 0)]), "INVALID_ARGUMENT",
     "truncation"),
    (P4CloneSessionEntry(9, class_of_service=1, replicas=[(1, 0)]), "INVALID_ARGUMENT",
     "class_of_service"),
    (P4CloneSessionEntry(9, replicas=[(1, 0), (1, 0)]), "INVALID_ARGUMENT", "twice"),
    (P4CloneSessionEntry(9, replicas=[(70000, 0)]), "INVALID_ARGUMENT", "16 bits"),
])
def test_bad_clone_sessions_are_refused_and_change_nothing(shell, entry, code, words):
    with pytest.raises(P4RuntimeError, match=f"{code}.*{words}"):
        shell.conn.insert(entry)
    sessions = {e.packet_replication_engine_entry.clone_session_entry.session_id
                for e in shell.conn.read_raw(P4CloneSessionEntry())}
    assert sessions == {5, 7}


def test_missing_sessions_cannot_be_modified_or_deleted(shell):
    for write in (shell.conn.modify, shell.conn.delete):
        with pytest.raises(P4RuntimeError, match="NOT_FOUND.*clone session 9"):
            write(P4CloneSessionEntry(9, replicas=[(1, 0)]))


BMV2_FRAMES = [frame(1, 5), frame(1, 9), frame(6), frame(2, 7), frame(2, 7, 0xdead),
               frame(3, 0), frame(3, 3), frame(4, 0), frame(4, 3), frame(8, 5), frame(0)]


def frames() -> list[bytes]:
    """Every operation once (the loader fuzzer's too), the endless ones included."""
    return BMV2_FRAMES + [frame(5), frame(9), frame(10, 5)]


def setup(pipe) -> None:
    """SESSIONS and the plain clone's entry, written straight into a pipeline."""
    from innet_aggregation.softswitch.backends.tables import Entry

    for sid, replicas in SESSIONS.items():
        pipe.sessions[sid] = replicas
    table = pipe.tables["I.clone_table"]
    aid = next(a for a in table.spec.action_ids if pipe.actions[a].name == "I.i2e_plain")
    table.insert(Entry((6,), (0xFF,), 0, (aid, (7,))))


@pytest.mark.skipif(bmv2_path() is None or os.geteuid() != 0,
                    reason="needs simple_switch_grpc and root")
def test_bmv2_agrees_frame_by_frame(shell):
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess
    from tests.softswitch.test_vs_bmv2 import compare

    plain = ("I.clone_table", "I.i2e_plain", {"hdr.cmd.op": 6}, {"session": 7})
    shell.conn.insert(shell.conn.table_entry(*plain))
    with Namespaces(4) as topo, SwitchProcess("bmv2", topo.switch_ports) as bmv2:
        conn = connect(bmv2.grpc_addr, "special_ops")
        try:
            for sid, replicas in SESSIONS.items():
                conn.insert(P4CloneSessionEntry(sid, replicas=replicas))
            conn.insert(conn.table_entry(*plain))
            mismatches, forwarded = compare(topo, BMV2_FRAMES, lambda data: shell.send(data, 1))
        finally:
            conn.close()
    assert not mismatches, mismatches[:3]
    assert forwarded == len(BMV2_FRAMES)


def refusal(mutate) -> str:
    """The front half's refusal of special_ops.json changed by ``mutate``."""
    import json

    from innet_aggregation.softswitch import frontend
    from tests.softswitch.conftest import program_files

    doc = json.loads(program_files("special_ops")[0].read_text())
    mutate(doc)
    with pytest.raises((ValueError, frontend.Unsupported)) as err:
        frontend.load(json.dumps(doc))
    return str(err.value)


def action(doc, name):
    return next(a for a in doc["actions"] if a["name"] == name)


def test_field_lists_and_misplaced_operations_are_refused_naming_them():
    def unknown_list(doc):
        action(doc, "I.i2e")["primitives"][0]["parameters"][1]["value"] = "0x9"
    assert "parameters[1].value: no field list with id 9" in refusal(unknown_list)

    def header_field(doc):
        doc["field_lists"][0]["elements"].append({"type": "field", "value": ["eth", "src"]})
    assert "field list element eth.src is a header field" in refusal(header_field)

    def bad_id(doc):
        doc["field_lists"][0]["id"] = 1 << 16
    assert refusal(bad_id).startswith("field_lists[0].id: expected an int")

    def twice(doc):
        doc["field_lists"][1]["id"] = doc["field_lists"][0]["id"]
    assert "field list id 1 already used" in refusal(twice)

    def recirculate_in_ingress(doc):
        action(doc, "I.i2e")["primitives"].append(
            {"op": "recirculate", "parameters": [{"type": "hexstr", "value": "0x1"}]})
    assert refusal(recirculate_in_ingress) == "recirculate in ingress"
