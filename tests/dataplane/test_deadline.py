"""A deadline job's release (p4src/shared/deadline.p4), packet by packet: what the
round holds goes to every worker with who is in it; a contribution after the release
gets those same bits and changes nothing; the next rounds of both shadow sets work;
a packet of an older round is dropped; a QUORUM contribution releases its round the
moment as many workers as it names are in; and a release from a host that is not the
job's, for another job's slot, for a round nobody began or in a job without a
deadline (or a quorum there, or a quorum of none) is refused and counted."""

from __future__ import annotations

import time

import numpy as np

from innet_aggregation.p4src import protocol

from .harness import SERVICE_IP

DEADLINE_MS = 50


def k() -> int:
    return protocol.packet_format().values_per_packet


def delta(before, after):
    return {name: after[name] - before[name] for name in after}


def wait_for(switch, before, name: str, count: int) -> None:
    """Until the switch has counted ``count`` more ``name`` (frames from several ports
    may be taken in any order)."""
    deadline = time.monotonic() + 10
    while delta(before, switch.counters())[name] < count:
        assert time.monotonic() < deadline, f"the switch never counted {count} {name}"
        time.sleep(0.02)


def released(results, values, bitmap: int, count: int, pkt_id: int, slot: int, set_: int):
    for r in results:
        assert r.header["msg_type"] == protocol.MSG_RELEASED, r.header
        assert (r.header["slot"], r.header["set"], r.header["pkt_id"]) == (slot, set_, pkt_id)
        assert (r.header["fingerprint"], r.header["contributions"]) == (bitmap, count)
        assert r.values is not None and (r.values == values).all()


def test_a_release_sends_the_partial_sum_and_who_is_in_it_to_every_worker(switch, hosts, job):
    config = job(3, deadline_ms=DEADLINE_MS)
    jid, slot = config.job.id, config.job.first_slot
    values = (np.arange(3 * k()).reshape(3, k()) - 100) * 3
    before, deadline_before = switch.counters(), switch.controller.deadline_counters(jid)
    for w in (0, 2):
        hosts[w].contribute(values[w], job_id=jid, slot=slot, set_=0, pkt_id=77, exponent=w)
    wait_for(switch, before, "ingress.consumed", 2)
    # Worker 0's deadline: the round goes to every worker with what it holds.
    hosts[0].contribute(values[0], job_id=jid, slot=slot, set_=0, pkt_id=77,
                        msg_type=protocol.MSG_RELEASE)
    partial = values[0] + values[2]
    for h in hosts[:3]:
        got = h.results(2, timeout=1.0)
        assert len(got) == 1, got
        released(got, partial, 0b101, 2, 77, slot, 0)
        assert got[0].src == (SERVICE_IP, config.job.udp_port)
        assert got[0].header["exponent"] == 2            # the maximum of those in it
    # Worker 1 comes late: it gets those same bits, alone; nothing changes them.
    hosts[1].contribute(values[1], job_id=jid, slot=slot, set_=0, pkt_id=77)
    released(hosts[1].results(2, timeout=1.0), partial, 0b101, 2, 77, slot, 0)
    for w in (0, 2):   # a retransmission, and a second release: the same, alone
        hosts[w].contribute(values[w], job_id=jid, slot=slot, set_=0, pkt_id=77,
                            msg_type=protocol.MSG_RELEASE if w else protocol.MsgType.CONTRIBUTION)
        released(hosts[w].results(2, timeout=1.0), partial, 0b101, 2, 77, slot, 0)
    assert all(h.results(1, timeout=0.2) == [] for h in hosts[:3])
    counted = delta(deadline_before, switch.controller.deadline_counters(jid))
    assert counted == {"released": 1, "late": 1, "stale": 0, "release_refused": 0,
                       "quorum": 0}, counted


