"""Block floating point, checked element by element against a float64 reference.

The switch is played by numpy here: max of the exponents, int64 sum of the
quantized values (then checked to fit int32, so its saturation never matters).
"""

from __future__ import annotations

import numpy as np
import pytest

from innet_aggregation.p4src.protocol import EXPONENT_OF_ZERO
from innet_aggregation.worker import quantize as q

K = 64  # any block size works; the wire's comes from the compiled program


def worker_inputs(n: int, blocks: int, seed: int) -> list[np.ndarray]:
    """Per-worker float32 values whose blocks span the whole exponent range:
    ordinary, tiny, huge, subnormal, zero, and single-worker-only blocks."""
    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(-140, 120, size=(blocks, 1))
    scale[:8] = 2.0 ** np.array([[0], [-126], [-149], [123], [-3], [10], [-60], [40]])
    out = []
    for w in range(n):
        x = (rng.standard_normal((blocks, K)) * scale).astype(np.float32)
        x[8] = 0                         # a block of zeros everywhere
        if w:                             # a block only worker 0 has
            x[9] = 0
        x[10, ::3] = 0
        out.append(x)
    return out


def aggregate(inputs: list[np.ndarray], average: bool, dtype=np.float32):
    """What the workers and the switch compute together; also the exponents used."""
    n = len(inputs)
    own = [q.block_exponents(x) for x in inputs]
    agreed = np.max(own, axis=0)
    quantized = [q.quantize(x, e, agreed, n).astype(np.int64) for x, e in zip(inputs, own)]
    limit = 2 ** q.scale_bits(n) - 1
    assert all(np.abs(v).max() <= limit for v in quantized)
    total = np.sum(quantized, axis=0)
    assert np.abs(total).max() <= 2**31 - 1, "the int32 sum would overflow"
    result = q.dequantize(total.astype(np.int32), agreed, n, average=average, dtype=dtype)
    return result, agreed


def check_bound(result, inputs, agreed, n, average, output_ulps):
    reference = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    magnitude = np.sum([np.abs(x.astype(np.float64)) for x in inputs], axis=0)
    if average:
        reference, magnitude = reference / n, magnitude / n
    bound = (q.error_bound(agreed, n, average=average)[:, None]
             + output_ulps
             + magnitude * n * 2.0**-52)          # rounding of the float64 reference itself
    error = np.abs(result.astype(np.float64) - reference)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), (f"element {worst}: error {error[worst]:.3e} > bound "
                                    f"{bound[worst]:.3e} (E_max {agreed[worst[0]]})")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16, 31, 32])
@pytest.mark.parametrize("average", [False, True])
def test_every_element_within_the_bound(n, average):
    inputs = worker_inputs(n, 200, seed=n)
    result, agreed = aggregate(inputs, average)
    half_ulp = np.spacing(np.abs(result)).astype(np.float64) / 2
    check_bound(result, inputs, agreed, n, average, half_ulp)


def test_bound_is_tight_enough_to_mean_something():
    inputs = worker_inputs(4, 50, seed=1)
    result, agreed = aggregate(inputs, average=False)
    reference = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    largest = np.abs(reference).max(axis=1)
    nonzero = largest > 0
    # 4 workers: b = 29, so the bound is 2 * 2**(E-30) <= 2**-27 of 2**E, i.e. ~1e-8 of
    # the block's largest input. Every block is (nearly) full float32 precision.
    assert np.all(q.error_bound(agreed, 4, average=False)[nonzero] <= 2.0**(agreed[nonzero] - 27))
    assert np.all(np.abs(result - reference).max(axis=1)[nonzero]
                  <= largest[nonzero] * 2.0**-20 + 2.0**-149)


def test_float16_inputs_and_output():
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal((100, K)) * 2.0**rng.integers(-20, 12, (100, 1)))
              .astype(np.float16) for _ in range(4)]
    as32 = [x.astype(np.float32) for x in inputs]
    result, agreed = aggregate(as32, average=True, dtype=np.float16)
    assert result.dtype == np.float16
    half_ulp = np.spacing(np.abs(result)).astype(np.float64) / 2
    check_bound(result, as32, agreed, 4, True, half_ulp)


