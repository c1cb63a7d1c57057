"""Medians with a 95 % bootstrap interval: single calls here vary 2-10x, so a
figure is judged by its interval, never by one call or a min-max."""

from __future__ import annotations

import numpy as np

LEVEL = 0.95
RESAMPLES = 4000
MIN_CALLS = 15        # timed calls a point needs before its interval means anything


def median_interval(samples, level: float = LEVEL, resamples: int = RESAMPLES,
                    seed: int = 0) -> dict:
    """{"median", "lo", "hi", "n"}: the sample median and the percentile bootstrap
    interval of the median."""
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1 or not len(x):
        raise ValueError("median_interval needs a non-empty list of numbers")
    rng = np.random.default_rng(seed)
    boot = np.median(x[rng.integers(0, len(x), (resamples, len(x)))], axis=1)
    tail = (1 - level) / 2
    return {"median": float(np.median(x)), "lo": float(np.quantile(boot, tail)),
            "hi": float(np.quantile(boot, 1 - tail)), "n": len(x)}


def ratio_interval(a, b, level: float = LEVEL, resamples: int = RESAMPLES,
                   seed: int = 0) -> dict:
    """median(a) / median(b), and the bootstrap interval of that ratio (a and b
    resampled independently: they are separate calls)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not len(a) or not len(b):
        raise ValueError("ratio_interval needs samples on both sides")
    rng = np.random.default_rng(seed)
    boot = (np.median(a[rng.integers(0, len(a), (resamples, len(a)))], axis=1)
            / np.median(b[rng.integers(0, len(b), (resamples, len(b)))], axis=1))
    tail = (1 - level) / 2
    return {"median": float(np.median(a) / np.median(b)), "lo": float(np.quantile(boot, tail)),
            "hi": float(np.quantile(boot, 1 - tail)), "n": min(len(a), len(b))}


def judge(interval: dict, goal: float) -> str:
    """"met" when the whole interval is at or below ``goal``, "missed" when all of it
    is above, else "undecided" (more calls, or a quieter machine, would tell)."""
    if interval["hi"] <= goal:
        return "met"
    return "missed" if interval["lo"] > goal else "undecided"
