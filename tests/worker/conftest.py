"""The worker tests' fabric: eight namespaced hosts and one switch, for the session."""

from __future__ import annotations

import importlib.util
import os

import pytest

from p4src import protocol
from testbed.targets import default_target

from .harness import Fabric


@pytest.fixture(scope="session")
def fabric(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("worker end-to-end tests need root to create network namespaces")
    if not protocol.PROGRAM_JSON.exists():
        pytest.skip(f"{protocol.PROGRAM_JSON} is missing: run 'make p4'")
    target = default_target()
    if target == "softswitch" and importlib.util.find_spec("softswitch") is None:
        pytest.skip("no switch target: simple_switch_grpc is not installed and the "
                    "softswitch package is not present")
    fabric = Fabric(target, 8, tmp_path_factory.mktemp("worker-fabric")).start()
    yield fabric
    fabric.stop()
