"""Jobs sharing a switch: `switch_ctl apply` reads the jobs the switch holds and
refuses one that collides with another (slots, UDP port, service address, PRE
group, or an id the switch holds as another job), naming both, with exit status 1
and nothing written; a job that collides with nothing installs beside the others,
and re-applying or updating a job is not a collision. One switch on each target,
and a tree of three embedded switches."""

from __future__ import annotations

import numpy as np
import pytest
import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.client import P4MulticastGroupEntry, P4TableEntry, SwitchConnection
from innet_aggregation.testbed.layout import tree_config_dict
from tests.dataplane.harness import SERVICE_IP, SERVICE_MAC, WORKER_UDP_PORT
from tests.switch_ctl.test_controller import WRITER, cli
from tests.worker.harness import TreeFabric, skip_unless_runnable

PORT = protocol.AGG_UDP_PORT_BASE
OTHER_SERVICE = ("10.0.0.253", "02:00:00:00:00:fd")


def state(conn: SwitchConnection) -> set[bytes]:
    """Every table entry and PRE group the switch holds, to show nothing was written."""
    entities = conn.read_raw(P4TableEntry()) + conn.read_raw(P4MulticastGroupEntry())
    return {e.SerializeToString(deterministic=True) for e in entities}


@pytest.fixture
def jobs(switch, hosts, tmp_path):
    """Factory: a one-switch job file over some hosts, on slots ``offset``.. past the
    ones earlier tests used; every job applied is removed at the end."""
    base = switch.next_free_slot
    switch.next_free_slot += 32
    applied = []

    def make(job_id: int, workers: list[int], offset: int, num_slots: int = 8, *,
             udp_port: int = PORT, service: tuple[str, str] = (SERVICE_IP, SERVICE_MAC),
             group: int | None = None):
        job = {"id": job_id, "udp_port": udp_port, "service_ip": service[0],
               "service_mac": service[1], "first_slot": base + offset, "num_slots": num_slots,
               "workers": [{"id": n, "mac": hosts[i].host.mac, "ip": hosts[i].host.ip,
                            "udp_port": WORKER_UDP_PORT, "switch_port": hosts[i].host.switch_port}
                           for n, i in enumerate(workers)]}
        if group is not None:
            job["multicast_group"] = group
        path = tmp_path / f"job{job_id}-{len(list(tmp_path.iterdir()))}.toml"
        path.write_text(tomli_w.dumps({
            "switch": {"grpc_addr": switch.process.grpc_addr,
                       "device_id": switch.process.device_id,
                       "ports": sorted(switch.topology.switch_ports)},
            "job": job}))
        return path

    def apply(path):
        result = cli("apply", str(path), *WRITER, check=False)
        if result.returncode == 0:
            applied.append(path)
        return result

    make.base, make.apply = base, apply
    yield make
    for path in reversed(applied):
        cli("remove", str(path), *WRITER, check=False)


def refused(jobs, path, conn) -> str:
    """Apply ``path``, which must fail with status 1 and change nothing; its stderr."""
    before = state(conn)
    result = jobs.apply(path)
    assert result.returncode == 1, f"applied:\n{result.stdout}{result.stderr}"
    assert "Traceback" not in result.stderr
    assert state(conn) == before, "a refused apply wrote to the switch"
    return result.stderr


def test_overlapping_slots_are_refused_naming_both_jobs(switch, jobs):
    first = jobs(31, [0, 1], 0)
    assert jobs.apply(first).returncode == 0
    second = jobs(32, [2, 3], 4, udp_port=PORT + 1, service=OTHER_SERVICE)
    err = refused(jobs, second, switch.controller.conn)
    b = jobs.base
    assert f"job 32's slots {b + 4}..{b + 11} overlap job 31's slots {b}..{b + 7}" in err
    assert err.count("\n  - ") == 1, err   # that collision and no other


# What job 41 (installed: slots 0..7, UDP port PORT, SERVICE_IP/MAC, group 42)
# collides with in a second job file, and the line that must name it.
COLLISIONS = {
    "udp-port": (dict(job_id=42, service=OTHER_SERVICE), f"job 42's UDP port {PORT} is job 41's too"),
    "service-ip": (dict(job_id=42, udp_port=PORT + 1, service=(SERVICE_IP, OTHER_SERVICE[1])),
                   f"job 42's service IP {SERVICE_IP} is job 41's too"),
    "service-mac": (dict(job_id=42, udp_port=PORT + 1, service=(OTHER_SERVICE[0], SERVICE_MAC)),
                    f"job 42's service MAC {SERVICE_MAC} is job 41's too"),
    "group": (dict(job_id=43, udp_port=PORT + 1, service=OTHER_SERVICE, group=42),
              "job 43's multicast group 42 is job 41's too"),
    "job-id-port": (dict(job_id=41, udp_port=PORT + 1),
                    f"job 41 is installed with UDP port {PORT} (this file: {PORT + 1}): "
                    f"this file's job 41 is another job with the same id"),
    "job-id-service": (dict(job_id=41, service=OTHER_SERVICE),
                       f"job 41 is installed with service IP {SERVICE_IP} (this file: "
                       f"{OTHER_SERVICE[0]}) and service MAC {SERVICE_MAC} (this file: "
                       f"{OTHER_SERVICE[1]}): this file's job 41 is another job with the same id"),
}


