"""A testbed, demo or experiment stopped by a signal (a job scheduler's or `timeout`'s
SIGTERM, Ctrl-C's SIGINT, a closed terminal's SIGHUP) tears down as at a normal end:
it exits within seconds, and no process it started (switches, host shells, workers),
no interface it made and no run directory of its own is left behind.

Each case starts the real entry point as a subprocess on the smallest topology it
takes, waits until its switches are up (and, for the demo and the experiment, its
worker processes started), records every process descended from it, its
interfaces (Mininet names them s<pid % 10000><n>...) and its run directory (where
its switches log), sends the signal and checks all of them. About 10-20 s each.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.testbed.test_topology import _skip_reason

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
REPO = Path(__file__).resolve().parents[2]
TREE = ["--workers", "2", "--topo", "tree", "--leaves", "2", "--target", "softswitch"]
STAR = ["--workers", "2", "--target", "softswitch"]
START_TIMEOUT = 120.0   # the machine may be busy: starting is not what is judged
STOP_WITHIN = 15.0      # Mininet's teardown of 3 switches and 2 hosts takes a few seconds


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every living process below ``root``: pid -> start time (so a reused pid is not
    mistaken for it later)."""
    children: dict[int, list[int]] = {}
    starts = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            starts[int(entry)] = stat[2]
    out, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = starts[child]
            todo.append(child)
    return out


def alive(procs: dict[int, int]) -> list[str]:
    """Those of ``procs`` still running (a zombie has finished), with their command lines."""
    left = []
    for pid, start in procs.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == start and stat[1] != "Z":
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            left.append(f"{pid}: {cmd.strip()}")
    return left


def state(line: str) -> str:
    """A survivor's state, kernel wait channel and log tail, for the failure message; a
    softswitch is first asked for every thread's stack (it dumps them on SIGUSR1)."""
    pid = line.split(":")[0]
    lines = 5
    if "innet_aggregation.softswitch" in line:
        os.kill(int(pid), signal.SIGUSR1)
        time.sleep(0.5)
        lines = 60
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        log = Path(os.readlink(f"/proc/{pid}/fd/1"))
        tail = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []
    except OSError as exc:
        return f"{line}: {exc}"
    return "\n".join([line, *[s for s in status if s.startswith(("State", "Threads"))],
                      f"wchan {wchan}", *tail])


def cmdlines(procs) -> dict[int, str]:
    out = {}
    for pid in procs:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return out


def interfaces(pid: int) -> set[str]:
    """The root namespace's interfaces of the testbed process ``pid`` (topology.Testbed
    names its switch nodes s<pid % 10000><instance>, spine sp, leaves lJ)."""
    own = re.compile(rf"s{pid % 10000}\d(sp|l\d+)?-eth\d+")
    return {name for name in os.listdir("/sys/class/net") if own.fullmatch(name)}


def run_dirs(switch_pids) -> set[Path]:
    """The run directories the switches log to (their stdout)."""
    dirs = set()
    for pid in switch_pids:
        try:
            dirs.add(Path(os.readlink(f"/proc/{pid}/fd/1")).parent)
        except OSError:
            pass
    return dirs


CASES = {
    # (entry point, its options, switches it starts, whether to wait for its workers)
    "testbed": ("testbed.topology", TREE, 3, False),
    "demo": ("experiments.demo", TREE + ["--epochs", "1"], 3, True),
    "baseline": ("experiments.baseline", STAR + ["--bw", "0", "--values", "256", "--sizes",
                                                 "1024", "--reps", "1"], 1, True),
    "loss": ("experiments.loss", STAR + ["--loss", "1", "--directions", "ingress", "--sizes",
                                         "1024", "--reps", "1"], 1, True),
    "straggler": ("experiments.straggler", STAR + ["--model", "small", "--bw", "0",
                                                   "--deadline-ms", "0"], 1, True),
}


@pytest.mark.parametrize("case, sig", [
    ("testbed", signal.SIGTERM), ("testbed", signal.SIGINT), ("testbed", signal.SIGHUP),
    ("testbed", signal.SIGKILL), ("demo", signal.SIGTERM), ("demo", signal.SIGINT),
    ("demo", signal.SIGKILL), ("baseline", signal.SIGTERM), ("baseline", signal.SIGINT),
    ("loss", signal.SIGTERM), ("straggler", signal.SIGTERM), ("straggler", signal.SIGINT)],
    ids=lambda p: p if isinstance(p, str) else p.name)
def test_a_signal_tears_everything_down(case, sig, tmp_path):
    module, options, switches, workers = CASES[case]
    argv = [sys.executable, "-m", f"innet_aggregation.{module}", *options]
    if case in ("baseline", "loss", "straggler"):
        argv += ["--out", str(tmp_path / "out")]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(REPO)))
    output: list[bytes] = []
    procs, made, dirs = {}, set(), set()
    reader = threading.Thread(target=lambda: output.extend(iter(proc.stdout.readline, b"")),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, b"".join(output).decode(errors="replace")
            assert time.monotonic() < deadline, (f"{case} not up within {START_TIMEOUT:g} s:\n"
                                                 + b"".join(output).decode(errors="replace"))
            procs = descendants(proc.pid)
            commands = cmdlines(procs).values()
            up = (sum("innet_aggregation.softswitch" in c for c in commands) == switches
                  and (b"job configuration:" in b"".join(output) if not workers
                       else sum("innet_aggregation.testbed.train" in c for c in commands) == 2))
            if up:
                break
            time.sleep(0.2)
        made = interfaces(proc.pid)
        assert made, f"no interface of {case}'s topology found"
        dirs = run_dirs(pid for pid, c in cmdlines(procs).items()
                        if "innet_aggregation.softswitch" in c)
        assert dirs, "no run directory found"
        procs = descendants(proc.pid)
        signalled = time.monotonic()
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{case} still running {STOP_WITHIN:g} s after {sig.name}")
        took = time.monotonic() - signalled
        reader.join(5)
        text = b"".join(output).decode(errors="replace")
        # Its teardown stopped its children before it exited; killed, it left them
        # their own shutdown (a switch's takes a second or two on a busy machine).
        deadline = time.monotonic() + (STOP_WITHIN if sig == signal.SIGKILL else 0.5)
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = alive(procs)
        assert left == [], (f"{case} left processes running after {sig.name}:\n"
                            + "\n".join(map(state, left)) + f"\n{text}")
        if sig == signal.SIGKILL:
            # No teardown ran: the switches and workers stop with it (stopping.
            # dies_with_parent), the host shells when their terminal closes; links and
            # the run directory stay, and are removed below.
            return
        assert interfaces(proc.pid) & made == set(), text
        assert [d for d in dirs if d.exists()] == [], text
        assert code == 128 + sig, text
        assert f"stopped by {sig.name}" in text, text
        print(f"{case}: {sig.name} to exit {took:.1f} s")
    finally:
        # What a failed run left behind, removed by pid and by name (all of it its own).
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for line in alive(procs):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        for name in interfaces(proc.pid) & made:
            subprocess.run(["ip", "link", "del", name], capture_output=True)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
