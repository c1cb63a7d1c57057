"""The leaf role, packet by packet, on a real switch target: a host of the topology
plays the parent switch, so every frame between leaf and parent is seen and forged
exactly."""

from __future__ import annotations

import numpy as np
import pytest

from innet_aggregation.p4src import protocol

from .harness import SERVICE_IP, TestHost, contribution

WORKERS = 3
TOTAL = 7           # the whole tree's workers, as the parent's result reports them
PARENT = 7          # host index playing the parent switch


def k() -> int:
    return protocol.packet_format().values_per_packet


@pytest.fixture
def leaf(job, hosts):
    """A 3-worker leaf job whose parent is host 7, and that host's view of it: a UDP
    socket on the job's port (where partial sums arrive) and a raw socket."""
    config = job(WORKERS, parent=hosts[PARENT].host, total_workers=TOTAL)
    parent = TestHost(hosts[PARENT].host, udp_port=config.job.udp_port)
    yield config, parent
    parent.close()


def send_result(parent: TestHost, config, slot, set_, values, *, pkt_id, exponent,
                src_ip=None):
    payload = contribution(values, job_id=config.job.id, slot=slot, set_=set_, pkt_id=pkt_id,
                           exponent=exponent, msg_type=protocol.MsgType.RESULT,
                           contributions=TOTAL)
    parent.send_frame(parent.frame(payload, dst_port=config.job.udp_port, src_ip=src_ip))


def contribute_all(hosts, config, slot, set_, values, exponents, pkt_id):
    for i in range(WORKERS):
        hosts[i].contribute(values[i], job_id=config.job.id, slot=slot, set_=set_,
                            pkt_id=pkt_id, exponent=exponents[i], dst_port=config.job.udp_port)


def test_leaf_sends_its_sum_up_and_hands_down_the_parents_result(switch, hosts, leaf):
    config, parent = leaf
    slot = config.job.first_slot
    rng = np.random.default_rng(13)
    values = rng.integers(-2**26, 2**26, size=(WORKERS, k()))
    exponents = [3, -7, 5]
    before = switch.counters()

    contribute_all(hosts, config, slot, 1, values, exponents, pkt_id=0x1234)

    # One partial sum reaches the parent, from the leaf's service address ...
    (up,) = parent.results(2, timeout=3)
    np.testing.assert_array_equal(up.values, values.sum(axis=0))
    assert up.header["msg_type"] == protocol.MsgType.CONTRIBUTION
    assert up.header["exponent"] == max(exponents)
    assert up.header["contributions"] == WORKERS
    assert (up.header["slot"], up.header["set"], up.header["pkt_id"]) == (slot, 1, 0x1234)
    assert up.src == (SERVICE_IP, config.job.udp_port)
    # ... and nothing reaches the workers yet.
    assert all(hosts[i].results(1, timeout=0.3) == [] for i in range(WORKERS))

    # A worker's retransmission before the parent answered resends the partial up.
    hosts[1].contribute(values[1], job_id=config.job.id, slot=slot, set_=1, pkt_id=0x1234,
                        exponent=exponents[1], dst_port=config.job.udp_port)
    (again,) = parent.results(2, timeout=3)
    np.testing.assert_array_equal(again.values, up.values)
    assert again.header["exponent"] == max(exponents)

    # The parent's result goes to every worker of the leaf, from the leaf.
    total = rng.integers(-2**28, 2**28, size=k())
    send_result(parent, config, slot, 1, total, pkt_id=0x1234, exponent=9)
    for i in range(WORKERS):
        (r,) = hosts[i].results(2, timeout=3)
        np.testing.assert_array_equal(r.values, total)
        assert r.header["msg_type"] == protocol.MsgType.RESULT
        assert (r.header["exponent"], r.header["contributions"]) == (9, TOTAL)
        assert r.src == (SERVICE_IP, config.job.udp_port)

    # A second copy of it (the parent answering the resent partial) is dropped ...
    send_result(parent, config, slot, 1, total + 1, pkt_id=0x1234, exponent=9)
    assert all(hosts[i].results(1, timeout=0.3) == [] for i in range(WORKERS))
    # ... and a worker that lost its copy gets the stored result, not the partial sum.
    hosts[2].contribute(values[2], job_id=config.job.id, slot=slot, set_=1, pkt_id=0x1234,
                        exponent=exponents[2], dst_port=config.job.udp_port)
    (resent,) = hosts[2].results(2, timeout=3)
    np.testing.assert_array_equal(resent.values, total)
    assert (resent.header["exponent"], resent.header["contributions"]) == (9, TOTAL)
    assert parent.results(1, timeout=0.3) == []

    after = switch.counters()
    delta = {name: after[name] - before[name] for name in after}
    assert delta["ingress.consumed"] == WORKERS - 1
    assert delta["ingress.sent_up"] == 1
    assert delta["ingress.resent_up"] == 1
    assert delta["ingress.parent_result"] == 1
    assert delta["ingress.duplicate_dropped"] == 1
    assert delta["ingress.resent"] == 1
    assert delta["egress.upstream"] == 2
    assert delta["egress.multicast_copy"] == WORKERS
    assert delta["ingress.completed"] == 0


