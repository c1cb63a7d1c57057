"""The embedded switch's packet threads (``--io-threads``): each receives on its own
share of the ports and sends what its frames made, while the pipeline runs under one
lock. Eight workers on eight ports over four threads, so every slot's contributions
come in on different threads and its results leave from whichever took the last."""

from __future__ import annotations

import time
from pathlib import Path

from .harness import Fabric, skip_unless_runnable
from .test_end_to_end import check_run


def lane_threads(pid: int) -> list[str]:
    names = (task.joinpath("comm").read_text().strip()
             for task in Path(f"/proc/{pid}/task").iterdir())
    return sorted(name for name in names if name.startswith("ss-lane-"))


def test_eight_workers_over_four_packet_threads_get_identical_results_within_the_bound(tmp_path):
    skip_unless_runnable("softswitch")
    # Its own namespaces' names: the session's fabric (conftest) may be up beside it.
    fabric = Fabric("softswitch", 8, tmp_path / "fabric", io_threads=4, tag="io")
    (tmp_path / "fabric").mkdir()
    fabric.start()
    try:
        assert lane_threads(fabric.switch.process.pid) == [f"ss-lane-{i}" for i in range(4)]
        job = fabric.job(8, num_slots=32)
        size, reps = 200_000, 3
        runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed", "8",
                                "--save", str(tmp_path)])
        check_run(runs, job, tmp_path, size=size, seed=8, reps=reps)
        least = 8 * reps * size // 1024       # a contribution each, at most 1,024 values a packet
        deadline = time.monotonic() + 5        # the counters file is rewritten once a second
        while (io := fabric.switch.io_counters()).get("received", 0) < least:
            assert time.monotonic() < deadline, io
            time.sleep(0.2)
        assert io["send_errors"] == io["no_room"] == io["no_port"] == 0, io
    finally:
        fabric.stop()