def test_bfloat16_through_float32():
    torch = pytest.importorskip("torch", reason="the [torch] extra is not installed")
    gen = torch.Generator().manual_seed(4)
    inputs = [torch.randn(100 * K, generator=gen, dtype=torch.float32).to(torch.bfloat16)
              for _ in range(3)]
    as32 = [t.float().numpy().reshape(-1, K) for t in inputs]
    result32, agreed = aggregate(as32, average=True)
    result = torch.from_numpy(result32).to(torch.bfloat16).double().numpy()
    # Rounded to float32, then to bfloat16 (8 significant bits, float32 has 24).
    spacing32 = np.spacing(np.abs(result32)).astype(np.float64)
    check_bound(result, as32, agreed, 3, True, spacing32 / 2 + spacing32 * 2.0**16 / 2)


def test_blocks_are_views_of_the_array_but_the_padded_last_one():
    x = np.arange(K * 3 + 5, dtype=np.float32)
    b = q.Blocks(x, K)
    assert len(b) == 4 and np.shares_memory(b.whole, x) and b.whole.shape == (3, K)
    assert np.all(b.tail[0, :5] == x[-5:]) and np.all(b.tail[0, 5:] == 0)
    assert np.shares_memory(b.rows(np.array([1, 2])), x)      # consecutive whole: a view
    assert b.view(np.array([2, 1])) is None and b.view(np.array([2, 3])) is None
    rows = b.rows(np.array([3, 0]))                            # a copy, the padded one included
    assert np.all(rows[0] == b.tail[0]) and np.all(rows[1] == x[:K])
    b.write(np.array([3, 1]), np.full((2, K), -1, dtype=np.float32))
    assert np.all(x[-5:] == -1) and np.all(x[K:2 * K] == -1)   # of the last, what the array has
    assert np.all(x[:K] == np.arange(K)) and np.all(x[2 * K:3 * K] == np.arange(2 * K, 3 * K))
    assert len(q.Blocks(np.ones(K - 1), K)) == 1 and len(q.Blocks(np.ones(0), K)) == 0
    with pytest.raises(ValueError, match="flat"):
        q.Blocks(np.ones((2, K)), K)


def test_consecutive_indices_become_slices():
    assert q.consecutive(np.array([4, 5, 6])) == slice(4, 7)
    assert q.consecutive(np.array([9])) == slice(9, 10)
    for index in ([], [4, 6], [5, 4], [4, 6, 5], [1, 2, 2]):
        assert q.consecutive(np.array(index, dtype=np.int64)) is None, index


def test_block_exponent_is_the_smallest_power_of_two_above_the_block():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((500, K)) * 2.0**rng.integers(-120, 120, (500, 1))).astype(np.float32)
    x[0] = 0
    x[1, :] = 0
    x[1, 7] = np.float32(2.0**-149)     # smallest subnormal
    x[2, :] = 2.0**5                    # exact powers of two: E is one more
    e = q.block_exponents(x).astype(np.int64)
    largest = np.abs(x.astype(np.float64)).max(axis=1)
    assert e[0] == EXPONENT_OF_ZERO and e[1] == -126 and e[2] == 6
    normal = slice(2, None)
    assert np.all(largest[normal] < 2.0 ** e[normal])
    assert np.all(largest[normal] >= 2.0 ** (e[normal] - 1))


@pytest.mark.parametrize("bad, index", [(np.nan, 70), (np.inf, 3), (-np.inf, 64 * 9),
                                        (np.float32(2.0**126), 200)])
