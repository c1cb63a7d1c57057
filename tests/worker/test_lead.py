"""lead.py's pure parts: how many calls' results a rank keeps for a peer behind it, and
how a rank behind completes a call from a peer's record (its carry as the switch path
would leave it). The hand-over itself runs in test_lead_fallback.py."""

from __future__ import annotations

import numpy as np
import pytest

from innet_aggregation.worker.bounded import LEAD_LIMIT
from innet_aggregation.worker.carry import Carry
from innet_aggregation.worker.errors import CallMismatch
from innet_aggregation.worker.lead import Kept, Record, replay

K = 4


def test_without_a_deadline_only_the_last_call_is_kept_and_its_buffer_reused():
    kept = Kept()
    first = np.arange(8, dtype=np.float32)
    kept.keep(1, first, None, 11, K, deadline=False)
    buffer = kept.get(1).result
    kept.keep(2, first + 1, None, 12, K, deadline=False)
    kept.keep(3, first + 2, None, 13, K, deadline=False)
    assert [r.number for r in kept.records] == [3] and kept.oldest == 3
    assert kept.get(3).result is buffer           # call 1's, freed when call 2 came
    assert kept.get(3).result.tolist() == (first + 2).tolist()


def test_calls_of_several_sizes_in_turn_reuse_only_a_buffer_of_their_size():
    """DDP's buckets: calls of different sizes one after another (the spare list once
    compared arrays element by element to remove one, and a training step raised)."""
    kept = Kept()
    sizes = [330, 2410, 330, 2410, 7, 330]
    for number, size in enumerate(sizes, 1):
        kept.keep(number, np.full(size, number, np.float32), None, number, K, deadline=False)
        assert kept.get(number).result.tolist() == [number] * size
    assert [r.number for r in kept.records] == [len(sizes)]


def test_under_a_deadline_the_calls_a_lead_can_span_are_kept():
    """A lead spans at most LEAD_LIMIT released rounds past the late rank's pending call:
    a call is kept while the calls after it hold at most 2 LEAD_LIMIT blocks."""
    kept = Kept()
    big = np.zeros(LEAD_LIMIT * K, np.float32)           # LEAD_LIMIT blocks a call
    for number in range(1, 6):
        kept.keep(number, big, None, number, K, deadline=True)
    assert [r.number for r in kept.records] == [3, 4, 5]
    kept.keep(6, np.zeros(3, np.float32), None, 6, K, deadline=True)    # one block more
    assert [r.number for r in kept.records] == [4, 5, 6]


def test_a_call_taken_from_a_peer_carries_the_blocks_released_without_this_rank():
    carry = Carry()
    key = carry.key("bucket", 10)
    owed = np.array([[0.5] * K, [0.5, 0.5, 0, 0]], np.float32)   # the last block: 2 values
    carry.keep(key, np.array([0, 2]), owed)
    mine = np.arange(10, dtype=np.float64)
    work = mine.copy()
    everyone = 0b111
    members = np.array([everyone, everyone & ~0b010, everyone & ~0b010])  # rank 1 out of 1, 2
    result = np.full(10, 7.0)
    replay(Record(4, result, members, 99, K), 1, work, mine, 99, carry, key)
    assert work.tolist() == result.tolist()
    chunks, values = carry.store[key]
    assert chunks.tolist() == [1, 2]
    # Block 1: its input; block 2 (partial, 2 values): its input plus what it owed.
    assert values.tolist() == [[4, 5, 6, 7], [8.5, 9.5, 0, 0]]
    replay(Record(5, result, None, 99, K), 1, work, mine, 99, carry, key)
    assert key not in carry.store            # in every block: applied


def test_a_call_unlike_the_peers_is_a_mismatch():
    carry = Carry()
    work = np.zeros(8, np.float32)
    with pytest.raises(CallMismatch, match=r"rank 2, call 7: the ranks did not issue the same "
                                           r"calls: this one \(8 elements"):
        replay(Record(7, np.zeros(8, np.float32), None, 1, K), 2, work, work, 2, carry,
               carry.key(None, 8))
