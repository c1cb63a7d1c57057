"""Packets the switch must refuse, each counted, with the next aggregation still exact."""

from __future__ import annotations

import numpy as np

from innet_aggregation.p4src import protocol

from .harness import contribution


def k() -> int:
    return protocol.packet_format().values_per_packet


def assert_next_round_exact(hosts, config, set_=0):
    values = np.arange(config.job.num_workers * k()).reshape(config.job.num_workers, k()) - 77
    for i in range(config.job.num_workers):
        hosts[i].contribute(values[i], job_id=config.job.id, slot=config.job.first_slot,
                            set_=set_)
    for i in range(config.job.num_workers):
        (r,) = hosts[i].results(1)
        np.testing.assert_array_equal(r.values, values.sum(axis=0))
        assert r.header["contributions"] == config.job.num_workers


def delta(before, after, name):
    return after[name] - before[name]


def test_refused_packets_are_dropped_counted_and_harmless(switch, hosts, job):
    config = job(2)
    jid, slot, port = config.job.id, config.job.first_slot, config.job.udp_port
    ones = np.ones(k())
    good = contribution(ones, job_id=jid, slot=slot, set_=0)
    before = switch.counters()

    # Foreign senders: right job, wrong source port / spoofed source IP / a host
    # that is not a worker of this job.
    hosts[0].send_frame(hosts[0].frame(good, src_port=40001))
    hosts[0].send_frame(hosts[0].frame(good, src_ip=hosts[1].host.ip))
    hosts[2].send_frame(hosts[2].frame(good))
    # Short: header but only part of the values; header cut in half.
    hosts[0].send_frame(hosts[0].frame(good[:-8]))
    hosts[0].send_frame(hosts[0].frame(good[:5]))
    # A result sent to the switch, as if it were a contribution.
    fmt = protocol.packet_format()
    fake_result = fmt.pack(np.ones((1, k()), dtype=np.int32), msg_type=protocol.MsgType.RESULT,
                           job_id=jid, slot=slot, set=0).tobytes()
    hosts[0].send_frame(hosts[0].frame(fake_result))
    # Slots outside the job's range, and outside the whole pool.
    for bad_slot in (slot + config.job.num_slots, slot - 1 if slot else 1023, 0x7FFF):
        hosts[0].contribute(ones, job_id=jid, slot=bad_slot, set_=0)
    # Unknown job, and the right job on another port of the aggregation range.
    hosts[0].contribute(ones, job_id=(jid + 100) % 256, slot=slot, set_=0)
    hosts[0].contribute(ones, job_id=jid, slot=slot, set_=0, dst_port=port + 1)

    assert all(h.results(1, timeout=0.3) == [] for h in hosts[:3])
    after = switch.counters()
    assert delta(before, after, "ingress.unknown_sender") == 3
    assert delta(before, after, "ingress.malformed") == 3
    assert delta(before, after, "ingress.bad_slot") == 3
    assert delta(before, after, "ingress.unknown_job") == 2
    assert delta(before, after, "ingress.consumed") == 0

    assert_next_round_exact(hosts, config)


def test_longer_packet_than_the_format_is_malformed(switch, hosts, job):
    config = job(2)
    payload = contribution(np.ones(k()), job_id=config.job.id, slot=config.job.first_slot,
                           set_=0) + b"\x00" * 4
    before = switch.counters()
    hosts[0].send_frame(hosts[0].frame(payload))
    assert hosts[0].results(1, timeout=0.3) == []
    assert delta(before, switch.counters(), "ingress.malformed") == 1
    assert_next_round_exact(hosts, config)
