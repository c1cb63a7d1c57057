"""Worker processes in network namespaces, aggregating through the switch.

Every result is checked against an independent reference: the float64 sum of the
inputs (recomputed here from ``make_inputs``), element by element, within the
bound written below, which uses nothing of the workers' quantization code; and
every worker's result is bit-identical to every other's.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.worker import fastpath
from innet_aggregation.worker.run import as_float32, make_inputs

# The error bound of docs/how-it-works/quantization.md, written out: n workers quantize to b = 31 -
# ceil(log2 n) bits below a block's scale 2**S, each rounding once (half a step of
# 2**(S - b)), and a result is kept only if S <= E_max + 7, where 2**E_max bounds the
# block's largest input over all workers. So per element
#     |result - exact sum| <= n * 2**(E_max + 7 - b - 1)      (/ n for the mean)
# plus the final rounding to the output dtype: for 8 workers 2**-19 of 2**E_max,
# for 2 workers 2**-23.
SLACK_BITS = 7


def quantization_bound(n: int, block_exponent: np.ndarray) -> np.ndarray:
    b = 31 - math.ceil(math.log2(n))
    return n * 2.0 ** (block_exponent + SLACK_BITS - b - 1)     # 0 for -inf: blocks of zeros


def reference(size: int, seed: int, rep: int, n: int, dtype: str, average: bool,
              steady: bool = False, place: int | None = None):
    """The exact float64 sum (or mean) of the workers' inputs of call ``rep``, and per
    element the block exponent E_max (the smallest E with every worker's |x| < 2**E
    in the element's block; -inf for blocks of zeros)."""
    k = protocol.packet_format().values_per_packet
    inputs = np.stack([as_float32(make_inputs(size, seed, rep, w, dtype, steady, place))
                       .astype(np.float64) for w in range(n)])
    exact = inputs.sum(axis=0)            # float32 inputs: exact to 2**-53 of sum |x|
    blocks = -(-size // k)
    largest = np.zeros(blocks * k)
    largest[:size] = np.abs(inputs).max(axis=0)
    peak = largest.reshape(blocks, k).max(axis=1)
    exponent = np.where(peak > 0, np.frexp(peak)[1], -np.inf)     # peak < 2**E <= 2 peak
    per_element = np.repeat(exponent, k)[:size]
    roundoff = n * 2.0**-53 * np.abs(inputs).sum(axis=0)
    if average:
        return exact / n, per_element, roundoff / n
    return exact, per_element, roundoff


def check_run(runs, job, outdir, *, size, seed, reps, average=False, dtype="float32",
              steady=False, calls=None, step=None):
    """Every worker's result of every call is bit-identical and within the bound of
    the exact sum. ``calls``: which calls to check (all by default). ``step``: the
    sizes of one step's calls (``worker.run --steps``; ``size`` is ignored then)."""
    for run in runs:
        assert run.returncode == 0, f"worker {run.worker}: {run.error}\n{run.stderr[-3000:]}"
        assert len(run.reports) == reps
    n = job.num_workers
    for rep in range(reps) if calls is None else calls:
        results = [np.load(outdir / f"result_{w}_{rep}.npy") for w in range(n)]
        for w, result in enumerate(results[1:], 1):
            np.testing.assert_array_equal(result.view(np.uint32), results[0].view(np.uint32),
                                          err_msg=f"worker {w} differs from worker 0, call {rep}")
        place = None if step is None else rep % len(step)
        check_within_bound(results[0], size=size if step is None else step[place], seed=seed,
                           rep=rep, n=n, average=average, dtype=dtype, steady=steady,
                           place=place)


def check_within_bound(result, *, size, seed, rep, n, average, dtype, steady=False, keep=None,
                       place=None):
    exact, exponent, roundoff = reference(size, seed, rep, n, dtype, average, steady, place)
    bound = quantization_bound(n, exponent) / (n if average else 1) + roundoff
    keep = np.ones(size, dtype=bool) if keep is None else keep
    result = np.where(keep, result, 0)
    # The final rounding: half an ulp of the output (for bfloat16, of float32 first).
    ulp = np.spacing(np.abs(result.astype(np.float16 if dtype == "float16" else np.float32)))
    bound += ulp.astype(np.float64) * (0.5 + 2.0**15 * (dtype == "bfloat16"))
    result = result.astype(np.float64)
    excess = np.where(keep, np.abs(result - exact) - bound, -np.inf)
    worst = int(excess.argmax())
    assert excess[worst] <= 0, (f"call {rep}: element {worst} is {result[worst]!r}, the exact "
                                f"sum {exact[worst]!r}, beyond the bound {bound[worst]:.3g}")


@pytest.fixture(params=["compiled", "python"])
def result_path(request):
    """The worker's arguments for each way of handling results: the compiled fast path
    where it can be built (``worker.fastpath``), and the Python code alone."""
    if request.param == "compiled" and fastpath.library() is None:
        pytest.skip("no C compiler: the fast path is off")
    return [] if request.param == "compiled" else ["--python-path"]


def check_path(runs, path_args) -> None:
    """The fast path handled results where it was on, none where it was off."""
    fast = sum(r["counters"]["fast_results"] for run in runs for r in run.reports
               if "counters" in r)
    assert (fast == 0) if path_args else (fast > 0), f"{fast} results in the fast path"


@pytest.mark.parametrize("n", [2, 4, 8])
def test_workers_get_identical_results_within_the_bound(fabric, tmp_path, n, result_path):
    job = fabric.job(n, num_slots=32)
    size, reps = 12_000, 2
    runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed", str(n),
                            "--save", str(tmp_path), *result_path])
    check_run(runs, job, tmp_path, size=size, seed=n, reps=reps)
    check_path(runs, result_path)
    fabric.remove(job)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_averages(fabric, tmp_path, dtype):
    job = fabric.job(2, num_slots=16)
    runs = fabric.run(job, ["--size", "4000", "--dtype", dtype, "--average",
                            "--save", str(tmp_path)])
    check_run(runs, job, tmp_path, size=4000, seed=0, reps=1, average=True, dtype=dtype)
    fabric.remove(job)


