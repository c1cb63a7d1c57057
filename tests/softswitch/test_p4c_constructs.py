"""Valid p4c output that was refused for the wrong reason, made to run (issue #9).

Each construct is put into the real p4c output of our test programs the way p4c
writes it, and the result must run on both backends:
- a ?: between headers where the loader expected a header name, which crashed it
  with "unhashable type: 'dict'" (gauntlet_mux_validity-bmv2): as the source of a
  header assignment (what predication makes of ``if (c) { h = x; }``), and under
  ``isValid()``, which p4c writes as the field [<the bare ?: object>, "$valid$"];
- a P4Info table missing from the JSON because p4c removed the code that applied
  it, e.g. a ``switch`` behind a ``return`` (gauntlet_nested_switch-bmv2);
- a match field of type ``error``: 0 bits (a string) in the P4Info, 32 in the JSON
  (issue1062-1-bmv2).

The tests at the end run our own programs that make p4c emit each construct
(programs/mux_headers.p4, removed_table.p4, error_key.p4, compiled by p4c) on both
backends, and on BMv2 where it is installed, with the same frames and P4Runtime
writes; the edited-JSON tests above keep the refusals and edge cases.
"""

from __future__ import annotations

import json
import os

import pytest
from finsy.proto import p4i as p4info_pb2
from google.protobuf import text_format

from innet_aggregation.softswitch.frontend import Unsupported
from innet_aggregation.switch_ctl.client import P4RuntimeError, P4TableEntry, SwitchConnection
from innet_aggregation.testbed.targets import bmv2_path
from tests.softswitch.conftest import connect, load, pipeline, program_files
from tests.softswitch.test_primitives import fields, frame
from tests.softswitch.test_p4runtime import MAC1, ip_frame


def forwarding() -> tuple[dict, p4info_pb2.P4Info]:
    json_path, p4info_path = program_files("forwarding")
    info = text_format.Parse(p4info_path.read_text(), p4info_pb2.P4Info())
    return json.loads(json_path.read_text()), info


def header_mux(cond_header: str, left: str, right: str) -> dict:
    """``(cond_header.isValid() ? left : right)`` as p4c writes a header-typed ?:."""
    return {"type": "expression", "value": {
        "op": "?",
        "cond": {"type": "expression", "value": {
            "op": "d2b", "left": None,
            "right": {"type": "field", "value": [cond_header, "$valid$"]}}},
        "left": {"type": "header", "value": left},
        "right": {"type": "header", "value": right}}}


def the_condition(doc: dict) -> dict:
    """The ingress conditional ``hdr.ipv4.isValid()`` of forwarding.p4."""
    ingress = next(p for p in doc["pipelines"] if p["name"] == "ingress")
    return ingress["conditionals"][0]["expression"]["value"]


FRAMES = [ip_frame(), ip_frame(dst="10.1.2.3", proto=6),
          bytes.fromhex("020000000009") + bytes.fromhex("020000000001") + b"\x88\xb5" + bytes(50),
          b"\x02" * 13]


def outputs(doc: dict, backend: str) -> list:
    pipe = pipeline(json.dumps(doc).encode(), backend)
    pipe.groups[1] = [(1, 0), (2, 0)]
    return [sorted(pipe.process(frame, 3)) for frame in FRAMES]


def test_is_valid_of_a_header_expression_runs(backend):
    doc, _ = forwarding()
    expected = outputs(doc, backend)
    # (ethernet valid ? ipv4 : ethernet).isValid(): the same as ipv4.isValid() here.
    the_condition(doc)["right"]["value"][0] = header_mux("ethernet", "ipv4", "ethernet")
    assert outputs(doc, backend) == expected
    assert any(expected) and any(not out for out in expected)


def test_is_valid_of_an_expression_that_is_no_header_is_refused_by_name(backend):
    doc, _ = forwarding()
    the_condition(doc)["right"]["value"][0] = {"type": "hexstr", "value": "0x1"}
    with pytest.raises(Unsupported, match="isValid.. of the computed header"):
        pipeline(json.dumps(doc).encode(), backend)


def push(switch, doc: dict, info: p4info_pb2.P4Info, tmp_path) -> SwitchConnection:
    json_path, p4info_path = tmp_path / "prog.json", tmp_path / "prog.p4info.txtpb"
    json_path.write_text(json.dumps(doc))
    p4info_path.write_text(text_format.MessageToString(info))
    conn = connect(switch.addr)
    conn.push_pipeline(json_path, p4info_path)
    return conn


