"""Every start in the testbed is bounded and fails with what the failed part printed:
a Mininet node whose mnexec fails or hangs, a host agent that dies at start, a
switch that exits at once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="Mininet nodes need root")


def fake_mnexec(directory: Path, script: str) -> None:
    path = directory / "mnexec"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@needs_root
def test_a_host_whose_mnexec_fails_raises_its_message_at_once(tmp_path, monkeypatch):
    from innet_aggregation.testbed.p4switch import BoundedHost
    fake_mnexec(tmp_path, 'echo "mnexec: setns: Operation not permitted"; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)node hx did not start: its shell \(mnexec\) "
                                           r"exited with 1.*setns: Operation not permitted"):
        BoundedHost("hx")
    assert time.monotonic() - start < 5


@needs_root
def test_a_host_whose_shell_never_prompts_fails_after_the_bound(tmp_path, monkeypatch):
    from innet_aggregation.testbed.p4switch import BoundedHost
    fake_mnexec(tmp_path, 'echo "stuck"; exec sleep 600')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(BoundedHost, "start_timeout", 1.0)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)printed no prompt within 1 s.*stuck"):
        BoundedHost("hy")
    assert time.monotonic() - start < 5


@dataclass
class _Intf:
    name: str = "eth0"


@dataclass
class _DeadHost:
    """A host whose process dies before it reads a command (as when mnexec fails)."""
    name: str

    def defaultIntf(self):
        return _Intf()

    def popen(self, argv, **kwargs):
        proc = subprocess.Popen(["sh", "-c", "echo 'mnexec: no such namespace' >&2; exit 3"],
                                **kwargs)
        proc.wait()
        return proc


@dataclass
class _Testbed:
    hosts: list
    workdir: Path
    config_path: Path


def test_an_agent_that_dies_at_start_raises_its_log_not_a_broken_pipe(tmp_path):
    from innet_aggregation.testbed.agents import AgentError, HostAgents
    testbed = _Testbed([_DeadHost("h1"), _DeadHost("h2")], tmp_path, tmp_path / "job.toml")
    start = time.monotonic()
    with pytest.raises(AgentError, match=r"(?s)worker 0 exited with 3.*h1\.log.*"
                                         r"mnexec: no such namespace"):
        HostAgents(testbed, start_timeout=30).start()
    assert time.monotonic() - start < 5


def test_a_switch_that_exits_at_once_raises_its_log(tmp_path):
    from innet_aggregation.testbed.targets import SwitchProcess
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)softswitch exited with.*nonexistent0"):
        SwitchProcess("softswitch", {1: "nonexistent0"}, log_path=tmp_path / "sw.log").start(30)
    assert time.monotonic() - start < 30


def test_pytest_bounds_every_test():
    """`make test` never hangs: pytest-timeout is installed and configured."""
    import tomllib
    repo = Path(__file__).resolve().parents[2]
    options = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert options["timeout"] > 0
    assert subprocess.run([sys.executable, "-c", "import pytest_timeout"]).returncode == 0
