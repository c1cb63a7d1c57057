"""The embedded switch's packet threads (``--io-threads``): each receives on its own
share of the ports and runs the pipeline beside the others, each frame under the lock
of its slot's share of the registers (the aggregation program is sharded). Eight workers on eight ports over four threads, so every slot's contributions
come in on different threads and its results leave from whichever took the last."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

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
        lanes = [f"ss-lane-{i}" for i in range(4)]
        started = time.monotonic() + 5        # the lanes start once the pipeline is set
        while lane_threads(fabric.switch.process.pid) != lanes and time.monotonic() < started:
            time.sleep(0.1)
        assert lane_threads(fabric.switch.process.pid) == lanes
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


def test_four_parallel_lanes_give_results_bit_identical_to_one(tmp_path):
    """The aggregation program is sharded by slot: on four lanes the pipeline runs in
    parallel, each frame under its slot's share's lock. The same job on one lane and on
    four must give the same bits, every worker and every call."""
    skip_unless_runnable("softswitch")
    size, reps = 100_000, 2
    saved = {}
    for lanes in (1, 4):
        fabric = Fabric("softswitch", 4, tmp_path / f"fabric{lanes}", io_threads=lanes,
                        tag=f"l{lanes}")
        (tmp_path / f"fabric{lanes}").mkdir()
        out = tmp_path / f"out{lanes}"
        out.mkdir()
        fabric.start()
        try:
            job = fabric.job(4, num_slots=32)
            runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed", "5",
                                    "--save", str(out)])
            check_run(runs, job, out, size=size, seed=5, reps=reps)
        finally:
            fabric.stop()
        saved[lanes] = out
    for w in range(4):
        for rep in range(reps):
            one, four = (np.load(saved[lanes] / f"result_{w}_{rep}.npy") for lanes in (1, 4))
            np.testing.assert_array_equal(four.view(np.uint32), one.view(np.uint32),
                                          err_msg=f"worker {w}, call {rep}")
