"""The testbed's generated job configuration: valid TOML that the controller accepts."""

from __future__ import annotations

import tomllib

import pytest
import tomli_w

from p4src import protocol
from switch_ctl import config as config_mod

topology = pytest.importorskip("testbed.topology", reason="Mininet is not installed",
                               exc_type=ImportError)


@pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(), reason="the P4 program is not built")
def test_generated_config_round_trips_and_validates():
    raw = topology.job_config_dict({1: "s1-eth1", 2: "s1-eth2", 3: "s1-eth3"},
                                   "127.0.0.1:9559", 0, job_id=7, num_slots=64)
    config = config_mod.parse(tomllib.loads(tomli_w.dumps(raw)))
    assert [w.switch_port for w in config.job.workers] == [1, 2, 3]
    assert [w.ip for w in config.job.workers] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert config.job.num_slots == 64 and config.job.id == 7
