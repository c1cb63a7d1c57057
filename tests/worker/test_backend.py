"""The ``ina`` torch.distributed backend: training with no comm hook, every float
dtype, the collectives it hands to gloo, the transport's errors from ``Work.wait()``.

Training: the per-step parameters of the ``cpu:ina`` run against a gloo run of the
same model, data and steps. One step's averaged gradient through the switch is
within 2**-30 of the step's largest gradient of gloo's for two workers (the mean's
bound, 2**(E_max - 31) with 2**E_max <= 2 max|g|, docs/how-it-works/quantization.md),
plus both sides' float32 roundings (2**-24 relative): 2**-20 of max|g| leaves room
for both. SGD with momentum mu moves the parameters by at most lr / (1 - mu) times
a gradient's error over all later steps, so after step k the parameters may differ
by sum_j<=k lr / (1 - mu) * 2**-20 * gmax_j, times GROWTH for the gradients'
dependence on parameters that already differ (the loss's curvature times lr, over
these few steps); an error of 2**-17 of the largest gradient in every step
would break it.
"""

from __future__ import annotations

import subprocess
import time
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from innet_aggregation.p4src import protocol

from . import backend_calls
from .harness import REPO
from .test_session import free_udp_port
from .backend_train import LR, MODES, MOMENTUM

needs_program = pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(),
                                   reason=f"{protocol.PROGRAM_JSON} is missing: run 'make p4'")
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
        # DDP's buckets (with the hook or not) and HSDP's gradients went through the
        # switch (10 blocks of 256 a step); FSDP2's reduce-scatter went to gloo.
        for mode in ("ddp", "hook", "hsdp"):
            assert report["results"][mode] >= 10 * steps, report
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


def run_calls(fabric, case: str, *, port: int, ok: bool = True) -> tuple:
    """tests.worker.backend_calls on a job of two workers: (job, each rank's JSON lines)."""
    job = fabric.job(2, num_slots=16)
    master = f"{job.hosts[0].ip}:{port + job.id}"
    runs = fabric.run(job, ["--master", master, "--case", case],
                      module="tests.worker.backend_calls", timeout=300)
    for run in runs:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
    return job, [run.reports for run in runs]


def expected_integers(scale: float) -> list[float]:
    """backend_calls.integers summed over both ranks (scale 3), or averaged (1.5)."""
    return [(i % 61 - 30) * scale for i in range(backend_calls.SIZE)]


def test_all_reduce_of_every_float_dtype_is_exact(fabric):
    job, reports = run_calls(fabric, "dtypes", port=30000)
    for rank, lines in enumerate(reports):
        seen = set()
        for line in lines:
            if line["check"] == "dtype":
                want = expected_integers(3.0 if line["op"] == "SUM" else 1.5)
                assert line["values"] == want, f"rank {rank}: {line['dtype']} {line['op']}"
                seen.add((line["dtype"], line["op"]))
        assert seen == {(d, op) for d in backend_calls.DTYPES for op in ("SUM", "AVG")}
        # A NaN on rank 0: Work.wait() raises the transport's error on every rank,
        # and the session goes on, exactly.
        (nonfinite,) = [line for line in lines if line["check"] == "nonfinite"]
        assert nonfinite["error"].startswith("NonFiniteError: "), nonfinite
        assert "1 block(s) of 256 values from index 0 are NaN" in nonfinite["error"], nonfinite
        assert ("cannot aggregate nan at index 5" in nonfinite["error"]) == (rank == 0), nonfinite
        (after,) = [line for line in lines if line["check"] == "after"]
        assert after["values"] == expected_integers(3.0)
    fabric.remove(job)


def test_collectives_the_switch_does_not_serve_give_gloos_results(fabric):
    job, reports = run_calls(fabric, "fallback", port=30100)
    want = {"broadcast": [1.0, 2.0, 3.0, 4.0],
            "all_gather": [[0.0] * 3, [1.0] * 3],
            "all_gather_single": [0.0, 0.0, 1.0, -1.0],
            "max": [1.0, 0.0, 2.5],
            "int_sum": [3, 2**41 + 1],
            "coalesced_ints": [[1, 2], [7]]}
    for rank, lines in enumerate(reports):
        results = {line["group"]: line for line in lines if line["check"] == "fallback"}
        ina, gloo = results["ina"], results["gloo"]
        assert {k: v for k, v in ina.items() if k != "group"} == \
            {k: v for k, v in gloo.items() if k != "group"}, f"rank {rank}"
        for key, value in want.items():
            assert ina[key] == value, f"rank {rank}: {key}"
        assert ina["reduce_scatter"] == [[0.0, 3.0], [6.0, 9.0]][rank]
        (floats,) = [line for line in lines if line["check"] == "coalesced_floats"]
        assert floats["values"] == [expected_integers(3.0)[:700], expected_integers(3.0)[:1300]]
    fabric.remove(job)