def test_both_shadow_sets_go_on_after_a_release_and_an_older_round_is_dropped(
        switch, hosts, job):
    config = job(3, deadline_ms=DEADLINE_MS)
    jid, slot = config.job.id, config.job.first_slot
    values = np.arange(3 * k()).reshape(3, k()) + 1
    before = switch.counters()
    # Round 10 in set 0, released without worker 1, which never sends it.
    for w in (0, 2):
        hosts[w].contribute(values[w], job_id=jid, slot=slot, set_=0, pkt_id=10)
    wait_for(switch, before, "ingress.consumed", 2)
    hosts[2].contribute(values[2], job_id=jid, slot=slot, set_=0, pkt_id=10,
                        msg_type=protocol.MSG_RELEASE)
    for h in hosts[:3]:
        released(h.results(2, timeout=1.0), values[0] + values[2], 0b101, 2, 10, slot, 0)
    # Rounds 11 (set 1) and 12 (set 0) with everyone: whole sums, as without a deadline.
    for pkt_id, set_ in ((11, 1), (12, 0)):
        for w in range(3):
            hosts[w].contribute(values[w] * pkt_id, job_id=jid, slot=slot, set_=set_,
                                pkt_id=pkt_id)
        for h in hosts[:3]:
            (r,) = h.results(2, timeout=2.0)
            assert r.header["msg_type"] == protocol.MsgType.RESULT
            assert (r.header["pkt_id"], r.header["contributions"]) == (pkt_id, 3)
            assert (r.values == values.sum(axis=0) * pkt_id).all()
    # Worker 1's packet of round 10 now: older than set 0's round, dropped unanswered.
    deadline_before = switch.controller.deadline_counters(jid)
    hosts[1].contribute(values[1], job_id=jid, slot=slot, set_=0, pkt_id=10)
    assert hosts[1].results(1, timeout=0.5) == []
    counted = delta(deadline_before, switch.controller.deadline_counters(jid))
    assert counted["stale"] == 1, counted
    # Round 12's result is still what a retransmission gets.
    hosts[0].contribute(values[0] * 12, job_id=jid, slot=slot, set_=0, pkt_id=12)
    (r,) = hosts[0].results(2, timeout=1.0)
    assert (r.values == values.sum(axis=0) * 12).all()


def test_a_release_or_quorum_is_refused_unless_a_member_sends_it_in_its_deadline_job(
        switch, hosts, job):
    config = job(2, deadline_ms=DEADLINE_MS)
    jid, slot = config.job.id, config.job.first_slot
    ones = np.ones(k())
    hosts[0].contribute(ones, job_id=jid, slot=slot, set_=0, pkt_id=5)
    before, deadline_before = switch.counters(), switch.controller.deadline_counters(jid)
    release = dict(job_id=jid, set_=0, pkt_id=5, msg_type=protocol.MSG_RELEASE)
    hosts[2].contribute(ones, slot=slot, **release)                    # not the job's host
    hosts[0].contribute(ones, slot=slot + config.job.num_slots, **release)  # not its slot
    hosts[0].contribute(ones, slot=slot + 1, **release)                 # a round nobody began
    quorum = dict(job_id=jid, set_=0, pkt_id=5, quorum=1)               # a QUORUM alike
    hosts[2].contribute(ones, slot=slot, **quorum)
    hosts[0].contribute(ones, slot=slot + config.job.num_slots, **quorum)
    assert all(h.results(1, timeout=0.5) == [] for h in hosts[:3])
    counted = delta(before, switch.counters())
    assert counted["ingress.unknown_sender"] == 2 and counted["ingress.bad_slot"] == 2, counted
    assert counted["ingress.malformed"] == 1, counted
    assert delta(deadline_before, switch.controller.deadline_counters(jid)) == {
        "released": 0, "late": 0, "stale": 0, "release_refused": 1, "quorum": 0}


def test_a_job_without_a_deadline_refuses_a_release_and_a_quorum(switch, hosts, job):
    ones = np.ones(k())
    plain = job(2)
    pid, pslot = plain.job.id, plain.job.first_slot
    hosts[0].contribute(ones, job_id=pid, slot=pslot, set_=0, pkt_id=5)
    before = switch.counters()
    hosts[0].contribute(ones, job_id=pid, slot=pslot, set_=0, pkt_id=5,
                        msg_type=protocol.MSG_RELEASE)
    hosts[0].contribute(ones, job_id=pid, slot=pslot, set_=0, pkt_id=5, quorum=1)
    assert hosts[0].results(1, timeout=0.5) == []
    assert delta(before, switch.counters())["ingress.malformed"] == 2
    assert switch.controller.deadline_counters(pid)["release_refused"] == 2


