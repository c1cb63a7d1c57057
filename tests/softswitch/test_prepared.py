"""frontend/prepared.py: which headers every copy of a multicast deparses alike (the
native switch deparses them once a multicast), the bytes that path sends, and the
line the switch says at start."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends.native import printer
from innet_aggregation.softswitch.backends.native.loader import RUNTIME, NativePipeline
from innet_aggregation.softswitch.backends.python.pipeline import Pipeline
from innet_aggregation.softswitch.frontend import ir, prepared
from tests.softswitch.conftest import free_port, program_files
from tests.softswitch.test_backends_agree import JOB, SERVICE_MAC, WORKERS, install_job

REPO = Path(__file__).resolve().parents[2]
SAID = ("a multicast deparses agg, values once for all its copies (egress writes none of "
        "them)")


def aggregation(json_path: Path = protocol.PROGRAM_JSON):
    return frontend.load(json_path.read_bytes())


@pytest.mark.parametrize("json_path", [protocol.PROGRAM_JSON, protocol.JUMBO_PROGRAM_JSON])
def test_the_aggregation_program_deparses_its_header_and_values_once(json_path):
    """Egress rewrites Ethernet, IPv4 and UDP per rank; the agg header and the summed
    values are every rank's alike."""
    result = prepared.plan(aggregation(json_path))
    assert result.reason is None and [h.name for h in result.shared] == ["agg", "values"]
    assert prepared.describe(result) == SAID
    assert "#define SS_PREPARED 1" in printer.emit(aggregation(json_path), str(RUNTIME))


@pytest.mark.parametrize("name,reason", [
    ("forwarding", "egress may change ipv4, the last header deparsed"),
    ("special_ops", "the program clones, resubmits or recirculates"),
])
def test_a_program_the_proof_fails_on_deparses_each_copy_whole_and_says_why(name, reason):
    program = frontend.load(program_files(name)[0].read_bytes())
    result = prepared.plan(program)
    assert not result.shared and result.reason == reason
    assert prepared.describe(result) == f"each multicast copy is deparsed whole: {reason}"
    assert "SS_PREPARED" not in printer.emit(program, str(RUNTIME))


def contributions(fmt, seed: int = 1) -> tuple[list, np.ndarray]:
    """One aggregation: a contribution from each worker (its port), and their sum."""
    values = np.random.default_rng(seed).integers(-2**20, 2**20, size=(WORKERS,
                                                   fmt.values_per_packet)).astype(np.int32)
    frames = []
    for w in range(WORKERS):
        payload = fmt.pack(values[w:w + 1], msg_type=protocol.MsgType.CONTRIBUTION,
                           job_id=JOB, slot=3, set=0, pkt_id=9).tobytes()
        frames.append((bytes(Ether(src=f"02:00:00:00:00:{w + 1:02x}", dst=SERVICE_MAC)
                             / IP(src=f"10.0.0.{w + 1}", dst="10.0.0.254")
                             / UDP(sport=40000 + w, dport=protocol.AGG_UDP_PORT_BASE, chksum=0)
                             / payload), w + 1))
    return frames, values.sum(axis=0)


def sent_values(fmt, data: bytes) -> np.ndarray:
    return fmt.decode(bytes(Ether(data)[UDP].payload))[0]["values"]


def results(pipe, frames) -> list:
    for data, port in frames[:-1]:
        assert pipe.process(data, port) == []
    return sorted(pipe.process(*frames[-1]))


def test_the_shared_deparse_sends_the_bytes_of_a_whole_deparse_per_copy(monkeypatch):
    """A result to four ranks from the proven build equals, byte for byte, the one from a
    build whose proof is refused (each copy deparsed whole) and the Python backend's;
    each rank's frame carries its own addresses and the sum."""
    fmt = protocol.packet_format()
    text = protocol.PROGRAM_JSON.read_bytes()
    frames, total = contributions(fmt)
    shared = NativePipeline(text)
    assert shared.multicast_line == SAID
    monkeypatch.setattr(prepared, "plan", lambda program: prepared.Plan(reason="refused"))
    # One more byte of JSON (a space): the cache keeps this build apart from the other.
    whole = NativePipeline(text + b" ")
    assert whole.multicast_line == "each multicast copy is deparsed whole: refused"
    pipes = (shared, whole, Pipeline(text))
    for pipe in pipes:
        install_job(pipe, 16)
    outs = [results(pipe, frames) for pipe in pipes]
    assert outs[0] == outs[1] == outs[2]
    assert [port for port, _ in outs[0]] == [1, 2, 3, 4]
    for rank, (_, data) in enumerate(outs[0]):
        assert Ether(data)[IP].dst == f"10.0.0.{rank + 1}"
        assert Ether(data)[UDP].dport == 40000 + rank
        assert (sent_values(fmt, data) == total).all()


def test_egress_that_writes_a_value_deparses_each_copy_whole(monkeypatch):
    """The aggregation program with one more egress statement, the first value set to the
    copy's port: the proof refuses and says why, and every rank gets its own value (one
    shared deparse would give every rank the first copy's)."""
    text = protocol.PROGRAM_JSON.read_bytes()
    program = aggregation()
    first = program.field(["values", "v0"])
    program.ir.egress.append(ir.Assign(first, ir.FieldRef(program.std("egress_port"))))
    assert prepared.plan(program).reason == "egress may change values, the last header deparsed"
    pipe = NativePipeline(text + b"  ", program=program)     # its own cache entry
    assert pipe.multicast_line == ("each multicast copy is deparsed whole: egress may change "
                                   "values, the last header deparsed")
    install_job(pipe, 16)
    fmt = protocol.packet_format()
    frames, total = contributions(fmt, seed=2)
    outs = results(pipe, frames)
    assert [port for port, _ in outs] == [1, 2, 3, 4]
    for port, data in outs:
        values = sent_values(fmt, data)
        assert values[0] == port and (values[1:] == total[1:]).all()


def test_a_statement_the_proof_does_not_follow_stops_it():
    program = aggregation()
    program.ir.egress.append(ir.Require(4))
    assert prepared.plan(program).reason == ("egress has a Require, which the proof does not "
                                             "follow")


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
def test_the_switch_says_at_start_whether_a_multicast_is_deparsed_once():
    from innet_aggregation.testbed.netns import Namespaces

    with Namespaces(2) as topo:
        ports = [f"{h.switch_port}@{h.switch_ifname}" for h in topo.hosts]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        switch = subprocess.Popen(
            [sys.executable, "-m", "innet_aggregation.softswitch", str(protocol.PROGRAM_JSON),
             *[x for p in ports for x in ("-i", p)], "--", "--grpc-server-addr",
             f"127.0.0.1:{free_port()}"], env=env, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 90     # a build on a loaded machine
            said = b""
            # Raw reads: the line comes right after the lanes', often in the same read.
            while b"multicast" not in said and time.monotonic() < deadline:
                if select.select([switch.stderr], [], [], 0.5)[0]:   # never blocks past it
                    chunk = os.read(switch.stderr.fileno(), 65536)
                    assert chunk or switch.poll() is None, "the switch exited"
                    said += chunk
        finally:
            switch.terminate()
            switch.wait(timeout=60)
    lines = [line for line in said.decode().splitlines() if "multicast" in line]
    assert lines and lines[0].endswith(SAID), said
