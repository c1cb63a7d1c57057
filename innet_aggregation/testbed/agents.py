"""One long-lived worker process per Mininet host, driven by JSON lines.

Starting Python and torch costs seconds per host on a small machine, so each host
runs ``testbed.train`` once and receives commands (allreduce, train) on stdin; it
answers one JSON line per command on stdout. Lines with a "progress" key are
status updates, echoed by worker 0's agent so long phases show progress. Stderr
goes to a log per host, quoted when something fails.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from innet_aggregation import IMPORT_ROOT

from .stopping import dies_with_parent, whole


class Hosts(Protocol):
    """What the agents need of a topology (topology.Testbed has it): its Mininet hosts,
    a folder for their logs, and the job file their worker processes load. A protocol,
    not the Testbed, because the Testbed's CLI starts agents (no import circle)."""
    hosts: list
    workdir: Path
    config_path: Path


class AgentError(RuntimeError):
    """A worker process failed or did not answer in time."""


class HostAgents:
    def __init__(self, testbed: Hosts, gloo: bool = True, start_timeout: float = 180.0):
        self.testbed = testbed
        self.gloo = gloo
        self.start_timeout = start_timeout
        self.procs = []
        self.logs: list[Path] = []
        self._buffers: list[bytes] = []

    def start(self) -> "HostAgents":
        world = len(self.testbed.hosts)
        master_port = 29500 + os.getpid() % 1000
        try:
            for rank, host in enumerate(self.testbed.hosts):
                log = self.testbed.workdir / f"{host.name}.log"
                env = dict(os.environ, PYTHONPATH=str(IMPORT_ROOT), OMP_NUM_THREADS="1",
                           GLOO_SOCKET_IFNAME=host.defaultIntf().name, PYTHONUNBUFFERED="1")
                argv = [sys.executable, "-m", "innet_aggregation.testbed.train", "--config",
                        str(self.testbed.config_path), "--worker-id", str(rank),
                        "--world", str(world), "--master", f"10.0.0.1:{master_port}"]
                if not self.gloo:
                    argv.append("--no-gloo")
                with open(log, "wb") as err:
                    self.procs.append(host.popen(dies_with_parent(argv), stdin=-1, stdout=-1,
                                                 stderr=err, cwd=str(IMPORT_ROOT), env=env))
                self.logs.append(log)
                self._buffers.append(b"")
            self.call({"op": "ready"}, timeout=self.start_timeout)
        except BaseException:
            self.stop(graceful=False)
            raise
        return self

    def call(self, command: dict | list[dict], timeout: float = 600.0,
             progress=print) -> list[dict]:
        """Send a command (one for all, or one per worker); the workers' answers in order."""
        commands = command if isinstance(command, list) else [command] * len(self.procs)
        for i, (proc, cmd) in enumerate(zip(self.procs, commands)):
            try:
                proc.stdin.write((json.dumps(cmd) + "\n").encode())
                proc.stdin.flush()
            except BrokenPipeError:     # it died (at start: mnexec or the interpreter failed)
                raise self._exited(i) from None
        answers: list[dict | None] = [None] * len(self.procs)
        deadline = time.monotonic() + timeout
        while any(a is None for a in answers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentError(f"{commands[0].get('op')}: no answer within {timeout:.0f} s\n"
                                 + self._tails([i for i, a in enumerate(answers) if a is None]))
            pending = {self.procs[i].stdout.fileno(): i
                       for i, a in enumerate(answers) if a is None}
            ready, _, _ = select.select(list(pending), [], [], min(remaining, 1.0))
            for fd in ready:
                i = pending[fd]
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise self._exited(i)
                self._buffers[i] += chunk
                while b"\n" in self._buffers[i] and answers[i] is None:
                    line, self._buffers[i] = self._buffers[i].split(b"\n", 1)
                    message = json.loads(line)
                    if "progress" in message:
                        if i == 0 and progress:
                            progress(f"  {message['progress']}", flush=True)
                    elif "error" in message:
                        raise AgentError(f"worker {i}: {message['error']}\n" + self._tails([i]))
                    else:
                        answers[i] = message
        return answers

    def _exited(self, i: int) -> AgentError:
        """The error for worker ``i``, whose output closed: its exit status and log."""
        try:
            self.procs[i].wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.procs[i].kill()
            self.procs[i].wait()
        return AgentError(f"worker {i} exited with {self.procs[i].returncode}\n"
                          + self._tails([i]))

    def _tails(self, workers: list[int], lines: int = 15) -> str:
        out = []
        for i in workers:
            text = self.logs[i].read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {self.logs[i]} ---\n" + "\n".join(text))
        return "\n".join(out)

    @whole
    def stop(self, graceful: bool = True) -> None:
        """Ask each worker to quit (``graceful``: between commands, as at a normal end)
        or terminate it (after an error or a stop signal, when it may be in the middle
        of a long command); kill what has not exited within 10 s."""
        for proc in self.procs:
            if proc.poll() is not None:
                continue
            if not graceful:
                proc.terminate()
                continue
            try:
                proc.stdin.write(b'{"op": "quit"}\n')
                proc.stdin.flush()
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

    def __enter__(self) -> "HostAgents":
        return self.start()

    def __exit__(self, exc_type, *_) -> None:
        self.stop(graceful=exc_type is None)