def test_work_wait_raises_the_transports_error(fabric):
    """Ranks that all-reduce different sizes: Work.wait() raises CallMismatch, with
    the transport's message, on every rank."""
    job, reports = run_calls(fabric, "mismatch", port=30200)
    for rank, lines in enumerate(reports):
        (line,) = lines
        assert line["error"].startswith(
            f"CallMismatch: job {job.id}, worker {rank}, call 1 ({100 * (rank + 1)} elements): "
        ), line
        assert "did not all issue this call" in line["error"]
    fabric.remove(job)


@pytest.mark.parametrize("case", ["shape", "dtype"])
def test_calls_of_one_size_but_another_shape_or_dtype_are_refused(fabric, case):
    """Rank 0 all-reduces float32 (4, 8), rank 1 float32 (8, 4) or bfloat16 (4, 8):
    32 elements each, which the fingerprint told apart by size alone would sum."""
    job, reports = run_calls(fabric, case, port=30400 if case == "shape" else 30500)
    mine = {"shape": ["float32, shape (4, 8)", "float32, shape (8, 4)"],
            "dtype": ["float32, shape (4, 8)", "bfloat16, shape (4, 8)"]}[case]
    for rank, lines in enumerate(reports):
        (line,) = lines
        assert line["error"].startswith(
            f"CallMismatch: job {job.id}, worker {rank}, call 1 (32 elements): "), line
        assert f"this worker's: {mine[rank]}" in line["error"], line
    fabric.remove(job)


def reference(shape, dtype: str, scale: float = 3.0) -> list[float]:
    """backend_calls.logical summed over both ranks, computed in float64 here."""
    n = int(np.prod(shape)) if shape else 1
    return ((np.arange(n) % 61 - 30) * scale).tolist()


# gloo (torch 2.13) sums a view with gaps (a slice of columns) as the memory from its
# first element to its last, the elements between its rows included: wrong sums.
GLOO_WRONG = {"columns"}


def test_every_dtype_in_every_layout_is_summed_into_the_callers_tensor(fabric):
    """dist.all_reduce on the ina group and on gloo, and the session itself, on every
    dtype in every layout torch makes: the exact sum in the caller's tensor (its
    storage and strides, the memory around a view untouched); ranks holding one
    tensor in two layouts sum by index; sparse tensors go to gloo; an expanded
    tensor is refused before any packet; DDP's buckets through the hook, the
    gradients of parameters in those layouts the exact mean, as gloo's."""
    job, reports = run_calls(fabric, "layouts", port=30600)
    for rank, lines in enumerate(reports):
        layout_lines = [line for line in lines if line["check"] == "layout"]
        seen, wrong = set(), []
        for line in layout_lines:
            shape = backend_calls.LAYOUTS[line["layout"]]
            seen.add((line["dtype"], line["layout"], line["path"]))
            if line["path"] == "gloo" and line["layout"] in GLOO_WRONG:
                continue
            if (line["shape"] != list(shape) or line["values"] != reference(shape, line["dtype"])
                    or line["kept"] != [True, True, True] or line["outside_kept"] is False):
                wrong.append(f"{line['dtype']} {line['layout']} through {line['path']}: "
                             f"{line['values'][:8]}..., kept {line['kept']}, "
                             f"{line['outside_kept']}")
        assert not wrong, f"rank {rank}:\n" + "\n".join(wrong)
        want = {(d, layout, path) for d in backend_calls.LAYOUT_DTYPES
                for layout in backend_calls.LAYOUTS for path in ("ina", "gloo", "session")
                if path != "session" or d in backend_calls.DTYPES}
        assert seen == want, f"rank {rank}: missing {want - seen}"
        (mixed,) = [line for line in lines if line["check"] == "mixed"]
        assert mixed["values"] == reference((5, 7), "bfloat16") and all(mixed["kept"]), mixed
        (future,) = [line for line in lines if line["check"] == "future"]
        assert future["values"] == reference((6, 5), "int64") and future["outside_kept"], future
        (sparse,) = [line for line in lines if line["check"] == "sparse"]
        assert sparse["layout"] == "torch.sparse_coo", sparse
        assert sparse["values"] == reference((5, 7), "float32"), sparse
        expanded = {line["path"]: line["error"] for line in lines if line["check"] == "expanded"}
        for path, message in expanded.items():
            assert message is not None and message.startswith(
                "ValueError: the tensor's elements may share memory (shape (4, 3), "
                "strides (0, 1)"), f"rank {rank}, {path}: {message}"
        assert set(expanded) == {"ina", "session"}
        ddp = {(line["path"], line["dtype"], line["layout"]): line
               for line in lines if line["check"] == "ddp"}
        for (path, dtype, layout), line in ddp.items():
            shape = backend_calls.Parameters.SHAPES[layout]
            assert line["values"] == reference(shape, dtype, 1.5), f"rank {rank}: DDP {path} " \
                f"{dtype} {layout}"
            assert line["values"] == ddp["gloo", dtype, layout]["values"]
        assert len(ddp) == 2 * len(backend_calls.DTYPES) * len(backend_calls.Parameters.SHAPES)
        (buffers,) = [line for line in lines if line["check"] == "ddp_buffers"]
        assert buffers["own"] and all(buffers["own"]), buffers
    fabric.remove(job)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: torch.cuda.is_available() is false, so the "
                           "backend's CUDA path (copies through the host) is untested here")
