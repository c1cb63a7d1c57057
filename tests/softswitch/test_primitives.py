"""Each primitive and expression form, run through programs/primitives.p4 compiled by p4c.

The test header carries operands a, b (bit<32>), sa, sb (int<16>); hdr.t.op picks
the action; results come back in r1..r4, sr and the two nibbles.
"""

from __future__ import annotations

import struct

import pytest

from tests.softswitch.conftest import load

M32 = 0xFFFFFFFF
ETH = bytes.fromhex("020000000002" "020000000001")
T = struct.Struct("!BIIhhIIIIhB")


def frame(op, a=0, b=0, sa=0, sb=0, nib=0, payload=b"", ether_type=0x88B5, r2=0):
    return (ETH + struct.pack("!H", ether_type) + T.pack(op, a, b, sa, sb, 0, r2, 0, 0, 0, nib)
            + payload)


def fields(data: bytes) -> dict:
    op, a, b, sa, sb, r1, r2, r3, r4, sr, nib = T.unpack_from(data, 14)
    return dict(op=op, a=a, b=b, sa=sa, sb=sb, r1=r1, r2=r2, r3=r3, r4=r4, sr=sr,
                nib_hi=nib >> 4, nib_lo=nib & 0xF)


@pytest.fixture(scope="module")
def pipe(backend):
    return load("primitives", backend)


def run(pipe, data: bytes, port: int = 5) -> dict:
    out = pipe.process(data, port)
    assert [p for p, _ in out] == [port], out
    return fields(out[0][1])


