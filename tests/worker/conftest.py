"""The worker tests' fabric: eight namespaced hosts and one switch, per target: the
embedded switch's native and Python backends, and real BMv2 where installed.
AGG_SWITCH restricts to one."""

from __future__ import annotations

import os

import pytest

from p4src import protocol
from testbed.targets import unavailable

from .harness import Fabric


@pytest.fixture(scope="session", params=[
    "softswitch", "softswitch-python", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def fabric(request, tmp_path_factory):
    target = request.param
    if os.geteuid() != 0:
        pytest.skip("worker end-to-end tests need root to create network namespaces")
    if not protocol.PROGRAM_JSON.exists():
        pytest.skip(f"{protocol.PROGRAM_JSON} is missing: run 'make p4'")
    reason = unavailable(target)
    if reason:
        pytest.skip(reason)
    fabric = Fabric(target, 8, tmp_path_factory.mktemp("worker-fabric")).start()
    yield fabric
    fabric.stop()
