"""PyTorch's own backend-agnostic distributed tests on the ``ina`` backend.

    INA_JOB_CONFIG=job.toml INA_SUITE_NETNS=ns0,ns1,ns2 WORLD_SIZE=3 \
        python -m tests.worker.torch_suite outcomes.json test_selection

``torch.testing._internal.distributed.distributed_test``'s ``_DistTestBase``,
instantiated as PyTorch's ``test/distributed/test_distributed_spawn.py`` does for
gloo (BACKEND and WORLD_SIZE in the environment, a ``TestDistBackend`` subclass
spawning one process per rank), with these changes of ours:
- each rank enters its host's network namespace (``INA_SUITE_NETNS``, rank i the
  i-th) before it makes its group, so that its session reaches the switch from its
  worker's address (``INA_JOB_CONFIG``, worker id = rank);
- ``_test_all_reduce_helper``, which in torch 2.13 calls all_reduce without looking
  at the result, also compares every result with the sum it must be, exactly.
- ``test_sparse_all_reduce_sum_ina`` and ``test_all_reduce_coalesced_sum_ina`` run
  the suite's helpers for tests it gates to BACKEND gloo by name (the ``ina``
  backend hands sparse tensors to gloo, and takes all_reduce_coalesced of floats);
- ``test_selection`` runs the tests of ``SELECTION`` in one spawn of the ranks.
innet_aggregation/worker/README.md, "PyTorch's own tests", says what cannot run
here and why.
"""

import ctypes
import json
import os
import sys
import time
import unittest
from pathlib import Path

os.environ.setdefault("BACKEND", "ina")       # read by distributed_test at import

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

import innet_aggregation.worker.backend  # noqa: E402,F401  registers "ina"

# The suite gates its DDP tests to backends it names (at import, below).
DistTestCases.backend_feature["ddp"].add("ina")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend, _build_tensor)

CLONE_NEWNET = 0x40000000
# The suite's tests that ``test_selection`` runs (tests/worker/test_torch_suite.py):
# all_reduce through the switch (sum, async, a new group of every rank, coalesced),
# what the backend hands to gloo (MAX, complex, sparse), DDP on the CPU with no
# hook (its buckets through the switch), barrier. The subgroup tests need 8 ranks.
SELECTION = ("test_all_reduce_sum", "test_all_reduce_sum_async",
             "test_all_reduce_full_group_sum", "test_all_reduce_coalesced_sum_ina",
             "test_all_reduce_max", "test_all_reduce_sum_complex",
             "test_sparse_all_reduce_sum_ina", "test_DistributedDataParallelCPU", "test_barrier")


def enter_netns(name: str) -> None:
    """This thread (and the threads it starts) into network namespace ``name``."""
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name} failed")
    finally:
        os.close(fd)


class TestInaBackend(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()     # as test_distributed_spawn.py's TestDistBackendWithSpawn

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        enter_netns(os.environ["INA_SUITE_NETNS"].split(",")[rank])
        super()._run(rank, test_name, file_name, pipe, **kwargs)

    def _test_all_reduce_helper(self, group, group_id, rank, op, master_value, worker_value,
                                expected_value, cuda=False, rank_to_GPU=None,
                                dtype=torch.float, async_op=False):
        """The suite's helper (CPU tensors), with the result compared exactly."""
        assert not cuda, "the CUDA variants are not run here"
        for src in group:
            tensor = _build_tensor(src + 1, dtype=dtype).fill_(
                master_value if rank == src else worker_value)
            self.call_dist_op(":all_reduce", async_op, dist.all_reduce, tensor, op, group_id,
                              async_op=async_op, tensor_shapes=[tensor.shape])
            self.assertEqual(tensor, _build_tensor(src + 1, dtype=dtype).fill_(expected_value),
                             rtol=0, atol=0)
        self._barrier()

    def test_selection(self):
        """``SELECTION`` in one spawn of the ranks: a spawn costs every rank torch's
        import, 10-30 s on two busy cores, more than most of these tests."""
        for name in SELECTION:
            print(f"rank {self.rank}: {name}", file=sys.stderr, flush=True)
            getattr(self, name)()

    def test_sparse_all_reduce_sum_ina(self):
        self._test_sparse_all_reduce_sum(lambda t: t)

    def test_all_reduce_coalesced_sum_ina(self):
        group, group_id, rank = self._init_global_test()
        self._test_all_reduce_coalesced_helper(group, group_id, rank, dist.ReduceOp.SUM)


def main(out: str, names: list[str]) -> int:
    """Runs TestInaBackend's tests ``names``; writes {name: [outcome, seconds]} as JSON
    to ``out`` (outcome "ok", "skipped: why", "FAIL" or "ERROR")."""
    outcomes = {}
    for name in names:
        start = time.monotonic()
        result = unittest.TextTestRunner(verbosity=0).run(TestInaBackend(name))
        outcome = ("ERROR" if result.errors else "FAIL" if result.failures
                   else f"skipped: {result.skipped[0][1]}" if result.skipped else "ok")
        outcomes[name] = [outcome, round(time.monotonic() - start, 1)]
    Path(out).write_text(json.dumps(outcomes))
    return 0 if all(o == "ok" for o, _ in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
