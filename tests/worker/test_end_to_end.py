"""Worker processes in network namespaces, aggregating through the switch.

Every result is checked two ways: bit for bit against a numpy model of the whole
pipeline (quantize on every worker, the switch's integer sum and exponent max,
dequantize), which also makes every worker's result identical; and element by
element against the float64 sum, within the documented error bound.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from p4src import protocol
from worker import quantize
from worker.run import as_float32, make_inputs


def model(size: int, seed: int, reps: int, n: int, *, average: bool, dtype: str):
    """Per call: the exact result every worker must get, the scale exponent each
    block was kept with, and the inputs. The scales follow the transport's policy:
    speculated from the previous call's maxima (the first call probes), redone with
    the agreed maximum where the result says the speculation was not usable."""
    k = protocol.packet_format().values_per_packet
    history, calls = None, []
    for rep in range(reps):
        inputs = [quantize.to_blocks(as_float32(make_inputs(size, seed, rep, w, dtype)), k)
                  for w in range(n)]
        own = [quantize.block_exponents(b) for b in inputs]
        agreed = np.max(own, axis=0).astype(np.int64)
        scale = quantize.speculate(history, len(agreed))
        redo = ~quantize.usable(scale, agreed)
        scale[redo] = agreed[redo]
        scale[agreed == quantize.POISON_EXPONENT] = quantize.POISON_EXPONENT
        history = quantize.remember(agreed)
        total = sum(quantize.quantize(b, e, scale, n).astype(np.int64)
                    for b, e in zip(inputs, own))
        out_dtype = np.float16 if dtype == "float16" else np.float32
        result = quantize.dequantize(total.astype(np.int32), scale, n, average=average,
                                     dtype=out_dtype)
        if dtype == "bfloat16":
            import torch
            result = torch.from_numpy(result).to(torch.bfloat16).float().numpy()
        calls.append((result.astype(np.float32).reshape(-1)[:size], scale, inputs))
    return calls


def check_run(runs, job, outdir, *, size, seed, reps, average=False, dtype="float32"):
    for run in runs:
        assert run.returncode == 0, f"worker {run.worker}: {run.error}\n{run.stderr[-3000:]}"
        assert len(run.reports) == reps
    k = protocol.packet_format().values_per_packet
    n = job.num_workers
    for rep, (expected, scale, inputs) in enumerate(model(size, seed, reps, n,
                                                          average=average, dtype=dtype)):
        results = [np.load(outdir / f"result_{w}_{rep}.npy") for w in range(n)]
        for w, result in enumerate(results):
            np.testing.assert_array_equal(result.view(np.uint32), expected.view(np.uint32),
                                          err_msg=f"worker {w}, call {rep}")
        # Within the bound of worker/quantize.py against the float64 sum.
        reference = sum(b.astype(np.float64) for b in inputs).reshape(-1)[:size]
        if average:
            reference /= n
        bound = np.repeat(quantize.error_bound(scale, n, average=average), k)[:size]
        spacing = np.spacing(np.abs(expected)).astype(np.float64)
        rounding = {"float32": spacing / 2, "float16": np.spacing(np.abs(
            expected.astype(np.float16))).astype(np.float64) / 2,
            "bfloat16": spacing / 2 + spacing * 2.0**15}[dtype]   # float32, then bfloat16
        excess = np.abs(expected - reference) - (bound + rounding)
        assert excess.max() <= 0, f"call {rep}: element {excess.argmax()} beyond the bound"


@pytest.mark.parametrize("n", [2, 4, 8])
def test_workers_get_identical_results_within_the_bound(fabric, tmp_path, n):
    job = fabric.job(n, num_slots=32)
    size, reps = 12_000, 2
    runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed", str(n),
                            "--save", str(tmp_path)])
    check_run(runs, job, tmp_path, size=size, seed=n, reps=reps)
    fabric.remove(job)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_averages(fabric, tmp_path, dtype):
    job = fabric.job(2, num_slots=16)
    runs = fabric.run(job, ["--size", "4000", "--dtype", dtype, "--average",
                            "--save", str(tmp_path)])
    check_run(runs, job, tmp_path, size=4000, seed=0, reps=1, average=True, dtype=dtype)
    fabric.remove(job)


def test_loss_in_both_directions_changes_no_bit(fabric, tmp_path):
    """The same job serves one session per loss rate: each session parks its slots
    at close, so the next one starts cleanly."""
    job = fabric.job(3, num_slots=16)
    size, reps = 6000, 2
    args = ["--size", str(size), "--reps", str(reps), "--seed", "11",
            "--initial-rto", "0.1", "--peer-timeout", "60"]
    digests = {}
    try:
        for loss in (0.0, 0.01, 0.10):
            fabric.set_loss(job, loss)
            outdir = tmp_path / f"loss{loss}"
            runs = fabric.run(job, args + ["--save", str(outdir)])
            check_run(runs, job, outdir, size=size, seed=11, reps=reps)
            digests[loss] = [[r["digest"] for r in run.reports] for run in runs]
            retransmissions = sum(r["counters"]["retransmissions"] for run in runs
                                  for r in run.reports)
            if loss:
                assert retransmissions > 0, f"{loss:.0%} loss but no retransmission"
            if loss >= 0.1:     # most losses have later results behind them: no timer needed
                assert sum(r["counters"]["fast_retransmissions"] for run in runs
                           for r in run.reports) > 0
    finally:
        fabric.set_loss(job, 0.0)
    assert digests[0.01] == digests[0.0] and digests[0.10] == digests[0.0]
    fabric.remove(job)


def test_spurious_retransmissions_and_duplicate_results_are_harmless(fabric, tmp_path):
    """A timeout capped below the switch's round trip retransmits packets still
    waiting for slower workers (the switch drops those) and packets whose result is
    on its way (the switch resends it by unicast, so it arrives twice, out of order
    with later results). Each cap keeps the resent load (four workers, eight slots:
    32 packets per cap) below what the target forwards, else the resends bury the
    switch: 0.1 ms for the native switch (~200k packets/s, answers within 5 ms), 2 ms
    for the Python backend (~20k packets/s), 20 ms for BMv2 (~3k packets/s).

    A timer restarts on every answer, so while the switch keeps answering none need
    expire: worker 3 starts half a second late, and the others' first packets wait
    for it many caps long. Whether a retransmission then crosses its result is
    timing: a session without a duplicate result is followed by another with a new
    seed, at most three, and every session's result is checked."""
    cap = {"softswitch": "0.0001", "softswitch-python": "0.002", "bmv2": "0.02"}[fabric.target]
    job = fabric.job(4, num_slots=8)
    straggler = 0.5
    for seed in (5, 6, 7):
        outdir = tmp_path / f"seed{seed}"
        runs = fabric.run(job, ["--size", "6000", "--reps", "3", "--seed", str(seed),
                                "--initial-rto", cap, "--min-rto", cap,
                                "--max-rto", cap, "--save", str(outdir)], late={3: straggler})
        check_run(runs, job, outdir, size=6000, seed=seed, reps=3)
        waited = [run.reports[0]["counters"]["retransmissions"] for run in runs[:3]]
        assert all(waited), (f"workers 0-2 waited {straggler} s for worker 3 and "
                             f"retransmitted {waited} times")
        duplicates = sum(r["counters"]["duplicates_ignored"] for run in runs for r in run.reports)
        if duplicates > 0:
            break
    else:
        pytest.fail(f"three sessions with a {cap} s timeout, and no result arrived twice")
    fabric.remove(job)


