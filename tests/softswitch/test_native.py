"""What only the native backend has: fallback, the compiler cache, name safety."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends.native import printer as emit_c
from innet_aggregation.softswitch.backends import load_pipeline
from innet_aggregation.softswitch.backends.native.loader import NativePipeline
from innet_aggregation.softswitch.backends.python.pipeline import Pipeline
from innet_aggregation.softswitch.backends.tables import Entry
from tests.softswitch.conftest import connect, free_port, program_files
from tests.softswitch.test_cli_and_veth import REPO
from tests.softswitch.test_primitives import fields, frame


def forwarding_doc() -> dict:
    return json.loads(program_files("forwarding")[0].read_bytes())


def with_wide_field(doc: dict) -> bytes:
    """The program plus a 72-bit metadata field nothing uses: Python runs it, C cannot."""
    doc["header_types"].append({"name": "wide_t", "id": 99, "fields": [["big", 72, False]]})
    doc["headers"].append({"name": "wide", "id": 99, "header_type": "wide_t", "metadata": True,
                           "pi_omit": True})
    return json.dumps(doc).encode()


def test_a_refused_construct_runs_on_python_with_one_line_naming_it(caplog):
    text = with_wide_field(forwarding_doc())
    with pytest.raises(emit_c.NativeUnsupported, match="wide.big is 72 bits"):
        NativePipeline(text)
    with caplog.at_level(logging.WARNING, logger="softswitch"):
        pipe = load_pipeline(text, backend="native")
    assert isinstance(pipe, Pipeline)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "wide.big is 72 bits" in lines[0] and "Python backend" in lines[0]
    mac = bytes.fromhex("020000000009")
    forward = next(a.id for a in pipe.actions.values() if a.name == "Ing.forward")
    pipe.tables["Ing.mac_table"].insert(
        Entry((int.from_bytes(mac, "big"),), ((1 << 48) - 1,), 0, (forward, (3,))))
    data = mac + bytes(6) + b"\x88\xb5" + bytes(40)
    assert pipe.process(data, 1) == [(3, data)]


def test_a_select_key_over_64_bits_runs_on_python():
    doc = forwarding_doc()
    start = doc["parsers"][0]["parse_states"][0]
    start["transition_key"] = [{"type": "field", "value": ["ethernet", name]}
                               for name in ("dst", "src")]
    start["transitions"][0]["value"] = "0x020000000009020000000001"     # 96 bits
    text = json.dumps(doc).encode()
    with pytest.raises(emit_c.NativeUnsupported, match="a select key of more than 64 bits"):
        NativePipeline(text)
    assert isinstance(load_pipeline(text, backend="native"), Pipeline)


def test_no_compiler_means_python_backend_and_one_log_line(tmp_path):
    json_path, _ = program_files("primitives")
    env = dict(os.environ, PYTHONPATH=str(REPO), CC="no-such-cc-here",
               XDG_CACHE_HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "innet_aggregation.softswitch", str(json_path), "--",
                             "--grpc-server-addr", f"127.0.0.1:{free_port()}"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "P4Runtime on" in line or not line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=60)   # a loaded CI machine; what is checked is the log line
    fallback = [line for line in lines if "Python backend" in line]
    assert len(fallback) == 1, lines
    assert "no C compiler" in fallback[0] and "no-such-cc-here" in fallback[0]
    assert not list(tmp_path.rglob("*.so"))


def test_the_shared_object_is_cached_per_program(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    text = program_files("forwarding")[0].read_bytes()
    first = NativePipeline(text)
    built = first.so_path.stat().st_mtime_ns
    start = time.monotonic()
    again = NativePipeline(text)
    assert again.so_path == first.so_path and again.so_path.stat().st_mtime_ns == built
    assert time.monotonic() - start < 1.0          # no compiler run
    other = NativePipeline(text, drop_port=7)      # the drop port is compiled in
    assert other.so_path != first.so_path
    assert sorted(p.name for p in (tmp_path / "innet-softswitch").iterdir()) == sorted(
        {first.so_path.name, other.so_path.name})


def test_names_from_the_json_never_reach_the_c_source():
    evil = 'x"; } int system(const char*); void f() { system("touch /tmp/pwned"); /*\n#error'
    doc = json.loads(program_files("primitives")[0].read_bytes())
    renamed = json.loads(json.dumps(doc))
    rename(renamed, "e1", "e1" + evil)
    with pytest.raises(ValueError, match=r"^headers\[\d+\]\.name: expected a name"):
        frontend.load(json.dumps(renamed))
    marker = "Zq_marker$.[0]"            # every character a name may have
    for kind in ("headers", "actions", "register_arrays", "counter_arrays"):
        for item in doc[kind]:
            if kind != "headers" or item["name"] not in ("scalars", "standard_metadata"):
                rename(doc, item["name"], item["name"] + marker)
    text = json.dumps(doc).encode()
    source = emit_c.emit(frontend.load(text), "/runtime.c")
    assert "Zq_marker" not in source
    pipe = NativePipeline(text)
    out = pipe.process(frame(1, a=40, b=2), 5)
    assert [p for p, _ in out] == [5] and fields(out[0][1])["r1"] == 42


def rename(node, old: str, new: str):
    """Every string equal to ``old`` (a name and its references, keys of next_tables
    too) becomes ``new``."""
    if isinstance(node, dict):
        if old in node:
            node[new] = node.pop(old)
        for key, value in node.items():
            if value == old:
                node[key] = new
            else:
                rename(value, old, new)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if value == old:
                node[i] = new
            else:
                rename(value, old, new)


@pytest.mark.parametrize("size", [0, 1, 13, 14, 15, 60, 16384])
def test_frames_of_any_size_never_crash_the_native_pipeline(size):
    pipe = NativePipeline(program_files("primitives")[0].read_bytes())
    data = (bytes.fromhex("020000000002" "020000000001" "88b5") + bytes(range(256)) * 100)[:size]
    for port in (0, 1, 511):
        for eport, out in pipe.process(data, port):
            assert isinstance(eport, int) and isinstance(out, bytes)


# The largest frame the native backend takes (a receive slot); larger ones are dropped
# before ingress, whole, never cut short.
SLOT = int(re.search(r"#define SS_SLOT (\d+)",
                     (REPO / "innet_aggregation/softswitch/backends/native/runtime.c").read_text()).group(1))


@pytest.mark.parametrize("size", [SLOT + 1, SLOT + 1500, 20000])
def test_a_frame_larger_than_a_slot_is_dropped_before_ingress(size):
    """Through the aggregation program, which floods an unknown destination: a frame
    of a slot's size floods and counts as forwarded; a larger one leaves nothing and
    is counted nowhere (the receive loop counts it as dropped)."""
    pipe = NativePipeline(protocol.PROGRAM_JSON.read_bytes())
    pipe.groups[protocol.FLOOD_MCAST_GROUP] = [(1, 0), (2, 1), (3, 2)]
    data = bytes.fromhex("020000000002" "020000000001" "88b5") + bytes(range(256)) * 100

    def sent(frame: bytes) -> tuple[list, list[int], list[int]]:
        out = pipe.process(frame, 1)
        return (out, list(pipe.counters["AggIngress.ingress_outcomes"].packets),
                list(pipe.counters["AggEgress.egress_outcomes"].packets))

    out, ingress, egress = sent(data[:SLOT])
    assert sorted(out) == [(2, data[:SLOT]), (3, data[:SLOT])]
    forwarded = [0] * len(protocol.IngressOutcome)
    forwarded[protocol.IngressOutcome.FORWARDED_L2] = 1
    assert (ingress, egress) == (forwarded, [0] * len(protocol.EgressOutcome))
    assert sent(data[:size]) == ([], ingress, egress)


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
def test_the_native_switch_survives_garbage_on_the_wire():
    import random

    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess
    from tests.softswitch.test_cli_and_veth import receive

    with Namespaces(1) as topo, SwitchProcess("softswitch", topo.switch_ports) as switch:
        connect(switch.grpc_addr, "primitives").close()
        sock = topo.hosts[0].raw_socket()
        try:
            rng = random.Random(11)
            good = frame(1, a=40, b=2)
            for _ in range(2000):
                cut = rng.randrange(len(good) + 1)
                junk = rng.randbytes(rng.randrange(14, 300))
                sock.send(rng.choice([junk, good[:max(cut, 14)],
                                      good[:cut] + rng.randbytes(len(good) - cut)]))
            time.sleep(0.5)
            receive(sock, timeout=0.5)
            sock.send(good)
            replies = [f for f in receive(sock) if f != good and len(f) == len(good)]
            assert replies and fields(replies[-1])["r1"] == 42
        finally:
            sock.close()
        assert switch.process.poll() is None
        log = switch.log_tail(200)
        assert "(native backend)" in log and "Python backend" not in log, log


def test_registers_touched_together_are_stored_side_by_side_and_read_apart():
    """The aggregation program's value registers form one group (the same size and
    width, the same three actions), stored cell by cell in one block; the others,
    touched by other actions or of other widths, stay apart. A control-plane write
    reaches that register's cell only (test_backends_agree compares every cell the
    data plane wrote with the Python backend's)."""
    program = frontend.load(protocol.PROGRAM_JSON.read_bytes())
    k = protocol.packet_format().values_per_packet
    (group,) = program.ir.register_groups
    assert [spec.name.rsplit(".", 1)[1] for spec in group] == [f"value_{i}" for i in range(k)]
    unit = emit_c.emit(program, "runtime.c")
    # One block of k lanes for the group, its last value register in the last lane; its
    # 32-bit cells stored in 32 bits (narrow: 1).
    block = re.search(rf"ss_reg_init\(c, (\d+), {group[0].size}U, {k}U, 1\);", unit)
    assert block, f"no block of {group[0].size} 32-bit cells x {k} lanes"
    assert re.search(rf"ss_reg_lane\(c, \d+, {block[1]}, {k - 1}U\);", unit)

    pipe = NativePipeline(protocol.PROGRAM_JSON.read_bytes())
    cells = {i: pipe.registers[group[i].name].cells for i in (0, 1, 2, k - 1)}
    cells[1][5] = 0x11111111
    cells[k - 1][0] = 0x22222222
    cells[k - 1][group[0].size - 1] = 0x33333333
    assert [cells[i][5] for i in (0, 1, 2, k - 1)] == [0, 0x11111111, 0, 0]
    assert [cells[1][4], cells[1][6], cells[0][0], cells[k - 1][0]] == [0, 0, 0, 0x22222222]
    assert cells[k - 1][group[0].size - 1] == 0x33333333 and cells[0][group[0].size - 1] == 0
    assert sum(any(pipe.registers[spec.name].cells) for spec in group) == 2
    with pytest.raises(ValueError, match=r"value_1: 4294967296 does not fit its 32 bits"):
        cells[1][5] = 1 << 32
    assert cells[1][5] == 0x11111111


