"""The manager's hold on its switches: per switch one P4Runtime session, the program
on it, and the jobs the database says it holds, put back whenever the switch lost
them. A job is a Tree (switch_ctl/tree.py) over some of the switches (a star's one
switch is a tree of one): checked on each before any is written, installed parents
first, removed children first.

A switch that restarted comes back with no program and no entries: ``repair``
notices (a broken session, a switch without our program, a job missing from its
jobs table), opens a new session, pushes the program and applies every job again.
Applying is idempotent, so a manager that restarts in front of a healthy switch
writes nothing.

Only the manager's sweeper calls in here, never under the jobs' lock: every call
has a deadline (switch_ctl/client.py), so a hung switch holds up the sweeper a
bounded time and no rank's renewal at all. The jobs entry of every job the manager
writes carries MARK as its P4Runtime metadata, so a manager tells its own jobs on a
switch from those a person applied.
"""

from __future__ import annotations

import logging
import threading

from innet_aggregation.p4src import protocol

from ..client import P4RuntimeError, SwitchConnection
from ..config import Config
from ..controller import Controller
from ..overlaps import InstalledJob
from ..tree import Tree
from .config import ManagerSwitch

log = logging.getLogger("innet_aggregation.manager")
BUSY_WAIT = 2.0      # seconds a port proof waits for a session the sweeper holds
MARK = b"innet-aggregation job manager"
# Reaching a switch: short, since the sweeper tries again every sweep.
CONNECT_TIMEOUT = 3.0


class Installer:
    def __init__(self, switch: ManagerSwitch):
        self.switch = switch
        self.election_id = switch.election_id
        self.program = protocol.program(switch.values_per_packet)
        self._lock = threading.Lock()
        self._ctl: Controller | None = None

    # -- session -----------------------------------------------------------------
    def _controller(self) -> Controller:
        """The session, opened (and the program pushed if the switch has none) if
        there is none; P4RuntimeError if the switch cannot be reached or refuses."""
        if self._ctl is not None:
            return self._ctl
        conn = SwitchConnection(self.switch.grpc_addr, self.switch.device_id,
                                (0, self.election_id), CONNECT_TIMEOUT,
                                self.switch.tls).connect()
        try:
            if not conn.is_primary:
                raise P4RuntimeError(f"another controller is primary on {conn.grpc_addr}: "
                                     f"the manager needs election id {self.election_id} to "
                                     f"be the highest")
            ctl = Controller(conn, MARK)
            try:
                conn.load_p4info()
            except P4RuntimeError as exc:
                if not _no_program(exc):
                    raise
                log.warning("switch %s has no program: pushing %s (%d values per packet)",
                            conn.grpc_addr, self.program.json.name,
                            self.program.values_per_packet)
                ctl.push(self.program.json, self.program.p4info)
            have = protocol.values_per_packet_in(r.name for r in conn.schema.registers)
            if have != self.switch.values_per_packet:
                raise P4RuntimeError(
                    f"the program on {conn.grpc_addr} carries {have} values per packet; the "
                    f"manager's switch.values_per_packet is {self.switch.values_per_packet}")
        except BaseException:
            conn.close()
            raise
        self._ctl = ctl
        return ctl

    def _drop(self) -> None:
        if self._ctl is not None:
            self._ctl.conn.close()
            self._ctl = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _run(self, action, wait: float = -1):
        """``action(controller)``; a broken session is reopened once and retried.
        ``wait``: how long to wait for the session (-1: as long as it takes), else
        P4RuntimeError saying the switch is busy."""
        if not self._lock.acquire(timeout=wait):
            raise P4RuntimeError(f"switch {self.switch.grpc_addr} is busy (a program push or a "
                                 f"repair): try again")
        try:
            for attempt in (0, 1):
                ctl = self._controller()
                try:
                    return action(ctl)
                except P4RuntimeError as exc:
                    if attempt or not _broken(exc):
                        raise
                    log.warning("switch session broke (%s): reconnecting", exc)
                    self._drop()
        finally:
            self._lock.release()

    # -- jobs ----------------------------------------------------------------------
    def installed(self) -> list[InstalledJob]:
        return self._run(lambda ctl: ctl.installed_jobs())

    def check(self, config: Config) -> None:
        """JobOverlap if the job collides with one the switch holds; nothing written."""
        self._run(lambda ctl: ctl.check_overlaps(config))

    def install(self, config: Config) -> None:
        self._run(lambda ctl: ctl.apply(config))

    def send_frame(self, port: int, frame: bytes) -> None:
        """A registration's port proof: it does not wait behind a push or repair (tens
        of seconds), the rank asks again."""
        self._run(lambda ctl: ctl.send_frame(port, frame), wait=BUSY_WAIT)

    def remove(self, config: Config) -> None:
        """Entries first, so no straggler's packet reaches the slots, then the slots
        back to a fresh switch's state for the next job."""
        def remove(ctl):
            ctl.remove(config)
            ctl.reset(config)
        self._run(remove)

    def repair(self, configs: list[Config]) -> list[int]:
        """Put back what the switch lost: the session, the program, any of ``configs``
        missing from its jobs table. Returns the ids of the jobs re-applied."""
        with self._lock:
            try:
                if self._ctl is not None:
                    self._ctl.conn.load_p4info()   # the program is still there?
            except P4RuntimeError as exc:
                log.warning("switch %s lost its session or program (%s): reconnecting",
                            self.switch.grpc_addr, exc)
                self._drop()
            ctl = self._controller()
            try:
                present = {job.id for job in ctl.job_lookup.installed()}
            except P4RuntimeError:
                self._drop()
                raise
            missing = [c for c in configs if c.job.id not in present]
            for config in missing:
                log.warning("job %d is not on the switch: re-applying it", config.job.id)
                ctl.apply(config)
            return [c.job.id for c in missing]


