"""Every problem in a job configuration is found before anything is written."""

from __future__ import annotations

import copy

import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.config import ConfigError, parse
from innet_aggregation.switch_ctl.jobfile import load

POOL = 1024

GOOD = {
    "switch": {"grpc_addr": "127.0.0.1:9559", "device_id": 0, "ports": [1, 2, 3]},
    "job": {"id": 1, "udp_port": protocol.AGG_UDP_PORT_BASE, "service_ip": "10.0.0.254",
            "service_mac": "02:00:00:00:00:fe", "first_slot": 0, "num_slots": 64,
            "workers": [
                {"id": 0, "mac": "02:00:00:00:00:01", "ip": "10.0.0.1", "udp_port": 40000,
                 "switch_port": 1},
                {"id": 1, "mac": "02:00:00:00:00:02", "ip": "10.0.0.2", "udp_port": 40000,
                 "switch_port": 2}]},
    "loss": {"ingress": 0.01, "egress": 0},
}


def variant(change) -> dict:
    raw = copy.deepcopy(GOOD)
    change(raw)
    return raw


def problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(raw, pool_size=POOL)
    return info.value.problems


def test_good_config_parses():
    config = parse(copy.deepcopy(GOOD), pool_size=POOL)
    assert config.job.num_workers == 2
    assert config.job.multicast_group == 2
    assert config.loss.egress == 0.0


def test_loads_toml_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("""
[switch]
grpc_addr = "127.0.0.1:9559"
ports = [1, 2]
[job]
id = 3
udp_port = 48865
service_ip = "10.0.0.254"
service_mac = "02:00:00:00:00:fe"
num_slots = 8
[[job.workers]]
id = 0
mac = "02:00:00:00:00:01"
ip = "10.0.0.1"
udp_port = 40000
switch_port = 2
""")
    config = load(path, pool_size=POOL)
    assert config.job.workers[0].switch_port == 2 and config.job.first_slot == 0


@pytest.mark.parametrize("change, expected", [
    (lambda r: r["job"]["workers"][1].update(id=0), "same id 0"),
    (lambda r: r["job"]["workers"][1].update(mac="02:00:00:00:00:01"), "same mac"),
    (lambda r: r["job"]["workers"][1].update(ip="10.0.0.1"), "same ip"),
    (lambda r: r["job"]["workers"][1].update(mac="02:00:00:00:00"), "is not a MAC address"),
    (lambda r: r["job"]["workers"][0].update(mac="zz:00:00:00:00:01"), "is not a MAC address"),
    (lambda r: r["job"]["workers"][1].update(ip="10.0.0.300"), "is not an IPv4 address"),
    (lambda r: r["job"].update(service_ip="10.0.0"), "is not an IPv4 address"),
    (lambda r: r["job"].update(first_slot=1000, num_slots=64), "not within the compiled pool"),
    (lambda r: r["job"].update(num_slots=0), "not within the compiled pool"),
    (lambda r: r["job"]["workers"][1].update(switch_port=9), "is not a port of the switch"),
    (lambda r: r["job"].update(udp_port=5000), "is not an aggregation port"),
    (lambda r: r["job"].update(id=300), "job.id must be 0..255"),
    (lambda r: r["job"]["workers"][1].update(id=32), "must be 0..31"),
    (lambda r: r["loss"].update(ingress=1.5), "must be a probability"),
    (lambda r: r["job"].update(multicast_group=protocol.FLOOD_MCAST_GROUP), "floods"),
    (lambda r: r["job"]["workers"][1].pop("ip"), "is missing ip"),
    (lambda r: r["job"]["workers"][0].update(ip="10.0.0.254"), "service address"),
    (lambda r: r["job"].update(deadline_ms=0), "job.deadline_ms must be a number of "
                                               "milliseconds in (0, 60000], not 0"),
    (lambda r: r["job"].update(deadline_ms=True), "job.deadline_ms must be"),
    (lambda r: r["job"].update(deadline_ms=1e9), "job.deadline_ms must be"),
])
def test_each_problem_is_named(change, expected):
    found = problems(variant(change))
    assert any(expected in p for p in found), found


def test_more_workers_than_the_bitmap_holds():
    def many(raw):
        raw["switch"]["ports"] = list(range(1, 41))
        raw["job"]["workers"] = [
            {"id": i % 32, "mac": f"02:00:00:00:01:{i:02x}", "ip": f"10.0.1.{i + 1}",
             "udp_port": 40000, "switch_port": i + 1} for i in range(33)]
    found = problems(variant(many))
    assert any("the bitmap holds 32" in p for p in found), found


def test_all_problems_reported_at_once():
    def broken(raw):
        raw["job"]["workers"][0]["mac"] = "nope"
        raw["job"]["workers"][1]["ip"] = "nope"
        raw["job"]["num_slots"] = 5000
    assert len(problems(variant(broken))) == 3


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[job\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(bad)


def test_the_documented_example_is_valid():
    import re
    import tomllib
    from pathlib import Path
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "config.md").read_text()
    example = re.search(r"```toml\n# a job file\n(.*?)```", page, re.S).group(1)
    config = parse(tomllib.loads(example), pool_size=POOL)
    assert config.job.workers[0].switch_port in config.switch.ports
