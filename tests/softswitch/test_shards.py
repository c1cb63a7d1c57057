"""frontend/shards.py: what the front end can prove about sharing register state out
among lanes, and the line the switch prints at start saying whether its lanes share
one lock and why."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.frontend import ir, shards
from tests.softswitch.conftest import free_port, program_files

REPO = Path(__file__).resolve().parents[2]
AGGREGATION = REPO / "innet_aggregation/p4src/build/aggregation.json"


def program(name: str):
    path = AGGREGATION if name == "aggregation" else program_files(name)[0]
    return frontend.load(path.read_bytes())


@pytest.mark.parametrize("name,reason", [
    ("forwarding", "register Ing.last_ttl: standard_metadata.ingress_port is metadata not "
                   "set once from a header field"),
    ("special_ops", "the program clones, resubmits or recirculates"),
    ("varbit", "the program has no registers"),
    ("primitives", "register Ing.reg: an index that is not the field's bits (Cast)"),
])
def test_a_program_that_cannot_be_proven_keeps_one_lock_and_says_why(name, reason):
    result = shards.plan(program(name))
    assert not result.keys and reason in result.reason
    assert shards.describe(result).startswith("the lanes run the pipeline under one lock: ")


def test_the_aggregation_program_is_shared_out_by_its_slot():
    """Every register index is bits of agg.slot, or (the controller's slot reset) of
    packet_out.slot on a branch no aggregation packet takes."""
    result = shards.plan(program("aggregation"))
    assert result.reason is None, result.reason
    assert sorted(f"{f.header}.{f.name}" for f in result.keys) == ["agg.slot", "packet_out.slot"]
    assert result.shifts["AggIngress.bitmap_checker.bitmaps"] == 0
    assert result.shifts["AggIngress.contribution_counter.counts"] == 1
    assert result.bits == 15
    assert shards.describe(result) == (
        "register state is shared out by agg.slot or packet_out.slot (261 registers, "
        "15 bits of it): the lanes run the pipeline in parallel, a frame under the lock "
        "of its share only")
    # The controller's slot reset reaches registers only in a PacketOut; the front end
    # cannot show that of agg.slot (the branch tests metadata set from isValid()), so a
    # frame with no agg header takes share 0's lock.
    assert {f"{f.header}.{f.name}": g for f, g in result.guarded.items()} == {
        "agg.slot": False, "packet_out.slot": True}


def test_a_frame_that_can_reach_registers_by_two_fields_is_refused():
    """The aggregation program with one more write by agg.slot after its branch on the
    PacketOut: a PacketOut frame then reaches registers by both slot fields."""
    p = program("aggregation")
    slot = ir.FieldRef(p.field(["agg", "slot"]))
    bitmaps = p.registers["AggIngress.bitmap_checker.bitmaps"]
    p.ir.ingress.append(ir.RegisterWrite(bitmaps, slot, ir.Const(0)))
    assert shards.plan(p).reason == ("a frame can reach registers indexed by agg.slot "
                                     "and by packet_out.slot")
    # Behind the same test on the PacketOut's validity, no frame can.
    p.ir.ingress[-1] = ir.If(ir.Unary("not", ir.Valid(p.header("packet_out"))), [], [
        ir.RegisterWrite(bitmaps, slot, ir.Const(0))])
    assert "packet_out" in shards.plan(p).reason
    p.ir.ingress[-1] = ir.If(ir.Valid(p.header("packet_out")), [], [
        ir.RegisterWrite(bitmaps, slot, ir.Const(0))])
    assert shards.plan(p).reason is None


def test_the_slot_is_found_through_temporaries_shifts_and_masks():
    """The aggregation program's cell index, ``slot ++ set`` through a temporary: the
    slot's bits sit at shift 1, 15 of them kept by the 16-bit mask."""
    p = program("aggregation")
    prover = shards._Prover(p, p.ir)
    cells = {a.register.name: a.index for a in prover.accesses}
    f, shift, bits = prover.form(cells["AggIngress.contribution_counter.counts"])
    assert (f.header, f.name, shift, bits) == ("agg", "slot", 1, 15)
    f, shift, bits = prover.form(cells["AggIngress.value_aggregator.value_0"])
    assert (f.header, f.name, shift, bits) == ("agg", "slot", 1, 15)


def test_an_index_mixing_other_bits_into_the_slot_is_refused():
    p = program("aggregation")
    prover = shards._Prover(p, p.ir)
    slot = ir.FieldRef(p.field(["agg", "slot"]))
    job = ir.FieldRef(p.field(["agg", "job_id"]))
    assert prover.form(slot)[1:] == (0, slot.field.width)
    assert prover.form(ir.Binary("|", slot, job)) == "an index ORs other bits into the field's"
    assert prover.form(ir.Binary("&", slot, ir.Const(0xFF00))) == "a mask drops the field's bits"
    assert "not the field's bits" in prover.form(ir.Binary("+", slot, job))


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
@pytest.mark.parametrize("name,said", [
    ("forwarding", "2 lanes; the lanes run the pipeline under one lock: register "
                   "Ing.last_ttl: standard_metadata.ingress_port is metadata not set once "
                   "from a header field"),
    ("aggregation", "2 lanes; register state is shared out by agg.slot or packet_out.slot "
                    "(261 registers, 15 bits of it): the lanes run the pipeline in "
                    "parallel, a frame under the lock of its share only"),
])
def test_the_switch_says_at_start_whether_its_lanes_share_one_lock_and_why(name, said):
    from innet_aggregation.testbed.netns import Namespaces

    json_path = AGGREGATION if name == "aggregation" else program_files(name)[0]
    with Namespaces(2) as topo:
        ports = [f"{h.switch_port}@{h.switch_ifname}" for h in topo.hosts]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        switch = subprocess.Popen(
            [sys.executable, "-m", "innet_aggregation.softswitch", str(json_path),
             *[x for p in ports for x in ("-i", p)], "--io-threads", "2", "--", "--grpc-server-addr",
             f"127.0.0.1:{free_port()}"], env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            line = ""
            while "lanes;" not in line and time.monotonic() < deadline:
                if select.select([switch.stderr], [], [], 0.5)[0]:   # never blocks past it
                    line = switch.stderr.readline()
                    assert line or switch.poll() is None, "the switch exited"
        finally:
            switch.terminate()
            switch.wait(timeout=60)
    assert line.rstrip().endswith(said), line
