"""Block floating point: float gradients to the int32 the switch sums, and back.

One block is the values of one packet. Each worker computes its block exponent
``E`` (the smallest integer with ``max|x| < 2**E``, read from the float32 bits
like SwitchML's quantizer) and sends it with the block; the switch returns the
maximum ``E_max`` over the workers. Every worker quantizes a block with the same
scale exponent ``S``, chosen before ``E_max`` is known (``speculate``: the largest
of the maxima the same call agreed on its last ``DEPTH`` = 3 times, plus
``HEADROOM`` = 2), and keeps the result only if ``E_max <= S <= E_max + SLACK``
(``usable``, ``SLACK`` = 7); otherwise every worker redoes the block with
``S = E_max``, a round trip more. So a block is kept when its maximum rose by at
most 2 bits above those last three, or fell by at most 5 below the largest of them
(the speculation's comment below says why). A kept block was
never clipped, and:

    b = 31 - ceil(log2 n)                 # n workers; n * (2**b - 1) < 2**31
    q = rint(x * 2**(b - S))              # |q| <= 2**b - 1: the int32 sum never overflows
    sum = q_1 + ... + q_n                 # in the switch
    y = sum * 2**(S - b)                  # (/ n for the mean), then cast to the output dtype

Error bound, per element: each worker's rint is off by at most half a unit of
``2**(S - b)`` and the scalings by powers of two are exact, so

    |y - sum_i x_i| <= n * 2**(S - b - 1)          (divided by n for the mean)

with ``S <= E_max + SLACK``: at most ``n * 2**(E_max + SLACK - b - 1)``, which is
``2**(E_max - 21)`` for 4 workers and ``2**(E_max - 19)`` for 8; plus the final
rounding to the output dtype (half an ulp for float32 and float16; for bfloat16 the
float32 -> bfloat16 step adds another half ulp). In bits: a worker's values are
rounded to a step of ``2**(S - b) <= 2**(E_max - (b - SLACK))``, ``b - SLACK`` bits
below the block's ``2**E_max``: 22 for 4 workers (23 for 2, 19 for 32), where
float32's 24-bit mantissa gives the block's largest value a step of
``2**(E_max - 24)``. Each bit more of ``SLACK`` would cost one of them; ``HEADROOM``
and ``DEPTH`` cost none of the bound (a typical kept block uses 2.2-2.8 of the
``SLACK`` bits allowed). The reference is the float64 sum of the float32-rounded
inputs (float16/bfloat16 inputs are exact in float32; float64 inputs are rounded
to float32 first).

Policy for values the format cannot carry (NaN, Inf, or a magnitude of 2**126 or
more): such a block is sent with the reserved exponent ``POISON_EXPONENT`` (127)
and zero values, instead of failing on one worker alone, which would leave the
others waiting for it. The switch's maximum then carries the poison to every
worker, so every worker sees the same blocks as poisoned; dequantization makes
them NaN, and the session raises ``NonFiniteError`` on every worker at the end of
the same call (naming this worker's first bad index, if it had one). The sum is
never silently wrong, and the workers stay in step for the next call. Blocks of
zeros get ``EXPONENT_OF_ZERO``; float32 subnormals get -126.

Dequantization is a fixed function of the switch's integer sum and ``S``, which
every worker derives identically from what the switch returned, so all workers get
bit-identical results.
"""

from __future__ import annotations

import math

import numpy as np

from innet_aggregation.p4src.protocol import EXPONENT_OF_ZERO

POISON_EXPONENT = 127         # int8 maximum, reserved: "this block is not finite somewhere"
MAX_EXPONENT = POISON_EXPONENT - 1   # so finite blocks need max|x| < 2**126
_ABS_MASK = np.int32(0x7FFFFFFF)
_TOO_LARGE_BITS = (MAX_EXPONENT + 127) << 23  # float32 bits of 2**126 (Inf and NaN are above)


class NonFiniteError(ValueError):
    """Some worker's values held NaN, Inf or a magnitude the format cannot carry."""


def scale_bits(num_workers: int) -> int:
    """Integer bits per worker value, leaving headroom for the sum of all workers."""
    if not 1 <= num_workers <= 2**31:
        raise ValueError(f"num_workers must be positive, not {num_workers}")
    return 31 - math.ceil(math.log2(num_workers))


def consecutive(index: np.ndarray) -> slice | None:
    """``index`` as a slice, where it runs up by one (rows read or written through a
    view instead of a gather or scatter); None otherwise."""
    if not len(index):
        return None
    first, last = int(index[0]), int(index[-1])
    if last - first != len(index) - 1 \
            or (len(index) > 2 and np.count_nonzero(index[1:] - index[:-1] != 1)):
        return None
    return slice(first, last + 1)


