"""`make bench-demo`'s repeated demo, end to end: both backends train on real hosts
through the real switch, run after run on the same testbed, every other run gloo
first, beside a busy process, and the record keeps every run under its own name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed.test_topology import _skip_reason

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
REPO = Path(__file__).resolve().parents[2]


def test_runs_alternate_and_each_is_recorded(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-m", "innet_aggregation.experiments.demo", "--workers", "2",
         "--target", "softswitch", "--epochs", "1", "--runs", "2", "--busy", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads((tmp_path / "results" / "demo-small-busy1.json").read_text())
    runs = record["figures"]["runs"]
    assert [r["first"] for r in runs] == ["switch", "gloo"]
    ratios = [r["step_ratio"] for r in runs]
    assert all(r["step_ms"]["switch"] / r["step_ms"]["gloo"] == pytest.approx(x)
               for r, x in zip(runs, ratios))
    assert record["figures"]["step_ratio"]["min"] == min(ratios)
    assert all(r["cpu_ms_per_mb"][b] > 0 for r in runs for b in ("switch", "gloo"))
    assert f"switch / gloo step time: {ratios[0]:.2f}, {ratios[1]:.2f}." in out.stdout
    # both backends trained the same model on the same data, twice
    backends = record["figures"]["backends"]
    assert backends["switch"][0]["steps"] == backends["gloo"][0]["steps"] > 0
    # the warm-up's packets counted apart: its first step probed all 3 blocks of the
    # 2,410 parameters (1024 values a packet), and it is part of the run's counts
    for a in backends["switch"]:
        assert a["warmup_steps"] == 2 and 3 <= a["warmup_redone"] <= a["redone"], a
        assert 6 <= a["warmup_packets"] <= a["aggregation_packets"], a
    assert record["params"]["busy"] == 1 and record["params"]["runs"] == 2
    # where the switch path's time went, beside gloo's: its mean call after the warm-up,
    # whose phases and rest make the call
    for a in backends["switch"]:
        b = a["breakdown"]
        assert b["calls"] > 0 and b["packets_sent"] > 0, b
        assert sum(b["phases"].values()) + b["other"] == pytest.approx(b["seconds"], rel=0.01)
    assert all(a["breakdown"] is None for a in backends["gloo"])
    assert "where the switch path's time went (worker " in out.stdout
    assert "gloo's allreduce: " in out.stdout
