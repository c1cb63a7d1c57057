"""Start a switch target: real BMv2 (simple_switch_grpc) or the embedded softswitch.

Both get the same command line, so everything above this module (tests, Mininet,
benchmarks) is indifferent to which one runs. ``softswitch`` runs its default
(native) backend, ``softswitch-python`` the Python one. P4Runtime listens on
127.0.0.1 (a free port) unless told otherwise; with a TLS bundle (testbed.tls) the
switch serves mutual TLS with simple_switch_grpc's options.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from innet_aggregation import IMPORT_ROOT
from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch.dataplane import io_threads_argument

from .stopping import dies_with_parent, terminate, whole

if TYPE_CHECKING:
    from .tls import TLSBundle

BMV2_BINARY = "simple_switch_grpc"
TARGETS = ("softswitch", "softswitch-python", "bmv2")


def bmv2_path() -> str | None:
    return shutil.which(BMV2_BINARY)


def available_targets() -> list[str]:
    return ["softswitch", "softswitch-python"] + (["bmv2"] if bmv2_path() else [])


def unavailable(target: str) -> str | None:
    """Why ``target`` cannot run here (AGG_SWITCH selects another, BMv2 is not
    installed, the softswitch package is absent), or None."""
    wanted = os.environ.get("AGG_SWITCH")
    if wanted and wanted != target:
        return f"AGG_SWITCH={wanted} selects another target"
    if target == "bmv2" and bmv2_path() is None:
        return ("simple_switch_grpc is not on PATH: build BMv2 (see docs/p4/index.md) to run this "
                "on real BMv2")
    if target.startswith("softswitch") and importlib.util.find_spec("innet_aggregation.softswitch") is None:
        return "the softswitch package is not present"
    return None


def default_target() -> str:
    """AGG_SWITCH chooses; otherwise the embedded switch (native backend), the one
    that keeps up with the links: BMv2 forwards 1-2 k packets/s of this program,
    so it can show that the program runs, not that aggregating in it is faster."""
    wanted = os.environ.get("AGG_SWITCH")
    if wanted:
        if wanted not in TARGETS:
            raise ValueError(f"AGG_SWITCH must be one of {TARGETS}, not {wanted!r}")
        return wanted
    return "softswitch"


def add_switch_arguments(parser) -> None:
    """The options every testbed command shares: which switch, and the job's window."""
    parser.add_argument("--target", choices=TARGETS, default=None,
                        help="switch target (default: $AGG_SWITCH, else softswitch)")
    parser.add_argument("--slots", type=int, default=None,
                        help="the job's window, slots in flight per worker (default 128, "
                             "at most 128 KiB of values: 32 at 1024 values per packet; "
                             "max(8, 64/workers) on bmv2)")
    parser.add_argument("--tls", action="store_true",
                        help="P4Runtime over mutual TLS, with a CA and certificates made for "
                             "this run (openssl)")
    parser.add_argument("--grpc-host", default="127.0.0.1",
                        help="address the switches' P4Runtime servers listen on (default "
                             "127.0.0.1, this machine only; 0.0.0.0 opens them to the "
                             "network: add --tls)")
    parser.add_argument("--io-threads", type=io_threads_argument, default=None, metavar="N",
                        help="the embedded switch's packet threads (default: a quarter of "
                             "the cores, at least 1: softswitch.dataplane)")


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_manager(config: dict, config_path: Path, log_path: Path) -> subprocess.Popen:
    """The job manager (``switch_ctl serve``) on ``config`` (written to ``config_path``
    as TOML), its output in ``log_path``; returns once it accepts connections."""
    import tomli_w

    config_path.write_text(tomli_w.dumps(config))
    host, port = config["manager"]["listen"].rsplit(":", 1)
    manager = subprocess.Popen(
        [sys.executable, "-m", "innet_aggregation.switch_ctl", "serve", "--config",
         str(config_path)], stdout=open(log_path, "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    wait_listening(host, int(port), manager)
    return manager


def wait_listening(host: str, port: int, process) -> None:
    """Until the job manager ``process`` accepts a connection on host:port; it exiting
    first, or 60 s without, is an error."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the job manager exited with {process.returncode}")
        try:
            with socket.create_connection((host, port), 0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError("the job manager did not listen within 60 s")


@functools.lru_cache(maxsize=None)
def _has_thrift(binary: str) -> bool:
    """A BMv2 built without Thrift has no --thrift-port, and refuses the option."""
    result = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    return "--thrift-port" in result.stdout + result.stderr


def connect_addr(grpc_addr: str) -> str:
    """Where a controller here reaches a server listening on ``grpc_addr``: a wildcard
    address through loopback."""
    host, _, port = grpc_addr.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "::") else grpc_addr


def switch_argv(target: str, ports: dict[int, str], device_id: int, grpc_addr: str,
                tls: "TLSBundle | None" = None, counters_file: Path | None = None,
                io_threads: int | None = None, metrics_addr: str | None = None) -> list[str]:
    """simple_switch_grpc's command line, for either target (the softswitch keeping its
    data plane's counters in ``counters_file``, running ``io_threads`` packet threads
    (None: its default) and serving Prometheus metrics on ``metrics_addr``)."""
    if target == "bmv2":
        binary = bmv2_path()
        if binary is None:
            raise FileNotFoundError(f"{BMV2_BINARY} is not on PATH")
        program = [binary]
    elif target == "softswitch":
        program = [sys.executable, "-m", "innet_aggregation.softswitch"]
    elif target == "softswitch-python":
        program = [sys.executable, "-m", "innet_aggregation.softswitch", "--backend", "python"]
    else:
        raise ValueError(f"unknown switch target {target!r}; choose from {TARGETS}")
    argv = list(program)
    for port, ifname in sorted(ports.items()):
        argv += ["-i", f"{port}@{ifname}"]
    argv += ["--device-id", str(device_id), "--no-p4"]
    if target != "bmv2" and counters_file is not None:
        argv += ["--counters-file", str(counters_file)]
    if target != "bmv2" and io_threads is not None:
        argv += ["--io-threads", str(io_threads)]
    if target != "bmv2" and metrics_addr is not None:
        argv += ["--metrics-addr", metrics_addr]
    if target == "bmv2" and _has_thrift(program[0]):
        # Each instance needs its own Thrift port, or a second one fails to start.
        argv += ["--thrift-port", str(free_tcp_port())]
    # PacketOuts (the controller's slot reset) enter the pipeline on the program's CPU port.
    argv += ["--", "--grpc-server-addr", grpc_addr, "--cpu-port", str(protocol.CPU_PORT)]
    return argv + (tls.switch_args() if tls else [])


_libc = ctypes.CDLL(None, use_errno=True)


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system, all threads) process ``pid`` has used, from its
    CPU-time clock: /proc/PID/stat counts in 10 ms ticks, too coarse for one call."""
    clock = ctypes.c_int()
    error = _libc.clock_getcpuclockid(pid, ctypes.byref(clock))
    if error:
        raise OSError(error, f"clock_getcpuclockid({pid}): {os.strerror(error)}")
    return time.clock_gettime(clock.value)


class SwitchProcess:
    """A running switch; ``start()`` returns once its P4Runtime port accepts connections."""

    def __init__(self, target: str, ports: dict[int, str], *, device_id: int = 0,
                 grpc_addr: str | None = None, log_path: Path | None = None,
                 tls: "TLSBundle | None" = None, io_threads: int | None = None,
                 metrics_addr: str | None = None):
        self.target = target
        self.listen_addr = grpc_addr or f"127.0.0.1:{free_tcp_port()}"
        self.grpc_addr = connect_addr(self.listen_addr)    # where controllers connect
        self.device_id = device_id
        self.tls = tls
        self.log_path = log_path or Path(tempfile.mkstemp(prefix=f"{target}-", suffix=".log")[1])
        self.counters_path = self.log_path.with_name(self.log_path.name + ".counters.json")
        self.metrics_addr = metrics_addr
        self.argv = switch_argv(target, ports, device_id, self.listen_addr, tls,
                                self.counters_path, io_threads, metrics_addr)
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "SwitchProcess":
        repo = str(IMPORT_ROOT)
        self.counters_path.unlink(missing_ok=True)     # an earlier process's
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "wb") as log:
            # Its own session: a Ctrl-C meant for the experiment must not kill the switch
            # before the experiment's teardown has stopped everything in order. It
            # stops if the experiment is killed outright (stopping.dies_with_parent).
            self.process = subprocess.Popen(dies_with_parent(self.argv), stdout=log,
                                            stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        try:
            self._wait_listening(timeout)
        except BaseException:       # a timeout, or a stop signal: ``with`` calls no __exit__
            self.stop()
            raise
        return self

    def _wait_listening(self, timeout: float) -> None:
        host, port = self.grpc_addr.rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.target} exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                with socket.create_connection((host, int(port)), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.target} did not listen on {self.listen_addr} within "
                           f"{timeout:.0f} s; log {self.log_path}:\n{self.log_tail()}")

    def io_counters(self) -> dict[str, int]:
        """The softswitch's data-plane counters (frames received, sent, lost by where:
        ``softswitch.dataplane.DataPlane.counters``) as of its last second; none from
        BMv2."""
        try:
            return json.loads(self.counters_path.read_text())
        except FileNotFoundError:
            return {}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    @whole
    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)

    def __enter__(self) -> "SwitchProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
