"""testbed.stopping on its own, in child interpreters (its handlers are process-wide):
a stop signal raises Stopped where the program is, waits for a teardown under way,
and is not repeated by a second signal; a child started through dies_with_parent
ends with a parent killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def python(script: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_a_signal_during_a_teardown_is_raised_after_it_and_a_second_is_ignored():
    proc = python("""
        import os, signal, time
        from innet_aggregation.testbed.stopping import Stopped, stop_on_signals, whole

        @whole
        def teardown():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)             # the handler ran here, and raised nothing
            print("teardown finished", flush=True)

        stop_on_signals()
        try:
            teardown()
            print("not reached")
        except Stopped as stop:
            print(f"stopped by {stop.name}, exit {stop.code}")
            os.kill(os.getpid(), signal.SIGTERM)    # ignored: the run is stopping
            time.sleep(0.2)
            print("still here")
    """)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["teardown finished", "stopped by SIGTERM, exit 143", "still here"]


def test_a_signal_raises_stopped_in_a_blocking_wait_and_the_exit_status_is_the_shells():
    proc = python("""
        import time
        from innet_aggregation.testbed.stopping import stop_on_signals
        stop_on_signals()
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            print("finally ran", flush=True)
    """)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=30)
    assert out == "finally ran\n"
    assert proc.returncode == 128 + signal.SIGHUP


def test_a_child_started_through_dies_with_parent_ends_with_a_killed_parent():
    parent = python("""
        import subprocess, time
        from innet_aggregation.testbed.stopping import dies_with_parent
        child = subprocess.Popen(dies_with_parent(["sleep", "600"]))
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep\0"):
            assert time.monotonic() < deadline, "setpriv did not exec the child"
            time.sleep(0.05)    # same pid: setpriv set the signal and exec'd it
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)    # gone once init reaps it
        assert not Path(f"/proc/{child}").exists() or \
            Path(f"/proc/{child}/stat").read_text().split(") ")[1].startswith("Z")
    finally:
        if Path(f"/proc/{child}").exists():
            os.kill(child, signal.SIGKILL)
