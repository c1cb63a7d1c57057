"""DDP on two namespaced hosts: the switch hook against plain gloo allreduce.

Tolerance for one step's averaged gradients, hook against gloo on the same bucket:
2**-20 of the bucket's largest gradient. The hook's quantization error is at most
2**-30 of a block's largest gradient for two workers (innet_aggregation/worker/quantize.py: the mean's
bound is 2**(E_max - 31) with 2**E_max <= 2 max|g|), and each side rounds its result
to float32 (2**-24 relative); 2**-20 leaves room for both and would still catch an
error of one bit in 2**19.
"""

from __future__ import annotations

import numpy as np

TOLERANCE = 2.0**-20


def test_ddp_through_the_switch_trains_like_gloo(fabric, tmp_path):
    job = fabric.job(2, num_slots=16)
    reports = {}
    for offset, backend in enumerate(("gloo", "switch")):
        master = f"{job.hosts[0].ip}:{29600 + 2 * job.id + offset}"
        runs = fabric.run(job, ["--backend", backend, "--master", master, "--save", str(tmp_path)],
                          module="tests.worker.ddp_train", timeout=900)
        for run in runs:
            assert run.returncode == 0, f"{backend} rank {run.worker}:\n{run.stderr[-3000:]}"
        reports[backend] = [run.reports[0] for run in runs]

    switch, gloo = reports["switch"], reports["gloo"]
    for report in switch:
        # Every bucket of every step: one at first, two after DDP rebuilds them.
        assert report["buckets"] == 2 * report["steps"] - 1
        assert report["max_relative_error"] <= TOLERANCE
    for rank in range(2):
        a = np.load(tmp_path / f"switch_grads_{rank}.npy")
        b = np.load(tmp_path / f"gloo_grads_{rank}.npy")
        assert np.abs(a - b).max() <= TOLERANCE * np.abs(b).max()
    assert switch[0]["accuracy"] == switch[1]["accuracy"]
    assert gloo[0]["accuracy"] > 90
    assert abs(switch[0]["accuracy"] - gloo[0]["accuracy"]) <= 0.5
    fabric.remove(job)


def test_ranks_whose_calls_differ_get_the_error_from_backward(fabric, tmp_path):
    """Rank 1 allreduces 100 values of its own before training, so its calls are one
    ahead of rank 0's: the first bucket's call fails with CallMismatch on both ranks,
    and DDP raises the hook's error from the first backward() on each, promptly (rank
    1's bucket meets the broken session: TransportBroken, from the CallMismatch)."""
    job = fabric.job(2, num_slots=16)
    master = f"{job.hosts[0].ip}:{29700 + job.id}"
    runs = fabric.run(job, ["--backend", "switch", "--master", master, "--save", str(tmp_path)],
                      extra={0: ["--extra-call", "0"], 1: ["--extra-call", "100"]},
                      module="tests.worker.ddp_train",
                      timeout=120)
    errors = {}
    for run in runs:
        assert run.returncode == 1, f"rank {run.worker}:\n{run.stderr[-3000:]}"
        (report,) = run.reports
        assert report["steps"] == 0
        errors[run.worker] = report["error"]
    assert (f"CallMismatch: job {job.id}, worker 0, call 1 (2410 elements, 'bucket 0')"
            in errors[0]), errors
    assert "TransportBroken: an earlier aggregation failed" in errors[1], errors
    fabric.remove(job)
