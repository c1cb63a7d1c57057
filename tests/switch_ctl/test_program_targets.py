"""The controller against each compiled program's P4Info, with no switch: every entry
it would write for a job encodes (names, key and parameter widths) for the BMv2 and
the Tofino build alike, and what a program lacks is refused or named before any write.
"""

from __future__ import annotations

import dataclasses

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl import config as config_mod
from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.switch_ctl.client import DryRun, P4RuntimeError
from innet_aggregation.switch_ctl.control_base import field_value
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.switch_ctl.controls import RoundTracker
from innet_aggregation.testbed import layout

REPO = Path(__file__).resolve().parents[2]
NOWHERE = "127.0.0.1:9"

pytestmark = pytest.mark.skipif(not protocol.P4INFO.exists(), reason="the P4 program is not built")
NO_TNA_BUILD = (f"{protocol.TNA_P4INFO.relative_to(REPO)} is missing: make p4-tofino writes it "
                f"with bf-p4c (docs/p4/tofino.md)")


@pytest.fixture(params=["v1model", "tna"])
def p4info(request) -> Path:
    if request.param == "tna" and not protocol.TNA_P4INFO.exists():
        pytest.skip(NO_TNA_BUILD)
    return protocol.P4INFO if request.param == "v1model" else protocol.TNA_P4INFO


def one_switch_job(loss=(0.01, 0.02), values_per_packet=None) -> config_mod.Config:
    """The testbed's job, without a packet size (as a hand-written file may be) unless
    one is given."""
    raw = layout.job_config_dict({1: "h1", 2: "h2", 3: "h3"}, NOWHERE, 0, num_slots=64,
                                 loss=loss)
    raw["job"]["values_per_packet"] = values_per_packet
    if values_per_packet is None:
        del raw["job"]["values_per_packet"]
    return jobfile.load_text(tomli_w.dumps(raw))


def tree_job(values_per_packet=None):
    switches = {name: (NOWHERE, 0) for name in ("spine", "leaf0", "leaf1")}
    return jobfile.load_text(tomli_w.dumps(
        layout.tree_config_dict(switches, leaves=2, per_leaf=2, num_slots=16,
                                values_per_packet=values_per_packet)))


def size_of(p4info: Path) -> int:
    return protocol.values_per_packet_in(r.name for r in DryRun(p4info).schema.registers)


def neutral(name: str) -> str:
    """A P4Info name without the pipeline prefix bf-p4c puts on a TNA program's names."""
    return name[name.index("Agg"):] if "Agg" in name else name


def written(run: DryRun) -> set[tuple]:
    """What was written, target-neutral: table, match by field name, action, params."""
    out = set()
    for _, entity in run.written:
        if entity.HasField("table_entry"):
            te = entity.table_entry
            table = run.schema.tables[te.table_id]
            fields = {mf.id: mf.name for mf in table.match_fields}
            action = run.schema.actions[te.action.action.action_id]
            out.add((neutral(table.name),
                     tuple(sorted((fields[fm.field_id], field_value(fm)) for fm in te.match)),
                     neutral(action.name),
                     tuple(sorted((action.params[p.param_id].name, int.from_bytes(p.value, "big"))
                                  for p in te.action.action.params))))
        else:
            group = entity.packet_replication_engine_entry.multicast_group_entry
            out.add(("multicast", group.multicast_group_id,
                     tuple(sorted((r.egress_port, r.instance) for r in group.replicas))))
    return out


def apply(p4info: Path, config) -> tuple[DryRun, object]:
    run = DryRun(p4info)
    return run, Controller(run).apply(config)


@pytest.mark.parametrize("p4info_path, size", [(protocol.P4INFO, 256), (protocol.SMALL_P4INFO, 64),
                                              (protocol.JUMBO_BUILD_DIR / protocol.P4INFO.name, 1024),
                                              (protocol.TNA_P4INFO, 64)])
