"""The manager's TOML is checked whole when read: every problem, one line each, and
the pool's allocation (no switch needed)."""

from __future__ import annotations

import pytest
import tomli_w

from innet_aggregation.switch_ctl.config import ConfigError
from innet_aggregation.switch_ctl.manager import config as manager_config
from innet_aggregation.switch_ctl.manager.config import Service
from innet_aggregation.switch_ctl.manager.pool import Allocator, Holding

GOOD = {
    "manager": {"listen": "127.0.0.1:7070", "secret": "x" * 16},
    "switch": {"grpc_addr": "127.0.0.1:9559"},
    "pool": {"slots": [0, 63], "services": [{"ip": "10.0.0.254", "mac": "02:00:00:00:00:fe"}]},
    "fabric": {"hosts": [{"mac": "02:00:00:00:00:01", "switch_port": 1},
                         {"mac": "02:00:00:00:00:02", "switch_port": 2}]},
}


def test_a_good_file_and_its_defaults(tmp_path):
    (tmp_path / "m.toml").write_text(tomli_w.dumps(GOOD))
    config = manager_config.load(tmp_path / "m.toml")
    assert config.listen == ("127.0.0.1", 7070)
    assert config.switch.ports == (1, 2) and config.switch.values_per_packet == 256
    assert config.pool.slots == range(0, 64) and len(config.pool.udp_ports) == 16
    assert config.database == tmp_path / "manager.db"
    assert config.fabric == {"02:00:00:00:00:01": 1, "02:00:00:00:00:02": 2}


def test_every_problem_is_named(tmp_path):
    raw = {"manager": {"listen": "nowhere", "secret": "short", "cert": "c.pem",
                       "lease_seconds": 0},
           "switch": {"grpc_addr": "127.0.0.1:9559", "ports": [1], "values_per_packet": 100},
           "pool": {"job_ids": [5, 2], "services": [{"ip": "10.0.0.254", "mac": "02:00:00:00:00:01"}]},
           "fabric": {"hosts": [{"mac": "02:00:00:00:00:01", "switch_port": 2},
                                {"mac": "nope", "switch_port": 3}]},
           "extra": {}}
    with pytest.raises(ConfigError) as err:
        manager_config.parse(raw, tmp_path)
    text = str(err.value)
    for said in ["unknown tables extra", "manager.listen 'nowhere' must be host:port",
                 "manager's secret has 5 characters; give at least 16",
                 "manager.cert and manager.key go together",
                 "manager.lease_seconds must be in (0, 3600], not 0",
                 "fabric.hosts[1].mac 'nope' is not a MAC address",
                 "fabric.hosts name switch ports [2] that switch.ports lacks",
                 "switch.values_per_packet: no compiled program carries 100 values per packet",
                 "pool.job_ids [5, 2] must lie within 0..255, first <= last",
                 "pool.services[0].mac 02:00:00:00:00:01 is a host's MAC in fabric.hosts"]:
        assert said in text, (said, text)


def test_a_secret_file(tmp_path):
    (tmp_path / "secret").write_text("0123456789abcdef0123\n")
    raw = {**GOOD, "manager": {"listen": "127.0.0.1:1", "secret_file": "secret"}}
    assert manager_config.parse(raw, tmp_path).tenants["default"].secret == b"0123456789abcdef0123"
    raw["manager"]["secret"] = "y" * 20
    with pytest.raises(ConfigError, match="give manager.secret or manager.secret_file"):
        manager_config.parse(raw, tmp_path)


def test_plaintext_off_loopback_needs_insecure(tmp_path):
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        raw = {**GOOD, "manager": {**GOOD["manager"], "listen": f"[{host}]:7070"}}
        assert not manager_config.parse(raw, tmp_path).insecure
    for host in ("0.0.0.0", "198.18.0.1", "::", "manager.example"):
        raw = {**GOOD, "manager": {**GOOD["manager"], "listen": f"[{host}]:7070"}}
        with pytest.raises(ConfigError, match=f"manager.listen {host}:7070 is not a loopback "
                                              f"address and the manager has no certificate: "
                                              f"give manager.cert and manager.key"):
            manager_config.parse(raw, tmp_path)
        raw["manager"]["insecure"] = True
        assert manager_config.parse(raw, tmp_path).insecure


def test_the_listener_limits_and_their_defaults(tmp_path):
    config = manager_config.parse(GOOD, tmp_path)
    assert (config.max_connections, config.max_connections_per_peer,
            config.request_seconds) == (512, 32, 10.0)
    raw = {**GOOD, "manager": {**GOOD["manager"], "max_connections": 0,
                               "max_connections_per_peer": 8, "request_seconds": 301,
                               "insecure": "yes", "max_conections": 5}}
    with pytest.raises(ConfigError) as err:
        manager_config.parse(raw, tmp_path)
    for said in ["manager.max_connections must be in 1..65536, not 0",
                 "manager.request_seconds must be in (0, 300], not 301",
                 "manager.insecure must be true or false, not 'yes'",
                 "manager has unknown keys max_conections (known: listen, "]:
        assert said in str(err.value), (said, str(err.value))
    raw["manager"] = {**GOOD["manager"], "max_connections": 16, "max_connections_per_peer": 17}
    with pytest.raises(ConfigError, match=r"max_connections_per_peer must be in 1..16 "
                                          r"\(max_connections\), not 17"):
        manager_config.parse(raw, tmp_path)


