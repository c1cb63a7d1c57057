"""The manager's jobs as it holds them: the dicts of records (records.py) that every
room of ``Jobs`` (jobs.py) works on under ``cond``, kept in step with the database's
rows (store.py), and what survives a restart (``restore``).

No switch I/O happens under ``cond``, which every registration, renewal, close and
listing takes: state changes happen under it (a job allocated and its row written
INSTALLING; lapsed or closed, REMOVING), and the sweeper does the switch work after,
outside it (installation.py). A restored job gets fresh leases: the manager was away,
not its ranks.
"""

from __future__ import annotations

import logging
import threading
import time

from innet_aggregation.p4src import protocol

from ..overlaps import InstalledJob
from . import placement
from .config import ManagerConfig
from .installer import Switches
from .metrics import Tally
from .pool import Allocator
from .records import Pending, Running
from .store import INSTALLING, REMOVING, RUNNING, Store, StoredJob
from .tenants import Tenant, tenant_of
from .wire import job_name_of

log = logging.getLogger("innet_aggregation.manager")


class JobState:
    """The jobs in memory and in the database, from registration to removal."""

    def __init__(self, config: ManagerConfig, installer: Switches, store: Store):
        self.config = config
        self.installer = installer
        self.store = store
        self.allocator = Allocator(config.pool)
        self.pool_size = protocol.packet_format(config.values_per_packet).pool_size
        self.cond = threading.Condition()
        self.pending: dict[str, Pending] = {}
        self.running: dict[str, Running] = {}
        self.installing: dict[str, Running] = {}   # its row written; the switch work to do
        self.removing: dict[str, Running] = {}     # leaving the switches, its resources held
        self.wake = threading.Event()              # switch work for the sweeper
        self._generations = 0
        self._seen: list[InstalledJob] | None = None   # the switches' jobs, as last read
        self._trouble = "not reached yet"              # why the switches could not be read
        self._orphans: list[int] = []                  # marked as ours, unknown to the database
        self._preempted: dict[str, str] = {}           # a preempted job's key -> why
        self._places: dict[str, float] = {}            # a preempted job's name -> its place
        self.tally = Tally()                           # for the metrics (metrics.py)
        self._alive = time.monotonic()

    def restore(self) -> None:
        """The jobs the database holds, without a word to the switches (they may be
        down; the sweeper repairs them): a running one with fresh leases (the manager
        was away, not its ranks); one caught installing or removing is to be taken off
        the switches and freed, and its ranks register again."""
        self._alive = time.monotonic()
        deadline = self._alive + self.config.lease_seconds
        for stored in self.store.jobs():
            running = self._running(stored, deadline)
            if stored.state == RUNNING:
                self.running[stored.name] = running
                log.info("job %s (id %d) restored from the database: ranks %s", stored.name,
                         running.job.id, sorted(running.tokens))
                continue
            if stored.state == INSTALLING:
                self.store.set_state(stored.name, REMOVING)
            self.removing[stored.name] = running
            log.warning("job %s (id %d) was %s when the manager stopped: taking it off the "
                        "switches (its ranks register again)", stored.name, running.job.id,
                        stored.state)
        self.wake.set()

    def _running(self, stored: StoredJob, deadline: float) -> Running:
        tenant = self.tenant(stored.name)
        return Running(stored.name, placement.as_tree(stored.config, self.pool_size),
                       stored.config, stored.tokens, {rank: deadline for rank in stored.tokens}, set(stored.closed),
                       stored.started, priority=tenant.priority if tenant else 0)

    def tenant(self, name: str) -> Tenant | None:
        """The tenant a job's key names (None: one no longer in the configuration)."""
        return self.config.tenants.get(tenant_of(name))

    def _finish(self, running: Running, why: str) -> None:
        """The job leaves: its row says removing before the sweeper takes it off the
        switches; what it holds stays held until they confirmed."""
        self.store.set_state(running.name, REMOVING)
        del self.running[running.name]
        self.removing[running.name] = running
        log.info("job %s (id %d) leaving %s: %s", running.name, running.job.id,
                 ", ".join(running.tree.switches), why)
        self.wake.set()

    def listing(self, tenant: Tenant) -> dict:
        """The tenant's own jobs (an operator's: every tenant's), each with its tenant;
        nothing of a job's credential."""
        def mine(name: str) -> bool:
            return tenant.operator or tenant_of(name) == tenant.name

        with self.cond:
            running = [{"name": job_name_of(r.name), "tenant": tenant_of(r.name), "id": r.job.id,
                        "slots": [r.job.first_slot, r.job.first_slot + r.job.num_slots - 1],
                        "udp_port": r.job.udp_port, "service_ip": r.job.service_ip,
                        "switches": list(r.tree.switches), "ranks": len(r.tokens),
                        "closed": sorted(r.closed), "priority": r.priority}
                       for r in self.running.values() if mine(r.name)]
            waiting = [{"name": job_name_of(p.name), "tenant": tenant_of(p.name),
                        "registered": sorted(p.members), "world": p.world,
                        "slots": p.slots, "message": p.message, "priority": p.priority}
                       for p in self.pending.values() if mine(p.name)]
            removing = [{"name": job_name_of(r.name), "tenant": tenant_of(r.name),
                         "id": r.job.id} for r in self.removing.values() if mine(r.name)]
        return {"running": running, "waiting": waiting, "removing": removing}
