"""The testbed's generated job configuration: valid TOML that the controller accepts."""

from __future__ import annotations

import tomllib

import pytest
import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl import config as config_mod
from innet_aggregation.switch_ctl import jobfile

from innet_aggregation.testbed import layout


@pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_generated_config_round_trips_and_validates():
    raw = layout.job_config_dict({1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"},
                                 "127.0.0.1:9559", 0, job_id=7, num_slots=64)
    config = config_mod.parse(tomllib.loads(tomli_w.dumps(raw)))
    assert [w.switch_port for w in config.job.workers] == [1, 2, 3]
    assert [w.ip for w in config.job.workers] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert config.job.num_slots == 64 and config.job.id == 7


@pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_generated_tree_validates_and_routes_every_worker():
    switches = {name: (f"127.0.0.1:{9560 + i}", 0)
                for i, name in enumerate(("spine", "leaf0", "leaf1"))}
    raw = layout.tree_config_dict(switches, leaves=2, per_leaf=4, job_id=3, num_slots=32,
                                  loss={"leaf1": {"egress": 0.01}})
    tree = jobfile.load_text(tomli_w.dumps(raw))
    assert list(tree.switches) == ["spine", "leaf0", "leaf1"]
    assert tree.num_workers == 8 and tree.for_worker(5) is tree.switches["leaf1"]
    spine, leaf0, leaf1 = tree.switches.values()
    # The spine's contributors are the leaves, at the leaves' service addresses.
    assert [(w.id, w.ip, w.switch_port) for w in spine.job.workers] == [
        (0, "10.0.0.240", 1), (1, "10.0.0.241", 2)]
    assert spine.job.parent is None and leaf1.job.parent.ip == layout.SERVICE_IP
    assert leaf1.job.parent.port == 5 and leaf1.job.num_workers == 8
    assert [w.id for w in leaf1.job.workers] == [4, 5, 6, 7]
    # L2: every other switch's worker by the port towards it.
    assert dict(leaf0.l2_routes) == {layout.host_mac(g): 5 for g in range(5, 9)}
    assert dict(spine.l2_routes) == {layout.host_mac(g): 1 + (g > 4) for g in range(1, 9)}
    assert (leaf1.loss.egress, leaf0.loss.egress) == (0.01, 0.0)


@pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_links_too_small_for_the_packets_are_refused_naming_both_sizes():
    fmt = protocol.packet_format(256)
    layout.check_mtu({"h1-eth0": "1500\n", "h2-eth0": "1066"}, fmt)     # 20 + 8 + 1038
    with pytest.raises(ValueError, match="256 values.* need an MTU of 1066 B; h2-eth0 has 1065 B"):
        layout.check_mtu({"h1-eth0": "1500", "h2-eth0": "1065"}, fmt)


@pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_the_job_names_its_program_size_and_another_size_is_a_clear_error():
    raw = layout.job_config_dict({1: "s1-eth1"}, "127.0.0.1:9559", 0, values_per_packet=64)
    assert config_mod.parse(raw).job.values_per_packet == 64
    assert config_mod.parse(layout.job_config_dict({1: "s1-eth1"}, "127.0.0.1:9559", 0)
                            ).job.values_per_packet == protocol.packet_format().values_per_packet
    with pytest.raises(ValueError, match="no compiled program carries 100 values per packet "
                                         r"\(the builds here carry 64, 256"):
        protocol.program(100)
    raw["job"]["values_per_packet"] = "64"
    with pytest.raises(config_mod.ConfigError, match="values_per_packet must be a positive"):
        config_mod.parse(raw)


@pytest.mark.skipif(not protocol.JUMBO_PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_links_get_the_mtu_the_programs_packets_need():
    """Ethernet's 1500 B while the packets fit, else just enough: a jumbo MTU."""
    assert layout.link_mtu(protocol.packet_format(256)) == 1500      # 1,066 B needed
    assert layout.link_mtu(protocol.packet_format(1024)) == 20 + 8 + 14 + 4 * 1024


def test_the_default_window_holds_at_most_128_kib_of_values():
    """128 slots, fewer where their packets would hold more than 128 KiB; BMv2's own."""
    assert layout.default_window(8, "softswitch", 64) == 128
    assert layout.default_window(8, "softswitch", 256) == 128
    assert layout.default_window(8, "softswitch", 1024) == 32
    assert layout.default_window(4, "bmv2", 1024) == 16


@pytest.mark.skipif(not protocol.JUMBO_PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_a_testbed_runs_the_jumbo_build_on_the_softswitch_and_the_default_on_bmv2():
    """Where a testbed sets the links' MTU, the embedded switch gets the packets that cost
    it least per value; BMv2, as fast per value at either size, keeps Ethernet's MTU."""
    from innet_aggregation.testbed import topology
    from innet_aggregation.experiments import demo, loss as loss_experiment
    assert layout.default_values_per_packet("softswitch") == 1024
    assert layout.default_values_per_packet("softswitch-python") == 1024
    assert layout.default_values_per_packet("bmv2") == protocol.program().values_per_packet == 256
    assert layout.link_mtu(protocol.packet_format(1024)) == 4138
    for parser in (demo._parser(), loss_experiment._parser(), topology._parser()):
        assert parser.parse_args([]).values is None                 # the target's default
        assert parser.parse_args(["--values", "256"]).values == 256


@pytest.mark.skipif(not protocol.JUMBO_PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_the_limit_with_headers_takes_gloos_segments_on_the_same_links():
    """bench-allreduce's limit: the aggregation frames per KiB of values against TCP's
    frames per payload at the MTU the packet size's testbed gives its links."""
    from innet_aggregation.experiments.baseline import limits
    pure, with_headers = limits(4, 256)
    assert pure == pytest.approx(2 / 3)
    assert with_headers == pytest.approx(2 / 3 * (1080 / 1024) / (1514 / 1448))
    pure, with_headers = limits(8, 1024)                 # a 4,138 B MTU for both
    assert with_headers == pytest.approx(8 / 14 * (4152 / 4096) / (4152 / 4086))


def test_a_deadline_is_in_the_job_only_where_one_is_set():
    """A job without a deadline is the same file as before; one with names it in [job]."""
    star = {1: "s1-eth1", 2: "s1-eth2"}
    assert "deadline_ms" not in layout.job_config_dict(star, "127.0.0.1:9559", 0)["job"]
    assert layout.job_config_dict(star, "127.0.0.1:9559", 0, deadline_ms=40.0)["job"]["deadline_ms"] == 40.0
    switches = {name: ("127.0.0.1:9560", 0) for name in ("spine", "leaf0", "leaf1")}
    assert "deadline_ms" not in layout.tree_config_dict(switches, 2, 2)["job"]
    assert layout.tree_config_dict(switches, 2, 2, deadline_ms=25.0)["job"]["deadline_ms"] == 25.0
