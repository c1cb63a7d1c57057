"""A real Prometheus server for the metrics tests (Debian's ``prometheus``), and a
plain scrape of an endpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from innet_aggregation.testbed.stopping import terminate
from tests.softswitch.conftest import free_port


def scrape(addr: str) -> dict[tuple, float]:
    """Every sample an endpoint serves now, by (name, sorted labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class Prometheus:
    """A real Prometheus server scraping each job's targets (``jobs``: job name ->
    host:port list) every 0.2 s, its data in a temporary folder, stopped by pid."""

    def __init__(self, jobs: dict[str, list[str]]):
        self.dir = Path(tempfile.mkdtemp(prefix="prometheus-"))
        self.addr = f"127.0.0.1:{free_port()}"
        (self.dir / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "200ms", "scrape_timeout": "200ms"},
            "scrape_configs": [{"job_name": name, "static_configs": [{"targets": targets}]}
                               for name, targets in jobs.items()]}))
        self.log = open(self.dir / "log", "wb")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address={self.addr}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict]:
        url = f"http://{self.addr}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, expr: str, timeout: float = 20.0) -> float:
        """The single value of ``expr`` once Prometheus has one."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = self.query(expr)
                if result:
                    return float(result[0]["value"][1])
            except OSError:
                pass            # not listening yet
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus had no value for {expr} within {timeout:.0f} s; "
                                     f"log:\n{(self.dir / 'log').read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        terminate(self.process)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


