"""The worker tests' fabric: eight namespaced hosts and one switch, per target: the
embedded switch's native and Python backends, and real BMv2 where installed.
AGG_SWITCH restricts to one."""

from __future__ import annotations

import pytest

from .harness import Fabric, skip_unless_runnable


@pytest.fixture(scope="session", params=[
    "softswitch", "softswitch-python", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def fabric(request, tmp_path_factory):
    target = request.param
    skip_unless_runnable(target)
    fabric = Fabric(target, 8, tmp_path_factory.mktemp("worker-fabric")).start()
    yield fabric
    fabric.stop()


@pytest.fixture(autouse=True)
def remove_jobs_at_the_end(request):
    """A test's jobs leave the fabric with it: the switch holds 16 jobs, and jobs
    must not share a UDP port or service address (switch_ctl apply refuses that)."""
    if "fabric" not in request.fixturenames:
        yield
        return
    fabric = request.getfixturevalue("fabric")
    before = list(fabric.jobs)
    yield
    for job in [j for j in fabric.jobs if j not in before]:
        fabric.remove(job)
