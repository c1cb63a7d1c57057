"""PyTorch's own distributed tests (``tests/worker/torch_suite.py``) on the ``ina``
backend: three ranks in the fabric's namespaces, through the native switch.

A selection (``torch_suite.SELECTION``), run in one spawn of the ranks to stay
short: the all_reduce tests whose tensors go through the switch (sum, async, a
new group of every rank, coalesced), with every result compared exactly (the
suite's own all_reduce helper does not look at them), those the backend hands to
gloo (MAX, complex, sparse), DDP on the CPU with no hook (its buckets through
the switch) and barrier. innet_aggregation/worker/README.md, "PyTorch's own
tests", says what else the suite holds that cannot run on ``ina``, and why.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .harness import REPO, _env

WORLD = 3
# The session's start completes a round per slot (16 here); the sums of the
# all_reduce tests alone add 3 per test (one call per source rank).
AT_LEAST_COMPLETED = 16 + 3 * 3


def test_pytorchs_own_tests_pass_on_the_ina_backend(fabric, tmp_path):
    if fabric.target != "softswitch":
        pytest.skip("the backend's checks, not the switch's: one target keeps the suite short")
    pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest "
                                             "(the [test] extra): make setup")
    job = fabric.job(WORLD, num_slots=16)
    before = fabric.counters(job)["ingress.completed"]
    env = dict(_env(), BACKEND="ina", WORLD_SIZE=str(WORLD), INA_JOB_CONFIG=str(job.path),
               INA_SUITE_NETNS=",".join(h.netns for h in job.hosts), GLOO_SOCKET_IFNAME="eth0")
    out = tmp_path / "outcomes.json"
    run = subprocess.run([sys.executable, "-m", "tests.worker.torch_suite", str(out),
                          "test_selection"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.exists(), run.stderr[-6000:]
    outcomes = json.loads(out.read_text())
    print("outcome, seconds:", outcomes)
    assert outcomes["test_selection"][0] == "ok", run.stderr[-6000:]
    assert run.returncode == 0
    assert fabric.counters(job)["ingress.completed"] - before >= AT_LEAST_COMPLETED
    fabric.remove(job)