def test_the_pool_hands_out_disjoint_resources_in_turn():
    config = manager_config.parse({**GOOD, "manager": {**GOOD["manager"], "default_slots": 16}, "pool": {
        "slots": [0, 31], "job_ids": [1, 3], "udp_ports": [48864, 48866],
        "services": [{"ip": f"10.0.0.{250 + i}", "mac": f"02:00:00:00:00:f{i}"} for i in range(3)]}},
        None)
    pool = Allocator(config.pool)
    a = pool.allocate(16, frozenset({"m1"}), [])
    held = [Holding("a", a.job_id, a.first_slot, a.num_slots, a.udp_port, a.service.ip,
                    a.service.mac, frozenset({"m1"}))]
    b = pool.allocate(16, frozenset({"m2"}), held)
    assert (a.first_slot, b.first_slot) == (0, 16)
    assert a.job_id != b.job_id and a.udp_port != b.udp_port and a.service != b.service
    held.append(Holding("b", b.job_id, b.first_slot, b.num_slots, b.udp_port, b.service.ip,
                        b.service.mac))
    assert pool.allocate(1, frozenset({"m3"}), held) == (
        "waiting for slots: 2 jobs hold 32 of the pool's 32 slots; this job needs 1 in one range")
    assert pool.allocate(1, frozenset({"m1"}), held).startswith(
        "waiting for hosts: job a runs on m1")
    # a leaves: its slots go to c, but the id, port and address a freed come last.
    c = pool.allocate(16, frozenset({"m3"}), held[1:])
    assert c.first_slot == 0 and c.job_id not in (a.job_id, b.job_id)
    assert c.service == Service("10.0.0.252", "02:00:00:00:00:f2")


def test_tenants_each_with_a_secret_and_quotas(tmp_path):
    from innet_aggregation.switch_ctl.manager.tenants import DEFAULT, identify

    (tmp_path / "bob.secret").write_text("bob's own secret, long\n")
    raw = {**GOOD, "tenants": {"alice": {"secret": "a" * 16, "jobs": 2, "slots": 32},
                               "bob": {"secret_file": "bob.secret", "operator": True}}}
    tenants = manager_config.parse(raw, tmp_path).tenants
    assert sorted(tenants) == ["alice", "bob", DEFAULT]
    alice = tenants["alice"]
    assert (alice.jobs, alice.slots, alice.pending) == (2, 32, None)
    assert tenants["bob"].operator and not tenants["alice"].operator
    assert identify(tenants, b"bob's own secret, long") is tenants["bob"]
    assert identify(tenants, b"x" * 16) is tenants[DEFAULT]
    assert identify(tenants, b"a" * 15) is None
    # Tenants alone, without manager.secret: no default tenant.
    alone = {**raw, "manager": {"listen": "127.0.0.1:7070"}}
    assert sorted(manager_config.parse(alone, tmp_path).tenants) == ["alice", "bob"]
    bad = {**GOOD, "tenants": {"Alice": {"secret": "x" * 16, "slots": -1, "jobs": True,
                                         "colour": "red"},
                               "carol": {"operator": "yes"}, DEFAULT: {"secret": "d" * 16}}}
    with pytest.raises(ConfigError) as err:
        manager_config.parse(bad, tmp_path)
    for said in ["tenants.Alice: a tenant's name is 1-32 of a-z, 0-9, _ and -",
                 "tenants.Alice has unknown keys colour (known: secret, secret_file, operator, "
                 "jobs, slots, services, pending, priority, max_priority)",
                 "tenants.Alice.slots must be an integer, 0 or more, not -1",
                 "tenants.Alice.jobs must be an integer, 0 or more, not True",
                 "tenants default and Alice have the same secret: each tenant needs its own",
                 "tenants.carol.operator must be true or false, not 'yes'",
                 "give tenants.carol.secret or tenants.carol.secret_file (one of them)",
                 "tenants.default: manager.secret is the tenant 'default' already"]:
        assert said in str(err.value), (said, str(err.value))
    with pytest.raises(ConfigError, match="give manager.secret or manager.secret_file \\(one "
                                          "tenant\\), or \\[tenants.NAME\\] tables"):
        manager_config.parse({**GOOD, "manager": {"listen": "127.0.0.1:7070"}}, tmp_path)


def test_the_waiting_registrations_limits_and_their_defaults(tmp_path):
    config = manager_config.parse(GOOD, tmp_path)
    assert (config.join_seconds, config.max_pending, config.max_pending_per_peer) == (
        120.0, 512, 16)
    raw = {**GOOD, "manager": {**GOOD["manager"], "join_seconds": 0, "max_pending": 8,
                               "max_pending_per_peer": 9}}
    with pytest.raises(ConfigError) as err:
        manager_config.parse(raw, tmp_path)
    for said in ["manager.join_seconds must be in (0, 86400], not 0",
                 "manager.max_pending_per_peer must be in 1..8 (max_pending), not 9"]:
        assert said in str(err.value), (said, str(err.value))
