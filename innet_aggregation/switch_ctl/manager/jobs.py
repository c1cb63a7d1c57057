"""The manager's jobs: ranks gather into a job (registration.py), a complete job gets
resources (the pool, priorities and preemption: pool.py, sharing.py) and is installed
(switch_work.py), its ranks renew their leases (here), and a job leaves when every
rank closed it or one rank's lease ran out.

A complete job that does not fit (slots, ids, ports, service addresses, or a host
interface another job uses) waits; the waiting jobs are tried by priority, then in
the order they became complete, and one that fits goes ahead of an earlier one that
does not. Its ranks see why they wait until their own timeout ends the wait.

Time the manager itself was stuck (stopped, starved; ``alive``) is added to every
lease, and a restored job gets fresh leases: only a rank's own silence loses its job.
"""

from __future__ import annotations

import logging
import threading
import time

from innet_aggregation.p4src import protocol

from .. import config as config_mod
from ..overlaps import InstalledJob
from . import placement, sharing
from .config import ManagerConfig
from .installer import MARK, Switches
from .metrics import Tally
from .pool import Allocation, Allocator, Holding
from .records import Pending, Running, same_token
from .registration import Registration
from .store import INSTALLING, REMOVING, RUNNING, Store, StoredJob
from .switch_work import SwitchWork
from .tenants import Tenant, tenant_of, wire_key
from .wire import Lease, job_name_of

log = logging.getLogger("innet_aggregation.manager")
# The listener calls ``alive`` at least every TICK seconds (its accept timeout): a gap
# over STALL means the manager could not have handled a renewal meanwhile.
TICK = 0.5
STALL = 3 * TICK


class Jobs(Registration, SwitchWork):
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
        return Running(stored.name, placement.as_tree(stored.config, self.pool_size), stored.config, stored.tokens,
                       {rank: deadline for rank in stored.tokens}, set(stored.closed),
                       stored.started, priority=tenant.priority if tenant else 0)

    # -- scheduling ------------------------------------------------------------------
    def tenant(self, name: str) -> Tenant | None:
        """The tenant a job's key names (None: one no longer in the configuration)."""
        return self.config.tenants.get(tenant_of(name))

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
                          priority=pending.priority)
        self.installing[pending.name] = running
        pending.message = f"installing job {pending.title} on the switch"
        pending.outcome = ("waiting", pending.message)
        self.wake.set()
        return running

    # -- leases ----------------------------------------------------------------------
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


def _whose(job: InstalledJob) -> str:
    return ("marked as this manager's, unknown to its database" if job.mark == MARK
            else "not the manager's")