def test_cuda_tensors_go_through_the_switch(fabric):
    job, reports = run_calls(fabric, "cuda", port=30300)
    for rank, lines in enumerate(reports):
        strided = [line for line in lines if line["check"] == "cuda_layout"]
        lines = [line for line in lines if line["check"] != "cuda_layout"]
        *sums, ddp = lines
        assert [line["dtype"] for line in sums] == ["float32", "float16", "bfloat16"]
        assert len(strided) == 3 * len(backend_calls.CUDA_LAYOUTS) * 2
        for line in strided:
            shape, what = backend_calls.LAYOUTS[line["layout"]], \
                f"rank {rank}: {line['dtype']} {line['layout']} through {line['path']}"
            assert line["device"].startswith("cuda"), what
            assert line["values"] == reference(shape, line["dtype"]), what
            assert line["kept"] == [True, True, True] and line["outside_kept"] is not False, \
                f"{what}: kept {line['kept']}, {line['outside_kept']}"
        for line in sums:
            assert line["device"].startswith("cuda"), line
            assert line["values"] == expected_integers(3.0), f"rank {rank}: {line['dtype']}"
        # The mean's bound for two workers (module docstring), with room for both
        # sides' float32 roundings: 2**-20 of the largest gradient.
        assert ddp["check"] == "cuda_ddp" and ddp["buckets"] >= 1, ddp
        assert ddp["devices"] == ["cuda:0"] and ddp["grad_device"] == "cuda:0", ddp
        assert ddp["max_error"] <= GRADIENT * ddp["gmax"], ddp
    fabric.remove(job)


# -- in one process, no switch: the backend's own checks ---------------------------

def loopback_job(tmp_path, workers: int) -> Path:
    """A job file whose workers are on loopback addresses (nothing answers them)."""
    lines = ["[switch]", 'grpc_addr = "127.0.0.1:9559"', "device_id = 0", "ports = [1, 2]", "",
             "[job]", "id = 1", f"udp_port = {protocol.AGG_UDP_PORT_BASE}",
             'service_ip = "127.0.0.1"', 'service_mac = "02:00:00:00:00:fe"',
             "first_slot = 0", "num_slots = 8"]
    for i in range(workers):
        lines += ["", "[[job.workers]]", f"id = {i}", f'mac = "02:00:00:00:00:0{i + 1}"',
                  f'ip = "127.0.0.{i + 2}"', f"udp_port = {free_udp_port()}",
                  f"switch_port = {i + 1}"]
    path = tmp_path / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def one_process(monkeypatch):
    """No INA_* variables; the default group destroyed after the test."""
    import innet_aggregation.worker.backend  # noqa: F401  registers "ina"
    monkeypatch.delenv("INA_MANAGER", raising=False)
    monkeypatch.delenv("INA_JOB_CONFIG", raising=False)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def init(backend: str = "cpu:ina", **kwargs) -> None:
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)


def test_importing_the_worker_library_does_not_import_torch():
    code = "import sys, innet_aggregation.worker; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_the_backend_is_registered_for_cpu_and_cuda(one_process):
    assert "ina" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["ina"] == ["cpu", "cuda"]


@needs_program
def test_without_a_job_the_error_names_both_variables(one_process):
    for backend in ("ina", "cpu:ina", "cpu:ina,cuda:nccl"):
        with pytest.raises(RuntimeError, match="set INA_MANAGER .* or INA_JOB_CONFIG"):
            init(backend)
        assert not dist.is_initialized()


@needs_program
def test_a_job_of_another_size_than_the_group_is_refused(one_process, monkeypatch, tmp_path):
    monkeypatch.setenv("INA_JOB_CONFIG", str(loopback_job(tmp_path, 2)))
    with pytest.raises(ValueError, match="the job has 2 workers, the process group 1 ranks"):
        init()


def test_pg_options_of_another_type_are_refused(one_process):
    with pytest.raises(TypeError, match="pg_options of the ina backend must be InaOptions"):
        init(pg_options=dist.ProcessGroupGloo._Options())


