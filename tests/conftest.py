"""A switch target with eight hosts, for the packet and controller tests.

Every test runs on each target available: the embedded softswitch always (native
and Python backends), real BMv2 where simple_switch_grpc is installed.
AGG_SWITCH=bmv2|softswitch|softswitch-python restricts to one.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import pytest

from innet_aggregation.switch_ctl.client import SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.testbed.netns import Namespaces
from innet_aggregation.testbed.targets import SwitchProcess, unavailable

from tests.dataplane.harness import TestHost, make_config

NUM_HOSTS = 8
# Above the CLI's default of 1, so a test's own controller stays primary unless a
# test deliberately starts a higher one.
TEST_ELECTION_ID = (0, 10)


@dataclass
class Switch:
    process: SwitchProcess
    controller: Controller
    topology: Namespaces
    next_free_slot: int = 0

    def counters(self) -> dict[str, int]:
        return {name: c["packets"] for name, c in self.controller.counters().items()}


@pytest.fixture(scope="session")
def topology():
    if os.geteuid() != 0:
        pytest.skip("the packet tests need root to create network namespaces")
    with Namespaces(NUM_HOSTS) as topo:
        yield topo


@pytest.fixture(scope="session")
def hosts(topology):
    test_hosts = [TestHost(h) for h in topology.hosts]
    yield test_hosts
    for h in test_hosts:
        h.close()


# Per module: each module's topology has a switch of its own.
@pytest.fixture(scope="module", params=[
    "softswitch", "softswitch-python", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def switch(request, topology):
    target = request.param
    reason = unavailable(target)
    if reason:
        pytest.skip(reason)
    with SwitchProcess(target, topology.switch_ports) as process:
        with SwitchConnection(process.grpc_addr, process.device_id, TEST_ELECTION_ID) as conn:
            controller = Controller(conn)
            controller.push()
            yield Switch(process, controller, topology)


_job_ids = itertools.count(1)


@pytest.fixture
def job(switch, hosts):
    """Factory: install a job over the first n hosts on slots no earlier test touched.

    Slots keep their shadow-set state for ever, so a test that reused one would
    have to know which set it was last used with; fresh slots keep tests independent.
    """
    installed = []

    def make(n: int, num_slots: int = 4, **kw):
        first = switch.next_free_slot
        switch.next_free_slot += num_slots
        config = make_config([h.host for h in hosts[:n]], list(switch.topology.switch_ports),
                             switch.process.grpc_addr,
                             next(_job_ids) % 200 + 1, first, num_slots, **kw)
        switch.controller.apply(config)
        installed.append(config)
        for h in hosts:
            h.drain()
        return config

    yield make
    for config in installed:
        switch.controller.remove(config)
