"""What a worker still owes the job: its values that released rounds left out.

Under a deadline (transport.py, "Bounded time") a round may be released without this
worker's contribution; its values of those blocks are then added to the same blocks
of the next call of the same key (error feedback). The store is the session's, not a
transport's, so a value survives every way a call can end: a fallback to gloo (the
call redone there with them in, ``restore`` and ``add_into``), a new transport after
a rejoin, a session that closes (``pending`` hands them to the caller). A key that
never returns (DDP rebuilds its buckets after the first step) keeps its values here,
counted in ``values`` and bounded by ``limit``: a store that would go past it is an
error naming the key and the size, never a silent drop.

Keys (``key``) follow the calls, not the transport: a call's name and size, and for
an unnamed one its place in the run of consecutive calls of that size, the same on
every rank whichever path (switch or gloo) runs the call.
"""

from __future__ import annotations

import numpy as np

RUN_PLACES = 64               # places told apart in a run of unnamed calls of one size
# Values (float32) the store may hold: 256 MiB, far past a step's carry (at most its
# gradients, once) unless keys pile up that never return.
CARRY_LIMIT = 1 << 26


class CarryFull(RuntimeError):
    """A call's left-out values would take the store past its bound."""


def history_key(name: str | None, elements: int, place: int) -> tuple:
    """Where a call's agreed exponents and its carry are kept, for its next time: its
    place in the training step. A named call is its name (the DDP hook names buckets
    by index); an unnamed one is its size and ``place``, its position in the run of
    consecutive calls of that size (capped at ``RUN_PLACES - 1``), so that
    equal-sized calls of one step, such as repeated layers' buckets, keep apart."""
    return ("named", name, elements) if name is not None else ("unnamed", elements, place)


class Carry:
    """Per call key, the chunks (blocks of ``k`` values) this worker was left out of
    and its values of them, as float32 rows of ``k``."""

    def __init__(self, limit: int = CARRY_LIMIT):
        self.limit = limit
        self.store: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.run = (0, 0)             # the last call's (elements, place in its run)

    def key(self, name: str | None, elements: int) -> tuple:
        """The next call's key (``history_key``); once per call, in call order."""
        place = min(self.run[1] + 1, RUN_PLACES - 1) if self.run[0] == elements else 0
        self.run = (elements, place)
        return history_key(name, elements, place)

    @property
    def values(self) -> int:
        """Values held, over every key (whole rows: a partial last block counts whole)."""
        return sum(v.size for _, v in self.store.values())

    def take(self, key: tuple) -> tuple[np.ndarray, np.ndarray] | None:
        """The key's values, for the call that adds them in; gone from the store."""
        return self.store.pop(key, None)

    def keep(self, key: tuple, chunks: np.ndarray, values: np.ndarray) -> None:
        """Values left out of a call of ``key``, for its next call; with any held for it
        already (``restore``), block by block."""
        if key in self.store:
            chunks, values = _merge(*self.store.pop(key), chunks, values)
        held = self.values
        if held + values.size > self.limit:
            raise CarryFull(
                f"carrying {values.size} values of call {key} would hold {held + values.size} "
                f"left-out values, past the carry's limit of {self.limit}: calls whose keys "
                f"never return keep theirs ({len(self.store)} keys held); apply them "
                f"(AggregationSession.carry.pending()) or issue calls of those keys")
        self.store[key] = (chunks, values)

    restore = keep    # a call that took a key's values failed: they are owed again

    def add_into(self, key: tuple, flat: np.ndarray) -> None:
        """The key's values added into a call's input (``flat``, any float dtype), for a
        call that is not the switch's (gloo): every rank's owed values are in its sum."""
        taken = self.take(key)
        if taken is None:
            return
        chunks, values = taken
        k = values.shape[1]
        whole = flat.size // k
        inside = chunks < whole
        flat[:whole * k].reshape(whole, k)[chunks[inside]] += values[inside].astype(flat.dtype)
        if not inside.all():             # the partial last block
            flat[whole * k:] += values[~inside][0][:flat.size - whole * k].astype(flat.dtype)

    def pending(self) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
        """Every key's values still owed, handed to the caller (and gone from here)."""
        store, self.store = self.store, {}
        return store


def _merge(chunks_a: np.ndarray, values_a: np.ndarray, chunks_b: np.ndarray,
           values_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of left-out blocks as one, the values of a block both hold summed."""
    chunks = np.union1d(chunks_a, chunks_b)
    values = np.zeros((len(chunks), values_a.shape[1]), dtype=np.float32)
    np.add.at(values, np.searchsorted(chunks, chunks_a), values_a)
    np.add.at(values, np.searchsorted(chunks, chunks_b), values_b)
    return chunks, values