def test_nan_inf_and_huge_values_poison_their_block_on_every_worker(bad, index):
    mine = np.ones((10, K), dtype=np.float32)
    mine.reshape(-1)[index] = bad
    other = np.ones((10, K), dtype=np.float32)
    own = [q.block_exponents(x) for x in (mine, other)]
    block = index // K
    assert own[0][block] == q.POISON_EXPONENT
    assert np.all(np.delete(own[0], block) == 1) and np.all(own[1] == 1)
    agreed = np.max(own, axis=0)
    sums = sum(q.quantize(x, e, agreed, 2).astype(np.int64) for x, e in zip((mine, other), own))
    assert np.all(sums[block] == 0)           # nothing of the bad block reaches the switch
    result = q.dequantize(sums.astype(np.int32), agreed, 2, average=False)
    assert np.all(np.isnan(result[block]))
    assert np.all(np.delete(result, block, axis=0) == 2)
    told = q.nonfinite(mine.reshape(-1))
    assert told.startswith(f"cannot aggregate {np.float32(bad)} at index {index}")
    assert q.describe_poison(told, agreed, K).startswith(told)
    assert q.nonfinite(other.reshape(-1)) is None
    assert q.describe_poison(None, agreed, K).startswith("another worker sent NaN")
    assert f"from index {block * K} are NaN" in q.describe_poison(None, agreed, K)


def test_largest_finite_magnitude_is_below_2_to_126():
    x = np.ones((2, K), dtype=np.float32)
    x[1, 5] = -np.nextafter(np.float32(2.0**126), np.float32(0))
    assert q.block_exponents(x)[1] == 126 == q.MAX_EXPONENT


def test_a_scale_below_a_workers_own_exponent_clips_and_is_never_usable():
    x = np.ones((2, K), dtype=np.float32)
    x[1] *= -1000
    own = q.block_exponents(x)
    v = q.quantize(x, own, own - 3, 2).astype(np.int64)
    b = q.scale_bits(2)
    assert np.abs(v).max() == 2**b - 2**(b - 24)               # clipped, not wrapped
    assert not q.usable(own - 3, own).any()                    # so the switch's max says redo


def switch_with_speculation(calls: list[list[np.ndarray]]):
    """Workers and a saturating int32 switch over a sequence of calls of one shape.
    The decisions are the transport's own functions: ``speculate`` from the last
    calls' maxima, ``settle`` on each result (keep, or redo with the maximum, once:
    a redone block must be kept), ``remember`` for the next call. Returns per call
    the result, the scales kept and how many blocks were redone."""
    history, out = None, []
    for inputs in calls:
        n = len(inputs)
        own = [q.block_exponents(x) for x in inputs]
        agreed = np.max(own, axis=0).astype(np.int64)     # the switch's exponent maximum

        def switch(rows, scale):
            return np.clip(np.sum([q.quantize(x[rows], e[rows], scale, n).astype(np.int64)
                                   for x, e in zip(inputs, own)], axis=0), -2**31, 2**31 - 1)

        everything = np.arange(len(agreed))
        scale = q.speculate(history, len(agreed))
        total = switch(everything, scale)
        keep, scale = q.settle(scale, agreed)
        redo = everything[~keep]
        total[redo] = switch(redo, scale[redo])
        again, _ = q.settle(scale[redo], agreed[redo])
        assert again.all(), "a block redone with the agreed maximum must be kept"
        out.append((q.dequantize(total.astype(np.int32), scale, n, average=False), scale,
                    len(redo)))
        history = q.remember(agreed, history)
    return out


def test_mispredicted_scales_are_redone_and_every_kept_result_is_within_the_bound():
    """Scales drift by up to 2**3 per call in both directions, so the speculation
    misses often (too small: clipped; too large: precision) and is repaired."""
    rng = np.random.default_rng(4)
    n, blocks = 4, 300
    base = [(rng.standard_normal((blocks, K))).astype(np.float32) for _ in range(n)]
    drift = np.zeros((blocks, 1))
    calls = []
    for step in range(6):
        drift = drift + rng.integers(-3, 4, size=(blocks, 1))
        calls.append([(b * 2.0 ** drift).astype(np.float32) for b in base])
    results = switch_with_speculation(calls)
    assert results[0][2] == blocks                      # no history: every block probed
    assert 0 < sum(r[2] for r in results[1:]) < 5 * blocks
    for inputs, (result, scale, _) in zip(calls, results):
        agreed = np.max([q.block_exponents(x) for x in inputs], axis=0)
        assert np.all((scale >= agreed) & (scale - agreed <= q.SLACK))
        check_bound(result, inputs, scale, n, False, np.spacing(np.abs(result)) / 2)


