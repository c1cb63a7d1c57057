"""The loss simulator drops at the configured rate, in either direction, and counts."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from innet_aggregation.p4src import protocol

PROBABILITY = 0.25
# Packets per run: BMv2 moves about 1 k frames/s, so it gets fewer and, from the same
# formula, a wider band.
PACKETS = {"bmv2": 2000}
DEFAULT_PACKETS = 10000
BATCH = 32


def k() -> int:
    return protocol.packet_format().values_per_packet


def band(packets: int, p: float) -> float:
    """Three standard deviations of a binomial count of drops: a correct simulator
    lands outside it in 0.27 % of runs."""
    return 3 * math.sqrt(packets * p * (1 - p))


@pytest.mark.parametrize("direction", ["ingress", "egress"])
def test_drop_rate_within_three_sigma(switch, hosts, job, direction):
    packets = PACKETS.get(switch.process.target, DEFAULT_PACKETS)
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
                dropped = switch.counters()[counter] - before
                received += len(host.results(sent - received - dropped, timeout=0.01))

        ones = np.ones(k())
        # One-worker job: every contribution completes at once and comes back.
        for i in range(packets):
            host.contribute(ones, job_id=config.job.id, slot=config.job.first_slot + i % BATCH,
                            set_=(i // BATCH) % 2, pkt_id=i)
            if i % BATCH == BATCH - 1:
                settle(i + 1)
        settle(packets)
    finally:
        switch.controller.set_loss(ports, **{direction: 0.0})
    assert received + dropped == packets, (received, dropped)
    expected, width = packets * PROBABILITY, band(packets, PROBABILITY)
    assert abs(dropped - expected) <= width, \
        f"{dropped} of {packets} dropped, {expected:g} +- {width:.1f} expected (3 sigma)"


def test_zero_probability_removes_the_entries(switch, hosts, job):
    config = job(1)
    ports = [hosts[0].host.switch_port]
    switch.controller.set_loss(ports, ingress=0.5, egress=0.5)
    changes = switch.controller.set_loss(ports, ingress=0.0, egress=0.0)
    assert changes.deleted == 2
    hosts[0].contribute(np.ones(k()), job_id=config.job.id, slot=config.job.first_slot, set_=0)
    assert len(hosts[0].results(1)) == 1