def test_a_job_for_another_packet_size_is_refused_before_any_write(p4info_path, size):
    if not p4info_path.exists():
        pytest.skip(NO_TNA_BUILD)
    run, _ = apply(p4info_path, one_switch_job(values_per_packet=size))
    assert run.written
    other = 64 if size == 256 else 256
    refused = DryRun(p4info_path)
    with pytest.raises(P4RuntimeError, match=f"job 1 is for a program of {other} values per "
                                             f"packet; the program on .* carries {size}"):
        Controller(refused).apply(one_switch_job(values_per_packet=other))
    assert not refused.written


def test_every_entry_of_a_job_encodes(p4info):
    config = one_switch_job()
    run, changes = apply(p4info, config)
    entries = written(run)
    assert changes.inserted == len(run.written) == len(entries)
    tables = {e[0] for e in entries}
    assert {"AggIngress.job_lookup.jobs", "AggIngress.sender_identification.senders",
            "AggEgress.result_rewrite.workers", "AggIngress.l2_forwarding.mac_table",
            "AggIngress.arp_responder.arp_table", "AggIngress.ingress_loss.drop_probability",
            "AggEgress.egress_loss.drop_probability", "multicast"} <= tables
    job = config.job
    assert ("AggIngress.job_lookup.jobs",
            (("job_id", ("exact", job.id)), ("udp_port", ("exact", job.udp_port))),
            "AggIngress.job_lookup.set_job",
            (("first_slot", job.first_slot), ("group", job.multicast_group),
             ("num_slots", job.num_slots), ("num_workers", 3), ("total_workers", 3))) in entries
    assert ("multicast", job.multicast_group,
            tuple(sorted((w.switch_port, w.id) for w in job.workers))) in entries
    for w in job.workers:
        assert any(e[0] == "AggIngress.sender_identification.senders"
                   and dict(e[3]) == {"worker_id": w.id, "worker_bit": 1 << w.id}
                   and dict(e[1])["src_ip"] == ("exact", int(ipaddress.IPv4Address(w.ip)))
                   for e in entries)


def test_the_tofino_build_takes_the_same_entries_less_port_security_plus_the_slot_range():
    if not protocol.TNA_P4INFO.exists():
        pytest.skip(NO_TNA_BUILD)
    config = one_switch_job()
    bmv2, bmv2_changes = apply(protocol.P4INFO, config)
    tofino, tofino_changes = apply(protocol.TNA_P4INFO, config)
    guard = {e for e in written(bmv2) if e[0] == "AggIngress.source_guard.service_sources"}
    assert len(guard) == 3 and bmv2_changes.skipped == ()
    job = config.job
    slot_range = ("AggIngress.job_lookup.slot_range",
                  (("job_id", ("exact", job.id)),
                   ("slot", ("range", job.first_slot, job.first_slot + job.num_slots - 1)),
                   ("udp_port", ("exact", job.udp_port))), "AggIngress.job_lookup.slot_in_range", ())
    assert written(tofino) == written(bmv2) - guard | {slot_range}
    assert tofino_changes.skipped == ("SourceGuard",)


def widths(p4info: Path) -> dict[tuple, int]:
    run = DryRun(p4info)
    out = {}
    for table in run.schema.tables:
        for mf in table.match_fields:
            out[("key", neutral(table.name), mf.name)] = mf.bitwidth
    for action in run.schema.actions:
        for param in action.params:
            out[("param", neutral(action.name), param.name)] = param.bitwidth
    return out


