"""Installation: the switch work, done by the sweeper thread (``Jobs.sweep``) outside
``Jobs.cond`` (which every registration, renewal, close and listing takes): state
changes happen under the lock (a job allocated and its row written INSTALLING; lapsed
or closed, REMOVING), and the switch I/O after (installer.py): it takes the removing
jobs off the switches, installs the installing ones, repairs the switches and reads
what they hold. A switch
that hangs or restarts (and takes tens of seconds to get its program back) delays
installs and removals, never a renewal.

A room of ``Jobs`` (jobs.py).
"""

from __future__ import annotations

import logging
import time

from ..client import P4RuntimeError
from ..overlaps import JobOverlap
from .installer import MARK, refusal
from .records import Running
from .scheduling import Scheduling
from .store import REMOVING, RUNNING

log = logging.getLogger("innet_aggregation.manager")


class Installation(Scheduling):
    """The sweeper's side of ``Jobs``: the switch work, outside its cond."""

    def _install(self, running: Running) -> None:
        """Put an installing job on its switches; the row says running after. A switch
        that is away leaves it installing (tried again next sweep); one that refuses
        it refuses its ranks, and what it wrote is taken off again."""
        try:
            self.installer.install(running.tree)
        except (P4RuntimeError, ValueError) as exc:
            with self.cond:
                pending = running.pending
                if not refusal(exc):
                    pending.message = f"waiting for the switch: {exc}"
                    pending.outcome = ("waiting", pending.message)
                    return
                log.error("job %s cannot be installed: %s", running.name, exc)
                pending.outcome = ("refused", f"the switch refused job {running.name}: {exc}")
                self.pending.pop(running.name, None)
                del self.installing[running.name]
                if isinstance(exc, JobOverlap):     # checked before any write: none to undo
                    self.store.delete_job(running.name)
                else:
                    self.store.set_state(running.name, REMOVING)
                    self.removing[running.name] = running
                self.cond.notify_all()
            return
        with self.cond:
            self.store.set_state(running.name, RUNNING)
            del self.installing[running.name]
            running.leases = dict.fromkeys(running.tokens,
                                           time.monotonic() + self.config.lease_seconds)
            self.running[running.name] = running
            pending, running.pending = running.pending, None
            pending.outcome = ("ready", running)
            self.pending.pop(running.name, None)
            job = running.job
            log.info("job %s installed: id %d, slots %d..%d, UDP port %d, %s, %d ranks",
                     running.name, job.id, job.first_slot, job.first_slot + job.num_slots - 1,
                     job.udp_port, ", ".join(f"{name} service {c.job.service_ip} "
                                             f"{c.job.service_mac}"
                                             for name, c in running.tree.switches.items()),
                     len(running.tokens))
            self.cond.notify_all()

    def _remove(self, running: Running) -> None:
        """Take a removing job off its switches and reset its slots; its row and its
        resources go once they confirmed, else it is tried again next sweep."""
        try:
            self.installer.remove(running.tree)
        except P4RuntimeError as exc:
            log.warning("job %s: removing it from the switch failed (%s): trying again",
                        running.name, exc)
            return
        with self.cond:
            self.store.delete_job(running.name)
            del self.removing[running.name]
            if self._seen is not None:
                self._seen = [j for j in self._seen if j.id != running.job.id]
            log.info("job %s (id %d) removed and its %d slots reset on %s", running.name,
                     running.job.id, running.job.num_slots, ", ".join(running.tree.switches))
            self._schedule()

    def _read(self) -> None:
        """Repair the switches (the running jobs' entries back on a restarted one) and
        read what they hold: until they answer, no job is scheduled."""
        with self.cond:
            trees = [r.tree for r in self.running.values()]
        try:
            self.installer.repair(trees)
            seen = self.installer.installed()
        except P4RuntimeError as exc:
            with self.cond:
                if str(exc) != self._trouble:
                    log.warning("the switch%s cannot be repaired or read now (%s): jobs wait, "
                                "and it is tried again every %g s",
                                "es" * (len(self.installer.installers) > 1), exc,
                                self.config.sweep_seconds)
                self._trouble = str(exc)
            return
        with self.cond:
            if self._trouble:
                log.info("the switches are reachable: scheduling the jobs that wait")
            self._seen, self._trouble = seen, ""
            ours = {r.job.id for jobs in (self.running, self.installing, self.removing)
                    for r in jobs.values()}
            orphans = sorted({j.id for j in seen if j.mark == MARK and j.id not in ours})
            if orphans and orphans != self._orphans:
                log.warning("the switches hold job%s %s marked as this manager's that its "
                            "database does not know (was the database replaced?): left in "
                            "place, their resources held; remove them by hand",
                            "s" * (len(orphans) > 1), ", ".join(map(str, orphans)))
            self._orphans = orphans
            self._schedule()
