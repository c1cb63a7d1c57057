"""The compiled fast path's numbers are quantize.quantize's and quantize.dequantize's,
bit for bit, on random and edge-case blocks: subnormals, zeros, the poison, clipped
blocks (own exponent above the scale), scales whose factor is not a float32, for
n = 3, 4, 8 workers, sum and mean. The end-to-end tests run calls both ways."""

from __future__ import annotations

import numpy as np
import pytest

from innet_aggregation.p4src.protocol import EXPONENT_OF_ZERO, packet_format
from innet_aggregation.worker import fastpath
from innet_aggregation.worker import quantize as q

lib = fastpath.library()
needs_lib = pytest.mark.skipif(lib is None, reason="no C compiler: the fast path is off")
pytestmark = pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # both give Inf
K = 256


def blocks(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Float32 blocks over the whole exponent range, with their own exponents."""
    rng = np.random.default_rng(seed)
    scale = 2.0 ** rng.integers(-150, 126, size=(64, 1))
    x = (rng.standard_normal((64, K)) * scale).astype(np.float32)
    x[0] = 0
    x[1, ::2] = 0
    x[2] = np.float32(2.0 ** -149) * rng.integers(-5, 5, K)            # subnormals
    x[3, 7] = np.inf
    x[4, 3] = np.nan
    x[5] = np.float32(2.0 ** 125) * rng.standard_normal(K).astype(np.float32)
    x[6, :] = np.float32(0.5)                                          # ties for rint
    x[7] = rng.integers(-3, 4, K).astype(np.float32) + np.float32(0.5)
    return x, q.block_exponents(x).astype(np.int64)


def state(n: int, average: bool) -> fastpath.CallState:
    s = fastpath.CallState()
    fastpath.layout(s, packet_format(K), n, average)
    return s


def scales(own: np.ndarray, rng) -> np.ndarray:
    """Scales as speculation gives them: right, above, below (clipped), the probe,
    the poison, zero's exponent."""
    shift = rng.integers(-3, 6, len(own))
    scale = np.clip(own + shift, EXPONENT_OF_ZERO, q.MAX_EXPONENT)
    scale[:6] = [EXPONENT_OF_ZERO, q.PROBE_EXPONENT, q.POISON_EXPONENT, -126, -130, 120]
    return scale


@needs_lib
@pytest.mark.parametrize("n", [3, 4, 8, 1, 32])
@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_is_numpys_bit_for_bit(n, seed):
    x, own = blocks(seed)
    scale = scales(own, np.random.default_rng(seed + 10))
    expected = q.quantize(x, own, scale, n)
    s = state(n, False)
    got = np.zeros((len(x), K), dtype=">i4")
    for i in range(len(x)):
        lib.fp_quantize(fastpath.ctypes.byref(s), x[i].ctypes.data, int(own[i]), int(scale[i]),
                        got[i].ctypes.data)
    np.testing.assert_array_equal(got.astype(np.int32), expected)
    # Each block alone in numpy (its own path choice) gives the same bits as well.
    for i in range(len(x)):
        np.testing.assert_array_equal(q.quantize(x[i:i + 1], own[i:i + 1], scale[i:i + 1], n)[0],
                                      expected[i])


@needs_lib
@pytest.mark.parametrize("n", [3, 4, 8, 1, 32])
@pytest.mark.parametrize("average", [False, True])
def test_dequantize_is_numpys_bit_for_bit(n, average):
    rng = np.random.default_rng(n)
    bits = q.scale_bits(n)
    limit = n * (2 ** bits - 1)
    sums = rng.integers(-limit, limit + 1, size=(300, K)).astype(">i4")
    sums[0] = 0
    sums[1] = rng.integers(-3, 4, K)                 # small: subnormal results at low scales
    sums[2, :2] = [limit, -limit]
    scale = rng.integers(EXPONENT_OF_ZERO, q.MAX_EXPONENT + 1, len(sums))
    scale[:12] = [EXPONENT_OF_ZERO, -127, -126, -125, -100, -97, -96, 0, 95, 120, 125, 126]
    scale[12:24] = scale[:12]
    sums[12:24] = sums[1]
    expected = q.dequantize(sums, scale, n, average=average)
    s = state(n, average)
    got = np.zeros((len(sums), K), dtype=np.float32)
    for i in range(len(sums)):
        lib.fp_dequantize(fastpath.ctypes.byref(s), sums[i].ctypes.data, int(scale[i]),
                          got[i].ctypes.data)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_without_a_compiler_the_python_path_runs_and_says_so(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("CC", "no-such-cc-here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))    # nothing cached to fall back on
    fastpath.library.cache_clear()
    try:
        with caplog.at_level("INFO", logger="worker"):
            assert fastpath.library() is None
            assert fastpath.library() is None
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "no-such-cc-here" in lines[0], lines
    finally:
        fastpath.library.cache_clear()
