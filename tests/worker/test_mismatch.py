"""Ranks that issue different calls: every rank raises CallMismatch on the first call
that differs, naming its own call, and none returns a sum; after a reset new
sessions on the same job are exact.

Two calls of one size in swapped order are the same calls on the wire unless they
are named (``allreduce(..., name=...)``): the swapped-order cases use different
sizes, or names.
"""

from __future__ import annotations

import pytest

from .test_end_to_end import check_run
from .test_reset import switch_ctl

SIZE = 1000


def calls(*specs: str) -> list[str]:
    return [arg for spec in specs for arg in ("--call", spec)]


@pytest.mark.parametrize("case, per_worker", [
    # Ranks 0 and 1 sum 1,000 values, rank 2 2,000; then all three 1,000.
    ("size", {0: ("1000", "1000"), 1: ("1000", "1000"), 2: ("2000", "1000")}),
    ("order", {0: ("1000", "3000"), 1: ("3000", "1000")}),
    ("named order", {0: ("1000:A", "1000:B"), 1: ("1000:B", "1000:A")}),
])
def test_every_rank_raises_on_the_first_call_that_differs(fabric, tmp_path, case, per_worker):
    job = fabric.job(len(per_worker), num_slots=8)
    outdir = tmp_path / "mismatch"
    runs = fabric.run(job, ["--save", str(outdir)],
                      extra={w: calls(*specs) for w, specs in per_worker.items()}, timeout=60)
    for run in runs:
        own = per_worker[run.worker][0]
        size, _, name = own.partition(":")
        label = f"call 1 ({size} elements" + (f", '{name}')" if name else ")")
        assert run.returncode == 1, f"worker {run.worker}: {run.reports}\n{run.stderr[-2000:]}"
        (report,) = run.reports                  # the first call failed; no second one
        assert report["error"].startswith(f"CallMismatch: job {job.id}, worker {run.worker}, "
                                          f"{label}: "), report["error"]
        assert "did not all issue this call" in report["error"]
        assert "digest" not in report and report["seconds"] < 10    # no sum, no timeout
    assert not outdir.exists(), "a rank saved a result"

    # The slots hold the failed calls' contributions: reset them, as the error says,
    # and the job goes on exactly (named calls too).
    reset = switch_ctl("reset", str(job.path))
    assert reset.returncode == 0, reset.stderr
    again = tmp_path / "again"
    runs = fabric.run(job, ["--save", str(again), "--seed", "3"] + calls(f"{SIZE}:A", f"{SIZE}:B"))
    check_run(runs, job, again, size=SIZE, seed=3, reps=2)
    fabric.remove(job)
