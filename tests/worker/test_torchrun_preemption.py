"""Preemption as a torchrun job sees it (manager/sharing.py, worker/fallback.py): three
ranks of DDP on the ``ina`` backend (the default tenant, priority 0) hold part of the
pool; a job of tenant ``high`` (priority 5) asks for the whole pool mid-training and
preempts it. The torchrun job goes on through gloo on every rank alike, registers
again, and comes back to the switch once the high job has closed; its ranks'
parameters are identical after every step and match the exact-mean reference
(test_torchrun_fallback.train_through). About a minute (marked slow).
"""

from __future__ import annotations

import pytest

from tests.switch_ctl.manager_harness import POOL_SLOTS, ManagerBed
from tests.switch_ctl.test_manager import finished
from tests.worker.harness import skip_unless_runnable
from tests.worker.test_torchrun_fallback import train_through

pytestmark = pytest.mark.slow
HIGH_SECRET = "the-secret-of-the-high-tenant"


@pytest.fixture
def bed(tmp_path):
    skip_unless_runnable("softswitch")
    bed = ManagerBed(tmp_path, tenants={"high": {"secret": HIGH_SECRET, "priority": 5}}).start()
    yield bed
    bed.stop()


def test_a_preempted_torchrun_job_trains_on_gloo_and_returns_exact(bed, tmp_path):
    high = []

    def preempt(bed):
        high.extend(bed.launch("high", [3, 4], "--reps", "5", "--pause", "0.2",
                               extra_env={"INA_SECRET": HIGH_SECRET,
                                          "INA_SLOTS": str(POOL_SLOTS)}))

    logs, paths, _ = train_through(bed, tmp_path, preempt)
    finished(high, calls=5)
    assert "preempted by job high of tenant high (priority 5 over 0)" in bed.manager_log()
    # Every rank moved to gloo at the same step and came back to the switch.
    assert len({p.index("gloo") for p in paths}) == 1, paths
    assert all(p[-1] == "switch" for p in paths), paths
    first = paths[0].index("gloo")
    back = paths[0].index("switch", first)
    print(f"preemption: {back - first} steps on gloo, back on the switch "
          f"{logs[0][back]['at'] - logs[0][first]['at']:.1f} s after the first")