@pytest.mark.parametrize("kind", COLLISIONS)
def test_a_shared_port_address_group_or_id_is_refused_naming_both_jobs(switch, jobs, kind):
    overrides, line = COLLISIONS[kind]
    assert jobs.apply(jobs(41, [0, 1], 0)).returncode == 0
    second = jobs(workers=[2, 3], offset=8, **overrides)   # slots apart from job 41's
    err = refused(jobs, second, switch.controller.conn)
    assert line in err
    assert err.count("\n  - ") == 1, err


def one_round(hosts, workers: list[int], job_id: int, slot: int, udp_port: int) -> None:
    """One exact sum through the job's slot. The switch binds a contribution to its
    job by job id and UDP port, so the frames go to the harness's service address."""
    k = protocol.packet_format().values_per_packet
    values = np.arange(len(workers) * k).reshape(len(workers), k) * (job_id + 1)
    for n, i in enumerate(workers):
        hosts[i].contribute(values[n], job_id=job_id, slot=slot, set_=0, dst_port=udp_port)
    for i in workers:
        (result,) = hosts[i].results(1, timeout=5)
        assert result.header["job_id"] == job_id and result.header["slot"] == slot
        np.testing.assert_array_equal(result.values, values.sum(axis=0))


def test_a_job_apart_from_the_others_installs_and_both_sum(switch, hosts, jobs):
    assert jobs.apply(jobs(51, [0, 1], 0)).returncode == 0
    second = jobs.apply(jobs(52, [2, 3], 8, udp_port=PORT + 1, service=OTHER_SERVICE))
    assert second.returncode == 0, second.stderr
    installed = {j.id: j for j in switch.controller.installed_jobs()}
    assert {51, 52} <= set(installed)
    assert (installed[52].first_slot, installed[52].udp_port, installed[52].service_ip,
            installed[52].group) == (jobs.base + 8, PORT + 1, OTHER_SERVICE[0], 53)
    for h in hosts:
        h.drain()
    one_round(hosts, [0, 1], 51, jobs.base, PORT)
    one_round(hosts, [2, 3], 52, jobs.base + 8, PORT + 1)


def test_reapplying_or_updating_a_job_is_not_a_collision(switch, jobs):
    job = jobs(61, [0, 1], 0)
    assert jobs.apply(job).returncode == 0
    assert jobs.apply(jobs(62, [2, 3], 8, udp_port=PORT + 1, service=OTHER_SERVICE)
                      ).returncode == 0
    again = jobs.apply(job)
    assert again.returncode == 0 and "0 inserted, 0 modified, 0 deleted" in again.stdout
    # The same job with a third worker on other slots: an update of job 61.
    update = jobs.apply(jobs(61, [0, 1, 4], 16))
    assert update.returncode == 0, update.stderr
    assert "0 inserted, 0 modified" not in update.stdout
    installed = {j.id: j for j in switch.controller.installed_jobs()}
    assert installed[61].first_slot == jobs.base + 16
    # An update is checked too: onto job 62's slots it is refused.
    err = refused(jobs, jobs(61, [0, 1], 12), switch.controller.conn)
    b = jobs.base
    assert f"job 61's slots {b + 12}..{b + 19} overlap job 62's slots {b + 8}..{b + 15}" in err


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    skip_unless_runnable("softswitch")
    fabric = TreeFabric("softswitch", 4, tmp_path_factory.mktemp("overlap-tree"), leaves=2,
                        per_leaf=2).start()
    yield fabric
    fabric.stop()


def tree_file(tree, path, job_id: int, first_slot: int, udp_port: int,
              addresses: dict[str, tuple[str, str]] | None = None):
    raw = tree_config_dict({n: (s.grpc_addr, 0) for n, s in tree.switches.items()}, 2, 2,
                           job_id, num_slots=8)
    raw["job"].update(first_slot=first_slot, udp_port=udp_port)
    for name, (ip, mac) in (addresses or {}).items():
        raw["switches"][name].update(service_ip=ip, service_mac=mac)
    path.write_text(tomli_w.dumps(raw))
    return path


def test_a_tree_job_is_checked_on_every_switch_before_any_is_written(tree, tmp_path):
    """The second job collides on leaf1 only: the spine, written first, is left alone."""
    first = tree_file(tree, tmp_path / "a.toml", 71, 0, PORT)
    assert cli("apply", str(first), *WRITER).returncode == 0
    theirs = {"spine": ("10.0.0.200", "02:00:00:00:02:00"),
              "leaf0": ("10.0.0.201", "02:00:00:00:02:01"),
              "leaf1": ("10.0.0.241", "02:00:00:00:02:02")}   # job 71's leaf1 IP
    second = tree_file(tree, tmp_path / "b.toml", 72, 8, PORT + 1, theirs)
    conns = {name: control.conn for name, control in tree.controls.items()}
    before = {name: state(conn) for name, conn in conns.items()}
    result = cli("apply", str(second), *WRITER, check=False)
    assert result.returncode == 1, result.stdout
    assert ("leaf1 (" + tree.switches["leaf1"].grpc_addr + "): job 72's service IP 10.0.0.241 "
            "is job 71's too") in result.stderr
    assert result.stderr.count("\n  - ") == 1, result.stderr
    assert {name: state(conn) for name, conn in conns.items()} == before
    # With its own address on leaf1, the job installs on every switch.
    theirs["leaf1"] = ("10.0.0.202", "02:00:00:00:02:02")
    third = tree_file(tree, tmp_path / "c.toml", 72, 8, PORT + 1, theirs)
    assert cli("apply", str(third), *WRITER).returncode == 0
    for name, control in tree.controls.items():
        assert {j.id for j in control.installed_jobs()} == {71, 72}, name
    for path in (third, first):
        cli("remove", str(path), *WRITER)