def test_a_dead_worker_ends_the_others_with_a_clear_error(fabric):
    job = fabric.job(3, num_slots=8)
    runs = fabric.run(job, ["--size", "2000", "--peer-timeout", "3", "--max-rto", "0.5"],
                      workers=[0, 1], timeout=60)
    # fabric.run's 60 s limit is the hang guard; the workers gave up on their own.
    for run in runs:
        assert run.returncode == 1
        assert run.error.startswith("AggregationTimeout: job ")
        assert "no result for 8 slot(s)" in run.error and "switch_ctl reset" in run.error
        waited = float(re.search(r"after (\d+\.\d) s \(peer_timeout 3 s", run.error)[1])
        assert waited >= 3.0
    fabric.remove(job)


def test_nonfinite_values_fail_the_call_on_every_worker_and_the_session_goes_on(fabric, tmp_path):
    job = fabric.job(2, num_slots=8)
    runs = fabric.run(job, ["--size", "1000", "--reps", "2", "--save", str(tmp_path)],
                      extra={1: ["--nonfinite-at", "300"]})
    by_worker = {run.worker: run for run in runs}
    assert by_worker[1].reports[0]["error"].startswith(
        "NonFiniteError: cannot aggregate inf at index 300")
    assert by_worker[0].reports[0]["error"].startswith("NonFiniteError: another worker sent")
    for run in runs:
        assert run.returncode == 0
        assert "error" not in run.reports[1]
        assert run.reports[0]["digest"] == runs[0].reports[0]["digest"]
    # Only the block holding index 300 is lost (NaN); the rest is the exact result.
    k = protocol.packet_format().values_per_packet
    (expected, _, _), (expected1, _, _) = model(1000, 0, 2, 2, average=False, dtype="float32")
    result = np.load(tmp_path / "result_0_0.npy")
    bad = slice(300 // k * k, (300 // k + 1) * k)
    assert np.all(np.isnan(result[bad]))
    keep = np.ones(1000, dtype=bool)
    keep[bad] = False
    np.testing.assert_array_equal(result[keep], expected[keep])
    np.testing.assert_array_equal(np.load(tmp_path / "result_0_1.npy"), expected1)
    fabric.remove(job)


def test_mispredicted_exponents_are_redone_exactly(fabric, tmp_path):
    """Each call's block scales are drawn afresh (2**-20 to 2**12), so most of the
    previous call's maxima mispredict, both ways: every result still equals the
    model bit for bit, and the redone blocks are counted."""
    job = fabric.job(3, num_slots=16)
    size, reps = 5000, 3
    runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed", "21",
                            "--save", str(tmp_path)])
    check_run(runs, job, tmp_path, size=size, seed=21, reps=reps)
    blocks = -(-size // protocol.packet_format().values_per_packet)
    for run in runs:
        redone = [r["counters"]["redone"] for r in run.reports]
        assert redone[0] == blocks                 # the first call probes every block
        assert all(0 < r < blocks for r in redone[1:]), redone
    fabric.remove(job)
