"""The Mininet testbed asked for TLS: its switch serves mutual TLS with the run's own
certificates, the controller, the CLI and the workers work as on plaintext, and a
controller without the certificates is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.switch_ctl.client import P4RuntimeError, SwitchConnection
from tests.testbed.test_topology import _skip_reason

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["softswitch", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def testbed(request):
    from innet_aggregation.testbed.targets import unavailable
    from innet_aggregation.testbed.topology import Testbed
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    bed = Testbed(2, bw=50.0, target=request.param, tls=True).start()
    yield bed
    bed.stop()


def test_the_switch_serves_mutual_tls_with_the_runs_certificates(testbed):
    switch = testbed.switches["switch"].process
    assert "--grpc-server-with-client-auth" in switch.argv
    if switch.target == "softswitch":
        assert "(TLS, client certificates required" in switch.log_tail(200)
    tls = jobfile.load(testbed.config_path).switch.tls
    assert tls == testbed.tls_bundle.controller()
    assert tls.ca_cert.parent == testbed.workdir / "tls"
    with pytest.raises(P4RuntimeError, match="it may require TLS"):
        SwitchConnection(switch.grpc_addr, 0, (0, 99), connect_timeout=5).connect()


def test_the_cli_reads_the_settings_from_the_runs_job_file(testbed):
    result = subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", "counters",
                             str(testbed.config_path)], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr
    assert "ingress" in result.stdout


def test_one_allreduce_through_the_switch(testbed):
    from innet_aggregation.testbed.agents import HostAgents
    with HostAgents(testbed, gloo=False) as agents:
        answers = agents.call({"op": "allreduce", "backend": "switch", "size": 1000,
                               "reps": 1, "seed": 1, "barrier": False}, timeout=120)
    assert all(a["exact"] == [True] for a in answers), answers
    assert testbed.counters()     # read over TLS by the testbed's controller