def s32(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


@pytest.mark.parametrize("a,b", [(0xFFFFFFF0, 0x20), (3, 5), (0x12345678, 0x9ABCDEF0)])
def test_arithmetic_wraps_at_the_field_width(pipe, a, b):
    r = run(pipe, frame(1, a, b))
    assert r["r1"] == (a + b) & M32
    assert r["r2"] == (a - b) & M32
    assert r["r3"] == (a * b) & M32
    assert r["r4"] == ((a << 4) | (b >> 28)) & M32


@pytest.mark.parametrize("a,b,sa,sb", [(0xFFFFFFF0, 0x20, 30000, 10000),
                                       (5, 9, -30000, 10000),
                                       (100, 1, -5, 7)])
def test_saturating_add_and_sub(pipe, a, b, sa, sb):
    r = run(pipe, frame(2, a, b, sa, sb))
    assert r["r1"] == min(a + b, M32)
    assert r["r2"] == max(a - b, 0)
    assert r["sr"] == max(min(sa + sb, 32767), -32768)
    assert r["r3"] == max(min(sa - sb, 32767), -32768) & M32


@pytest.mark.parametrize("a,b,sa,sb", [(0x7FFFFFF0, 0x20, 30000, 10000),
                                       (0x80000000, 0xFFFFFFFF, -5, 7),
                                       (1, 2, -32768, -1)])
def test_signed_arithmetic(pipe, a, b, sa, sb):
    r = run(pipe, frame(3, a, b, sa, sb))
    wrapped = (sa + sb + 0x8000) % 0x10000 - 0x8000
    assert r["sr"] == wrapped
    assert r["r1"] == sa & M32                      # sign extension
    assert r["r2"] == (1 if sa < sb else 0)         # signed comparison
    assert r["r3"] == (sa >> 2) & M32               # arithmetic shift
    assert r["r4"] == max(min(s32(a) + s32(b), 2**31 - 1), -2**31) & M32


@pytest.mark.parametrize("a,b,nib", [(0x12345678, 0x9ABCDEF0, 0x5C), (0xFFFFFFFF, 0, 0xF1)])
def test_slices_concat_and_bitwise(pipe, a, b, nib):
    r = run(pipe, frame(4, a, b, nib=nib))
    assert r["r1"] == ((a & 0xFFFF) << 16) | (b >> 16)
    assert r["r2"] == (a >> 4) & 0xF
    assert r["r3"] == ~a & M32
    assert r["r4"] == ((a ^ b) & 0xFF00FF00) | 1
    assert r["nib_hi"] == nib & 0xF                 # assigned from the old low nibble
    assert r["nib_lo"] == ((a & 0xF) + 15) & 0xF    # 4-bit wrap-around


@pytest.mark.parametrize("a,b", [(9, 3), (5, 3), (1, 7), (1, 2)])
def test_boolean_logic_and_conditional_expression(pipe, a, b):
    r = run(pipe, frame(5, a, b))
    x = (a > b and a != 5) or b == 7
    assert r["r1"] == (1 if x else 2)
    assert r["r2"] == (a if a != b else b)
    assert r["r3"] == 0 and r["r4"] == 0


def test_registers_read_modify_write_and_out_of_range_read(pipe):
    first = run(pipe, frame(6, a=5, b=3))
    second = run(pipe, frame(6, a=7, b=3, r2=0x1234))
    assert (first["r1"], second["r1"]) == (5, 12)
    # reg.read(r2, 1000) is out of range: r2 keeps the packet's value (p4c removed the
    # r2 = 0xABCD before it as a dead store).
    assert second["r2"] == 0x1234
    assert pipe.registers["Ing.reg"].cells[3] == 12
    run(pipe, frame(6, a=1, b=99))                  # out-of-range write: ignored
    assert sum(pipe.registers["Ing.reg"].cells) == 12


def test_counters_count_packets_and_ingress_bytes(pipe):
    data = frame(7, b=2, payload=b"x" * 30)
    run(pipe, data)
    run(pipe, data)
    ctr = pipe.counters["Ing.ctr"]
    assert ctr.packets[2] == 2 and ctr.bytes[2] == 2 * len(data)
    run(pipe, frame(7, b=100))                      # out of range: nothing counted
    assert sum(ctr.packets) == 2


def test_random_stays_in_its_range(pipe):
    draws = [run(pipe, frame(8))["r1"] for _ in range(200)]
    assert set(draws) <= set(range(10, 21)) and len(set(draws)) > 5


def test_set_valid_and_header_assignment_append_headers(pipe):
    data = frame(9, a=0xCAFEF00D, payload=b"tail")
    out = pipe.process(data, 2)
    assert len(out) == 1
    sent = out[0][1]
    assert len(sent) == len(data) + 8
    assert fields(sent)["r1"] == 1
    assert sent[14 + T.size:14 + T.size + 8] == struct.pack("!II", 0xCAFEF00D, 0xCAFEF00D)
    assert sent.endswith(b"tail")


def test_set_invalid_removes_a_parsed_header(pipe):
    data = frame(13, a=0x01, payload=struct.pack("!I", 0x11223344) + b"rest")
    out = pipe.process(data, 1)
    sent = out[0][1]
    assert fields(sent)["r1"] == 13
    assert sent == data[:14 + 13] + struct.pack("!I", 13) + data[14 + 17:14 + T.size] + b"rest"


def test_masked_select_cases(pipe):
    # (op 0xF0 &&& 0xF0, a[7:0] 0x02 &&& 0x0F) goes through parse_e1_tagged.
    data = frame(0xF3, a=0x52, payload=b"\0\0\0\1")
    assert run(pipe, data)["r4"] == 0x7A6
    assert run(pipe, frame(0xF3, a=0x53, payload=b"\0\0\0\1"))["r4"] == 0
    for ether_type, expected in ((0x8812, 0xBEEF), (0x88FF, 0xBEEF), (0x8912, 0x8912)):
        out = pipe.process(ETH + struct.pack("!H", ether_type) + b"data", 1)
        assert out[0][1][12:14] == struct.pack("!H", expected)


def test_lookahead_select(pipe):
    for first, expected in ((b"\x42", 0xBEEF), (b"\x43", 0x88B6)):
        data = ETH + b"\x88\xb6" + first + b"rest"
        out = pipe.process(data, 1)
        assert out == [(1, data[:12] + struct.pack("!H", expected) + data[14:])]
    # Looking past the end of the packet is PacketTooShort.
    assert pipe.process(ETH + b"\x88\xb6", 1) == [(3, ETH + b"\xde\xad")]


def test_mark_to_drop_and_drop_port(pipe):
    assert pipe.process(frame(10), 1) == []
    assert pipe.process(frame(14), 1) == []


def test_exit_leaves_the_control(pipe):
    assert run(pipe, frame(11))["r1"] == 1


def test_multicast_replicas_carry_port_and_rid(pipe):
    pipe.groups[5] = [(1, 0), (2, 7), (3, 9)]
    out = pipe.process(frame(12, a=5), 4)
    assert [p for p, _ in out] == [1, 2]            # rid 9 is dropped in egress
    for port, data in out:
        r = fields(data)
        assert (r["r3"], r["r2"]) == (port, 5)      # egress_port, instance_type REPLICATION
    assert [fields(d)["r4"] for _, d in out] == [0, 7]
    assert pipe.process(frame(12, a=6), 4) == []    # an empty group sends nothing


def test_packet_too_short_reaches_ingress_with_the_header_invalid(pipe):
    data = frame(1)[:14 + 10]
    out = pipe.process(data, 1)
    assert [p for p, _ in out] == [3]
    assert out[0][1] == data[:12] + b"\xde\xad" + data[14:]


def test_frame_shorter_than_ethernet_is_sent_unparsed(pipe):
    out = pipe.process(b"\x01" * 10, 1)
    assert out == [(3, b"\x01" * 10)]


def test_verify_sets_the_program_error(pipe):
    data = frame(0xEE)
    assert pipe.process(data, 1) == [(4, data)]


def test_other_frames_pass_unchanged(pipe):
    data = ETH + b"\x08\x00" + bytes(range(40))
    assert pipe.process(data, 7) == [(7, data)]


@pytest.mark.parametrize("a,b,expected", [(11, 0, (1, 0, 0)), (11, 1, (1, 2, 4)),
                                          (10, 0, (3, 0, 4))])
def test_if_and_return_inside_an_action(pipe, a, b, expected):
    r = run(pipe, frame(15, a, b))
    assert (r["r1"], r["r2"], r["r3"]) == expected


def test_register_index_copied_to_a_temporary_field(pipe):
    r = run(pipe, frame(16, a=77, sa=0x0105, r2=9))          # index 5: in range
    assert r["r2"] == 77 and pipe.registers["Ing.reg"].cells[5] == 77
    before = list(pipe.registers["Ing.reg"].cells)
    r = run(pipe, frame(16, a=55, sa=0x00C8, r2=9))          # index 200: skipped
    assert r["r2"] == 9 and pipe.registers["Ing.reg"].cells == before


def test_drop_port_option(backend):
    """--drop-port moves what mark_to_drop sets and what drops; 511 becomes a port."""
    pipe = load("primitives", backend, drop_port=7)
    assert pipe.process(frame(10), 1) == []                  # mark_to_drop
    assert [p for p, _ in pipe.process(frame(14), 1)] == [511]
    assert pipe.process(frame(1), 7) == []                   # reflected to port 7: dropped
