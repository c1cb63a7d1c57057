"""A retransmission for a (slot, set) the switch has not finished: dropped, or, if it
asks (``contributions`` not 0), answered to its sender alone with a short WAITING
reply holding the bitmap of the workers that have contributed."""

from __future__ import annotations

import time

import numpy as np

from innet_aggregation.p4src import protocol

from .harness import SERVICE_IP


def k() -> int:
    return protocol.packet_format().values_per_packet


def delta(before, after):
    return {name: after[name] - before[name] for name in after}


def test_a_duplicate_that_asks_is_answered_with_who_has_contributed(switch, hosts, job):
    config = job(3)
    jid, slot = config.job.id, config.job.first_slot
    fmt = protocol.packet_format()
    values = np.arange(3 * k()).reshape(3, k())
    before = switch.counters()

    # Worker 0's first packet asks, but is no duplicate: consumed, no reply. Its
    # retransmissions: two that do not ask (dropped), then three that ask.
    hosts[0].contribute(values[0], job_id=jid, slot=slot, set_=1, pkt_id=77, asks=True)
    for asks in (False, False, True, True, True):
        hosts[0].contribute(values[0], job_id=jid, slot=slot, set_=1, pkt_id=77, asks=asks)
    replies = hosts[0].results(4, timeout=1.0)
    assert len(replies) == 3
    for r in replies:
        assert r.values is None and r.size == fmt.header_bytes     # the header alone
        assert r.header["msg_type"] == protocol.MsgType.WAITING
        assert (r.header["slot"], r.header["set"], r.header["pkt_id"]) == (slot, 1, 77)
        assert r.header["fingerprint"] == 0b001         # who has contributed: worker 0
        assert r.header["contributions"] == 1
        assert r.src == (SERVICE_IP, config.job.udp_port)
    assert hosts[1].results(1, timeout=0.2) == [] and hosts[2].results(1, timeout=0.2) == []

    # Worker 2 comes; once the switch has it (frames from two ports may be taken in
    # either order), worker 0 asks again: now 0 and 2 have contributed.
    hosts[2].contribute(values[2], job_id=jid, slot=slot, set_=1, pkt_id=77)
    deadline = time.monotonic() + 10
    while delta(before, switch.counters())["ingress.consumed"] < 2:
        assert time.monotonic() < deadline, "the switch did not take worker 2's contribution"
        time.sleep(0.05)
    hosts[0].contribute(values[0], job_id=jid, slot=slot, set_=1, pkt_id=77, asks=True)
    (r,) = hosts[0].results(2, timeout=1.0)
    assert r.header["msg_type"] == protocol.MsgType.WAITING
    assert (r.header["fingerprint"], r.header["contributions"]) == (0b101, 2)

    # The last worker completes the slot exactly; asking for a finished slot gets
    # the result again, as any retransmission does.
    hosts[1].contribute(values[1], job_id=jid, slot=slot, set_=1, pkt_id=77)
    for i in range(3):
        (r,) = hosts[i].results(2, timeout=2.0)
        assert r.header["msg_type"] == protocol.MsgType.RESULT
        np.testing.assert_array_equal(r.values, values.sum(axis=0))
    hosts[2].contribute(values[2], job_id=jid, slot=slot, set_=1, pkt_id=77, asks=True)
    (r,) = hosts[2].results(2, timeout=2.0)
    assert r.header["msg_type"] == protocol.MsgType.RESULT
    np.testing.assert_array_equal(r.values, values.sum(axis=0))

    changed = delta(before, switch.counters())
    assert changed["ingress.consumed"] == 2
    assert changed["ingress.duplicate_dropped"] == 2
    assert changed["ingress.waiting_sent"] == 4
    assert changed["egress.waiting_reply"] == 4
    assert changed["ingress.completed"] == 1
    assert changed["ingress.resent"] == 1


def test_a_worker_cannot_send_a_waiting_reply(switch, hosts, job):
    config = job(2)
    fmt = protocol.packet_format()
    waiting = fmt.pack(count=1, msg_type=int(protocol.MsgType.WAITING), job_id=config.job.id,
                       slot=config.job.first_slot, set=0).tobytes()
    before = switch.counters()
    hosts[0].send_frame(hosts[0].frame(waiting[:fmt.header_bytes]))   # the right length
    hosts[0].send_frame(hosts[0].frame(waiting))                      # with values
    assert hosts[0].results(1, timeout=0.3) == []
    assert delta(before, switch.counters())["ingress.malformed"] == 2