def error_entry(conn: SwitchConnection, table: str, error: str, port: int):
    """An entry matching the error-typed key "err" by name, as P4Runtime sends an
    error (its P4Info width is 0, so it is no bitstring finsy could encode)."""
    entity = conn.encode(conn.table_entry(table, "Ing.forward", params={"port": port}))
    match = entity.table_entry.match.add(field_id=conn.schema.tables[table].match_fields["err"].id)
    match.exact.value = error.encode()
    return entity


def raw_entries(conn: SwitchConnection, table: str) -> list:
    return [e.table_entry for e in conn.read_raw(P4TableEntry(table))]


def test_a_p4info_table_p4c_removed_from_the_json_is_accepted(switch, tmp_path):
    doc, info = forwarding()
    gone = info.tables.add()
    gone.CopyFrom(next(t for t in info.tables if t.preamble.name == "Ing.mac_table"))
    gone.preamble.id, gone.preamble.name, gone.preamble.alias = 33554000, "Ing.gone", "gone"
    conn = push(switch, doc, info, tmp_path)
    try:
        with pytest.raises(P4RuntimeError, match="nothing applies it"):
            conn.insert(conn.table_entry("Ing.gone", "Ing.forward", {"dst": MAC1}, {"port": 2}))
        assert raw_entries(conn, "Ing.gone") == []
        conn.insert(conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": MAC1}, {"port": 2}))
    finally:
        conn.close()
    frame = bytes.fromhex(MAC1.replace(":", "")) + bytes(6) + b"\x88\xb5" + bytes(40)
    assert switch.send(frame, 1) == [(2, frame)]


def test_a_match_field_of_type_error_is_matched_by_name(switch, tmp_path):
    doc, info = forwarding()
    ingress = next(p for p in doc["pipelines"] if p["name"] == "ingress")
    table = next(t for t in ingress["tables"] if t["name"] == "Ing.mac_table")
    table["key"][0]["target"] = ["standard_metadata", "parser_error"]
    table["key"][0]["name"] = "err"
    field = next(t for t in info.tables if t.preamble.name == "Ing.mac_table").match_fields[0]
    field.name, field.bitwidth = "err", 0           # what p4c writes for an error
    conn = push(switch, doc, info, tmp_path)
    try:
        conn.insert(error_entry(conn, "Ing.mac_table", "PacketTooShort", 4))
        with pytest.raises(P4RuntimeError, match="not an error of this program"):
            conn.insert(error_entry(conn, "Ing.mac_table", "NoSuchError", 4))
        [read] = raw_entries(conn, "Ing.mac_table")
        assert read.match[0].exact.value == b"PacketTooShort"
    finally:
        conn.close()
    short = b"\x02" * 13                      # ethernet does not fit: PacketTooShort
    assert switch.send(short, 1) == [(4, short)]
    whole = b"\x02" * 12 + b"\x88\xb5" + bytes(20)     # NoError: missed, floods group 1
    assert switch.send(whole, 1) == []


def test_a_header_assigned_from_a_choice_of_headers(backend):
    """primitives.p4's ``hdr.e2 = hdr.e1`` becomes ``hdr.e2 = hdr.t.b != 0 ? hdr.e1 : hdr.e2``."""
    doc = json.loads(program_files("primitives")[0].read_text())
    action = next(a for a in doc["actions"] if a["name"] == "Ing.headers_op")
    copy = next(p for p in action["primitives"] if p["op"] == "assign_header")
    copy["parameters"][1] = {"type": "expression", "value": {
        "op": "?",
        "cond": {"type": "expression", "value": {
            "op": "!=", "left": {"type": "field", "value": ["t", "b"]},
            "right": {"type": "hexstr", "value": "0x00000000"}}},
        "left": {"type": "header", "value": "e1"},
        "right": {"type": "header", "value": "e2"}}}
    pipe = pipeline(json.dumps(doc).encode(), backend)
    original = pipeline(program_files("primitives")[0].read_bytes(), backend)
    [(_, copied)] = pipe.process(frame(9, a=77, b=1), 5)
    assert [(5, copied)] == original.process(frame(9, a=77, b=1), 5)
    assert fields(copied)["r1"] == 1                 # e2 was copied from e1: valid
    [(_, kept)] = pipe.process(frame(9, a=77, b=0), 5)
    assert fields(kept)["r1"] == 0 and len(kept) == len(copied) - 4   # e2 (4 bytes) stays out


# --- our programs, compiled by p4c, each emitting one of the constructs ---------------

ETH = bytes.fromhex("020000000002" "020000000001")


def ctl(sel: int, has_b: int, words: bytes) -> bytes:
    return ETH + b"\x88\xb5" + bytes([sel, has_b]) + words


# mux_headers.p4: hdr.copy = (ctl.sel != 0 ? a : b); port 2 if that choice is valid, else 3
MUX_CASES = [
    (ctl(1, 0, b"\xaa\xbb"), [(2, ctl(1, 0, b"\xaa\xbb" + b"\xaa\xbb"))]),      # copy = a
    (ctl(0, 0, b"\xaa\xbb"), [(3, ctl(0, 0, b"\xaa\xbb"))]),          # b invalid: copy too
    (ctl(0, 1, b"\xaa\xbb\xcc\xdd"), [(2, ctl(0, 1, b"\xaa\xbb\xcc\xdd" + b"\xcc\xdd"))]),
    (ctl(1, 1, b"\xaa\xbb\xcc\xdd"), [(2, ctl(1, 1, b"\xaa\xbb\xcc\xdd" + b"\xaa\xbb"))]),
    (ETH + b"\x08\x00" + bytes(20), [(1, ETH + b"\x08\x00" + bytes(20))]),   # no ctl
]


def test_p4c_writes_the_header_mux_of_mux_headers_p4():
    doc = json.loads(program_files("mux_headers")[0].read_text())
    [pick] = [a for a in doc["actions"] if a["name"] == "Ing.pick"]
    source = pick["primitives"][0]["parameters"][1]
    assert pick["primitives"][0]["op"] == "assign_header"
    assert source["value"]["value"]["op"] == "?"                   # twice wrapped
    assert source["value"]["value"]["left"] == {"type": "header", "value": "a"}
    ingress = next(p for p in doc["pipelines"] if p["name"] == "ingress")
    valid = [c["expression"]["value"]["right"]["value"] for c in ingress["conditionals"]]
    assert [v[0]["op"] for v in valid if isinstance(v[0], dict)] == ["?"]   # bare ?:


def test_mux_headers_p4_runs(backend):
    pipe = load("mux_headers", backend)
    assert [pipe.process(data, 1) for data, _ in MUX_CASES] == [out for _, out in MUX_CASES]


REMOVED_MAC = "02:00:00:00:00:02"


def program_removed_table(addr: str, bmv2: bool = False) -> None:
    """Entries in "kept" work; "dead" is refused (softswitch: naming why; BMv2: its
    generic target error, and reading it fails)."""
    conn = connect(addr, "removed_table")
    try:
        conn.insert(conn.table_entry("Ing.kept", "Ing.forward", {"dst": REMOVED_MAC}, {"port": 2}))
        [read] = raw_entries(conn, "Ing.kept")
        assert read.match[0].exact.value.rjust(6, b"\0") == bytes.fromhex("020000000002")
        dead = conn.table_entry("Ing.dead", "Ing.tag", {"src": "02:00:00:00:00:01"},
                                {"t": 0x1234})
        refusal = "Error when adding match entry to target" if bmv2 else "nothing applies it"
        with pytest.raises(P4RuntimeError, match=refusal):
            conn.insert(dead)
        if bmv2:
            with pytest.raises(P4RuntimeError, match="reading table entries"):
                raw_entries(conn, "Ing.dead")
        else:
            assert raw_entries(conn, "Ing.dead") == []
    finally:
        conn.close()


REMOVED_CASES = [(ETH + b"\x88\xb5" + bytes(20), [(2, ETH + b"\x88\xb5" + bytes(20))]),
                 (bytes(6) + ETH[6:] + b"\x88\xb5" + bytes(20),
                  [(3, bytes(6) + ETH[6:] + b"\x88\xb5" + bytes(20))])]


def test_p4c_removed_the_dead_table_of_removed_table_p4():
    json_path, p4info_path = program_files("removed_table")
    doc = json.loads(json_path.read_text())
    info = text_format.Parse(p4info_path.read_text(), p4info_pb2.P4Info())
    assert [t["name"] for p in doc["pipelines"] for t in p["tables"]] == ["Ing.kept"]
    assert sorted(t.preamble.name for t in info.tables) == ["Ing.dead", "Ing.kept"]


def test_removed_table_p4_runs_over_p4runtime(switch):
    program_removed_table(switch.addr)
    assert [switch.send(data, 1) for data, _ in REMOVED_CASES] == [o for _, o in REMOVED_CASES]


def tagged(value: bytes) -> bytes:
    return ETH + b"\x88\xb5" + value


# error_key.p4: by_error matches sm.parser_error; verify(tag != 0xff, error.BadTag)
ERROR_ENTRIES = (("NoError", 3), ("BadTag", 2), ("PacketTooShort", 4))
ERROR_CASES = [(tagged(b"\x05" + bytes(20)), [(3, tagged(b"\x05" + bytes(20)))]),
               (tagged(b"\xff" + bytes(20)), [(2, tagged(b"\xff" + bytes(20)))]),
               (tagged(b""), [(4, tagged(b""))]),            # no tag byte: PacketTooShort
               (ETH + b"\x08\x00" + bytes(20), [(3, ETH + b"\x08\x00" + bytes(20))])]


def program_error_key(addr: str, check_refusal: bool) -> None:
    conn = connect(addr, "error_key")
    try:
        conn.insert([error_entry(conn, "Ing.by_error", name, port) for name, port in ERROR_ENTRIES])
        read = {e.match[0].exact.value: int.from_bytes(e.action.action.params[0].value, "big")
                for e in raw_entries(conn, "Ing.by_error")}
        assert read == {name.encode(): port for name, port in ERROR_ENTRIES}
        if check_refusal:
            with pytest.raises(P4RuntimeError, match="not an error of this program"):
                conn.insert(error_entry(conn, "Ing.by_error", "NoSuchError", 1))
    finally:
        conn.close()


def test_p4c_writes_an_error_match_key_in_error_key_p4():
    json_path, p4info_path = program_files("error_key")
    doc = json.loads(json_path.read_text())
    info = text_format.Parse(p4info_path.read_text(), p4info_pb2.P4Info())
    [[key]] = [t["key"] for p in doc["pipelines"] for t in p["tables"]]
    assert key["target"] == ["standard_metadata", "parser_error"]
    [field] = info.tables[0].match_fields
    assert field.name == "err" and field.bitwidth == 0
    assert ["BadTag", 7] in doc["errors"]


def test_error_key_p4_runs_over_p4runtime(switch):
    connect(switch.addr, "error_key").close()
    assert [switch.send(data, 1) for data, _ in ERROR_CASES] == [[]] * len(ERROR_CASES)
    program_error_key(switch.addr, check_refusal=True)
    assert [switch.send(data, 1) for data, _ in ERROR_CASES] == [o for _, o in ERROR_CASES]


@pytest.mark.skipif(bmv2_path() is None or os.geteuid() != 0,
                    reason="needs simple_switch_grpc and root")
def test_bmv2_gives_the_same_outputs_for_the_three_programs():
    """One BMv2, given each program in turn; its outputs are the ones asserted above.
    BMv2 refuses entries in the removed table too, and entries on the error key (it
    takes P4Info's 0 bits for the width), so there error_key.p4 only drops (its default
    action). BMv2 cannot load mux_headers.json at all (simple_switch aborts with
    Json::LogicError "Type is not convertible to string" on the header ?:): the config
    is refused, so it goes last."""
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess
    from tests.softswitch.test_vs_bmv2 import compare

    def expect(cases):
        return lambda data: dict(cases)[data]

    results = {}
    with Namespaces(4) as topo, SwitchProcess("bmv2", topo.switch_ports) as bmv2:
        conn = connect(bmv2.grpc_addr, "error_key")
        try:
            with pytest.raises(P4RuntimeError, match="does not fit within 0 bits"):
                conn.insert(error_entry(conn, "Ing.by_error", "BadTag", 2))
        finally:
            conn.close()
        results["error"] = compare(topo, [d for d, _ in ERROR_CASES], lambda data: [])
        program_removed_table(bmv2.grpc_addr, bmv2=True)
        results["removed"] = compare(topo, [d for d, _ in REMOVED_CASES], expect(REMOVED_CASES))
        with pytest.raises(P4RuntimeError, match="UNKNOWN|INVALID_ARGUMENT|INTERNAL"):
            connect(bmv2.grpc_addr, "mux_headers")
    for name, (mismatches, forwarded) in results.items():
        assert not mismatches, (name, mismatches[:3])
    assert [f for _, f in results.values()] == [0, 2]
