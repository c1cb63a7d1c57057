"""Aggregation semantics of the P4 program, packet by packet, on a real switch target."""

from __future__ import annotations

import numpy as np
import pytest

from innet_aggregation.p4src import protocol

from .harness import SERVICE_IP, WORKER_UDP_PORT

INT32_MAX = 2**31 - 1
INT32_MIN = -2**31

def k() -> int:
    return protocol.packet_format().values_per_packet


def run_round(hosts, config, slot, set_, values, exponents=None, pkt_id=7):
    """Every worker of ``config`` contributes; returns each worker's results."""
    n = config.job.num_workers
    exponents = exponents if exponents is not None else [0] * n
    for i in range(n):
        hosts[i].contribute(values[i], job_id=config.job.id, slot=slot, set_=set_,
                            pkt_id=pkt_id, exponent=exponents[i], dst_port=config.job.udp_port)
    return [hosts[i].results(1) for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_exact_sum_reaches_every_worker(switch, hosts, job, n):
    config = job(n)
    rng = np.random.default_rng(n)
    values = rng.integers(-2**27, 2**27, size=(n, k()))
    exponents = [int(e) for e in rng.integers(-20, 20, size=n)]
    before = switch.counters()

    results = run_round(hosts, config, config.job.first_slot, 0, values, exponents, pkt_id=0xABCD)

    for worker, got in enumerate(results):
        assert len(got) == 1, f"worker {worker} got {len(got)} results"
        r = got[0]
        np.testing.assert_array_equal(r.values, values.sum(axis=0))
        assert r.header["msg_type"] == protocol.MsgType.RESULT
        assert r.header["exponent"] == max(exponents)
        assert r.header["contributions"] == n
        assert r.header["pkt_id"] == 0xABCD
        assert (r.header["slot"], r.header["set"]) == (config.job.first_slot, 0)
        assert r.src == (SERVICE_IP, config.job.udp_port)
    after = switch.counters()
    assert after["ingress.consumed"] - before["ingress.consumed"] == n - 1
    assert after["ingress.completed"] - before["ingress.completed"] == 1
    assert after["egress.multicast_copy"] - before["egress.multicast_copy"] == n


def test_single_worker_job_gets_its_own_values(hosts, job):
    config = job(1)
    values = np.arange(k())[None, :] - 5
    (got,) = run_round(hosts, config, config.job.first_slot, 1, values, [-3])
    np.testing.assert_array_equal(got[0].values, values[0])
    assert got[0].header["exponent"] == -3


def test_sums_saturate_at_int32_limits(hosts, job):
    config = job(3)
    values = np.zeros((3, k()), dtype=np.int64)
    values[:, 0] = INT32_MAX - 5          # overflows upwards
    values[:, 1] = INT32_MIN + 5          # overflows downwards
    values[:, 2] = [2**30, 2**30, 2**30]  # any order overflows: saturates, never wraps
    values[:, 3] = [INT32_MAX, -10, 3]    # exact: fits
    results = run_round(hosts, config, config.job.first_slot, 0, values)
    got = results[0][0].values
    assert got[0] == INT32_MAX
    assert got[1] == INT32_MIN
    assert got[2] == INT32_MAX
    assert got[3] == INT32_MAX - 7


def test_exponent_is_the_maximum_including_negative_ones(hosts, job):
    config = job(4)
    values = np.ones((4, k()), dtype=np.int64)
    results = run_round(hosts, config, config.job.first_slot, 0, values,
                        [-128, -7, -100, -9])
    assert {r[0].header["exponent"] for r in results} == {-7}


def test_duplicate_contribution_is_ignored(switch, hosts, job):
    config = job(3)
    slot = config.job.first_slot
    values = np.arange(3 * k()).reshape(3, k())
    before = switch.counters()
    hosts[0].contribute(values[0], job_id=config.job.id, slot=slot, set_=0)
    hosts[0].contribute(values[0], job_id=config.job.id, slot=slot, set_=0)  # retransmission
    assert hosts[0].results(1, timeout=1.0) == []  # unfinished: the duplicate is dropped
    for i in (1, 2):
        hosts[i].contribute(values[i], job_id=config.job.id, slot=slot, set_=0)
    for i in range(3):
        (r,) = hosts[i].results(1)
        np.testing.assert_array_equal(r.values, values.sum(axis=0))
        assert r.header["contributions"] == 3
    after = switch.counters()
    assert after["ingress.duplicate_dropped"] - before["ingress.duplicate_dropped"] == 1


def test_retransmission_for_finished_slot_is_answered_by_unicast(switch, hosts, job):
    config = job(3)
    slot = config.job.first_slot
    values = np.arange(3 * k()).reshape(3, k()) * 3
    run_round(hosts, config, slot, 1, values, [1, 2, 3], pkt_id=99)
    before = switch.counters()

    # Worker 2 lost the multicast copy and retransmits its contribution.
    hosts[2].contribute(values[2], job_id=config.job.id, slot=slot, set_=1, pkt_id=99,
                        exponent=3)
    (r,) = hosts[2].results(1)
    np.testing.assert_array_equal(r.values, values.sum(axis=0))
    assert r.header["exponent"] == 3 and r.header["contributions"] == 3
    assert r.header["pkt_id"] == 99 and r.header["set"] == 1
    assert hosts[0].results(1, timeout=0.5) == [] and hosts[1].results(1, timeout=0.5) == []
    after = switch.counters()
    assert after["ingress.resent"] - before["ingress.resent"] == 1
    assert after["egress.unicast_resend"] - before["egress.unicast_resend"] == 1
    assert after["egress.multicast_copy"] == before["egress.multicast_copy"]


def test_next_round_on_other_set_rearms_and_overwrites(hosts, job):
    """After set 0 finishes, set 1 fills; then set 0 is reused with fresh values,
    the first contribution overwriting the old sum (no reset by the controller)."""
    config = job(2)
    slot = config.job.first_slot
    rng = np.random.default_rng(1)
    for set_ in (0, 1, 0, 1):
        values = rng.integers(-1000, 1000, size=(2, k()))
        results = run_round(hosts, config, slot, set_, values)
        for got in results:
            assert len(got) == 1
            np.testing.assert_array_equal(got[0].values, values.sum(axis=0))


def test_thousands_of_rounds_over_both_sets_without_reset(hosts, job):
    slots = 8
    config = job(2, num_slots=slots)
    rounds = 250  # x 8 slots = 2000 aggregations, each slot alternating sets 250 times
    rng = np.random.default_rng(7)
    first = config.job.first_slot
    for r in range(rounds):
        values = rng.integers(-2**20, 2**20, size=(slots, 2, k()))
        for s in range(slots):
            for w in range(2):
                hosts[w].contribute(values[s, w], job_id=config.job.id, slot=first + s,
                                    set_=r % 2, pkt_id=r * slots + s)
        for w in range(2):
            got = hosts[w].results(slots)
            assert len(got) == slots, f"round {r}: worker {w} got {len(got)} of {slots}"
            by_slot = {g.header["slot"] - first: g for g in got}
            for s in range(slots):
                assert by_slot[s].header["set"] == r % 2
                assert by_slot[s].header["pkt_id"] == r * slots + s
                np.testing.assert_array_equal(by_slot[s].values, values[s].sum(axis=0))


def test_results_carry_the_wrapping_sum_of_the_fingerprints(switch, hosts, job):
    """The switch adds the fingerprints like values, but wrapping (no saturation), and
    a resent result carries the stored sum."""
    config = job(3)
    slot = config.job.first_slot
    fingerprints = [0xFFFFFFF0, 0x00000020, 0x80000001]   # the sum wraps past 2**32
    values = np.ones((3, k()), dtype=np.int64)
    for i in range(3):
        hosts[i].contribute(values[i], job_id=config.job.id, slot=slot, set_=0, pkt_id=5,
                            fingerprint=fingerprints[i])
    want = sum(fingerprints) % 2**32
    for i in range(3):
        (r,) = hosts[i].results(1)
        assert r.header["fingerprint"] == want == 0x80000011
    hosts[1].contribute(values[1], job_id=config.job.id, slot=slot, set_=0, pkt_id=5,
                        fingerprint=12345)             # a retransmission: its own is ignored
    (r,) = hosts[1].results(1)
    assert r.header["fingerprint"] == want
    np.testing.assert_array_equal(r.values, values.sum(axis=0))
