"""The fallback at a lead: switch results that some ranks completed and others owe.

Without a deadline the switch finishes a block only with every rank's contribution,
so when the switch path fails the ranks are at most one call apart. With one
(transport.py, "Bounded time") the others run ahead of a late rank by up to
``LEAD_LIMIT`` released rounds: a laggard may still be in call c while the leaders
completed c, c+1, ..., hi through the switch and applied those results. Every rank
must end each call with the same bits, so the calls c..hi stay the switch's on every
rank: redoing them on gloo would give the laggard a sum the leaders never applied.

So each rank keeps the switch results of its last calls (``Kept``: the result, and
per block who was in its final round, ``Transport.last_members``), as many calls
back as a lead can span: the newest, and older ones while the blocks of the calls
after them are at most ``2 LEAD_LIMIT`` (no deadline: the newest alone, as a one-call
gap needs). In the fallback's agreement the lowest rank that holds call j hands it to
every rank that has not completed it (``hand_over``: a gloo broadcast, in call
order), which keeps it (``Fallback.owed``) until its caller issues call j and then
replays it (``replay``): it checks that the call is the same (its signature), takes
the leaders' result as its own, and keeps, as the switch path would have, its
values of the blocks whose final round lacked it for the next call of the key
(``carry.py``); of the blocks it was in, what it carried into the call is applied.
Nothing of the laggard is redone or sent: it only catches up, locally, to where the
leaders went to gloo, and from there every call goes through gloo on every rank.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from . import quantize
from .bounded import LEAD_LIMIT
from .errors import CallMismatch

DTYPES = ("float16", "float32", "float64")      # a result's dtype on the wire, by index
HEADER = 6                                       # the int64 fields a handed-over call's header has
SPARE = 2                                        # freed buffers kept for reuse


class LeadLost(RuntimeError):
    """A rank lacks a call's switch result that no rank kept: the ranks were further
    apart than a deadline's lead allows."""


@dataclass
class Record:
    """One call's switch result as every rank applies it: ``result`` (flat, the call's
    host dtype), per block the bitmap of who was in its final round (``members``;
    None: everyone), the call's signature hash, the values per packet (blocks of), and
    whether some block was poisoned (the call raised NonFiniteError on every rank)."""
    number: int
    result: np.ndarray
    members: np.ndarray | None
    sig: int
    k: int
    poisoned: bool = False

    @property
    def blocks(self) -> int:
        return -(-self.result.size // self.k)


class Kept:
    """The switch results of this rank's last calls, for a peer that has not completed
    them when the switch path fails: the newest, and older ones while the newer ones'
    blocks are at most ``lead_blocks`` (``2 LEAD_LIMIT`` under a deadline, else 0)."""

    def __init__(self):
        self.records: deque[Record] = deque()
        self._blocks = 0                 # the records' blocks, summed
        self._spare: list[np.ndarray] = []

    def keep(self, number: int, work: np.ndarray, members, sig: int, k: int,
             deadline: bool, poisoned: bool = False) -> None:
        flat = work.reshape(-1)
        at = next((i for i, b in enumerate(self._spare)
                   if b.shape == flat.shape and b.dtype == flat.dtype), None)
        if at is None:
            buffer = flat.copy()
        else:           # by position: list.remove would compare arrays element by element
            buffer = self._spare.pop(at)
            np.copyto(buffer, flat)
        record = Record(number, buffer, None if members is None else members.copy(), sig, k,
                        poisoned)
        self.records.append(record)
        self._blocks += record.blocks
        lead_blocks = 2 * LEAD_LIMIT if deadline else 0
        while len(self.records) > 1 and self._blocks - self.records[0].blocks > lead_blocks:
            gone = self.records.popleft()
            self._blocks -= gone.blocks
            self._spare = [gone.result, *self._spare][:SPARE]

    @property
    def oldest(self) -> int:
        """The oldest call kept; none: past any call (it holds nothing to hand over)."""
        return self.records[0].number if self.records else np.iinfo(np.int64).max

    def get(self, number: int) -> Record | None:
        return next((r for r in self.records if r.number == number), None)


def hand_over(group, rank: int, number: int, rows: list[tuple], kept: Kept) -> Record | None:
    """Collective: call ``number``'s switch result from the lowest rank that holds it
    (``rows``: every rank's (completed, pending, signature, oldest kept) from the
    agreement) to every rank; the record, where this rank has not completed the call."""
    import torch
    import torch.distributed as dist

    holders = [r for r, row in enumerate(rows) if row[0] >= number and row[3] <= number]
    if not holders:
        raise LeadLost(f"rank {rank}: call {number}'s switch result is kept by no rank (calls "
                       f"completed, call pending, its signature, oldest call kept, per rank: "
                       f"{rows}): the ranks are further apart than a deadline's lead allows")
    options = dist.BroadcastOptions()
    options.rootRank = holders[0]
    header = torch.zeros(HEADER, dtype=torch.int64)
    record = kept.get(number) if rank == holders[0] else None
    if record is not None:
        header[:] = torch.tensor([record.result.size, DTYPES.index(record.result.dtype.name),
                                  record.sig, record.k, record.members is not None,
                                  record.poisoned])
    group.broadcast([header], options).wait()
    size, dtype, sig, k, members, poisoned = header.tolist()
    dtype = np.dtype(DTYPES[dtype])
    payload = np.empty(size * dtype.itemsize + (8 * -(-size // k) if members else 0), np.uint8)
    if record is not None:
        payload[:record.result.nbytes] = record.result.view(np.uint8)
        if members:
            payload[record.result.nbytes:] = record.members.view(np.uint8)
    if payload.size:                     # every rank knows it from the header
        group.broadcast([torch.from_numpy(payload)], options).wait()
    if rows[rank][0] >= number:
        return None
    result = payload[:size * dtype.itemsize].view(dtype)
    members = payload[result.nbytes:].copy().view(np.int64) if members else None
    return Record(number, result, members, sig, k, bool(poisoned))


def replay(record: Record, rank: int, work: np.ndarray, original: np.ndarray, sig: int,
           carry, key: tuple) -> None:
    """Complete this rank's call ``record.number`` as the switch did for the others:
    ``work`` (the call's output) takes the handed-over result; of ``original`` (its
    input) plus what it carried into the call, the blocks whose final round lacked
    this rank are carried again (``carry``), as ``Transport.aggregate`` would have."""
    if record.sig != sig or record.result.size != work.size:
        raise CallMismatch(
            f"rank {rank}, call {record.number}: the ranks did not issue the same calls: this "
            f"one ({work.size} elements, signature {sig}) is not the one the others completed "
            f"as call {record.number} through the switch ({record.result.size} elements, "
            f"signature {record.sig})")
    left = (np.flatnonzero((record.members >> rank) & 1 == 0) if record.members is not None
            else np.zeros(0, np.int64))
    if left.size:
        contribution = np.array(original.reshape(-1), dtype=np.float32)   # a copy
        carry.add_into(key, contribution)
        rows = quantize.Blocks(contribution, record.k).rows(left)
        carry.keep(key, left, np.array(rows, dtype=np.float32, copy=True))
    else:
        carry.take(key)        # in every block's sum: applied
    np.copyto(work.reshape(-1), record.result)