def test_the_next_round_clears_the_stored_result(switch, hosts, leaf):
    """The slot's other set then the same set again: a new partial, not the old result."""
    config, parent = leaf
    slot = config.job.first_slot + 1
    for round_, set_ in enumerate((0, 1, 0)):
        values = np.full((WORKERS, k()), round_ + 1) * np.arange(1, WORKERS + 1)[:, None]
        contribute_all(hosts, config, slot, set_, values, [0] * WORKERS, pkt_id=round_)
        (up,) = parent.results(2, timeout=3)
        np.testing.assert_array_equal(up.values, values.sum(axis=0))
        assert (up.header["set"], up.header["pkt_id"]) == (set_, round_)
        send_result(parent, config, slot, set_, up.values * 10, pkt_id=round_, exponent=0)
        for i in range(WORKERS):
            (r,) = hosts[i].results(2, timeout=3)
            np.testing.assert_array_equal(r.values, up.values * 10)


def test_stale_and_forged_results_are_refused(switch, hosts, leaf):
    config, parent = leaf
    slot = config.job.first_slot + 2
    before = switch.counters()
    # A parent result for a round the leaf has not completed (one worker of three).
    hosts[0].contribute(np.ones(k()), job_id=config.job.id, slot=slot, set_=0,
                        dst_port=config.job.udp_port)
    send_result(parent, config, slot, 0, np.ones(k()), pkt_id=0, exponent=0)
    # A worker sending a result; a non-member host; the parent from a wrong address.
    payload = contribution(np.ones(k()), job_id=config.job.id, slot=slot, set_=0,
                           msg_type=protocol.MsgType.RESULT)
    hosts[1].send_frame(hosts[1].frame(payload, dst_port=config.job.udp_port))
    hosts[5].send_frame(hosts[5].frame(payload, dst_port=config.job.udp_port))
    send_result(parent, config, slot, 0, np.ones(k()), pkt_id=0, exponent=0,
                src_ip="10.0.0.99")
    # The parent sending a contribution.
    parent.contribute(np.ones(k()), job_id=config.job.id, slot=slot, set_=0,
                      dst_port=config.job.udp_port)
    assert all(hosts[i].results(1, timeout=0.5) == [] for i in range(WORKERS))
    assert parent.results(1, timeout=0.1) == []

    after = switch.counters()
    delta = {name: after[name] - before[name] for name in after}
    assert delta["ingress.consumed"] == 1
    assert delta["ingress.duplicate_dropped"] == 1     # the stale result
    assert delta["ingress.malformed"] == 2             # worker's result, parent's contribution
    assert delta["ingress.unknown_sender"] == 2        # non-member, wrong parent address
    assert delta["ingress.parent_result"] == 0
    # The round still completes normally afterwards.
    for i in (1, 2):
        hosts[i].contribute(np.ones(k()), job_id=config.job.id, slot=slot, set_=0,
                            dst_port=config.job.udp_port)
    (up,) = parent.results(2, timeout=3)
    np.testing.assert_array_equal(up.values, np.full(k(), 3))


def test_the_parents_waiting_reply_is_dropped_and_counted(switch, hosts, leaf):
    """The parent answers a resent partial sum with WAITING when another child is
    missing; its bits name child switches, not workers, so the leaf drops it."""
    config, parent = leaf
    fmt = protocol.packet_format()
    waiting = fmt.pack(count=1, msg_type=int(protocol.MsgType.WAITING), job_id=config.job.id,
                       slot=config.job.first_slot + 3, set=0, fingerprint=0b01).tobytes()
    before = switch.counters()
    parent.send_frame(parent.frame(waiting[:fmt.header_bytes], dst_port=config.job.udp_port))
    parent.send_frame(parent.frame(waiting, dst_port=config.job.udp_port))   # too long
    assert all(hosts[i].results(1, timeout=0.3) == [] for i in range(WORKERS))
    changed = {name: after - before[name] for name, after in switch.counters().items()}
    assert changed["ingress.parent_waiting"] == 1
    assert changed["ingress.malformed"] == 1