def test_gradients_whose_exponents_move_by_two_bits_are_not_redone():
    """As DDP's gradients do (benchmarks/bench_exponents.py: a block's agreed exponent
    moves by 1 in 46 % of steps and by 2 in 7 %), each block's maximum wanders
    around a level of its own, 0 to 2 bits above it, from call to call: changes of
    up to 2 bits either way. After the first call (probes) no block is redone, and
    every result is within the bound. With one bit of headroom every rise by 2
    (a ninth of the blocks) was redone."""
    rng = np.random.default_rng(6)
    n, blocks, calls = 4, 400, 8
    level = rng.integers(-30, 0, size=(blocks, 1))
    sequence = []
    for _ in range(calls):
        top = level + rng.integers(0, 3, size=(blocks, 1))     # the agreed exponent
        inputs = []
        for _ in range(n):
            x = rng.standard_normal((blocks, K))
            x *= rng.uniform(0.5, 0.99, (blocks, 1)) * 2.0 ** top / np.abs(x).max(1, keepdims=True)
            inputs.append(x.astype(np.float32))
        assert (np.max([q.block_exponents(x) for x in inputs], axis=0) == top[:, 0]).all()
        sequence.append(inputs)
    results = switch_with_speculation(sequence)
    assert [r[2] for r in results] == [blocks] + [0] * (calls - 1)
    for inputs, (result, scale, _) in zip(sequence, results):
        check_bound(result, inputs, scale, n, False, np.spacing(np.abs(result)) / 2)


def test_a_steady_shape_needs_no_redo():
    rng = np.random.default_rng(5)
    x = [(rng.standard_normal((50, K)) * 2.0 ** rng.integers(-20, 10, (50, 1))).astype(np.float32)
         for _ in range(3)]
    results = switch_with_speculation([[v * 0.9 for v in x], x, [v * 1.3 for v in x]])
    assert [r[2] for r in results] == [50, 0, 0]


def test_poison_is_probed_again_and_zeros_are_final_at_any_scale():
    history = q.remember(np.array([3, 3]), None)
    history = q.remember(np.array([9, q.POISON_EXPONENT]), history)
    assert list(q.speculate(history, 2)) == [9 + q.HEADROOM, q.PROBE_EXPONENT]
    # The probe told the block's maximum: predicted from the largest known since.
    history = q.remember(np.array([4, 1]), history)
    assert list(q.speculate(history, 2)) == [9 + q.HEADROOM, 3 + q.HEADROOM]
    keep, scale = q.settle(np.array([5, q.PROBE_EXPONENT]),
                           np.array([EXPONENT_OF_ZERO, q.POISON_EXPONENT]))
    assert keep.all() and list(scale) == [5, q.POISON_EXPONENT]


def test_speculation_takes_the_largest_of_the_last_calls_maxima():
    history = None
    for agreed in ([1, 5, -3], [4, 2, EXPONENT_OF_ZERO], [2, 2, -9], [0, 1, -9]):
        history = q.remember(np.array(agreed, dtype=np.int8), history)
    assert history.shape == (q.DEPTH, 3) and history.dtype == np.int8
    # The first call's [1, 5, -3] is past DEPTH = 3; a block of zeros counts as none.
    assert list(q.speculate(history, 3)) == [4 + q.HEADROOM, 2 + q.HEADROOM, -9 + q.HEADROOM]