def test_a_read_add_write_per_value_is_one_repeat_printed_as_a_loop():
    """The front half lowers the add action's 3 x K statements to one Repeat of K
    iterations; the C printer prints it as a loop over the values' fields and lanes,
    and one by one where they do not step evenly (test_backends_agree runs the loop
    against the Python backend, which prints every iteration)."""
    from innet_aggregation.softswitch.frontend import ir
    program = frontend.load(protocol.PROGRAM_JSON.read_bytes())
    k = protocol.packet_format().values_per_packet
    add = next(a for a in program.ir.actions.values() if a.name.endswith(".add_values"))
    (repeat,) = add.body
    assert isinstance(repeat, ir.Repeat) and len(repeat.iterations) == k
    assert [type(s) for s in repeat.iterations[0]] == [ir.RegisterRead, ir.Assign,
                                                      ir.RegisterWrite]
    assert repeat.iterations[5][2].register.name.endswith(".value_5")
    c = emit_c.CPrinter(program)
    fields, registers = c.loop_steps(repeat.iterations)
    assert sorted(fields.values()) == [0, 0, 1] and list(registers.values()) == [1]   # cell, stored; v_i
    assert emit_c.emit(program, "runtime.c").count(f"for (uint32_t _i = 0; _i < {k}U; _i++)") == 3
    swapped = [repeat.iterations[1], repeat.iterations[0]] + repeat.iterations[2:]
    assert c.loop_steps(swapped) is None
