"""The Python view of the packet format agrees with the compiled program."""

from __future__ import annotations

import json

import numpy as np
import pytest

from innet_aggregation.p4src import protocol


@pytest.fixture(scope="module")
def program():
    return json.loads(protocol.PROGRAM_JSON.read_text())


@pytest.mark.parametrize("build, values", [(protocol.BUILD_DIR, 256),
                                           (protocol.SMALL_BUILD_DIR, None),
                                           (protocol.JUMBO_BUILD_DIR, 1024)])
def test_packet_format_matches_the_p4_definitions(build, values):
    """The software builds have the sizes make p4 asks for; the small one size.p4's own
    (Tofino's)."""
    fmt = protocol.PacketFormat.load(build / f"{protocol.PROGRAM_NAME}.json")
    sizes = protocol.parse_defines((protocol.P4SRC_DIR / "shared/size.p4").read_text())
    defines = json.loads((build / f"{protocol.PROGRAM_NAME}.manifest.json").read_text())["defines"]
    assert defines == [f"VALUES_PER_PACKET={values or sizes['VALUES_PER_PACKET']}"]
    assert fmt.values_per_packet == (values or sizes["VALUES_PER_PACKET"])
    assert fmt.pool_size == sizes["POOL_SIZE"]
    assert fmt.header_bytes == 14
    assert fmt.payload_bytes == 14 + 4 * fmt.values_per_packet
    assert fmt.header_dtype.itemsize == fmt.header_bytes


def test_counters_have_one_cell_per_outcome(program):
    sizes = {c["name"]: c["size"] for c in program["counter_arrays"]}
    assert sizes["AggIngress.ingress_outcomes"] == len(protocol.IngressOutcome)
    assert sizes["AggEgress.egress_outcomes"] == len(protocol.EgressOutcome)


def test_every_value_has_its_register(program):
    fmt = protocol.packet_format()
    names = {r["name"] for r in program["register_arrays"]}
    for i in range(fmt.values_per_packet):
        assert f"AggIngress.value_aggregator.value_{i}" in names


def test_pack_unpack_round_trip():
    fmt = protocol.packet_format()
    rng = np.random.default_rng(0)
    n = 50
    values = rng.integers(-2**31, 2**31, size=(n, fmt.values_per_packet)).astype(np.int32)
    fields = {"msg_type": 1, "job_id": rng.integers(0, 256, n), "set": rng.integers(0, 2, n),
              "slot": rng.integers(0, 2**15, n), "pkt_id": rng.integers(0, 2**32, n),
              "exponent": rng.integers(-128, 128, n), "contributions": rng.integers(0, 33, n),
              "fingerprint": rng.integers(0, 2**32, n)}
    packets = fmt.decode(fmt.pack(values, **fields).tobytes())
    got = fmt.unpack(packets)
    for name, want in fields.items():
        np.testing.assert_array_equal(got[name], np.broadcast_to(want, n))
    np.testing.assert_array_equal(packets["values"], values)


def test_wire_layout_is_big_endian_with_set_in_the_top_bit():
    fmt = protocol.packet_format()
    wire = fmt.pack(np.zeros((1, fmt.values_per_packet), dtype=np.int32), msg_type=2, job_id=3,
                    set=1, slot=5, pkt_id=0x01020304, exponent=-2, contributions=4,
                    fingerprint=0xA1B2C3D4).tobytes()
    assert wire[:14] == bytes([2, 3, 0x80, 5, 1, 2, 3, 4, 0xFE, 4, 0xA1, 0xB2, 0xC3, 0xD4])


def test_a_waiting_reply_decodes_as_a_header_alone():
    fmt = protocol.packet_format()
    wire = fmt.pack(count=1, msg_type=int(protocol.MsgType.WAITING), slot=9, pkt_id=7,
                    fingerprint=0b1011).tobytes()[:fmt.header_bytes]
    got = fmt.unpack(fmt.decode(wire))
    assert (got["msg_type"][0], got["slot"][0], got["pkt_id"][0], got["fingerprint"][0]) == (
        protocol.MsgType.WAITING, 9, 7, 0b1011)


def test_bad_sizes_are_refused():
    fmt = protocol.packet_format()
    with pytest.raises(ValueError):
        fmt.pack(np.zeros((1, 3), dtype=np.int32))
    with pytest.raises(ValueError):
        fmt.decode(b"\x00" * (fmt.payload_bytes + 1))
    with pytest.raises(ValueError):
        fmt.pack(np.zeros((1, fmt.values_per_packet), dtype=np.int32), bogus=1)


def test_pack_without_values_gives_zeros_and_headers():
    fmt = protocol.packet_format()
    packets = fmt.pack(count=3, msg_type=1, slot=[1, 2, 3])
    assert (packets["values"] == 0).all()
    np.testing.assert_array_equal(fmt.unpack(packets)["slot"], [1, 2, 3])
    with pytest.raises(ValueError):
        fmt.pack(msg_type=1)


def test_finding_a_build_by_size_parses_only_that_build(monkeypatch):
    """A rank joining with 64 values a packet must not parse the 6.6 MB 1,024-value build
    (a join took 0.3 s that way): sizes come from the manifests, one JSON is loaded."""
    monkeypatch.setattr(protocol, "_programs", {})
    small = protocol.program(64)
    assert small.format.values_per_packet == 64
    parsed = [b.json for b in protocol.builds() if "format" in vars(b)]
    assert parsed == [small.json]


def test_a_manifest_that_names_another_size_is_refused(tmp_path, monkeypatch):
    build = tmp_path / "k64"
    build.mkdir()
    for name in ("aggregation.json", "aggregation.p4info.txtpb"):
        (build / name).write_bytes((protocol.SMALL_PROGRAM_JSON.parent / name).read_bytes())
    manifest = json.loads(protocol.SMALL_PROGRAM_JSON.with_name("aggregation.manifest.json").read_text())
    manifest["defines"] = ["VALUES_PER_PACKET=32"]
    (build / "aggregation.manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(protocol, "_programs", {})
    monkeypatch.setattr(protocol, "SMALL_PROGRAM_JSON", build / "aggregation.json")
    with pytest.raises(ValueError, match="carries 64 values per packet, its manifest says 32"):
        protocol.program(32)