def test_loss_in_both_directions_changes_no_bit(fabric, tmp_path, result_path):
    """The same job serves one session per loss rate: each session parks its slots
    at close, so the next one starts cleanly."""
    job = fabric.job(3, num_slots=16)
    size, reps = 6000, 2
    args = ["--size", str(size), "--reps", str(reps), "--seed", "11",
            "--initial-rto", "0.1", "--peer-timeout", "60", *result_path]
    digests = {}
    try:
        for loss in (0.0, 0.01, 0.10):
            fabric.set_loss(job, loss)
            outdir = tmp_path / f"loss{loss}"
            runs = fabric.run(job, args + ["--save", str(outdir)])
            check_run(runs, job, outdir, size=size, seed=11, reps=reps)
            check_path(runs, result_path)
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


def test_spurious_retransmissions_and_duplicate_results_are_harmless(fabric, tmp_path,
                                                                     result_path):
    """A timeout capped below the switch's round trip retransmits packets still
    waiting for slower workers (the switch drops those) and packets whose result is
    on its way (the switch resends it by unicast, so it arrives twice, out of order
    with later results). Each cap keeps the resent load (four workers, eight slots:
    32 packets per cap) below what the target forwards, else the resends bury the
    switch: 0.1 ms for the native switch (~200k packets/s, answers within 5 ms), 2 ms
    for the Python backend (~20k packets/s), 20 ms for BMv2 (~3k packets/s).

    A timer restarts on every answer, so while the switch keeps answering none need
    expire: worker 3 starts half a second after the others are ready (fabric.run's
    ``together``: launched half a second late, it could still be ready first on a
    busy machine), and the others' first packets wait for it many caps long. Whether
    a retransmission then crosses its result is timing: a session without a duplicate
    result is followed by another with a new seed, at most three, and every session's
    result is checked."""
    cap = {"softswitch": "0.0001", "softswitch-python": "0.002", "bmv2": "0.02"}[fabric.target]
    job = fabric.job(4, num_slots=8)
    straggler = 0.5
    for seed in (5, 6, 7):
        outdir = tmp_path / f"seed{seed}"
        runs = fabric.run(job, ["--size", "6000", "--reps", "3", "--seed", str(seed),
                                "--initial-rto", cap, "--min-rto", cap,
                                "--max-rto", cap, "--save", str(outdir), *result_path],
                          late={3: straggler}, together=True)
        check_run(runs, job, outdir, size=6000, seed=seed, reps=3)
        check_path(runs, result_path)
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
    # Workers 0 and 1 start their sessions together: each gives up 3 s after its first
    # packet, and names worker 2 alone only if the other had contributed by then,
    # which a worker still starting its interpreter on a busy machine had not.
    runs = fabric.run(job, ["--size", "2000", "--peer-timeout", "3", "--max-rto", "0.5"],
                      workers=[0, 1], together=True, timeout=60)
    # fabric.run's 60 s limit is the hang guard; the workers gave up on their own.
    for run in runs:
        assert run.returncode == 1
        assert run.error.startswith(f"AggregationTimeout: job {job.id}, worker {run.worker}, "
                                    "session start: no result for 8 slot(s)"), run.error
        assert "the switch waits for worker(s) 2" in run.error, run.error
        assert "switch_ctl reset" in run.error
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
    # Only the block holding index 300 is lost (NaN); the rest is within the bound
    # (computed from the inputs as sent: Inf at 300), and so is the next call.
    k = protocol.packet_format().values_per_packet
    result = np.load(tmp_path / "result_0_0.npy")
    bad = slice(300 // k * k, (300 // k + 1) * k)
    assert np.all(np.isnan(result[bad]))
    keep = np.ones(1000, dtype=bool)
    keep[bad] = False
    check_within_bound(result, size=1000, seed=0, rep=0, n=2, average=False, dtype="float32",
                       keep=keep)
    check_run(runs, job, tmp_path, size=1000, seed=0, reps=2, calls=[1])
    fabric.remove(job)


def test_mispredicted_exponents_are_redone_and_a_steady_shape_is_not(fabric, tmp_path,
                                                                     result_path):
    """The transport's own redo policy, through the switch. Each call's block scales
    drawn afresh (2**-20 to 2**12): most of the previous call's maxima mispredict,
    both ways, and are redone; every result is within the bound. Scales kept from
    call to call (``--steady``, as training's): after the first call, none is."""
    job = fabric.job(3, num_slots=16)
    size, reps = 5000, 3
    blocks = -(-size // protocol.packet_format().values_per_packet)
    for steady in (False, True):
        outdir = tmp_path / f"steady{steady}"
        runs = fabric.run(job, ["--size", str(size), "--reps", str(reps), "--seed", "21",
                                "--save", str(outdir), *result_path] + ["--steady"] * steady)
        for run in runs:
            redone = [r["counters"]["redone"] for r in run.reports]
            assert redone[0] == blocks                 # the first call probes every block
            if steady:
                assert redone[1:] == [0] * (reps - 1), redone
            else:
                assert all(0 < r < blocks for r in redone[1:]), redone
        check_run(runs, job, outdir, size=size, seed=21, reps=reps, steady=steady)
        check_path(runs, result_path)
    fabric.remove(job)


def test_equal_sized_calls_of_a_step_keep_their_own_exponents(fabric, tmp_path):
    """Each step: a call of another size, then three of one size with block scales
    of their own (as repeated layers' gradient buckets), kept from step to step.
    Every call predicts from the exponents it agreed on in the last step, named
    (by its name) or not (by its place in the run of equal sizes), so after the
    first step no block is redone. Predicting from the last call of the same size,
    most of their blocks would be redone in every step."""
    job = fabric.job(3, num_slots=16)
    k = protocol.packet_format().values_per_packet
    step, steps = [800, 3000, 3000, 3000], 3
    for named in (False, True):
        outdir = tmp_path / f"named{named}"
        calls = [f"{size}:layer{i}" if named else str(size) for i, size in enumerate(step)]
        runs = fabric.run(job, [*(a for call in calls for a in ("--call", call)),
                                "--steps", str(steps), "--steady", "--seed", "31",
                                "--save", str(outdir)])
        check_run(runs, job, outdir, size=None, seed=31, reps=len(step) * steps, steady=True,
                  step=step)
        for run in runs:
            redone = [r["counters"]["redone"] for r in run.reports]
            assert redone[:2] == [-(-size // k) for size in step[:2]]   # no history: probed
            assert redone[len(step):] == [0] * (len(step) * (steps - 1)), redone
    fabric.remove(job)
