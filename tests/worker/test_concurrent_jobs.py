"""Two jobs through one switch at once, on disjoint hosts, slots and service
addresses: both exact, and resetting or removing one leaves the other's calls
exact while they run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.worker.test_end_to_end import check_run
from tests.worker.test_reset import switch_ctl

# Calls long enough for job B to be still running while job A is reset and removed.
B_REPS = {"softswitch": 80, "softswitch-python": 40, "bmv2": 12}


def args(seed: int, reps: int, out) -> list[str]:
    return ["--size", "20000", "--reps", str(reps), "--seed", str(seed), "--save", str(out)]


def test_two_jobs_at_once_and_one_leaving_spares_the_other(fabric, tmp_path):
    a = fabric.job(4, num_slots=8)
    b = fabric.job(4, num_slots=8, first_host=4, service=("10.0.0.253", "02:00:00:00:00:fd"))
    with ThreadPoolExecutor(2) as pool:
        runs_a = pool.submit(fabric.run, a, args(21, 4, tmp_path / "a"))
        runs_b = pool.submit(fabric.run, b, args(22, 4, tmp_path / "b"))
        check_run(runs_a.result(), a, tmp_path / "a", size=20000, seed=21, reps=4)
        check_run(runs_b.result(), b, tmp_path / "b", size=20000, seed=22, reps=4)

        reps = B_REPS[fabric.target]
        runs_b = pool.submit(fabric.run, b, args(23, reps, tmp_path / "b2"))
        reset = switch_ctl("reset", str(a.path))
        assert reset.returncode == 0, reset.stderr
        fabric.remove(a)
        assert not runs_b.done(), "job B finished before A was reset and removed: no overlap"
        check_run(runs_b.result(), b, tmp_path / "b2", size=20000, seed=23, reps=reps)
    fabric.remove(b)
