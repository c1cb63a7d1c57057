"""What the worker's modules share about a packet's identity: the widths of its packet id
and fingerprint, and the identity bytes a result echoes, compared as one value each."""

from __future__ import annotations

import functools

import numpy as np

PKT_ID_MASK = 0xFFFFFFFF
FINGERPRINT_MASK = 0xFFFFFFFF


def leading_bytes(records: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` bytes of every record, as one opaque (void) value each, a
    view whatever the records' stride: compared with one call per batch."""
    return records.view(_prefix(records.dtype.itemsize, count))["b"]


@functools.cache
def _prefix(itemsize: int, count: int) -> np.dtype:
    return np.dtype({"names": ["b"], "formats": [f"V{count}"], "offsets": [0],
                     "itemsize": itemsize})
