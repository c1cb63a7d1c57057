"""tools/stf_samples.py, the driver that runs p4c's STF samples: reading STF text,
making entries and comparing frames as p4c's runner (bmv2stf.py) does, and one
sample-like STF of our own (forwarding.p4, committed build) through the real
switches over P4Runtime and veth pairs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from innet_aggregation.testbed.targets import bmv2_path
from tests.softswitch.conftest import program_files

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import stf_samples as stf  # noqa: E402


def test_parse_reads_each_command_and_names_the_ones_it_does_not_run():
    commands = stf.parse_stf("""
# a comment
add ingress.t 7 h.h.a:0x1* h.b:5 ingress.set(p:0x1, q:2) = E1
add t2 k:10.0/8 NoAction()
setdefault t3 act(x:3)
packet 0 0102 0304 0506 0708 090a 0b0c 0d0e   # trailing comment
expect 1 01** 0304 $
expect 2
mc_node_create 7 1 2
mirroring_add 5 3
wait
register_write r 0 1
""")
    kinds = [c.kind for c in commands]
    assert kinds == ["add", "add", "setdefault", "packet", "expect", "expect", "mc_node_create",
                     "mirroring_add", "wait", "unsupported:register_write"]
    add = commands[0].args
    assert (add["table"], add["priority"], add["action"]) == ("ingress.t", 7, "ingress.set")
    assert add["keys"] == [("h.h.a", "0x1*"), ("h.b", "5")]
    assert add["params"] == [("p", "0x1"), ("q", "2")]
    assert commands[1].args["priority"] is None and commands[1].args["params"] == []
    assert commands[3].args == {"port": 0, "data": "0102030405060708090A0B0C0D0E", "exact": False}
    assert commands[4].args == {"port": 1, "data": "01**0304", "exact": True}
    assert commands[5].args["data"] == ""
    assert commands[6].args["numbers"] == [7, 1, 2]


@pytest.mark.parametrize("line", ["packet x 00", "packet 0 0g", "packet 0 0*", "expect 0 123",
                                  "add t k:1 act", "setdefault t", "mirroring_add 1",
                                  "add t k act(p:1)"])
def test_a_malformed_line_is_refused_with_its_number(line):
    with pytest.raises(stf.StfError, match="line 2"):
        stf.parse_stf("wait\n" + line)


def test_ternary_and_lpm_values_as_p4cs_runner_makes_them():
    assert stf.ternary("0x0800", 16) == (0x0800, 0xFFFF)
    assert stf.ternary("0x1", 16) == (0x1, 0xF)             # only the written digit is cared about
    assert stf.ternary("0x1*3", 16) == (0x103, 0xF0F)
    assert stf.ternary("0b1*0", 8) == (0b100, 0b101)
    assert stf.ternary("10", 8) == (10, 0xFF)
    assert stf.ternary("0x1F&&&0x0F", 8) == (0x0F, 0x0F)
    assert stf.lpm("0x0a000000/8") == (0x0A000000, 8)
    assert stf.lpm("0x0a01****") == (0x0A010000, 16)
    assert stf.lpm("0b10**") == (0b1000, 2)
    with pytest.raises(stf.StfError):
        stf.parse_int("12ab")


def test_wildcards_exact_length_and_prefix_as_compare_pkt():
    got = bytes.fromhex("0102030405")
    assert stf.match_packet("0102030405", False, got) is None
    assert stf.match_packet("01**03", False, got) is None           # longer frame: prefix
    assert "too long" in stf.match_packet("01**03", True, got)
    assert "too short" in stf.match_packet("010203040506", False, got)
    assert "byte 1" in stf.match_packet("01FF", False, got)
    assert stf.match_packet("0*0*0*0*0*", True, got) is None
    padded = bytes.fromhex("0102") + bytes(12)            # a 2-byte input sent as 14 bytes
    assert stf.match_packet("0102", True, padded, slack=12) is None
    assert "too long" in stf.match_packet("0102", True, padded, slack=11)
    assert "too long" in stf.match_packet("0102", True, padded[:-1] + b"\1", slack=12)


def test_compare_in_order_per_port_and_every_difference_named():
    want = stf.expectations(stf.parse_stf("expect 1 AA\nexpect 1 BB\nexpect 2 CC\nexpect 3"))
    assert want == {1: [("AA", False), ("BB", False)], 2: [("CC", False)], 3: None}
    a, b, c = b"\xaa", b"\xbb", b"\xcc"
    assert stf.compare(want, {1: [a, b], 2: [c], 3: [a, a, a]}) == []     # port 3: anything
    problems = stf.compare(want, {1: [b, a], 4: [c]})
    assert problems == ["port 1 #0: wrong packet (differs at byte 0): expected AA got BB",
                        "port 1 #1: wrong packet (differs at byte 0): expected BB got AA",
                        "port 2 #0: missing, expected CC",
                        "port 4 #0: extra packet CC"]


def test_refusals_are_sorted_by_construct():
    assert stf.construct_of("header_types[1].fields[1]: expected [name, bitwidth, signed], "
                            "got 2 items") == "varbit fields"
    assert stf.construct_of("pipelines[0].actions[2].primitives[0].op: primitive "
                            "'clone_ingress_pkt_to_egress'") == "clone"
    assert stf.construct_of("header_union_types: header unions (u) are not supported") == \
        "header unions"


def frames():
    """Frames for forwarding.p4 and what it makes of them, a VLAN-tagged one among
    them: (STF text, the same text with one expected byte wrong)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    def ip(src):
        return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:09")
                     / IP(src=src, dst="10.1.2.3", ttl=64) / UDP(sport=1, dport=2) / b"payload")

    def routed(frame):   # MACs rewritten, identification 0 (class 0), TTL - 1, checksum anew
        out = "0200000000CC" + "020000000009" + frame[12:18].hex().upper() + "0000" \
            + frame[20:22].hex().upper() + "3F11" + "****" + frame[26:].hex().upper()
        return out + "$"

    l2_known = "020000000002" "020000000001" "88B5" "00112233"
    l2_unknown = "0200000000FF" "020000000001" "88B5" "44556677"
    # The kernel takes the tag off on the way in; the switch must forward it as sent.
    tagged = "020000000002" "020000000001" "8100" "0064" "88B5" "00112233"
    to_acl, to_route = ip("10.0.0.9"), ip("10.0.0.8")
    text = f"""
add mac_table dst:0x020000000002 Ing.forward(port:2)
mc_mgrp_create 1
mc_node_create 0 1 2 3
mc_node_associate 1 0
add routes dst_addr:0x0a010000/16 route(port:3, next_mac:0x0200000000cc)
add acl 5 src_addr:0x0a000009 protocol:0x11 set_port(port:1)
packet 1 {l2_known}
expect 2 {l2_known}
packet 1 {l2_unknown}
expect 2 {l2_unknown}$
expect 3 {l2_unknown}
packet 2 {to_acl.hex()}
expect 1 {routed(to_acl)}
packet 2 {to_route.hex()}
expect 3 {routed(to_route)}
packet 1 {tagged}
expect 2 {tagged}$
"""
    return text, text.replace(f"expect 2 {l2_known}", f"expect 2 {l2_known[:-2]}34")


