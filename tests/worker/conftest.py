"""The worker tests' fabric: eight namespaced hosts and one switch, per target: the
embedded switch (native backend; the packet tests compare it with the Python one)
and real BMv2 where installed. AGG_SWITCH restricts to one."""

from __future__ import annotations

import importlib.util
import os

import pytest

from p4src import protocol
from testbed.targets import bmv2_path

from .harness import Fabric


@pytest.fixture(scope="session", params=[
    "softswitch", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def fabric(request, tmp_path_factory):
    target = request.param
    if os.geteuid() != 0:
        pytest.skip("worker end-to-end tests need root to create network namespaces")
    if not protocol.PROGRAM_JSON.exists():
        pytest.skip(f"{protocol.PROGRAM_JSON} is missing: run 'make p4'")
    wanted = os.environ.get("AGG_SWITCH")
    if wanted and wanted != target:
        pytest.skip(f"AGG_SWITCH={wanted} selects another target")
    if target == "bmv2" and bmv2_path() is None:
        pytest.skip("simple_switch_grpc is not on PATH: build BMv2 (see README) "
                    "to run the worker tests on real BMv2")
    if target == "softswitch" and importlib.util.find_spec("softswitch") is None:
        pytest.skip("the softswitch package is not present")
    fabric = Fabric(target, 8, tmp_path_factory.mktemp("worker-fabric")).start()
    yield fabric
    fabric.stop()
