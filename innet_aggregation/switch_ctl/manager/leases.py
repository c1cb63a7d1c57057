"""Leases: a running job's ranks renew their leases and close it; a job leaves when
every rank closed it or one rank's lease ran out (``_expire``, at each sweep).

Time the manager itself was stuck (stopped, starved; ``alive``) is added to every
lease: only a rank's own silence loses its job.
"""

from __future__ import annotations

import logging
import time

from .records import same_token
from .scheduling import Scheduling
from .tenants import tenant_of, wire_key
from .wire import Lease, job_name_of

log = logging.getLogger("innet_aggregation.manager")
# The listener calls ``alive`` at least every TICK seconds (its accept timeout): a gap
# over STALL means the manager could not have handled a renewal meanwhile.
TICK = 0.5
STALL = 3 * TICK


class Leases(Scheduling):
    """Renewals, closes and expiry of running jobs' leases."""

    def lease(self, request: Lease) -> str | None:
        """Renew or close; None if done, else why refused."""
        with self.cond:
            running = next((r for r in self.running.values() if wire_key(r.name) == request.job
                            and request.rank in r.tokens
                            and same_token(r.tokens[request.rank], request.token_hash)), None)
            if running is None and request.job in self._preempted:
                return f"job {job_name_of(request.job)} was {self._preempted[request.job]}"
            if running is None:
                return (f"job {job_name_of(request.job)} has no rank {request.rank} with this "
                        f"lease on this manager: it was closed, or reclaimed after a lease of "
                        f"{self.config.lease_seconds:g} s ran out")
            if request.op == "renew":
                running.leases[request.rank] = time.monotonic() + self.config.lease_seconds
                self.tally.count(self.tally.renewals, tenant_of(running.name))
                return None
            if request.rank not in running.closed:
                running.closed.add(request.rank)
                self.store.close_rank(running.name, request.rank)
                log.info("job %s: rank %d closed (%d of %d)", running.name, request.rank,
                         len(running.closed), len(running.tokens))
            if running.closed == set(running.tokens):
                self._finish(running, "every rank closed it")
                self._schedule()
            return None

    def alive(self) -> None:
        """The listener's tick (at least every TICK seconds): see ``_live``."""
        with self.cond:
            self._live()

    def _live(self) -> None:
        """Time since the last tick beyond STALL is time the manager itself was stuck
        (stopped, starved, a lock held): no rank could renew then, so every lease is
        extended by it."""
        now = time.monotonic()
        gap, self._alive = now - self._alive, now
        if gap > STALL:
            for running in self.running.values():
                for rank in running.leases:
                    running.leases[rank] += gap
            if self.running:
                log.warning("the manager was stuck for %.1f s: its jobs' leases are extended "
                            "by that", gap)

    def _expire(self) -> None:
        """Every job with a rank whose lease ran out leaves; under cond."""
        self._live()
        now = time.monotonic()
        for running in list(self.running.values()):
            late = sorted(r for r, deadline in running.leases.items()
                          if r not in running.closed and deadline < now)
            if late:
                self.tally.count(self.tally.expiries, tenant_of(running.name))
                self._finish(running, f"rank{'s' * (len(late) > 1)} "
                                      f"{', '.join(map(str, late))} stopped renewing")
