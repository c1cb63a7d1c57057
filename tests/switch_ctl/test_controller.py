"""The controller over real gRPC, against each switch target: CLI, idempotence,
restart, arbitration, readable errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.client import P4RuntimeError
from tests.dataplane.harness import SERVICE_IP, SERVICE_MAC, WORKER_UDP_PORT

REPO = Path(__file__).resolve().parents[2]
WRITER = ["--election-id", "20"]   # above the fixture's controller: may write
BACKUP = ["--election-id", "5"]    # below it: must not


def cli(*args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"switch_ctl {' '.join(args)} failed:\n{result.stderr}")
    return result


def write_config(path: Path, switch, hosts, job_id: int, first_slot: int) -> Path:
    workers = "\n".join(textwrap.dedent(f"""
        [[job.workers]]
        id = {i}
        mac = "{h.host.mac}"
        ip = "{h.host.ip}"
        udp_port = {WORKER_UDP_PORT}
        switch_port = {h.host.switch_port}
        """) for i, h in enumerate(hosts))
    path.write_text(textwrap.dedent(f"""
        [switch]
        grpc_addr = "{switch.process.grpc_addr}"
        device_id = {switch.process.device_id}
        ports = {sorted(switch.topology.switch_ports)}

        [job]
        id = {job_id}
        udp_port = {protocol.AGG_UDP_PORT_BASE + 3}
        service_ip = "{SERVICE_IP}"
        service_mac = "{SERVICE_MAC}"
        first_slot = {first_slot}
        num_slots = 4
        """) + workers)
    return path


@pytest.fixture
def config_file(tmp_path, switch, hosts):
    first = switch.next_free_slot
    switch.next_free_slot += 4
    path = write_config(tmp_path / "job.toml", switch, hosts[:3], 222, first)
    yield path
    cli("remove", str(path), *WRITER, check=False)


def one_round(hosts, job_id, slot, set_):
    k = protocol.packet_format().values_per_packet
    values = np.arange(3 * k).reshape(3, k)
    for i in range(3):
        hosts[i].contribute(values[i], job_id=job_id, slot=slot, set_=set_,
                            dst_port=protocol.AGG_UDP_PORT_BASE + 3)
    return [h.results(1, timeout=3) for h in hosts[:3]]


def test_apply_is_idempotent_and_a_restarted_controller_sees_the_same_state(
        switch, hosts, config_file):
    from innet_aggregation.switch_ctl.jobfile import load
    first = cli("apply", str(config_file), *WRITER)
    assert "0 inserted" not in first.stdout
    again = cli("apply", str(config_file), *WRITER)
    assert "0 inserted, 0 modified, 0 deleted" in again.stdout

    # The fixture's long-lived controller reads the same entries: nothing to change.
    config = load(config_file)
    assert switch.controller.apply(config).total == 0

    before = switch.counters()
    results = one_round(hosts, 222, config.job.first_slot, 0)
    assert all(len(r) == 1 for r in results)
    expected = {"ingress.consumed": 2, "ingress.completed": 1, "egress.multicast_copy": 3}
    from_cli = json.loads(cli("counters", str(config_file), "--json").stdout)
    in_process = switch.counters()
    for name, n in expected.items():
        assert in_process[name] - before[name] == n
        assert from_cli[name]["packets"] == in_process[name]


def test_remove_then_reapply(switch, hosts, config_file):
    cli("apply", str(config_file), *WRITER)
    removed = cli("remove", str(config_file), *WRITER)
    assert "entries deleted" in removed.stdout
    before = switch.counters()
    assert all(r == [] for r in one_round(hosts, 222, 0, 0))
    assert switch.counters()["ingress.unknown_job"] - before["ingress.unknown_job"] == 3
    assert "0 inserted" not in cli("apply", str(config_file), *WRITER).stdout


def test_lower_election_id_cannot_write(switch, config_file):
    refused = cli("apply", str(config_file), *BACKUP, check=False)
    assert refused.returncode == 1
    assert "another controller is primary" in refused.stderr
    assert "Traceback" not in refused.stderr
    # And the switch itself refuses a backup's write, whatever the client thinks.
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from innet_aggregation.switch_ctl.client import SwitchConnection, P4RuntimeError
        conn = SwitchConnection("{switch.process.grpc_addr}", 0, (0, 5)).connect()
        conn.load_p4info()
        te = conn.table_entry("AggIngress.l2_forwarding.mac_table",
                              "AggIngress.l2_forwarding.forward",
                              {{"dst_mac": "02:00:00:00:aa:aa"}}, {{"port": 1}})
        try:
            conn.insert(te)
            print("WRITTEN")
        except P4RuntimeError as exc:
            print("REFUSED", exc)
        conn.close()
        """)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "REFUSED" in probe.stdout and "PERMISSION_DENIED" in probe.stdout, probe.stdout + probe.stderr


def test_errors_are_one_readable_line(switch, tmp_path):
    unreachable = cli("counters", "--grpc-addr", "127.0.0.1:1", "--connect-timeout", "1",
                      check=False)
    assert unreachable.returncode == 1
    assert unreachable.stderr.count("\n") == 1 and "cannot reach" in unreachable.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[switch]\ngrpc_addr = 'x'\nports = [1]\n[job]\nid = 999\n")
    invalid = cli("apply", str(bad), check=False)
    assert invalid.returncode == 1 and "job.id must be 0..255" in invalid.stderr
    assert "Traceback" not in invalid.stderr


def test_p4runtime_rejection_is_a_p4runtime_error(switch):
    conn = switch.controller.conn
    te = conn.table_entry("AggIngress.job_lookup.jobs", "AggIngress.job_lookup.set_job",
                          {"job_id": 250, "udp_port": protocol.AGG_UDP_PORT_BASE},
                          dict.fromkeys(("num_workers", "total_workers", "group", "first_slot",
                                         "num_slots"), 1))
    conn.insert(te)
    try:
        with pytest.raises(P4RuntimeError, match="ALREADY_EXISTS"):
            conn.insert(te)
    finally:
        conn.delete(te)
