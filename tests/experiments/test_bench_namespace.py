"""`bench-allreduce`'s path end to end, short: 2 workers in namespaces, 100 Mbit/s
links, recorded gradients, 3 timed calls (no more: --min-timed-s 0). SLOW-ish: about 25-40 s on a loaded
2-core machine (one testbed, a bulk transfer, 10 calls); needs root and Mininet."""

from __future__ import annotations

import json

import pytest

from innet_aggregation.experiments import baseline as baseline_experiment

from tests.testbed.test_topology import _skip_reason

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def test_two_workers_one_rate_recorded_gradients(tmp_path, capsys):
    out = tmp_path / "baseline"
    assert baseline_experiment.main(["--workers", "2", "--bw", "100", "--values", "1024",
                                     "--reps", "3", "--min-timed-s", "0",
                                     "--out", str(out)]) == 0, \
        capsys.readouterr().err
    record = out / "bench-allreduce.json"
    [point] = json.loads(record.read_text())["figures"]["points"]
    # Every call's sum was checked against the float64 sum of the recorded gradients
    # (measure raises on a wrong one); what is left to check is the model's figures.
    assert point["data"] == "recorded" and point["goal"] == "too few calls"
    switch, gloo = point["switch"], point["gloo"]
    assert 50 < switch["capacity_mbit"] < 200          # a 100 Mbit/s link, its bucket aside
    # The switch path's first transmissions carry the tensor once: at least 1 MiB, at most
    # 10 % more. What the bucket dropped is sent again, each resend one more frame; the
    # record's count (all calls, all workers) bounds any one worker's in any one call.
    resent = switch["retransmissions"] * baseline_experiment.agg_frame_bytes(1024)
    assert 4 * 262144 <= switch["wire_bytes"] < 1.1 * 4 * 262144 + resent
    assert switch["blocks_per_call"] == 256 and 0 <= switch["redone_per_call"] < 256
    for path in (switch, gloo):
        t = path["time_ms"]
        assert t["lo"] <= t["median"] <= t["hi"] and t["n"] == 3
        assert path["link_ms"] > 0.5 * t["median"]     # 100 Mbit/s links bind, roughly
    assert point["limit"] == pytest.approx(switch["link_ms"] / gloo["link_ms"])
    assert point["bound"] in ("links", "burst", "hosts")
    assert (out / "baseline.csv").exists() and (out / "baseline.png").exists()
    # Where the switch path's time went, its phases' medians beside gloo's time: the
    # 100 Mbit/s links make most of the call a wait for the switch and the wire.
    ms = switch["breakdown_ms"]
    assert ms["wait"] > 0.3 * switch["time_ms"]["median"], ms
    assert ms["network_wait"] > ms["ranks_wait"], ms
    assert gloo["breakdown_ms"] is None
    assert "  switch path " in capsys.readouterr().out