@needs_program
def test_the_job_file_gives_the_session_and_destroy_closes_it(one_process, monkeypatch, tmp_path):
    from innet_aggregation.worker.backend import InaProcessGroup, session_of
    monkeypatch.setenv("INA_JOB_CONFIG", str(loopback_job(tmp_path, 1)))
    init(timeout=timedelta(seconds=42))
    group = dist.group.WORLD
    assert isinstance(group, InaProcessGroup) and dist.get_backend() == "cpu:ina"
    session = session_of()
    assert (session.worker_id, session.num_workers) == (0, 1)
    # A call waits for a slow peer up to the group's timeout, and for a silent switch up to
    # INA_SWITCH_TIMEOUT (10 s by default): past it, calls go to gloo (fallback.py).
    policy = session.transport.policy
    assert (policy.peer_timeout, policy.switch_silence) == (42, 10)
    t = torch.tensor([3, 4])                               # int: gloo's, one rank
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert t.tolist() == [3, 4]
    # c10d's multi-tensor form (one sum over every tensor of every rank) is refused
    # before any packet; all_reduce_coalesced reduces several tensors each.
    with pytest.raises(ValueError, match="all_reduce takes one tensor, got 2"):
        group.allreduce([torch.ones(2), torch.ones(2)], dist.AllreduceOptions())
    assert session.stats.packets_sent == 0
    whole = dist.new_group([0])
    assert session_of(whole) is session          # every rank in order: the same session
    dist.destroy_process_group()
    assert session.transport.sock.fileno() == -1  # closed
    with pytest.raises(TypeError, match="not a process group of the ina backend"):
        init("gloo")
        session_of()


@needs_program
def test_an_ina_group_beside_a_gloo_default_group_opens_the_session_once(one_process, monkeypatch,
                                                                         tmp_path):
    from innet_aggregation.worker.backend import InaOptions, session_of
    monkeypatch.setenv("INA_JOB_CONFIG", str(loopback_job(tmp_path, 1)))
    init("gloo")
    first = dist.new_group(backend="ina")
    second = dist.new_group([0], backend="ina")           # every rank again: shared
    assert session_of(second) is session_of(first)
    with pytest.raises(ValueError, match="holds a session already"):
        dist.new_group(backend="ina", pg_options=InaOptions(session_of(first)))
    session = session_of(first)
    dist.destroy_process_group()
    assert session.transport.sock.fileno() == -1


def test_the_job_credential_comes_from_the_environment_or_rank_0_through_the_store(
        one_process, monkeypatch):
    from innet_aggregation.worker.backend import job_credential
    monkeypatch.delenv("INA_JOB_CREDENTIAL", raising=False)
    monkeypatch.delenv("INA_JOB_CREDENTIAL_FILE", raising=False)
    store = dist.HashStore()
    drawn = job_credential(store, 0)
    assert len(drawn) == 64 and job_credential(store, 1) == drawn
    assert job_credential(dist.HashStore(), 0) != drawn      # each job draws its own
    monkeypatch.setenv("INA_JOB_CREDENTIAL", "given-by-the-launcher")
    assert job_credential(store, 1) == "given-by-the-launcher"


@needs_program
def test_work_wait_honours_its_timeout(one_process, monkeypatch, tmp_path):
    """No switch answers: wait(timeout) raises as c10d's Work::wait does, and the call
    itself ends within the group's timeout (shorter than INA_SWITCH_TIMEOUT's) with
    the session's own error (INA_FALLBACK=error: SwitchUnavailable, naming why)."""
    from innet_aggregation.worker.backend import session_of
    from innet_aggregation.worker.fallback import SwitchUnavailable
    monkeypatch.setenv("INA_JOB_CONFIG", str(loopback_job(tmp_path, 1)))
    monkeypatch.setenv("INA_FALLBACK", "error")
    init(timeout=timedelta(seconds=2))
    # Sparse and expanded tensors never reach the session: gloo's, and refused.
    sparse = torch.ones(3, 4).to_sparse()
    dist.all_reduce(sparse)
    assert sparse.to_dense().tolist() == torch.ones(3, 4).tolist()
    for t in (torch.ones(3).expand(4, 3), torch.ones(3, dtype=torch.int64).expand(4, 3)):
        with pytest.raises(ValueError, match=r"elements may share memory \(shape \(4, 3\)"):
            dist.all_reduce(t)
    assert session_of().stats.packets_sent == 0
    work = dist.all_reduce(torch.ones(10), async_op=True)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^Operation timed out! .* within 0.3 s"):
        work.wait(timeout=timedelta(seconds=0.3))
    assert 0.3 <= time.monotonic() - start < 1.5
    assert not work.is_completed()
    with pytest.raises(SwitchUnavailable, match="switch restarted or unreachable"):
        work.wait()
