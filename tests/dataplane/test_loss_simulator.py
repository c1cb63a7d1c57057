"""The loss simulator drops at the configured rate, in either direction, and counts."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from p4src import protocol

PACKETS = 400
PROBABILITY = 0.25
BATCH = 16


def k() -> int:
    return protocol.packet_format().values_per_packet


@pytest.mark.parametrize("direction", ["ingress", "egress"])
def test_drop_rate_within_statistical_bounds(switch, hosts, job, direction):
    config = job(1, num_slots=BATCH)
    host = hosts[0]
    ports = [host.host.switch_port]
    counter = f"{direction}.simulated_drop"
    switch.controller.set_loss(ports, **{direction: PROBABILITY})
    received = dropped = 0
    try:
        before = switch.counters()[counter]

        def settle(sent: int) -> None:
            """Wait until every packet sent so far came back or was counted as dropped."""
            nonlocal received, dropped
            deadline = time.monotonic() + 20
            while received + dropped < sent and time.monotonic() < deadline:
                received += len(host.results(sent - received - dropped, timeout=0.05))
                dropped = switch.counters()[counter] - before

        ones = np.ones(k())
        # One-worker job: every contribution completes at once and comes back.
        for i in range(PACKETS):
            host.contribute(ones, job_id=config.job.id, slot=config.job.first_slot + i % BATCH,
                            set_=(i // BATCH) % 2, pkt_id=i)
            if i % BATCH == BATCH - 1:
                settle(i + 1)
        settle(PACKETS)
    finally:
        switch.controller.set_loss(ports, **{direction: 0.0})
    assert received + dropped == PACKETS
    sigma = math.sqrt(PACKETS * PROBABILITY * (1 - PROBABILITY))
    assert abs(dropped - PACKETS * PROBABILITY) < 4.5 * sigma, dropped


def test_zero_probability_removes_the_entries(switch, hosts, job):
    config = job(1)
    ports = [hosts[0].host.switch_port]
    switch.controller.set_loss(ports, ingress=0.5, egress=0.5)
    changes = switch.controller.set_loss(ports, ingress=0.0, egress=0.0)
    assert changes.deleted == 2
    hosts[0].contribute(np.ones(k()), job_id=config.job.id, slot=config.job.first_slot, set_=0)
    assert len(hosts[0].results(1)) == 1
