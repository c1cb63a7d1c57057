"""torchrun end to end: two jobs at once, each launched with torchrun on its hosts
(one process per host, in its namespace), through one job manager and one switch.
Nobody writes a job file or runs switch_ctl: the script calls
``init_process_group("cpu:ina")`` and the environment names the manager.

Each job's parameters after four DDP steps are checked against one process that
trains the same model on the ranks' batches with the exact average gradient. The
bound, 1e-5 absolute on parameters of order 0.1: the switch's mean of two ranks is
off by at most 2**-30 of a block's largest gradient (docs/how-it-works/quantization.md), float32
rounding adds about 2**-24 relative per step, and four steps at a learning rate of
0.1 keep that far below 1e-6; a sum left unaveraged, or a step's gradients lost,
moves parameters by 1e-3 or more.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.switch_ctl.manager_harness import REPO, SECRET, ManagerBed, env
from tests.worker import torchrun_train as script
from tests.worker.harness import skip_unless_runnable

BOUND = 1e-5


@pytest.fixture
def bed(tmp_path):
    skip_unless_runnable("softswitch")
    bed = ManagerBed(tmp_path).start()
    yield bed
    bed.stop()


def reference(world: int) -> list[torch.Tensor]:
    """The model trained in one process on every rank's batch, with the exact mean
    of the ranks' gradients (what DDP computes)."""
    net = script.model()
    optimizer = torch.optim.SGD(net.parameters(), lr=script.LR)
    for step in range(script.STEPS):
        for rank in range(world):
            x, y = script.batch(step, rank)
            (torch.nn.functional.mse_loss(net(x), y) / world).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() for p in net.parameters()]


def torchrun(bed: ManagerBed, job: str, hosts: list[int], port: int, out, *,
             script: str = "tests/worker/torchrun_train.py", extra_env=None) -> list:
    """Rendezvous and gloo on the management network, as in a cluster: the switch
    forwards between the job's hosts only once the manager has installed the job."""
    master = bed.topology.hosts[hosts[0]]
    processes = []
    for node_rank, index in enumerate(hosts):
        host = bed.topology.hosts[index]
        rank_env = {**env(), "INA_MANAGER": bed.address, "INA_SECRET": SECRET,
                    "INA_CA_CERT": str(bed.tls.ca_cert), "INA_JOIN_TIMEOUT": "120",
                    "GLOO_SOCKET_IFNAME": bed.topology.MGMT_IFNAME, "OMP_NUM_THREADS": "1",
                    **(extra_env or {})}
        log = open(out.parent / f"{job}-{node_rank}.log", "w")
        processes.append((host.popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
             "--node-rank", str(node_rank), "--nproc-per-node", "1",
             "--rdzv-endpoint", f"{master.mgmt_ip}:{port}", "--rdzv-id", job, "--max-restarts", "0",
             script, str(out)],
            stdout=log, stderr=log, env=rank_env, cwd=REPO), log))
    return processes


def stop(processes: list) -> None:
    """Every torchrun still running stopped (its agent stops its worker on SIGTERM),
    and its log closed."""
    for process, log in processes:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


def test_two_torchrun_jobs_at_once_train_exactly_on_disjoint_slots(bed, tmp_path):
    jobs = {"alpha": [0, 1], "beta": [2, 3]}
    running = {name: torchrun(bed, name, hosts, 29810 + i, tmp_path / name)
               for i, (name, hosts) in enumerate(jobs.items())}
    try:
        for name, processes in running.items():
            for node_rank, (process, log) in enumerate(processes):
                code = process.wait(timeout=300)
                text = (tmp_path / f"{name}-{node_rank}.log").read_text()
                assert code == 0, f"{name} node {node_rank}:\n{text[-4000:]}"
    finally:
        stop([p for processes in running.values() for p in processes])

    expected = reference(2)
    seen = {}
    for name in jobs:
        reports = [json.loads(line) for node_rank in range(2)
                   for line in (tmp_path / f"{name}-{node_rank}.log").read_text().splitlines()
                   if line.startswith('{"rank"')]
        assert sorted(r["rank"] for r in reports) == [0, 1], reports
        # DDP's buckets went through the switch, and both ranks are in one job.
        assert all(r["packets_sent"] > 0 and r["results"] > 0 for r in reports), reports
        assert len({(r["job"], tuple(r["slots"])) for r in reports}) == 1, reports
        seen[name] = reports[0]
        ranks = [torch.load(tmp_path / f"{name}.{rank}.pt") for rank in range(2)]
        for a, b in zip(*ranks):
            assert torch.equal(a, b), f"{name}: the ranks' parameters differ"
        for got, want in zip(ranks[0], expected):
            torch.testing.assert_close(got, want, rtol=0, atol=BOUND)

    alpha, beta = seen["alpha"], seen["beta"]
    assert alpha["job"] != beta["job"]
    (a, n), (b, m) = alpha["slots"], beta["slots"]
    assert a + n <= b or b + m <= a, (alpha, beta)
    # Both jobs closed: the manager removed them from the switch.
    assert not bed.installed(), bed.installed()
