"""The ``ina`` torch.distributed backend: training with no comm hook, every float
dtype, the collectives it hands to gloo, the transport's errors from ``Work.wait()``.

Training: the per-step parameters of the ``cpu:ina`` run against a gloo run of the
same model, data and steps. One step's averaged gradient through the switch is
within 2**-30 of the step's largest gradient of gloo's for two workers (the mean's
bound, 2**(E_max - 31) with 2**E_max <= 2 max|g|, innet_aggregation/worker/README.md),
plus both sides' float32 roundings (2**-24 relative): 2**-20 of max|g| leaves room
for both. SGD with momentum mu moves the parameters by at most lr / (1 - mu) times
a gradient's error over all later steps, so after step k the parameters may differ
by sum_j<=k lr / (1 - mu) * 2**-20 * gmax_j, times GROWTH for the gradients'
dependence on parameters that already differ (the loss's curvature times lr, over
these few steps); an error of 2**-17 of the largest gradient in every step
would break it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .backend_train import LR, MODES, MOMENTUM

GRADIENT = 2.0**-20
GROWTH = 4.0


def parameter_bound(gmax: np.ndarray) -> np.ndarray:
    """Per step, the largest difference of any parameter from gloo's (module docstring)."""
    return GROWTH * np.cumsum(LR / (1 - MOMENTUM) * GRADIENT * gmax)


def test_training_through_the_backend_matches_gloo(fabric, tmp_path):
    steps = 6 if fabric.target == "bmv2" else 20
    job = fabric.job(2, num_slots=16)
    reports = {}
    for offset, backend in enumerate(("gloo", "ina")):
        master = f"{job.hosts[0].ip}:{29800 + 2 * job.id + offset}"
        runs = fabric.run(job, ["--backend", backend, "--master", master, "--steps", str(steps),
                                "--save", str(tmp_path)],
                          module="tests.worker.backend_train", timeout=900)
        for run in runs:
            assert run.returncode == 0, f"{backend} rank {run.worker}:\n{run.stderr[-3000:]}"
        reports[backend] = [run.reports[0] for run in runs]

    for report in reports["ina"]:
        # DDP's buckets and HSDP's gradients went through the switch (10 blocks of 256
        # a step); FSDP2's reduce-scatter went to gloo.
        assert report["results"]["ddp"] >= 10 * steps, report
        assert report["results"]["hsdp"] >= 10 * steps, report
        assert report["results"]["fsdp"] == 0, report
    for mode in MODES:
        ina = [np.load(tmp_path / f"ina_{mode}_{rank}.npy") for rank in range(2)]
        gloo = [np.load(tmp_path / f"gloo_{mode}_{rank}.npy") for rank in range(2)]
        assert ina[0].shape == (steps, 2410)
        assert ina[0].tobytes() == ina[1].tobytes(), f"{mode}: the ranks' parameters differ"
        assert gloo[0].tobytes() == gloo[1].tobytes()
        gmax = np.load(tmp_path / f"gloo_{mode}_gmax_0.npy")
        bound = parameter_bound(gmax)
        for step in range(steps):
            torch.testing.assert_close(torch.from_numpy(ina[0][step]),
                                       torch.from_numpy(gloo[0][step]),
                                       rtol=0, atol=float(bound[step]),
                                       msg=lambda m: f"{mode}, step {step}: {m}")
        if mode == "fsdp":       # all gloo: the same bits
            assert ina[0].tobytes() == gloo[0].tobytes()
        diff = np.abs(ina[0] - gloo[0]).max(axis=1)
        print(f"{mode}: largest difference / bound per step {np.round(diff / bound, 3).tolist()}")
    fabric.remove(job)