class Blocks:
    """A flat array as (N, values_per_packet) blocks, without copying it: the whole
    blocks are a view of the array; only the last one, if partial, is a row of its
    own, padded with zeros (which cost nothing in the bound).

    Reading blocks after writing them reads what was written: a caller that aggregates
    in place writes only blocks it will not read again."""

    def __init__(self, flat: np.ndarray, values_per_packet: int):
        if flat.ndim != 1:
            raise ValueError("blocks are made of a flat array (its memory, not a copy)")
        k = values_per_packet
        whole = flat.size // k
        self.flat = flat
        self.whole = flat[:whole * k].reshape(whole, k)
        self.tail = np.zeros((-(-flat.size // k) - whole, k), dtype=flat.dtype)  # 0 or 1 row
        self.tail.reshape(-1)[:flat.size - self.whole.size] = flat[self.whole.size:]

    def __len__(self) -> int:
        return len(self.whole) + len(self.tail)

    @property
    def parts(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole blocks, then the padded last one (if any), in order."""
        return self.whole, self.tail

    def view(self, chunks: np.ndarray) -> np.ndarray | None:
        """Blocks ``chunks`` as a view of the array, where they are consecutive whole
        blocks (the usual case: chunks go out and come back in order); else None."""
        at = consecutive(chunks)
        return self.whole[at] if at is not None and at.stop <= len(self.whole) else None

    def rows(self, chunks: np.ndarray) -> np.ndarray:
        """Blocks ``chunks``: a view where it can be, else a copy."""
        view = self.view(chunks)
        if view is not None:
            return view
        rows = np.empty((len(chunks), self.whole.shape[1]), dtype=self.flat.dtype)
        inside = chunks < len(self.whole)
        rows[inside] = self.whole[chunks[inside]]
        rows[~inside] = self.tail          # the only block beyond the whole ones
        return rows

    def write(self, chunks: np.ndarray, values: np.ndarray) -> None:
        """Store ``values`` as blocks ``chunks``; of a partial last block, the values
        that are in the array."""
        inside = chunks < len(self.whole)
        self.whole[chunks[inside]] = values[inside]
        if not inside.all():
            last = self.flat[self.whole.size:]
            last[:] = values[np.argmin(inside), :last.size]


def block_exponents(blocks: np.ndarray) -> np.ndarray:
    """Per block (row) of float32, the int8 ``E`` with ``max|x| < 2**E``, or
    ``POISON_EXPONENT`` for a block the format cannot carry.

    Works on the IEEE bits (no float math), so it is exact and fast."""
    bits = blocks.view(np.int32) & _ABS_MASK
    largest = bits.max(axis=1)
    exponents = (largest >> 23) - 126
    exponents[largest == 0] = EXPONENT_OF_ZERO
    exponents[largest >= _TOO_LARGE_BITS] = POISON_EXPONENT
    return exponents.astype(np.int8)


def nonfinite(values: np.ndarray) -> str | None:
    """This worker's values the format cannot carry, described, or None if it has
    none (read before an aggregation in place overwrites them)."""
    bad = np.flatnonzero(~(np.abs(values) < np.float32(2.0**MAX_EXPONENT)))
    if not bad.size:
        return None
    i = int(bad[0])
    return (f"cannot aggregate {values[i]} at index {i} ({bad.size} value(s) are NaN, Inf "
            f"or of magnitude 2**{MAX_EXPONENT} or more)")


def describe_poison(mine: str | None, agreed: np.ndarray, values_per_packet: int) -> str:
    """Why blocks came back poisoned: this worker's values (``nonfinite``), or another's."""
    poisoned = np.flatnonzero(np.asarray(agreed) == POISON_EXPONENT)
    where = (f"{len(poisoned)} block(s) of {values_per_packet} values from index "
             f"{poisoned[0] * values_per_packet} are NaN in the result")
    if mine:
        return f"{mine}; {where}"
    return f"another worker sent NaN, Inf or a magnitude of 2**{MAX_EXPONENT} or more: {where}"


def quantize(blocks: np.ndarray, own: np.ndarray, scale: np.ndarray, num_workers: int,
             out: np.ndarray | None = None) -> np.ndarray:
    """int32 values to send: ``rint(x * 2**(b - S))`` per block, for the block's scale
    exponent ``S`` (see ``speculate``).

    ``own`` are this worker's block exponents. A block whose own exponent exceeds
    ``S`` (a misprediction) is clipped to the representable range: the switch's
    exponent maximum then exceeds ``S``, so every worker discards that result and
    redoes the block (``usable``). ``out`` may be a (possibly big-endian, strided)
    int32 view such as the packets' values field, or float32, which holds the values
    exactly (each is a float32 rounded to an integer) and is the only memory used."""
    own = np.asarray(own)
    scale = np.asarray(scale, dtype=np.int32)
    bits = scale_bits(num_workers)
    # A block of zeros everywhere keeps EXPONENT_OF_ZERO; any shift quantizes it to 0.
    shift = (bits - np.maximum(scale, EXPONENT_OF_ZERO + 1)).astype(np.int32)
    work = out if out is not None and out.dtype == np.float32 else None
    if shift.size and shift.max() <= 127:
        # 2**shift is a float32 and the product is rounded once, exactly as ldexp
        # rounds: the same bits, several times faster than ldexp.
        scaled = np.multiply(blocks, np.ldexp(np.float32(1), shift)[:, None], out=work)
    else:                  # blocks below 2**-96: 2**shift itself is not a float32
        scaled = np.ldexp(blocks, shift[:, None], out=work)
    over = own > scale
    if over.any():         # clipped to an integer before rounding: the same as after
        limit = np.nextafter(np.float32(2.0**bits), np.float32(0))   # below 2**b, as a float32
        scaled[over] = np.clip(scaled[over], -limit, limit)
    # NaN/Inf blocks (own or agreed poison) carry zeros; the exponent carries the poison.
    poisoned = (scale == POISON_EXPONENT) | (own == POISON_EXPONENT)
    if poisoned.any():
        scaled[poisoned] = 0
    if out is None:
        out = np.empty(scaled.shape, dtype=np.int32)
    return np.rint(scaled, out=out, casting="unsafe")


def _contiguous(values: np.ndarray) -> np.ndarray:
    """``values`` in contiguous memory, same dtype: numpy's casts from a strided
    big-endian view are slower than a strided copy of its native view (fast: a
    batch stays in the cache) and a contiguous cast."""
    if values.flags.c_contiguous:
        return values
    native = values.dtype.newbyteorder("=")
    return np.ascontiguousarray(values.view(native)).view(values.dtype)


def dequantize(sums: np.ndarray, scale: np.ndarray, num_workers: int, *, average: bool,
               out: np.ndarray | None = None, dtype=np.float32) -> np.ndarray:
    """Floats from the switch's int32 sums: ``sum * 2**(S - b)`` (/ n), rounded
    once to ``out``'s dtype (or ``dtype``). ``sums`` may be a strided big-endian view
    such as the received packets' values field, ``out`` a view of the caller's tensor.

    The exact value is formed in float64 (for a mean over a number of workers that is
    not a power of two, the division rounds once in float64 before the final cast).
    When the factor is a power of two and every result is a normal float32, rounding
    the sum to float32 first and then scaling gives the same bits (scaling by 2**k
    commutes with rounding), at a third less memory traffic; that path is taken then."""
    power_of_two = num_workers & (num_workers - 1) == 0
    shift = scale_bits(num_workers)
    if average and power_of_two:
        shift += num_workers.bit_length() - 1
    exponent = np.asarray(scale, dtype=np.int32) - shift
    if out is None:
        out = np.empty(sums.shape, dtype=dtype)
    if not exponent.size:
        return out
    # Called once per batch of results: two reductions decide the path and find poison.
    low, high = int(exponent.min()), int(exponent.max())
    if out.dtype == np.float32 and (not average or power_of_two) \
            and low >= -126 and high <= 127 - 32:
        np.copyto(out, _contiguous(sums), casting="unsafe")    # the one rounding
        np.multiply(out, np.ldexp(np.float32(1), exponent)[:, None], out=out)   # exact
    else:
        exact = np.multiply(sums, np.ldexp(1.0, exponent)[:, None], dtype=np.float64)
        if average and not power_of_two:
            np.divide(exact, num_workers, out=exact)
        np.copyto(out, exact, casting="unsafe")
    if high == POISON_EXPONENT - shift:      # no exponent is larger than the poison
        out[exponent == high] = np.nan
    return out


def error_bound(scale: np.ndarray, num_workers: int, *, average: bool) -> np.ndarray:
    """Per block, the largest quantization error of an element of the result
    (before the final rounding to the output dtype), for the scale it was quantized
    with (at most ``SLACK`` above the workers' maximum)."""
    exponent = np.asarray(scale, dtype=np.int32) - scale_bits(num_workers) - 1
    bound = num_workers * np.ldexp(1.0, exponent)
    return bound / num_workers if average else bound


# Speculation: the scale a block is quantized with before the switch has said what
# the workers' maximum is. Every worker computes the same scale from what all of
# them received identically (the maxima the same call agreed on its last ``DEPTH``
# times), so no bootstrap round is needed; the result's maximum says whether it is
# usable. A block's maximum wanders about a level of its own, mostly dipping below
# it for a call or two, so the largest of the last three maxima predicts the next
# rise better than the last one alone, and the dips are what SLACK must keep.
# Measured on the recorded gradients (testbed.gradients: the demo's 1.13 M-parameter
# MLP and a small CNN, steps 284-299 of 300; `python -m benchmarks.bench_exponents
# --recorded`, blocks of 64/256/1,024 values, 4/8/16 workers), blocks redone:
#   last + 2, SLACK 5 (before 2026-11-27):   3.8-5.6 % for 4 workers, 1.2-1.5 % for 8
#   largest of last 3 + 2, SLACK 6:          0.3-1.0 % for 4, 0.3 % for 8
#   largest of last 3 + 2, SLACK 7 (now):    0.3-0.6 % for 4, 0.3 % for 8, 0.1-0.2 % for 16
#   last + 4, SLACK 8:                       0.0-0.9 % for 4 (4.0 bits typical, 3 of the bound)
# A kept block's scale is, on average, 2.7-2.8 bits above its maximum for 4 workers
# (2.1 before), 2.4 for 8 (2.0), 2.2 for 16 (2.0): the typical cost. The bound's cost
# is SLACK, 2 bits more than before (b - 7 bits below a block's maximum: 22 for 4
# workers). The same run quantizes the recorded calls
# for real: the worst element's error is 0.25 of the bound stated above (4 workers).
# DDP's early training (`bench_exponents --model large --workers 4 --steps 40`,
# replayed with --load): 0.53 % of the blocks after the first call's probes redone,
# against 0.72 % before.
HEADROOM = 2     # bits above the largest remembered maximum
DEPTH = 3        # calls whose agreed maxima are remembered per block
SLACK = 7        # most bits a usable scale may exceed the true maximum by (precision)
PROBE_EXPONENT = MAX_EXPONENT   # no history: quantize at the top; the block is redone
_UNKNOWN = PROBE_EXPONENT - HEADROOM   # remembered for a block without information


def speculate(previous: np.ndarray | None, num_blocks: int,
              headroom: int = HEADROOM) -> np.ndarray:
    """Scale exponents for a call of ``num_blocks`` blocks, from the maxima the same
    call agreed on its last times (``remember``; ``PROBE_EXPONENT`` everywhere
    without any): the largest of them, plus ``headroom``."""
    if previous is None:
        return np.full(num_blocks, PROBE_EXPONENT, dtype=np.int64)
    largest = np.asarray(previous).max(axis=0).astype(np.int64)
    return np.minimum(largest + headroom, MAX_EXPONENT)


def resized(previous: np.ndarray, num_blocks: int) -> np.ndarray:
    """A call's remembered maxima for a call of ``num_blocks`` blocks: cut, or with the
    blocks beyond them probed."""
    out = np.full((len(previous), num_blocks), _UNKNOWN, dtype=np.int8)
    kept = min(num_blocks, previous.shape[1])
    out[:, :kept] = previous[:, :kept]
    return out


def usable(scale: np.ndarray, agreed: np.ndarray, slack: int = SLACK) -> np.ndarray:
    """Per block: may the sum quantized with ``scale`` be kept, given the switch's
    maximum ``agreed``? Not if some worker's values were clipped (``agreed > scale``),
    nor if the scale wasted more than ``SLACK`` bits of precision. Zeros everywhere
    and poisoned blocks are final whatever the scale."""
    scale, agreed = np.asarray(scale), np.asarray(agreed)
    return ((agreed == EXPONENT_OF_ZERO) | (agreed == POISON_EXPONENT)
            | ((agreed <= scale) & (scale - agreed <= slack)))


def settle(scale: np.ndarray, agreed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The transport's decision on each block's result, from the scale it was
    quantized with and the switch's maximum ``agreed``: keep it (with its scale, or
    ``POISON_EXPONENT`` for a poisoned block), or redo it with ``agreed`` as its
    scale, which is always usable. Returns (kept, the block's scale now)."""
    scale, agreed = np.asarray(scale), np.asarray(agreed)
    keep = usable(scale, agreed)
    return keep, np.where(keep & (agreed != POISON_EXPONENT), scale, agreed)


def remember(agreed: np.ndarray, previous: np.ndarray | None,
             depth: int = DEPTH) -> np.ndarray:
    """What the call's next time predicts from: the agreed maxima of its last ``depth``
    times (int8 rows as on the wire, oldest first), ``agreed`` after ``previous``,
    the call's own (None for a call new to the history, even where it predicted from
    another's, which would linger). A poisoned block (no information) is probed next
    time; then its probe's maximum replaces the poison in the older rows."""
    agreed = np.asarray(agreed)
    newest = np.where(agreed == POISON_EXPONENT, _UNKNOWN, agreed).astype(np.int8)[None]
    if previous is None:
        return newest
    rows = np.concatenate([previous[max(len(previous) - depth + 1, 0):], newest])
    return np.where(rows == _UNKNOWN, newest, rows)