def test_every_worker_speculates_the_same_scales_from_what_the_switch_returned():
    """Workers keep the history apart, from the switch's maxima as each received them
    (the wire's int8 in a packet's big-endian record, or an int64 copy), through
    a poisoned block, zeros and a call of another size of the same name; and their
    own exponents differ. Every call, every worker's scales are the same: a pure
    function of the agreed maxima."""
    from innet_aggregation.worker.transport import history_key, same_name
    rng = np.random.default_rng(17)
    n, workers, calls = 50, 4, 12
    histories: list[dict] = [{} for _ in range(workers)]
    for c in range(calls):
        blocks = n + 7 * (c == 6)                            # a rebuilt bucket
        own = [rng.integers(-40, 10, blocks).astype(np.int8) for _ in range(workers)]
        own[c % workers][c] = q.POISON_EXPONENT
        own[0][-1] = EXPONENT_OF_ZERO
        agreed = np.max(own, axis=0)
        wire = np.zeros(blocks, dtype=[("h", "V3"), ("exponent", "i1"), ("v", ">i4")])
        wire["exponent"] = agreed
        received = [wire["exponent"], agreed.astype(np.int64), agreed.copy(), wire["exponent"]]
        scales = []
        for history, got in zip(histories, received):
            key = history_key("bucket 0", blocks * K, 0)
            previous = history.get(key)
            if previous is None:
                previous = same_name(history, "bucket 0", blocks)
            scales.append(q.speculate(previous, blocks))
            history[key] = q.remember(got, history.pop(key, None))
        for s in scales[1:]:
            np.testing.assert_array_equal(s, scales[0])
        assert (scales[0] == q.PROBE_EXPONENT).all() == (c == 0)


def test_recorded_gradients_redo_under_one_percent_within_the_bound():
    """The recorded DDP gradients (testbed.gradients), 4 workers, their 31 replayed
    calls: after the first call's probes, under 1 % of the blocks are redone
    (`bench_exponents --recorded`: 0.49 % for 256 values), and every element of
    every call is within the bound in terms of the block's maximum:
    n * 2**(E_max + SLACK - b - 1) against the float64 sum."""
    from innet_aggregation.testbed import gradients
    data = gradients.load()
    n, k = 4, 256
    length = len(gradients.MODELS) * gradients.PIECES * gradients.PIECE
    calls = [[gradients.replay(data, length, c, w).reshape(-1, k) for w in range(n)]
             for c in range(2 * data.kept_steps - 1)]
    results = switch_with_speculation(calls)
    blocks = length // k
    zeros = np.max([q.block_exponents(x) for x in calls[0]], axis=0) == EXPONENT_OF_ZERO
    assert results[0][2] == blocks - zeros.sum()       # probed; zeros are final at any scale
    redone = sum(r[2] for r in results[1:]) / (blocks * (len(calls) - 1))
    assert 0 < redone < 0.01
    for inputs, (result, scale, _) in zip(calls, results):
        agreed = np.max([q.block_exponents(x) for x in inputs], axis=0).astype(np.int64)
        live = agreed != EXPONENT_OF_ZERO
        assert np.all((scale >= agreed) & (scale - agreed <= q.SLACK) | ~live)
        check_bound(result, inputs, agreed + q.SLACK, n, False, np.spacing(np.abs(result)) / 2)


def test_settle_keeps_only_unclipped_precise_scales_and_redoes_with_the_maximum():
    agreed = np.array([3, 3, 3, 3, 3, -128])
    # clipped, exact, +SLACK, +SLACK + 1, probe, zeros
    scale = np.array([2, 3, 3 + q.SLACK, 4 + q.SLACK, 126, 9])
    keep, now = q.settle(scale, agreed)
    assert list(keep) == [False, True, True, False, False, True]
    assert list(now) == [3, 3, 3 + q.SLACK, 3, 3, 9]