class Switches:
    """Every switch of the manager, by name, each through an Installer of its own."""

    def __init__(self, switches: dict[str, ManagerSwitch]):
        self.installers = {name: Installer(sw) for name, sw in switches.items()}

    def close(self) -> None:
        for installer in self.installers.values():
            installer.close()

    def installed(self) -> list[InstalledJob]:
        """The jobs every switch holds (a job on several switches once per switch)."""
        return [job for installer in self.installers.values() for job in installer.installed()]

    def install(self, tree: Tree) -> None:
        """Every switch of the job checked before any is written (a collision on a leaf
        must not leave the job on its parent alone), then parents first; a switch that
        fails has the job taken back off the switches written before it."""
        for name, config in tree.switches.items():
            self.installers[name].check(config)
        done = []
        try:
            for name, config in tree.switches.items():
                self.installers[name].install(config)
                done.append(name)
        except BaseException:
            for name in reversed(done):
                try:
                    self.installers[name].remove(tree.switches[name])
                except P4RuntimeError as exc:
                    log.warning("job %d: taking it back off %s failed: %s", tree.job_id,
                                name, exc)
            raise

    def send_frame(self, switch: str, port: int, frame: bytes) -> None:
        self.installers[switch].send_frame(port, frame)

    def remove(self, tree: Tree) -> None:
        """Children first, so no switch sends sums to one that lost the job; every switch
        is tried, and the first failure raised after."""
        failed = []
        for name in reversed(tree.switches):
            try:
                self.installers[name].remove(tree.switches[name])
            except P4RuntimeError as exc:
                failed.append(P4RuntimeError(f"{name} ({self.installers[name].switch.grpc_addr}):"
                                             f" {exc}"))
        if failed:
            raise failed[0]

    def repair(self, trees: list[Tree]) -> None:
        """Each switch repaired (Installer.repair) with the jobs it should hold; every
        switch is tried, then P4RuntimeError names those that could not be."""
        failed = []
        for name, installer in self.installers.items():
            try:
                installer.repair([t.switches[name] for t in trees if name in t.switches])
            except (P4RuntimeError, ValueError) as exc:
                failed.append(f"{name} ({installer.switch.grpc_addr}): {exc}")
        if failed:
            raise P4RuntimeError("; ".join(failed))


def _no_program(exc: P4RuntimeError) -> bool:
    """A switch without a program says so (our client, or PI's FAILED_PRECONDITION)."""
    text = str(exc)
    return "has no program" in text or "No forwarding pipeline" in text


def _broken(exc: P4RuntimeError) -> bool:
    """A session the switch no longer has (restarted, the stream died, or it stopped
    answering within a call's deadline)."""
    text = str(exc)
    return any(word in text for word in ("UNAVAILABLE", "no program", "not connected",
                                         "PERMISSION_DENIED", "FAILED_PRECONDITION",
                                         "CANCELLED", "DEADLINE_EXCEEDED"))


def refusal(exc: Exception) -> bool:
    """The switches answered and will not take the job (a collision, an entry they
    reject, a program without what the job needs): trying again will not help.
    Anything else (unreachable, a broken session, a deadline) is worth another try."""
    if isinstance(exc, ValueError):         # JobOverlap, ConfigError
        return True
    text = str(exc)
    return (text.startswith("write rejected") or "which the program on" in text
            or "is for a program of" in text)
