"""The manager's jobs: ranks gather into a job, a complete job gets resources and is
installed, its ranks renew their leases, and a job leaves when every rank closed it
or one rank's lease ran out.

``Jobs`` is that whole life, put together from its rooms, each a file to read on
its own:
- jobstate.py: the jobs' records (records.py) under ``cond``, kept in step with the
  database (store.py); restore after a restart; the listing.
- registration.py: the waiting room (a rank's registration checked, its job
  gathering its ranks); the wire is wire.py's, the connection server.py's.
- scheduling.py: priorities and allocation from the pool (pool.py, sharing.py); the
  job file a job is installed from (placement.py).
- leases.py: renewals, closes, expiry, and time the manager itself was stuck.
- installation.py: the sweeper's switch work outside ``cond`` (installer.py talks
  to the switches).
"""

from __future__ import annotations

from .installation import Installation
from .leases import TICK, Leases
from .registration import Registration

__all__ = ["TICK", "Jobs"]


class Jobs(Registration, Leases, Installation):
    """Every job the manager holds, from registration to removal."""

    def sweep(self) -> None:
        """Reclaim the jobs with a rank whose lease ran out and give waiting jobs a
        try (under the lock); then the switch work, outside it."""
        with self.cond:
            self._expire()
            self._schedule()
            removing = list(self.removing.values())
        for running in removing:
            self._remove(running)
        with self.cond:
            self._schedule()
            installing = list(self.installing.values())
        for running in installing:
            self._install(running)
        self._read()