@pytest.mark.parametrize("n", list(range(1, 33)))
def test_no_overflow_at_the_largest_values_for_up_to_32_workers(n):
    # Every worker at the top of the block's range, same sign: the worst case.
    x = np.full((3, K), np.nextafter(np.float32(2.0**10), np.float32(0)), dtype=np.float32)
    x[1] *= -1
    x[2] = np.nextafter(np.float32(2.0**q.MAX_EXPONENT), np.float32(0))
    e = q.block_exponents(x)
    v = q.quantize(x, e, e, n).astype(np.int64)
    # The largest float32 below 2**E, scaled: 2**b - 2**(b-24), an integer below 2**b.
    assert np.abs(v).max() == 2 ** q.scale_bits(n) - 2 ** (q.scale_bits(n) - 24)
    assert n * np.abs(v).max() <= 2**31 - 1


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8, 12, 32])
@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_dequantize_is_one_rounding_of_the_exact_value(n, average, dtype):
    """Whichever internal path it takes, every bit equals float64-exact then one cast:
    a fixed function of (sum, E_max), so every worker gets the same bits."""
    rng = np.random.default_rng(n)
    sums = rng.integers(-2**31 + 1, 2**31, size=(300, K)).astype(np.int32)
    sums[:, :8] = rng.integers(-300, 300, size=(300, 8))
    agreed = rng.integers(-128, q.POISON_EXPONENT, size=300).astype(np.int8)
    agreed[:100] = rng.integers(-20, 20, size=100)       # the usual gradient range
    expected = sums.astype(np.float64) * np.ldexp(1.0, agreed.astype(np.int64)
                                                  - q.scale_bits(n))[:, None]
    if average:
        expected /= n
    with np.errstate(over="ignore"):      # float16 overflows to inf, both ways alike
        expected = expected.astype(dtype)
        got = q.dequantize(sums, agreed, n, average=average, dtype=dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), expected.view(f"u{got.itemsize}"))
    # Into a strided big-endian view, as the transport hands it over.
    packets = np.zeros(300, dtype=[("h", "V10"), ("values", ">i4", (K,))])
    packets["values"] = sums
    with np.errstate(over="ignore"):
        again = q.dequantize(packets["values"], agreed, n, average=average, dtype=dtype)
    np.testing.assert_array_equal(again.view(f"u{got.itemsize}"), expected.view(f"u{got.itemsize}"))


def test_quantize_scales_exactly_as_ldexp():
    """The fast path multiplies by 2**shift; it must round exactly as ldexp does,
    subnormal inputs and results included."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((500, K)) * 2.0 ** rng.integers(-149, 20, (500, 1))).astype(np.float32)
    e = q.block_exponents(x)
    scale = np.clip(e.astype(np.int64) + rng.integers(0, 3, 500), -96, q.MAX_EXPONENT)
    shift = q.scale_bits(5) - scale
    expected = np.rint(np.ldexp(x, shift[:, None].astype(np.int32))).astype(np.int32)
    np.testing.assert_array_equal(q.quantize(x, e, scale, 5), expected)


def test_quantize_into_big_endian_packet_field_or_float32_scratch():
    x = worker_inputs(1, 20, seed=9)[0]
    e = q.block_exponents(x)
    scale = e.astype(np.int64) + 1
    scale[3] = e[3] - 2                                # clipped
    expected = q.quantize(x, e, scale, 3)
    packets = np.zeros(20, dtype=[("h", "V10"), ("values", ">i4", (K,))])
    q.quantize(x, e, scale, 3, out=packets["values"])
    np.testing.assert_array_equal(packets["values"], expected)
    work = np.empty((20, K), dtype=np.float32)
    assert q.quantize(x, e, scale, 3, out=work) is work
    np.testing.assert_array_equal(work.astype(np.int64), expected)


def test_a_bucket_rebuilt_to_another_size_predicts_from_its_names_last_exponents():
    """DDP rebuilds its buckets after the first step: bucket 0 of 10 blocks becomes 2
    blocks (its first parameters) and a new bucket 1. Bucket 0 predicts from its
    first blocks of last time instead of probing; a new name, and blocks beyond the
    old ones, probe."""
    from innet_aggregation.worker.transport import history_key, same_name
    old = np.arange(-20, -10, dtype=np.int64)
    history = {history_key("bucket 0", 2410, 0): q.remember(old, None),
               history_key("other", 330, 0): q.remember(old + 5, None)}
    assert list(q.speculate(same_name(history, "bucket 0", 2), 2)) == list(old[:2] + q.HEADROOM)
    longer = same_name(history, "bucket 0", 12)
    assert list(q.speculate(longer, 12)) == list(old + q.HEADROOM) + [q.PROBE_EXPONENT] * 2
    assert same_name(history, "bucket 1", 9) is None
