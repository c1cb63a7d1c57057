"""A released round a late worker keeps for later (bounded time's ``early``) must come back
as it came: the check of which packets answer a slot once rewrote the type byte of a
lone record in place, so a kept RELEASED round, looked at alone and not yet due, turned
into a RESULT and never matched again (the straggler experiment hung on it)."""

from __future__ import annotations

import numpy as np
import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.worker import quantize
from innet_aggregation.worker.bounded import LEAD_LIMIT
from innet_aggregation.worker.call import Call
from innet_aggregation.worker.transport import Transport, call_fingerprints

SLOTS = 4


@pytest.fixture
def call():
    """A deadline session's call over SLOTS zero blocks, its socket closed after."""
    fmt = protocol.packet_format()
    k = fmt.values_per_packet
    t = Transport(fmt, job_id=1, worker_id=0, num_workers=2, switch_ip="127.0.0.1",
                  job_udp_port=48000, local_ip="127.0.0.1", local_port=0, first_slot=0,
                  num_slots=SLOTS, deadline=0.05)
    try:
        blocks = quantize.Blocks(np.zeros(SLOTS * k, dtype=np.float32), k)
        zeros = np.zeros(SLOTS, dtype=np.int64)
        yield Call(t, blocks, blocks, zeros, zeros, label="test", quantized=True,
                   fingerprints=call_fingerprints(0, 1, SLOTS * k, None, SLOTS))
    finally:
        t.sock.close()


def test_looking_at_a_lone_released_round_leaves_its_bytes_as_they_came(call):
    kept = call.t.fmt.pack(count=3, msg_type=protocol.MSG_RELEASED, job_id=1, slot=2,
                    pkt_id=[7, 8, 9])
    as_they_came = kept.tobytes()
    for lone in range(3):          # one record alone, as a group of one is taken
        match, _ = call.answers(kept[lone:lone + 1], protocol.MSG_RELEASED)
        assert not match.any()     # not due: no packet of the call has these ids
    call.answers(kept, protocol.MSG_RELEASED)
    assert kept.tobytes() == as_they_came


def test_a_flood_of_released_rounds_keeps_at_most_twice_the_lead_limit(call):
    """What a late worker keeps is bounded whatever comes (forged, or a switch gone
    wrong): past twice LEAD_LIMIT the oldest go."""
    t = call.t.bounded
    flood = 3 * LEAD_LIMIT
    for start in range(0, flood, 512):
        t.keep_early(call.t.fmt.pack(count=512, msg_type=protocol.MSG_RELEASED, job_id=1,
                                     slot=np.arange(512) % SLOTS,
                                     pkt_id=1 + (start + np.arange(512)) // SLOTS))
    assert len(t.early_id) <= 2 * LEAD_LIMIT
    assert sum(len(p) for p in t.early) == len(t.early_id) == len(t.early_slot)
    assert t.early_id.max() == flood // SLOTS        # the newest kept, the oldest gone