def test_keys_and_parameters_are_as_wide_on_both_targets():
    if not protocol.TNA_P4INFO.exists():
        pytest.skip(NO_TNA_BUILD)
    bmv2, tofino = widths(protocol.P4INFO), widths(protocol.TNA_P4INFO)
    # What the controller writes must mean the same on both.
    controlled = {k for k in bmv2 if not k[1].startswith(("AggIngress.source_guard",
                                                          "AggIngress.next_step_selector",
                                                          "AggIngress.contribution_counter",
                                                          "AggIngress.value_aggregator",
                                                          "AggIngress.exponent_max",
                                                          "AggIngress.fingerprint_sum",
                                                          "AggIngress.bitmap_checker",
                                                          # the deadline: v1model's alone
                                                          "AggIngress.round_tracker"))
                  and "set_leaf_job" not in k[1] and "set_parent" not in k[1]}
    assert {k: tofino.get(k) for k in controlled} == {k: bmv2[k] for k in controlled}


def test_counters_have_a_cell_per_outcome(p4info):
    run = DryRun(p4info)
    for name, outcomes in (("AggIngress.ingress_outcomes", protocol.IngressOutcome),
                           ("AggEgress.egress_outcomes", protocol.EgressOutcome)):
        counter = run.schema.counters[run.resolve("counters", name)]
        assert counter.size == len(outcomes), name


def test_a_leaf_needs_the_leaf_role(p4info):
    tree = tree_job(size_of(p4info))
    run = DryRun(p4info)
    controller = Controller(run)
    if run.resolve("actions", "AggIngress.job_lookup.set_leaf_job") is None:
        with pytest.raises(P4RuntimeError, match="set_leaf_job"):
            controller.apply(tree.switches["leaf0"])
        assert run.written == []          # refused before any write
        controller.apply(tree.switches["spine"])   # the root role is there
    else:
        controller.apply(tree.switches["leaf0"])
        assert any(e[2] == "AggIngress.job_lookup.set_leaf_job" for e in written(run)
                   if e[0] == "AggIngress.job_lookup.jobs")


def test_a_program_without_the_packet_out_reset_refuses_reset(p4info):
    run = DryRun(p4info)
    if "packet_out" in {m.name for m in run.schema.controller_packet_metadata}:
        pytest.skip("this program has the PacketOut slot reset (tests/worker/test_reset.py)")
    with pytest.raises(P4RuntimeError, match="no slot reset by PacketOut"):
        Controller(run).reset(one_switch_job())


def test_remove_touches_only_what_the_program_has(p4info):
    run = DryRun(p4info)
    Controller(run).remove(one_switch_job())   # reads every table it has, writes nothing
    assert run.written == []


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_check_prints_what_apply_would_write(p4info, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(tomli_w.dumps(layout.job_config_dict({1: "h1", 2: "h2"}, NOWHERE, 0,
                                                        num_slots=8,
                                                        values_per_packet=size_of(p4info))))
    result = cli("check", str(job), "--p4info", str(p4info))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("job_lookup.jobs job_id=1 udp_port=" in l and "set_job(num_workers=2" in l
               for l in lines), result.stdout
    inserts = sum(l.startswith("insert ") for l in lines)
    assert f"job 1: {inserts} inserted, 0 modified, 0 deleted" in lines


def test_a_deadline_job_gets_its_entry_on_both_programs(p4info):
    """Both programs release (p4src/shared/deadline.p4): the job's entry encodes for
    each, none for a job without a deadline, and the outcome counter gives each job its
    cells (v1model packs 5 a job; the TNA program's index is a hash of job id and
    outcome, so 8)."""
    config = one_switch_job()
    config = dataclasses.replace(config, job=dataclasses.replace(config.job, deadline_ms=20.0))
    run, _ = apply(p4info, config)
    assert ("AggIngress.round_tracker.deadline_jobs", (("job_id", ("exact", config.job.id)),),
            "AggIngress.round_tracker.set_deadline", ()) in written(run)
    run, _ = apply(p4info, one_switch_job())      # none for a job without one
    assert not any(e[0] == "AggIngress.round_tracker.deadline_jobs" for e in written(run))
    assert RoundTracker(DryRun(p4info)).stride() == (5 if p4info == protocol.P4INFO else 8)
