"""The fuzz campaign, short (a few thousand frames per target): every hostile frame
accounted for by the switch's outcome counters, every allreduce exact. `make fuzz`
runs the long one (tests/worker/fuzz.py)."""

from __future__ import annotations

from .fuzz import campaign

# (frames at least, frames per second, alone and while the workers run): a few thousand
# in all, well within what each target forwards (BMv2: ~1-3 k/s).
SIZING = {"softswitch": (4000, 1000), "softswitch-python": (3000, 600), "bmv2": (600, 200)}


def test_hostile_frames_are_all_accounted_for_and_calls_stay_exact(fabric, tmp_path):
    frames, rate = SIZING[fabric.target]
    report = campaign(fabric, tmp_path, frames=frames, rate=rate, size=6000, reps=3)
    assert report["problems"] == []
    assert report["frames"] >= frames
    hostile = report["phases"]["hostile"]
    assert all(hostile["sent"][kind] > 0 for kind in ("agg", "spoof", "l2"))
    assert hostile["outcomes"]["spoofed_source"] == hostile["sent"]["spoof"] > 0
    assert report["phases"]["concurrent"]["exact"] and report["phases"]["after"]["exact"]
