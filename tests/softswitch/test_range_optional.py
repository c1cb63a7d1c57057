"""Range and optional match kinds (programs/range_optional.p4): entries written over
P4Runtime with priorities (a range with its bounds inclusive, an optional present or
left out as a wildcard, beside ternary and exact keys), overlapping const range
entries, read back as written; log_msg in the parser, an action and a control does
nothing. Both backends give the same frames, and BMv2's where it is installed."""

from __future__ import annotations

import json
import os
import random

import pytest
from finsy import P4TableEntry
from finsy.proto import p4i as p4info_pb2
from google.protobuf import text_format

from innet_aggregation.switch_ctl.client import P4RuntimeError
from innet_aggregation.testbed.targets import bmv2_path
from tests.softswitch.conftest import connect, program_files

CLASSIFY = [  # priority, match, action, params
    (100, {"hdr.l4.dport": "100...199", "hdr.l4.proto": 17,
           "hdr.ethernet.dst[7:0]": "0x10/&0xf0"}, "route", {"port": 1, "tag": 0x11}),
    (50, {"hdr.l4.dport": "150...300"}, "route", {"port": 2, "tag": 0x22}),
    (40, {"hdr.l4.proto": 6}, "to_drop", {}),
    (30, {"hdr.l4.dport": "0...0x10", "hdr.ethernet.dst[7:0]": "0x01/&0x01"},
     "route", {"port": 1, "tag": 0x33}),
]
BY_LEN = [(10, "64...64", 0x40), (20, "100...0xffff", 0x41), (5, "0...10", 0x42)]
BY_PROTO = [(10, 17, 1, 0x50), (5, None, 1, 0x51), (1, 6, 2, 0x52)]


def program(addr: str, keep: bool = False):
    """The same P4Runtime writes for both switches; the session, if ``keep``."""
    conn = connect(addr, "range_optional")
    try:
        for prio, match, action, params in CLASSIFY:
            conn.insert(conn.table_entry("Ing.classify", f"Ing.{action}", match, params,
                                         priority=prio))
        for prio, lens, m in BY_LEN:
            conn.insert(conn.table_entry("Ing.by_len", "Ing.mark", {"hdr.l4.len": lens},
                                         {"m": m}, priority=prio))
        for prio, proto, src, m in BY_PROTO:
            match = {"hdr.ethernet.src[7:0]": src} | ({"hdr.l4.proto": proto} if proto else {})
            conn.insert(conn.table_entry("Ing.by_proto", "Ing.mark", match, {"m": m},
                                         priority=prio))
    except BaseException:
        conn.close()
        raise
    if not keep:
        conn.close()
    return conn


def frame(dport: int, proto: int, dst: int, length: int, src: int) -> bytes:
    return (bytes(5) + bytes([dst]) + bytes(5) + bytes([src]) + b"\x88\xb5"
            + bytes([proto, 0]) + length.to_bytes(2, "big") + dport.to_bytes(2, "big")
            + b"\x00payload")


def frames() -> list[bytes]:
    rng = random.Random(24)
    dports = (0, 0x10, 0x11, 0x20, 0x2f, 0x30, 0x40, 0x41, 99, 100, 150, 199, 200, 300, 301,
              0xffff)
    out = [frame(d, rng.choice((6, 17, 1)), rng.choice((0x10, 0x11, 0x21)),
                 rng.choice((0, 10, 11, 64, 65, 100, 0xffff)), rng.choice((1, 2)))
           for d in dports for _ in range(3)]
    out += [frame(150, 17, 0x10, 11, 1), frame(150, 6, 0x21, 65, 2), frame(5, 1, 0x11, 63, 1)]
    return out + [bytes(14) + b"not l4"]


def test_ranges_and_optionals_pick_by_priority_on_both_backends(switch):
    program(switch.addr)
    send = lambda f: switch.send(f, 1)
    # dport 150, proto 17, dst 0x10: both classify entries match, priority 100 wins.
    (port, out), = send(frame(150, 17, 0x10, 11, 1))
    assert port == 1 and out[15] == 0x11
    # by_len misses (11), by_proto: proto 17 and src 1 (priority 10) beats the wildcard.
    assert out[20] == 0x50
    # proto 1 and src 1: only the entry without the optional matches.
    assert send(frame(5, 1, 0x11, 63, 1))[0][1][20] == 0x51
    # Range edges: 199 in, 200 still in the second, 301 out of both; 64 is its own range.
    assert send(frame(199, 1, 0x21, 64, 2))[0][1][15] == 0x22
    assert send(frame(199, 1, 0x21, 64, 2))[0][1][20] == 0x40
    assert send(frame(300, 1, 0x20, 65, 2))[0][1][15] == 0x22
    (port, out), = send(frame(301, 1, 0x20, 65, 2))
    assert port == 4 and out[15] == 0xee                    # the default action
    assert send(frame(150, 6, 0x21, 65, 2))[0][0] == 2      # priority 50 over 40 (drop)
    assert send(frame(10, 6, 0x21, 65, 2)) == []            # proto 6 alone: dropped
    # Const entries: the first of two overlapping ranges wins, a one-value range.
    assert [send(frame(d, 1, 0x20, 65, 2))[0][1][10] for d in (0x27, 0x28, 0x30, 0x40, 0x41)] \
        == [1, 1, 2, 2, 0xff]


