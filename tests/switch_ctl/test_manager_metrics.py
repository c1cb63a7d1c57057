"""The job manager's and the switch's Prometheus metrics during a job, as a real
Prometheus server scrapes them and answers through its query API: the manager's jobs
by state and tenant, the pool it holds, the renewals it granted and what it refused,
and the switch's counters of the job's aggregation."""

from __future__ import annotations

import os
import shutil

import pytest

from innet_aggregation.switch_ctl.manager.client import _Manager
from innet_aggregation.switch_ctl.manager.config import ConfigError, parse
from innet_aggregation.testbed.targets import unavailable
from tests.prometheus import Prometheus, scrape
from tests.softswitch.conftest import free_port

from .manager_harness import JOB_SLOTS, LEASE, ManagerBed, until


def test_the_metrics_address_is_checked():
    base = {"manager": {"listen": "127.0.0.1:7070", "secret": "x" * 16},
            "switch": {"grpc_addr": "127.0.0.1:9559", "ports": [1]},
            "pool": {"job_ids": [1, 2], "slots": [0, 63],
                     "services": [{"ip": "10.0.0.254", "mac": "02:00:00:00:00:fe"}]},
            "fabric": {"hosts": [{"mac": "02:00:00:00:00:01", "switch_port": 1}]}}
    for addr, message in (("0.0.0.0:9470", "not a loopback address"), ("9470", "HOST:PORT")):
        with pytest.raises(ConfigError, match=message):
            parse({**base, "manager": {**base["manager"], "metrics": addr}})
    assert parse({**base, "manager": {**base["manager"], "metrics": "127.0.0.1:9470"}}
                 ).metrics == "127.0.0.1:9470"


@pytest.mark.skipif(os.geteuid() != 0, reason="the manager tests need root (namespaces)")
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="Debian's prometheus is not installed (make setup installs it)")
def test_prometheus_sees_the_managers_job_and_the_switchs_aggregation(tmp_path):
    if unavailable("softswitch"):
        pytest.skip(unavailable("softswitch"))
    manager_metrics, switch_metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    bed = ManagerBed(tmp_path, listener={"metrics": manager_metrics},
                     switch_metrics=switch_metrics).start()
    prometheus = Prometheus({"manager": [manager_metrics], "softswitch": [switch_metrics]})
    try:
        wrong = _Manager(bed.address, "not-the-secret-of-this-manager", bed.tls.ca_cert)
        assert wrong.request({"op": "jobs"})["status"] == "refused"
        hold = tmp_path / "hold"
        ranks = bed.launch("metered", [0, 1], "--reps", "4", "--hold", str(hold))
        until(lambda: all(r.event("held") for r in ranks), 90, "both ranks ran their calls")
        # The job runs and renews (a lease is LEASE s, renewed a few times within it).
        running = 'ina_manager_jobs{state="running",tenant="default"}'
        assert prometheus.value(running) == 1
        assert prometheus.value('ina_manager_pool_used{resource="slots"}') == JOB_SLOTS
        assert prometheus.value('ina_manager_pool_used{resource="job_ids"}') == 1
        renewed = prometheus.value('ina_manager_lease_renewals_total{tenant="default"} > 0',
                                   timeout=3 * LEASE)
        assert renewed > 0
        assert prometheus.value('ina_manager_refusals_total{reason="wrong_secret"}') == 1
        assert prometheus.value('ina_manager_request_seconds_count{op="renew"}') >= renewed
        # The switch's counters of the job's calls: every contribution consumed and every
        # round completed (4 calls of 5,000 values over 2 ranks), none dropped.
        now = scrape(switch_metrics)
        completed = sum(v for (name, labels), v in now.items()
                        if name == "softswitch_p4_counter_packets_total"
                        and ("counter", "AggIngress.ingress_outcomes") in labels)
        assert completed > 0
        assert prometheus.value('sum(softswitch_p4_counter_packets_total{counter='
                                '"AggIngress.ingress_outcomes"})') >= completed
        assert prometheus.value("sum(softswitch_frames_lost_total)") == 0
        hold.touch()
        for r in ranks:
            assert r.wait(60) == 0, r.stderr[-3000:]
        until(lambda: prometheus.query(f"{running} == 1") == [], 20,
              "Prometheus saw the job leave")
        # Removing, the job holds its slots until the sweeper has taken it off the switch.
        until(lambda: prometheus.query('ina_manager_pool_used{resource="slots"} == 0') != [],
              20, "Prometheus saw the job's slots free again")
    finally:
        prometheus.stop()
        bed.stop()