root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


def run(target: str, text: str, tmp_path: Path, io_threads: int | None = None) -> stf.Result:
    return stf.run_sample("forwarding", program_files("forwarding"), stf.parse_stf(text),
                          target, tmp_path, io_threads=io_threads)


@root
@pytest.mark.parametrize("target", ["softswitch", "softswitch-python", "bmv2"])
def test_a_sample_of_our_own_passes_on_each_switch(target, tmp_path):
    if target == "bmv2" and bmv2_path() is None:
        pytest.skip("simple_switch_grpc is not installed")
    result = run(target, frames()[0], tmp_path)
    assert (result.outcome, result.detail) == ("pass", "")
    assert not result.native_fallback


@root
@pytest.mark.parametrize("lanes", [1, 2, 4])
def test_a_sample_passes_on_every_lane_count_in_order_per_port(lanes, tmp_path):
    """The lanes share the ports out (4 lanes: one a port); the expected frames are
    compared in order per port (compare_pkt), multicast copies among them. Without the
    routed frame from port 2 to port 3: frames from two ingress ports may be on two
    lanes, and leave a third port in either order (as with RSS); each port's expected
    frames then come from one ingress port, whose order is kept."""
    text = frames()[0]
    routed = [line for line in text.splitlines() if line.startswith(("packet 2", "expect 3 "))
              and "44556677" not in line][1:]
    assert len(routed) == 2
    for line in routed:
        text = text.replace(line + "\n", "")
    result = run("softswitch", text, tmp_path, io_threads=lanes)
    assert (result.outcome, result.detail) == ("pass", "")


@root
def test_a_wrong_packet_fails_and_is_named(tmp_path):
    result = run("softswitch", frames()[1], tmp_path)
    assert result.outcome == "fail"
    assert result.detail.startswith("port 2 #0: wrong packet (differs at byte 17): expected "
                                    "02000000000202000000000188B500112234 got "
                                    "02000000000202000000000188B500112233")
