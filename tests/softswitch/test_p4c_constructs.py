"""Valid p4c output that was refused for the wrong reason, made to run (issue #9).

Each construct is put into the real p4c output of our test programs the way p4c
writes it, and the result must run on both backends:
- a ?: between headers where the loader expected a header name, which crashed it
  with "unhashable type: 'dict'" (gauntlet_mux_validity-bmv2): as the source of a
  header assignment (what predication makes of ``if (c) { h = x; }``), and under
  ``isValid()``, which p4c writes as the field [<expression object>, "$valid$"];
- a P4Info table missing from the JSON because p4c removed the code that applied
  it, e.g. a ``switch`` behind a ``return`` (gauntlet_nested_switch-bmv2);
- a match field of type ``error``: 0 bits (a string) in the P4Info, 32 in the JSON
  (issue1062-1-bmv2).
"""

from __future__ import annotations

import json

import p4runtime_sh.shell as sh
import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4runtime_sh.p4runtime import P4RuntimeWriteException

from softswitch.frontend import Unsupported
from tests.softswitch.conftest import pipeline, program_files
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


def push(switch, doc: dict, info: p4info_pb2.P4Info, tmp_path) -> None:
    json_path, p4info_path = tmp_path / "prog.json", tmp_path / "prog.p4info.txtpb"
    json_path.write_text(json.dumps(doc))
    p4info_path.write_text(text_format.MessageToString(info))
    sh.setup(device_id=0, grpc_addr=switch.addr, election_id=(0, 1),
             config=sh.FwdPipeConfig(str(p4info_path), str(json_path)), verbose=False)


def test_a_p4info_table_p4c_removed_from_the_json_is_accepted(switch, tmp_path):
    doc, info = forwarding()
    gone = info.tables.add()
    gone.CopyFrom(next(t for t in info.tables if t.preamble.name == "Ing.mac_table"))
    gone.preamble.id, gone.preamble.name, gone.preamble.alias = 33554000, "Ing.gone", "gone"
    push(switch, doc, info, tmp_path)
    try:
        te = sh.TableEntry("Ing.gone")(action="Ing.forward")
        te.match["dst"] = MAC1
        te.action["port"] = "2"
        with pytest.raises(P4RuntimeWriteException, match="nothing applies it"):
            te.insert()
        assert list(sh.TableEntry("Ing.gone").read()) == []
        te = sh.TableEntry("Ing.mac_table")(action="Ing.forward")
        te.match["dst"] = MAC1
        te.action["port"] = "2"
        te.insert()
    finally:
        sh.teardown()
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
    push(switch, doc, info, tmp_path)
    try:
        te = sh.TableEntry("Ing.mac_table")(action="Ing.forward")
        te.match["err"] = "PacketTooShort"
        te.action["port"] = "4"
        te.insert()
        bad = sh.TableEntry("Ing.mac_table")(action="Ing.forward")
        bad.match["err"] = "NoSuchError"
        bad.action["port"] = "4"
        with pytest.raises(P4RuntimeWriteException, match="not an error of this program"):
            bad.insert()
        [read] = list(sh.TableEntry("Ing.mac_table").read())
        assert read.match["err"].exact.value == b"PacketTooShort"
    finally:
        sh.teardown()
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