def test_entries_read_back_as_written_and_bad_ranges_are_refused(switch):
    conn = program(switch.addr, keep=True)
    try:
        read = {e.priority for e in conn.read(P4TableEntry("Ing.classify"))}
        assert read == {prio for prio, *_ in CLASSIFY}
        raw = {e.table_entry.priority: {fm.field_id: fm.WhichOneof("field_match_type")
                                        for fm in e.table_entry.match}
               for e in conn.read_raw(P4TableEntry("Ing.classify"))}
        assert raw[100] == {1: "range", 2: "optional", 3: "ternary"}
        assert raw[50] == {1: "range"} and raw[40] == {2: "optional"}
        ranges = {e.table_entry.priority: [(fm.range.low, fm.range.high)
                                           for fm in e.table_entry.match]
                  for e in conn.read_raw(P4TableEntry("Ing.by_len"))}
        assert ranges == {10: [(b"\x00\x40", b"\x00\x40")], 20: [(b"\x00\x64", b"\xff\xff")],
                          5: [(b"\x00\x00", b"\x00\x0a")]}
        for match, prio, why in (({"hdr.l4.len": "9...3"}, 1, "above high"),
                                 ({"hdr.l4.len": "1...3"}, 0, "priority > 0")):
            with pytest.raises(P4RuntimeError, match=why):
                conn.insert(conn.table_entry("Ing.by_len", "Ing.mark", match, {"m": 1},
                                             priority=prio))
        # The full range is the wildcard (as PI has it): the same entry as the field left
        # out, read back without it.
        conn.insert(conn.table_entry("Ing.by_len", "Ing.mark", {"hdr.l4.len": "0...0xffff"},
                                     {"m": 0x43}, priority=1))
        with pytest.raises(P4RuntimeError, match="ALREADY_EXISTS"):
            conn.insert(conn.table_entry("Ing.by_len", "Ing.mark", {}, {"m": 0x44}, priority=1))
        wildcard, = [e.table_entry for e in conn.read_raw(P4TableEntry("Ing.by_len"))
                     if e.table_entry.priority == 1]
        assert not wildcard.match
        assert switch.send(frame(0, 1, 0x21, 50, 2), 1)[0][1][20] == 0x43
        conn.delete(conn.table_entry("Ing.by_len", "Ing.mark", {}, {"m": 0x43}, priority=1))
        # Deleted by its bounds and priority: the frame then misses.
        conn.delete(conn.table_entry("Ing.by_len", "Ing.mark", {"hdr.l4.len": "64...64"},
                                     {"m": 0x40}, priority=10))
        assert switch.send(frame(0, 1, 0x21, 64, 2), 1)[0][1][20] == 0
    finally:
        conn.close()


@pytest.mark.parametrize("swap", ["p4info", "json"])
def test_a_range_key_must_be_a_range_in_both_the_p4info_and_the_json(switch, tmp_path, swap):
    """A range entry keeps its bounds where other kinds keep value and mask, so a
    field that is a range on one side only would be matched wrongly: refused."""
    json_path, p4info_path = program_files("range_optional")
    info = text_format.Parse(p4info_path.read_text(), p4info_pb2.P4Info())
    doc = json.loads(json_path.read_text())
    if swap == "p4info":
        table = next(t for t in info.tables if t.preamble.name == "Ing.by_len")
        table.match_fields[0].match_type = p4info_pb2.MatchField.TERNARY
    else:
        table = next(t for t in doc["pipelines"][0]["tables"] if t["name"] == "Ing.by_proto")
        table["match_type"], table["key"][0]["match_type"] = "range", "range"
    (tmp_path / "p.json").write_text(json.dumps(doc))
    (tmp_path / "p.p4info.txtpb").write_text(text_format.MessageToString(info))
    conn = connect(switch.addr)
    try:
        with pytest.raises(P4RuntimeError, match=r"is (TERNARY|OPTIONAL) in the P4Info, "
                                                 r"range in the JSON|is RANGE in the P4Info"):
            conn.push_pipeline(tmp_path / "p.json", tmp_path / "p.p4info.txtpb")
    finally:
        conn.close()


def test_p4c_writes_log_msg_in_the_parser_and_in_actions():
    doc = json.loads(program_files("range_optional")[0].read_text())
    in_parser = [op["parameters"][0]["op"] for state in doc["parsers"][0]["parse_states"]
                 for op in state["parser_ops"] if op["op"] == "primitive"]
    in_actions = [p["op"] for a in doc["actions"] for p in a["primitives"]]
    assert in_parser == ["log_msg"]
    assert in_actions.count("log_msg") == 3          # mark (p4c copies it per table), apply


@pytest.mark.skipif(bmv2_path() is None or os.geteuid() != 0,
                    reason="needs simple_switch_grpc and root")
def test_bmv2_agrees_frame_by_frame(switch):
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess
    from tests.softswitch.test_vs_bmv2 import compare

    program(switch.addr)
    with Namespaces(4) as topo, SwitchProcess("bmv2", topo.switch_ports) as bmv2:
        program(bmv2.grpc_addr)
        mismatches, forwarded = compare(topo, frames(), lambda data: switch.send(data, 1))
    assert not mismatches, mismatches[:3]
    assert forwarded > len(frames()) // 2
