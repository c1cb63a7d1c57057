"""Scheduling and allocation: which complete job goes on the switches next, and what
it gets from the pool (pool.py) and where (placement.py).

A complete job that does not fit (slots, ids, ports, service addresses, or a host
interface another job uses) waits; the waiting jobs are tried by priority, then in
the order they became complete, and one that fits goes ahead of an earlier one that
does not; one of higher priority may preempt running jobs (sharing.py), which wait
again at the place they had. Its ranks
see why they wait until their own timeout ends the wait.
"""

from __future__ import annotations

import logging

from .. import config as config_mod
from ..overlaps import InstalledJob
from . import placement, sharing
from .installer import MARK
from .jobstate import JobState
from .pool import Allocation, Holding
from .records import Pending, Running
from .store import INSTALLING

log = logging.getLogger("innet_aggregation.manager")


class Scheduling(JobState):
    """Complete jobs onto the pool, by priority and age; called under cond."""

    def _schedule(self) -> None:
        """Install every complete job that fits, in the order they became complete."""
        ready = sorted((p for p in self.pending.values()
                        if p.complete_since is not None and p.outcome is None),
                       key=lambda p: (-p.priority, p.complete_since))
        if not ready:
            return
        if self._seen is None:
            for pending in ready:
                pending.message = f"waiting for the switch: {self._trouble}"
            return
        held = self._held()
        for pending in ready:
            if pending.name in self.running:
                pending.message = (f"waiting for job {pending.title}'s earlier ranks to close "
                                   f"or lose their lease")
                continue
            if pending.name in self.removing:
                pending.message = (f"waiting for job {pending.name}'s earlier run to leave "
                                   f"the switch")
                continue
            macs = frozenset(m.mac for m in pending.members.values())
            spanned = placement.spanned(self.config, pending)
            why = sharing.over_services(self, pending, len(spanned))
            if why is not None:
                pending.outcome = ("refused", why)
                del self.pending[pending.name]
                continue
            allocation = self.allocator.allocate(pending.slots, macs, held, len(spanned))
            if isinstance(allocation, str):
                pending.message = allocation
                if not pending.preempting & self.removing.keys():
                    sharing.preempt(self, pending, macs, held, len(spanned))
                continue
            running = self._start(pending, allocation, spanned)
            if running is not None:
                held.append(running.holding())
        self.cond.notify_all()

    def _held(self) -> list[Holding]:
        """Ours (running, and on their way on or off the switches), and whatever else
        the switches held when last read (a job someone applied by hand)."""
        ours = [r.holding() for jobs in (self.running, self.installing, self.removing)
                for r in jobs.values()]
        ids = {h.job_id for h in ours}
        return ours + [Holding(f"#{j.id} ({_whose(j)})", j.id, j.first_slot, j.num_slots,
                               j.udp_port, j.service_ip, j.service_mac)
                       for j in self._seen or () if j.id not in ids]

    def _start(self, pending: Pending, allocation: Allocation,
               spanned: list[str]) -> Running | None:
        """The job's row, INSTALLING with its allocation, before any switch write; its
        ranks wait (their registrations are fixed now) until the sweeper installed it."""
        raw = placement.job_file(self.config, pending, allocation, spanned)
        try:
            tree = placement.as_tree(raw, self.pool_size)
        except (config_mod.ConfigError, ValueError) as exc:
            log.error("job %s cannot be installed: %s", pending.name, exc)
            pending.outcome = ("refused", f"the switch refused job {pending.title}: {exc}")
            del self.pending[pending.name]
            return None
        tokens = dict(pending.tokens)
        self.store.add_job(pending.name, raw, tokens, state=INSTALLING)
        running = Running(pending.name, tree, raw, tokens, {}, pending=pending,
                          priority=pending.priority, queued=pending.complete_since)
        self._places.pop(pending.name, None)
        self.installing[pending.name] = running
        pending.message = f"installing job {pending.title} on the switch"
        pending.outcome = ("waiting", pending.message)
        self.wake.set()
        return running


def _whose(job: InstalledJob) -> str:
    return ("marked as this manager's, unknown to its database" if job.mark == MARK
            else "not the manager's")
