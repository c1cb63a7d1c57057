"""Mininet glue: import Mininet from Debian's package, and a switch node that runs a P4 target.

Debian installs Mininet for the system Python only (/usr/lib/python3/dist-packages);
the project's venv is built on another interpreter. Mininet is pure Python, so the
package alone is loaded from there, without putting the rest of dist-packages (with
its older copies of libraries the venv also has) on sys.path.
"""

from __future__ import annotations

import importlib.util
import os
import select
import sys
import time
from pathlib import Path

MININET_DIRS = ("/usr/lib/python3/dist-packages", "/usr/local/lib/python3/dist-packages")


def import_mininet() -> None:
    """Make ``import mininet`` work; raises ImportError (with the fix) when it is not installed."""
    if "mininet" in sys.modules:
        return
    if importlib.util.find_spec("mininet") is not None:
        return
    for base in MININET_DIRS:
        package = Path(base) / "mininet"
        if (package / "__init__.py").exists():
            spec = importlib.util.spec_from_file_location(
                "mininet", package / "__init__.py", submodule_search_locations=[str(package)])
            module = importlib.util.module_from_spec(spec)
            sys.modules["mininet"] = module
            spec.loader.exec_module(module)
            return
    raise ImportError("Mininet is not installed: run 'make apt-deps' (Debian package 'mininet')")


import_mininet()

from mininet.log import lg  # noqa: E402
from mininet.net import Mininet  # noqa: E402
from mininet.node import Host, Switch  # noqa: E402

from .targets import SwitchProcess, default_target  # noqa: E402
from .tls import TLSBundle  # noqa: E402

# Mininet's logger prints on its own; through the root logger (set up by other
# libraries) every line would appear twice.
lg.propagate = False


class QuietMininet(Mininet):
    """Mininet without its start-up tuning, which raises system-wide sysctls and rlimits
    that would outlive the run; nothing here needs them."""

    @classmethod
    def init(cls):
        if os.geteuid() != 0:
            raise PermissionError("Mininet needs root (network namespaces, veth, tc)")
        cls.inited = True


class BoundedShell:
    """A Mininet node whose shell must show its prompt within ``start_timeout``.

    Mininet's startShell reads the pty until bash's prompt and then polls it with no
    timeout; when mnexec fails (a namespace it cannot make, a missing binary) it
    prints why and exits, but the parent still holds the pty open, so the poll waits
    for ever. Here the wait for the prompt is bounded and a shell that exits or
    stays silent fails the node with what it printed."""
    start_timeout = 30.0
    _start_deadline: float | None = None

    def startShell(self, mnopts=None):
        self._start_deadline = time.monotonic() + self.start_timeout
        try:
            super().startShell(mnopts)
        finally:
            self._start_deadline = None

    def read(self, size=1024):
        if self._start_deadline is None:
            return super().read(size)
        out = ""
        while not out.endswith(chr(127)):   # Mininet's prompt
            readable = select.select([self.stdout], [], [], 0.1)[0]
            if readable:
                out += super().read(size)
            elif self.shell.poll() is not None:
                self._abandon(f"its shell (mnexec) exited with {self.shell.returncode}", out)
            elif time.monotonic() > self._start_deadline:
                self._abandon(f"its shell printed no prompt within {self.start_timeout:g} s", out)
        return out

    def _abandon(self, why: str, output: str):
        self.shell.kill()
        self.shell.wait()
        self.stdin.close()
        os.close(self.slave)
        self.shell = None
        raise RuntimeError(f"node {self.name} did not start: {why}; it printed:\n"
                           f"{output.strip() or '(nothing)'}")


class BoundedHost(BoundedShell, Host):
    """Mininet's host, with a bounded start."""


class P4Switch(BoundedShell, Switch):
    """A Mininet switch whose datapath is a P4 target (BMv2 or the embedded softswitch).

    Mininet port n is the target's port n (``-i n@<name>-eth<n>``), so the job
    configuration can name switch ports by the numbers Mininet assigned. The target
    runs in the root namespace; its P4Runtime server listens on ``grpc_addr``, with
    mutual TLS given a ``tls`` bundle (testbed.tls).
    """

    def __init__(self, name, target: str | None = None, device_id: int = 0,
                 grpc_addr: str | None = None, log_path: Path | None = None,
                 tls: TLSBundle | None = None, io_threads: int | None = None, **params):
        super().__init__(name, **params)
        self.io_threads = io_threads
        self.target = target or default_target()
        self.device_id = device_id
        self.grpc_addr = grpc_addr
        self.log_path = log_path
        self.tls = tls
        self.process: SwitchProcess | None = None

    def port_map(self) -> dict[int, str]:
        return {self.ports[intf]: intf.name for intf in self.intfList() if intf.name != "lo"}

    def start(self, controllers):
        for ifname in self.port_map().values():
            # No router solicitations or MLD reports from the switch side into the pipeline.
            Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")
        self.process = SwitchProcess(self.target, self.port_map(), device_id=self.device_id,
                                     grpc_addr=self.grpc_addr, log_path=self.log_path,
                                     tls=self.tls, io_threads=self.io_threads)
        self.process.start()
        self.grpc_addr = self.process.grpc_addr

    def stop(self, deleteIntfs=True):
        if self.process is not None:
            self.process.stop()
        super().stop(deleteIntfs)