def test_a_quorum_contribution_releases_its_round_once_that_many_workers_are_in(
        switch, hosts, job):
    config = job(3, deadline_ms=DEADLINE_MS)
    jid, slot = config.job.id, config.job.first_slot
    values = (np.arange(3 * k()).reshape(3, k()) - 50) * 7
    before, deadline_before = switch.counters(), switch.controller.deadline_counters(jid)
    # Round 20 (set 1): worker 2 is in, short of the quorum of 2: nothing leaves.
    hosts[2].contribute(values[2], job_id=jid, slot=slot, set_=1, pkt_id=20, exponent=3,
                        quorum=2)
    wait_for(switch, before, "ingress.consumed", 1)
    assert all(h.results(1, timeout=0.2) == [] for h in hosts[:3])
    # Worker 0 makes two: every worker gets the round as a release would send it.
    hosts[0].contribute(values[0], job_id=jid, slot=slot, set_=1, pkt_id=20, exponent=1,
                        quorum=2)
    partial = values[0] + values[2]
    for h in hosts[:3]:
        got = h.results(2, timeout=1.0)
        assert len(got) == 1, got
        released(got, partial, 0b101, 2, 20, slot, 1)
        assert got[0].header["exponent"] == 3
    # Worker 1 comes late, once plainly and once as a quorum; worker 0 resends: the
    # same bits, alone, and the round stays as it was released.
    hosts[1].contribute(values[1], job_id=jid, slot=slot, set_=1, pkt_id=20)
    released(hosts[1].results(2, timeout=1.0), partial, 0b101, 2, 20, slot, 1)
    hosts[1].contribute(values[1], job_id=jid, slot=slot, set_=1, pkt_id=20, quorum=2)
    released(hosts[1].results(2, timeout=1.0), partial, 0b101, 2, 20, slot, 1)
    hosts[0].contribute(values[0], job_id=jid, slot=slot, set_=1, pkt_id=20, quorum=2)
    released(hosts[0].results(2, timeout=1.0), partial, 0b101, 2, 20, slot, 1)
    assert all(h.results(1, timeout=0.2) == [] for h in hosts[:3])
    counted = delta(deadline_before, switch.controller.deadline_counters(jid))
    assert counted == {"released": 0, "late": 2, "stale": 0, "release_refused": 0,
                       "quorum": 1}, counted
    # Rounds 21 (set 0) and 22 (set 1): a quorum of every worker is a whole sum, with
    # the fingerprints' sum, and the set released at its quorum starts over.
    for pkt_id, set_ in ((21, 0), (22, 1)):
        for w in range(3):
            hosts[w].contribute(values[w] * pkt_id, job_id=jid, slot=slot, set_=set_,
                                pkt_id=pkt_id, fingerprint=1000 + w, quorum=3)
        for h in hosts[:3]:
            (r,) = h.results(2, timeout=2.0)
            assert r.header["msg_type"] == protocol.MsgType.RESULT, r.header
            assert (r.header["pkt_id"], r.header["contributions"]) == (pkt_id, 3)
            assert r.header["fingerprint"] == 3003
            assert (r.values == values.sum(axis=0) * pkt_id).all()


def test_a_quorum_of_nobody_is_refused(switch, hosts, job):
    timed = job(2, deadline_ms=DEADLINE_MS)
    before = switch.counters()
    hosts[0].contribute(np.ones(k()), job_id=timed.job.id, slot=timed.job.first_slot, set_=0,
                        pkt_id=5, msg_type=protocol.MSG_QUORUM)       # contributions 0
    assert hosts[0].results(1, timeout=0.5) == []
    assert delta(before, switch.counters())["ingress.malformed"] == 1
    assert switch.controller.deadline_counters(timed.job.id)["release_refused"] == 1


