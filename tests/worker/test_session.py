"""Sessions on loopback, with no switch at all: what must happen without one."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.worker import (AggregationSession, AggregationTimeout, RetransmitPolicy,
                                      SendRefused, TransportBroken)
from innet_aggregation.worker.transport import RtoEstimator

pytestmark = pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(),
                                reason=f"{protocol.PROGRAM_JSON} is missing: run 'make p4'")


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session(peer_timeout: float = 1.0) -> AggregationSession:
    """Worker 0 of 2, whose 'switch' is a loopback port nobody listens on."""
    policy = RetransmitPolicy(initial_rto=0.1, min_rto=0.05, max_rto=0.2,
                              peer_timeout=peer_timeout)
    return AggregationSession(0, 2, "127.0.0.1", 1, protocol.AGG_UDP_PORT_BASE, 0, 16,
                              "127.0.0.1", free_udp_port(), policy=policy)


def test_an_unreachable_switch_ends_the_call_and_the_session():
    s = session(peer_timeout=1.0)
    values = np.arange(1000, dtype=np.float32)
    start = time.monotonic()
    # The first call starts the session: two rounds over every slot of the window.
    with pytest.raises(AggregationTimeout, match=r"session start: no result for 16 slot\(s\) "
                                                 r"\[0, 1, 2, .*after \d+\.\d s \(peer_timeout 1 s.*"
                                                 r"has not said whom it waits for.*switch_ctl reset"):
        s.allreduce(values)
    assert time.monotonic() - start >= 1.0     # it waited the configured time, then gave up
    np.testing.assert_array_equal(values, np.arange(1000, dtype=np.float32))  # untouched
    assert s.stats.retransmissions > 0 and s.stats.results_received == 0
    # Loopback's ICMP port-unreachable errors came back on the socket: counted as
    # losses, not raised.
    assert s.stats.socket_errors > 0
    # The switch's slot state is unknown now: no further call is attempted.
    with pytest.raises(TransportBroken, match="switch_ctl reset"):
        s.allreduce(np.ones(10, dtype=np.float32))
    s.close()


def test_an_empty_tensor_needs_no_packet():
    with session() as s:
        empty = np.zeros(0, dtype=np.float32)
        assert s.allreduce(empty) is empty
        assert s.stats.packets_sent == 0


def test_what_cannot_be_aggregated_is_refused_before_sending():
    with session() as s:
        with pytest.raises(TypeError, match="float16/32/64"):
            s.allreduce(np.arange(10))
        frozen = np.ones(10, dtype=np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            s.allreduce(frozen)
        with pytest.raises(TypeError, match="torch tensor or numpy array"):
            s.allreduce([1.0, 2.0])
        assert s.stats.packets_sent == 0
        torch = pytest.importorskip("torch", reason="the [torch] extra is not installed")
        with pytest.raises(TypeError, match="floating point"):
            s.allreduce_async(torch.arange(10)).wait()
        with pytest.raises(TypeError, match="strided .* not torch.sparse_coo"):
            s.allreduce(torch.ones(3, 4).to_sparse())
        # Elements that share memory: their sums could not each be written back.
        shared = r"elements may share memory \(shape \(4, 3\), strides \(0, 1\)"
        with pytest.raises(ValueError, match=shared):
            s.allreduce(torch.ones(3).expand(4, 3))
        with pytest.raises(ValueError, match=shared):
            s.allreduce(np.lib.stride_tricks.as_strided(np.ones(3, np.float32), (4, 3), (0, 4)))
        assert s.stats.packets_sent == 0


@pytest.mark.parametrize("shape, strides, shared", [
    ((4, 3), (3, 1), False), ((4, 3), (1, 4), False), ((3, 4), (5, 1), False),  # gaps
    ((2, 3, 4, 5), (60, 1, 15, 3), False), ((), (), False), ((0, 3), (0, 0), False),
    ((4, 1), (1, 0), False), ((4, 3), (0, 1), True), ((4, 3), (1, 1), True),
    ((4, 3), (2, 1), True), ((3, 3), (-3, 1), False)])
def test_overlapping_strides_are_told_apart(shape, strides, shared):
    from innet_aggregation.worker.session import overlapping
    assert overlapping(shape, strides) == shared


def test_rto_follows_rfc6298_and_backs_off_once_per_period():
    rto = RtoEstimator(RetransmitPolicy(initial_rto=1.0, min_rto=0.01, max_rto=4.0))
    assert rto.rto == 1.0
    rto.sample(0.1)                         # SRTT = R, RTTVAR = R/2, RTO = SRTT + 4 RTTVAR
    assert rto.srtt == pytest.approx(0.1) and rto.rto == pytest.approx(0.3)
    rto.sample(0.2)
    assert rto.rttvar == pytest.approx(0.75 * 0.05 + 0.25 * 0.1)
    assert rto.srtt == pytest.approx(0.875 * 0.1 + 0.125 * 0.2)
    assert rto.rto == pytest.approx(rto.srtt + 4 * rto.rttvar)
    before = rto.rto
    rto.timed_out(now=100.0)
    rto.timed_out(now=100.0 + before)       # the same burst of timeouts: no second doubling
    assert rto.rto == pytest.approx(2 * before)
    rto.timed_out(now=100.0 + 3 * before)
    assert rto.rto == pytest.approx(4 * before)
    for now in range(200, 300, 10):
        rto.timed_out(now=float(now))
    assert rto.rto == 4.0                   # capped
    rto.sample(0.1)                         # a fresh sample resets it
    assert rto.rto < 1.0


def test_rto_floor_follows_the_round_trip_not_a_constant():
    rto = RtoEstimator(RetransmitPolicy(initial_rto=0.5, min_rto=0.0001, max_rto=2.0))
    for _ in range(100):                    # steady round trips: RTTVAR decays to 0
        rto.sample(0.002)
    assert rto.rto == pytest.approx(0.004)  # twice the smoothed RTT, far below 100 ms
    assert rto.reorder_window == pytest.approx(0.0005)   # RACK: min RTT / 4


def test_a_worker_takes_the_job_programs_size_and_refuses_another():
    from innet_aggregation.testbed import layout
    from innet_aggregation.switch_ctl import config as config_mod

    raw = layout.job_config_dict({1: "p1", 2: "p2"}, "127.0.0.1:9", 0, values_per_packet=64)
    raw["job"]["workers"][0]["ip"] = "127.0.0.1"
    raw["job"]["service_ip"] = "127.0.0.2"          # loopback: nothing is sent
    raw["job"]["workers"][0]["udp_port"] = free_udp_port()
    config = config_mod.parse(raw)
    with AggregationSession.from_config(config, 0) as s:
        assert s.fmt.values_per_packet == 64
    with pytest.raises(ValueError, match="job 1's switch program carries 64 values per packet, "
                                         "this worker's 256"):
        AggregationSession.from_config(config, 0, packet_format=protocol.packet_format(256))


@pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root")
def test_a_route_whose_mtu_cannot_carry_the_packets_is_refused_at_setup():
    """Not IP fragments that the switch cannot parse: the worker's socket never fragments,
    and a route too small for one packet stops the session before it sends."""
    from innet_aggregation.testbed.netns import Namespaces, in_netns

    fmt = protocol.packet_format(256)
    needed = 20 + 8 + fmt.payload_bytes
    with Namespaces(1, mtu=needed - 1) as topo, in_netns(topo.hosts[0].netns):
        with pytest.raises(ValueError, match=rf"packets \(256 values\) need an MTU of {needed} B; "
                                             rf"the route to 10\.0\.0\.100 has {needed - 1} B"):
            AggregationSession(0, 2, "10.0.0.100", 1, protocol.AGG_UDP_PORT_BASE, 0, 16,
                               topo.hosts[0].ip, 40000, packet_format=fmt)
    with Namespaces(1, mtu=needed) as topo, in_netns(topo.hosts[0].netns):
        AggregationSession(0, 2, "10.0.0.100", 1, protocol.AGG_UDP_PORT_BASE, 0, 16,
                           topo.hosts[0].ip, 40000, packet_format=fmt).close()


@pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root")
def test_an_mtu_lowered_under_a_session_ends_its_call_at_once_and_a_route_mtu_does_not():
    """A route's MTU locked at 552 B (what one forged ICMP "fragmentation needed"
    made of it before) is ignored by a running worker: it sends on, and only the
    missing switch ends its call, at peer_timeout. Its interface's MTU lowered
    below the packets makes every send fail with EMSGSIZE: the call ends at once,
    naming it and the destination."""
    from innet_aggregation.testbed.netns import Namespaces, in_netns

    fmt = protocol.packet_format(256)
    policy = RetransmitPolicy(initial_rto=0.05, min_rto=0.05, max_rto=0.1, peer_timeout=1.0)
    with Namespaces(1) as topo, in_netns(topo.hosts[0].netns):
        host = topo.hosts[0]

        def open_session():
            return AggregationSession(0, 2, "10.0.0.100", 1, protocol.AGG_UDP_PORT_BASE, 0, 16,
                                      host.ip, free_udp_port(), packet_format=fmt, policy=policy)

        s = open_session()
        host.run(["ip", "route", "add", "10.0.0.100/32", "dev", host.ifname, "mtu", "lock",
                  "552"], check=True)
        with pytest.raises(AggregationTimeout):
            s.allreduce(np.ones(1000, dtype=np.float32))
        assert s.stats.packets_sent > 16 and s.stats.socket_errors == 0
        s.close()
        host.run(["ip", "route", "del", "10.0.0.100/32"], check=True)

        s = open_session()
        host.run(["ip", "link", "set", host.ifname, "mtu", "576"], check=True)
        start = time.monotonic()
        with pytest.raises(SendRefused, match=r"worker 0, session start: sending to "
                                              r"10\.0\.0\.100:\d+ fails with EMSGSIZE \(Message "
                                              r"too long\) 3 times in a row.*1066 B packets"):
            s.allreduce(np.ones(1000, dtype=np.float32))
        assert time.monotonic() - start < 0.5
        with pytest.raises(TransportBroken):
            s.allreduce(np.ones(10, dtype=np.float32))
        s.close()
