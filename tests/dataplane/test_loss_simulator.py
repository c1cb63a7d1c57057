"""The loss simulator drops at the configured rate, in either direction, and counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from p4src import protocol

PACKETS = 400
PROBABILITY = 0.25


def k() -> int:
    return protocol.packet_format().values_per_packet


@pytest.mark.parametrize("direction", ["ingress", "egress"])
def test_drop_rate_within_statistical_bounds(switch, hosts, job, direction):
    config = job(1, num_slots=16)
    ports = [hosts[0].host.switch_port]
    switch.controller.set_loss(ports, **{direction: PROBABILITY})
    try:
        before = switch.counters()
        received = 0
        ones = np.ones(k())
        # One-worker job: every contribution completes at once and comes back.
        for i in range(PACKETS):
            slot = config.job.first_slot + i % 16
            hosts[0].contribute(ones, job_id=config.job.id, slot=slot, set_=(i // 16) % 2,
                                pkt_id=i)
            if i % 16 == 15:
                received += len(hosts[0].results(16, timeout=1.0))
        received += len(hosts[0].results(PACKETS - received, timeout=1.0))
        after = switch.counters()
    finally:
        switch.controller.set_loss(ports, **{direction: 0.0})
    dropped = PACKETS - received
    sigma = math.sqrt(PACKETS * PROBABILITY * (1 - PROBABILITY))
    assert abs(dropped - PACKETS * PROBABILITY) < 4.5 * sigma, dropped
    key = f"{direction}.simulated_drop"
    assert after[key] - before[key] == dropped


def test_zero_probability_removes_the_entries(switch, hosts, job):
    config = job(1)
    ports = [hosts[0].host.switch_port]
    switch.controller.set_loss(ports, ingress=0.5, egress=0.5)
    changes = switch.controller.set_loss(ports, ingress=0.0, egress=0.0)
    assert changes.deleted == 2
    hosts[0].contribute(np.ones(k()), job_id=config.job.id, slot=config.job.first_slot, set_=0)
    assert len(hosts[0].results(1)) == 1