def test_a_slot_reset_keeps_the_round_ids_so_only_a_finished_or_quorum_round_starts_anew(
        switch, hosts, job):
    """``Controller.reset`` empties the bitmaps only (deadline.md, "A slot reset"): an
    older round stays stale and a round released by a RELEASE answers as before, but a
    finished round is taken as a new one by a worker's resend, and a QUORUM of one
    releases it at once with that worker's values alone."""
    config = job(2, num_slots=2, deadline_ms=DEADLINE_MS)
    jid, s0, s1 = config.job.id, config.job.first_slot, config.job.first_slot + 1
    values = (np.arange(2 * k()).reshape(2, k()) - 40) * 5
    whole = values.sum(axis=0)

    def finish(slot, set_, pkt_id, quorum=0):
        """Worker 1 first (a QUORUM of one first would release the round alone)."""
        consumed = switch.counters()
        hosts[1].contribute(values[1], job_id=jid, slot=slot, set_=set_, pkt_id=pkt_id)
        wait_for(switch, consumed, "ingress.consumed", 1)
        hosts[0].contribute(values[0], job_id=jid, slot=slot, set_=set_, pkt_id=pkt_id,
                            quorum=quorum)
        for h in hosts[:2]:
            (r,) = h.results(2, timeout=2.0)
            assert r.header["msg_type"] == protocol.MsgType.RESULT, r.header
            assert r.header["pkt_id"] == pkt_id and (r.values == whole).all()

    before = switch.counters()
    # (s0, set 0): round 10, then round 12; (s0, set 1): round 11, released by worker 0
    # alone; (s1, set 0) and (s1, set 1): rounds 20 and 21, finished by worker 0's QUORUM.
    hosts[0].contribute(values[0], job_id=jid, slot=s0, set_=0, pkt_id=10)
    wait_for(switch, before, "ingress.consumed", 1)
    finish(s0, 0, 12)
    hosts[0].contribute(values[0], job_id=jid, slot=s0, set_=1, pkt_id=11)
    wait_for(switch, before, "ingress.consumed", 3)
    hosts[0].contribute(values[0], job_id=jid, slot=s0, set_=1, pkt_id=11,
                        msg_type=protocol.MSG_RELEASE)
    for h in hosts[:2]:
        released(h.results(2, timeout=1.0), values[0], 0b01, 1, 11, s0, 1)
    finish(s1, 0, 20, quorum=1)
    finish(s1, 1, 21, quorum=1)
    # Before the reset a resend of a finished round gets its whole result.
    hosts[0].contribute(values[0], job_id=jid, slot=s1, set_=0, pkt_id=20)
    (r,) = hosts[0].results(2, timeout=1.0)
    assert r.header["msg_type"] == protocol.MsgType.RESULT and (r.values == whole).all()

    before, deadline_before = switch.counters(), switch.controller.deadline_counters(jid)
    assert switch.controller.reset(config) == 2
    assert delta(before, switch.counters())["ingress.slot_reset"] == 2
    # Round 10 is older than its (slot, set)'s round: stale, unanswered.
    hosts[1].contribute(values[1], job_id=jid, slot=s0, set_=0, pkt_id=10)
    assert hosts[1].results(1, timeout=0.5) == []
    # Round 11 was released: a late contribution gets the same bits.
    hosts[1].contribute(values[1], job_id=jid, slot=s0, set_=1, pkt_id=11)
    released(hosts[1].results(2, timeout=1.0), values[0], 0b01, 1, 11, s0, 1)
    # Round 20 finished: worker 0's resend is now its first contribution, unanswered,
    # and its release returns its values alone.
    hosts[0].contribute(values[0], job_id=jid, slot=s1, set_=0, pkt_id=20)
    assert hosts[0].results(1, timeout=0.5) == []
    hosts[0].contribute(values[0], job_id=jid, slot=s1, set_=0, pkt_id=20,
                        msg_type=protocol.MSG_RELEASE)
    for h in hosts[:2]:
        released(h.results(2, timeout=1.0), values[0], 0b01, 1, 20, s1, 0)
    # Round 21 finished: worker 0's resend as a QUORUM of one releases it at once, alone.
    hosts[0].contribute(values[0], job_id=jid, slot=s1, set_=1, pkt_id=21, quorum=1)
    for h in hosts[:2]:
        released(h.results(2, timeout=1.0), values[0], 0b01, 1, 21, s1, 1)
    counted = delta(deadline_before, switch.controller.deadline_counters(jid))
    assert counted == {"released": 1, "late": 1, "stale": 1, "release_refused": 0,
                       "quorum": 1}, counted
