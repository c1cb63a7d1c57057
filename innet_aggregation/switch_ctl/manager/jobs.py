"""The manager's jobs: ranks gather into a job, a complete job gets resources and is
installed, its ranks renew their leases, and a job leaves when every rank closed it
or one rank's lease ran out.

A job is known by its key, its name and its owner (wire.job_key), within its
tenant's space (tenants.scoped): what one tenant sends never reaches another's job.
A rank's lease token is the one it drew itself; a second registration of a waiting
rank with another token is refused. A tenant's jobs, slots, service addresses and
waiting registrations are bounded by its quotas, and waiting registrations by
address and in all (manager.max_pending_per_peer, max_pending); a registration
whose job has not filled within manager.join_seconds is refused.

A complete job that does not fit (slots, ids, ports, service addresses, or a host
interface another job uses) waits; the waiting jobs are tried in the order they
became complete, and one that fits goes ahead of an earlier one that does not.
Its ranks see why they wait until their own timeout ends the wait.

A host the fabric map does not list (``learn_hosts``) may claim only a MAC that no
rank the manager holds has behind another port, and never a pool service address;
its job gets no L2 route to it (``l2_route = false``): the switch's mac_table, which
every job shares, holds listed hosts at their listed ports only.

A tree manager's job spans the switches its ranks are behind and the switches
between them (up to the lowest one they share, its root): the same id, slots and UDP
port on each, and a service address of each switch's own.

No switch I/O happens under ``Jobs.cond``, which every registration, renewal, close
and listing takes: state changes happen under it (a job allocated and its row
written INSTALLING; lapsed or closed, REMOVING), and the sweeper thread does the
switch work after, outside it (``sweep``): it takes the removing jobs off the
switches, installs the installing ones, repairs the switches and reads what they
hold. A switch that hangs or restarts (and takes tens of seconds to get its program
back) delays installs and removals, never a renewal. Time the manager itself was
stuck (stopped, starved; ``alive``) is added to every lease, and a restored job
gets fresh leases: only a rank's own silence loses its job.

INA_MANAGER_FAULT=<step>, for tests only, makes the manager kill itself
(os._exit(137), as a SIGKILL) at one step of the switch work: "install" (the row
says installing, nothing written), "installed" (on the switches, the row still
installing), "remove" (the row says removing, nothing removed), "removed" (off the
switches, the row still there).
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from innet_aggregation.p4src import protocol

from .. import config as config_mod
from ..client import P4RuntimeError
from ..overlaps import InstalledJob, JobOverlap
from ..tree import Tree, parse_tree
from .config import STAR, ManagerConfig
from .installer import MARK, Switches, refusal
from . import sharing
from .pool import Allocation, Allocator, Holding
from .store import INSTALLING, REMOVING, RUNNING, Store, StoredJob
from .metrics import Tally
from .tenants import Tenant, tenant_of, wire_key
from .wire import BadRequest, Lease, Register, job_name_of

log = logging.getLogger("innet_aggregation.manager")
FAULT_STEPS = ("install", "installed", "remove", "removed")
# The listener calls ``alive`` at least every TICK seconds (its accept timeout): a gap
# over STALL means the manager could not have handled a renewal meanwhile.
TICK = 0.5
STALL = 3 * TICK


def _fault(step: str) -> None:
    """Test-only crash at ``step`` (INA_MANAGER_FAULT, see the module's docstring)."""
    if os.environ.get("INA_MANAGER_FAULT") == step:
        log.error("INA_MANAGER_FAULT=%s: the manager kills itself here", step)
        logging.shutdown()
        os._exit(137)


@dataclass(frozen=True)
class Member:
    """A registered rank: its data-plane interface, and the switch and port behind it
    (None and "" until a host the fabric does not list has proven them; ``learned``
    then)."""
    rank: int
    ifname: str
    ip: str
    mac: str
    udp_port: int
    switch_port: int | None
    switch: str = STAR
    learned: bool = False


@dataclass
class Pending:
    """A job gathering its ranks, or complete and waiting for room."""
    name: str
    world: int
    slots: int
    deadline_ms: float | None = None
    members: dict[int, Member] = field(default_factory=dict)
    tokens: dict[int, str] = field(default_factory=dict)        # rank -> its token's hash
    generation: dict[int, int] = field(default_factory=dict)   # rank -> its registration
    peers: dict[int, str] = field(default_factory=dict)        # rank -> the address it came from
    joined: dict[int, float] = field(default_factory=dict)     # rank -> when (monotonic)
    complete_since: float | None = None
    message: str = ""
    priority: int = 0
    preempting: frozenset[str] = frozenset()   # the jobs it preempted, leaving for it
    # ("ready", Running) or ("refused", why); ("waiting", why) while being installed:
    # its ranks are fixed then (one that reconnects finds it again).
    outcome: tuple[str, object] | None = None

    @property
    def title(self) -> str:
        """The job's name as its ranks gave it (``name`` is its key: name and owner)."""
        return job_name_of(self.name)


@dataclass
class Running:
    name: str
    tree: Tree                         # a star job: a tree of one switch
    raw: dict                          # what each rank is handed: a job file's form
    tokens: dict[int, str]             # rank -> its lease token's hash
    leases: dict[int, float]           # rank -> monotonic deadline
    closed: set[int] = field(default_factory=set)
    started: float = field(default_factory=time.time)
    pending: Pending | None = None     # while installing: its ranks, waiting for the outcome
    priority: int = 0                  # a restored job's: its tenant's default

    @property
    def job(self):
        """The job's settings every switch shares (id, slots, UDP port), and the root's
        service address."""
        return self.tree.switches[self.tree.root].job

    def holding(self) -> Holding:
        job = self.job
        others = [c.job for name, c in self.tree.switches.items() if name != self.tree.root]
        return Holding(self.name, job.id, job.first_slot, job.num_slots, job.udp_port,
                       job.service_ip, job.service_mac,
                       frozenset(self.member(rank).mac for rank in self.tree.homes),
                       frozenset(a for j in others for a in (j.service_ip, j.service_mac)))

    def member(self, rank: int):
        return next(w for w in self.tree.for_worker(rank).job.workers if w.id == rank)


class Jobs:
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
        fault = os.environ.get("INA_MANAGER_FAULT")
        if fault is not None and fault not in FAULT_STEPS:
            raise ValueError(f"INA_MANAGER_FAULT={fault!r} is not one of "
                             f"{', '.join(FAULT_STEPS)}")

    # -- start ---------------------------------------------------------------------
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
        return Running(stored.name, self._tree(stored.config), stored.config, stored.tokens,
                       {rank: deadline for rank in stored.tokens}, set(stored.closed),
                       stored.started, priority=tenant.priority if tenant else 0)

    # -- registration ----------------------------------------------------------------
    def member(self, request: Register) -> Member:
        """The rank's interface the fabric knows, and the switch port behind it; what
        the request alone can be refused for is refused here, before the port proof."""
        slots = request.slots or self.config.default_slots
        if slots > len(self.config.pool.slots):
            raise BadRequest(f"job {request.name} asks for {slots} slots; the manager's pool "
                             f"has {len(self.config.pool.slots)}")
        known = [(i, self.config.fabric[i.mac]) for i in request.interfaces
                 if i.mac in self.config.fabric]
        listed = ", ".join(f"{i.ifname} {i.mac}" for i in request.interfaces)
        if not known and len(request.interfaces) == 1:
            (interface,) = request.interfaces
            self._not_a_service(request, interface)
            if self.config.learn_hosts:     # its port is learned from the proof (proof.py)
                return Member(request.rank, interface.ifname, interface.ip, interface.mac,
                              request.udp_port, None, "")
        if not known:
            raise BadRequest(f"none of rank {request.rank}'s interfaces ({listed}) is in the "
                             f"manager's fabric (fabric.hosts)"
                             + (": name the data-plane interface with INA_IFNAME for the "
                                "manager to learn its port" if self.config.learn_hosts else
                                ", and the manager learns no hosts (learn_hosts is off): is "
                                "INA_IFNAME the data-plane interface, and is this host "
                                "behind the switch?"))
        if len(known) > 1:
            raise BadRequest(f"rank {request.rank} has several interfaces in the fabric "
                             f"({', '.join(i.ifname for i, _ in known)}): name one with INA_IFNAME")
        interface, port = known[0]
        self._not_a_service(request, interface)
        return Member(request.rank, interface.ifname, interface.ip, interface.mac,
                      request.udp_port, port, self.config.homes[interface.mac])

    def _not_a_service(self, request: Register, interface) -> None:
        for address in (interface.ip, interface.mac):
            if address in {a for s in self.config.pool.services for a in (s.ip, s.mac)}:
                raise BadRequest(f"rank {request.rank}'s address {address} is a service "
                                 f"address of the manager's pool")

    def _shown(self, member: Member) -> tuple[str, int | None] | None:
        """The (switch, port) behind which a rank of a job the manager holds (waiting,
        or on its way on, on or off the switches) has the member's MAC, if not the
        member's own; call under cond."""
        here = (member.switch, member.switch_port)
        for pending in self.pending.values():
            for other in pending.members.values():
                if other.mac == member.mac and (other.switch, other.switch_port) != here:
                    return other.switch, other.switch_port
        for jobs in (self.running, self.installing, self.removing):
            for running in jobs.values():
                for rank, switch in running.tree.homes.items():
                    worker = running.member(rank)
                    if worker.mac == member.mac and (switch, worker.switch_port) != here:
                        return switch, worker.switch_port
        return None

    def register(self, request: Register, member: Member,
                 peer: str = "") -> tuple[Pending, int]:
        """Enter the rank (from address ``peer``); returns its job and its registration's
        generation."""
        slots = request.slots or self.config.default_slots
        if request.deadline_ms is not None and self.config.tree is not None:
            raise BadRequest(f"job {request.name} asks for a deadline; this manager's switches "
                             f"form a tree, whose leaves do not release rounds")
        tenant = self.tenant(request.job)
        priority = (request.priority or 0) if tenant is None else tenant.job_priority(
            request.priority)
        if isinstance(priority, str):
            raise BadRequest(f"{priority}: rank {request.rank} of job {request.name} refused")
        with self.cond:
            running = self.running.get(request.job)
            if (running is not None and request.rank in running.tokens
                    and _same(running.tokens[request.rank], request.token_hash)):
                # The same client again (its answer was lost): the same lease. Another
                # token waits below until the running job is gone, and gets nothing of it.
                return Pending(request.job, request.world, slots, outcome=("ready", running)), 0
            pending = self.pending.get(request.job)
            again = pending is not None and member.rank in pending.members and _same(
                pending.tokens[member.rank], request.token_hash)
            if not again:
                sharing.admit(self, request, slots, peer, new_job=pending is None)
            if pending is None:
                pending = self.pending[request.job] = Pending(request.job, request.world, slots,
                                                              request.deadline_ms,
                                                              priority=priority)
            if pending.priority != priority:
                raise BadRequest(f"rank {request.rank} of job {request.name} has priority "
                                 f"{priority}; its other ranks have {pending.priority}")
            if pending.world != request.world:
                raise BadRequest(f"rank {request.rank} of job {request.name} says world size "
                                 f"{request.world}; its other ranks said {pending.world}")
            if pending.slots != slots:
                raise BadRequest(f"rank {request.rank} of job {request.name} asks for {slots} "
                                 f"slots; its other ranks asked for {pending.slots}")
            if pending.deadline_ms != request.deadline_ms:
                raise BadRequest(f"rank {request.rank} of job {request.name} asks for deadline_ms "
                                 f"{request.deadline_ms}; its other ranks asked for "
                                 f"{pending.deadline_ms}")
            shown = self._shown(member) if member.learned else None
            if shown is not None:
                raise BadRequest(f"rank {member.rank} of job {request.name} was learned behind "
                                 f"{member.switch} port {member.switch_port} with MAC "
                                 f"{member.mac}, which a rank the manager holds has behind "
                                 f"{shown[0]} port {shown[1]}: a learned host may claim only "
                                 f"a MAC no other port has shown")
            first = pending.members.get(member.rank)
            if first is not None and not _same(pending.tokens[member.rank], request.token_hash):
                raise BadRequest(f"rank {member.rank} of job {request.name} is already registered "
                                 f"(from {first.ip}, {first.mac}) and waiting: a rank registers "
                                 f"once; is another process started as rank {member.rank}?")
            for other in pending.members.values():
                if other.rank != member.rank and (other.mac == member.mac or other.ip == member.ip):
                    raise BadRequest(
                        f"ranks {other.rank} and {member.rank} of job {request.name} share the "
                        f"interface {member.mac} / {member.ip}: one rank per data-plane "
                        f"interface (the switch routes results by MAC)")
            self._generations += 1
            pending.members[member.rank] = member
            pending.tokens[member.rank] = request.token_hash
            pending.generation[member.rank] = self._generations
            pending.peers[member.rank] = peer
            pending.joined.setdefault(member.rank, time.monotonic())
            if len(pending.members) == pending.world and pending.complete_since is None:
                pending.complete_since = time.monotonic()
            log.info("job %s: rank %d of %d registered from %s (%s, %s port %d)",
                     request.job, member.rank, request.world, member.ip, member.mac,
                     member.switch, member.switch_port)
            self._schedule()
            return pending, self._generations

    def tenant(self, name: str) -> Tenant | None:
        """The tenant a job's key names (None: one no longer in the configuration)."""
        return self.config.tenants.get(tenant_of(name))

    def withdraw(self, pending: Pending, rank: int, generation: int) -> None:
        """A waiting rank went away (its timeout, or it died): the job waits for it again."""
        with self.cond:
            if pending.outcome is None and pending.generation.get(rank) == generation:
                del pending.members[rank]
                del pending.tokens[rank]
                del pending.generation[rank]
                pending.peers.pop(rank, None)
                pending.joined.pop(rank, None)
                pending.complete_since = None
                if not pending.members and self.pending.get(pending.name) is pending:
                    del self.pending[pending.name]
                log.info("job %s: rank %d stopped waiting", pending.name, rank)

    def status(self, pending: Pending, rank: int, generation: int) -> tuple[str, object]:
        """("ready", Running), ("refused", why) or ("waiting", message); call under cond."""
        if pending.outcome is not None:
            return pending.outcome
        if pending.generation.get(rank) != generation:
            return "refused", f"rank {rank} of job {pending.title} registered again elsewhere"
        if len(pending.members) < pending.world:
            waited = time.monotonic() - pending.joined[rank]
            if waited > self.config.join_seconds:
                registered = len(pending.members)
                self.withdraw(pending, rank, generation)
                return "refused", (f"rank {rank} of job {pending.title} of tenant "
                                   f"{tenant_of(pending.name)} waited "
                                   f"{self.config.join_seconds:g} s (the manager's "
                                   f"join_seconds) with {registered} of its {pending.world} "
                                   f"ranks registered: registration expired")
            return "waiting", (f"waiting for ranks: {len(pending.members)} of {pending.world} "
                               f"of job {pending.title} registered")
        return "waiting", pending.message or "waiting for the switch"

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
            spanned = self._spanned(pending)
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
        raw = (self._job_dict(pending, allocation) if self.config.tree is None
               else self._tree_dict(pending, allocation, spanned))
        try:
            tree = self._tree(raw)
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

    def _tree(self, raw: dict) -> Tree:
        """A job's dict as a Tree: a tree job file's form, or a star's (a tree of one)."""
        if "switches" in raw:
            return parse_tree(raw, self.pool_size)
        config = config_mod.parse(raw, self.pool_size)
        return Tree(STAR, {STAR: config}, {}, {w.id: STAR for w in config.job.workers})

    def _spanned(self, pending: Pending) -> list[str]:
        """The switches a job spans, parents first: those its ranks are behind and those
        between them, below the lowest switch they all share."""
        links = self.config.tree
        if links is None:
            return [STAR]
        used = set()
        for m in pending.members.values():
            switch = m.switch
            used.add(switch)
            while switch in links.parents:
                switch = links.parents[switch]
                used.add(switch)
        root = links.root
        while True:
            children = [c for c, p in links.parents.items() if p == root and c in used]
            if len(children) != 1 or any(m.switch == root for m in pending.members.values()):
                break
            used.discard(root)
            root = children[0]
        return [name for name in self.config.switches if name in used]

    def _tree_dict(self, pending: Pending, a: Allocation, spanned: list[str]) -> dict:
        """The job as a tree job file (switch_ctl/tree.py) over ``spanned``."""
        links = self.config.tree
        switches = {}
        for name, service in zip(spanned, a.services):
            sw = self.config.switches[name]
            entry = {"grpc_addr": sw.grpc_addr, "device_id": sw.device_id,
                     "ports": list(sw.ports), "service_ip": service.ip,
                     "service_mac": service.mac,
                     "workers": [_worker(m) for m in sorted(pending.members.values(),
                                                            key=lambda m: m.rank)
                                 if m.switch == name]}
            if name != spanned[0]:
                entry.update(parent=links.parents[name], uplink_port=links.uplink_ports[name],
                             parent_port=links.parent_ports[name])
            switches[name] = entry
        return {"job": {"id": a.job_id, "udp_port": a.udp_port, "first_slot": a.first_slot,
                        "num_slots": a.num_slots,
                        "values_per_packet": self.config.values_per_packet},
                "tree": {"root": spanned[0]}, "switches": switches,
                "loss": {"ingress": 0.0, "egress": 0.0}}

    def _job_dict(self, pending: Pending, a: Allocation) -> dict:
        sw = self.config.switch
        workers = [_worker(m) for m in sorted(pending.members.values(), key=lambda m: m.rank)]
        return {"switch": {"grpc_addr": sw.grpc_addr, "device_id": sw.device_id,
                           "ports": list(sw.ports)},
                "job": {"id": a.job_id, "udp_port": a.udp_port, "service_ip": a.service.ip,
                        "service_mac": a.service.mac, "first_slot": a.first_slot,
                        "num_slots": a.num_slots, "values_per_packet": sw.values_per_packet,
                        "workers": workers,
                        **({} if pending.deadline_ms is None
                           else {"deadline_ms": pending.deadline_ms})},
                "loss": {"ingress": 0.0, "egress": 0.0}}

    # -- leases ----------------------------------------------------------------------
    def lease(self, request: Lease) -> str | None:
        """Renew or close; None if done, else why refused."""
        with self.cond:
            running = next((r for r in self.running.values() if wire_key(r.name) == request.job
                            and request.rank in r.tokens
                            and _same(r.tokens[request.rank], request.token_hash)), None)
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

    def sweep(self) -> None:
        """Reclaim the jobs with a rank whose lease ran out and give waiting jobs a
        try (under the lock); then the switch work, outside it."""
        with self.cond:
            self._live()
            now = time.monotonic()
            for running in list(self.running.values()):
                late = sorted(r for r, deadline in running.leases.items()
                              if r not in running.closed and deadline < now)
                if late:
                    self.tally.count(self.tally.expiries, tenant_of(running.name))
                    self._finish(running, f"rank{'s' * (len(late) > 1)} "
                                          f"{', '.join(map(str, late))} stopped renewing")
            self._schedule()
            removing = list(self.removing.values())
        for running in removing:
            self._remove(running)
        with self.cond:
            self._schedule()
            installing = list(self.installing.values())
        for running in installing:
            self._install(running)
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

    def _install(self, running: Running) -> None:
        """Put an installing job on its switches; the row says running after. A switch
        that is away leaves it installing (tried again next sweep); one that refuses
        it refuses its ranks, and what it wrote is taken off again."""
        _fault("install")
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
        _fault("installed")
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

    def _finish(self, running: Running, why: str) -> None:
        """The job leaves: its row says removing before the sweeper takes it off the
        switches; what it holds stays held until they confirmed."""
        self.store.set_state(running.name, REMOVING)
        del self.running[running.name]
        self.removing[running.name] = running
        log.info("job %s (id %d) leaving %s: %s", running.name, running.job.id,
                 ", ".join(running.tree.switches), why)
        self.wake.set()

    def _remove(self, running: Running) -> None:
        """Take a removing job off its switches and reset its slots; its row and its
        resources go once they confirmed, else it is tried again next sweep."""
        _fault("remove")
        try:
            self.installer.remove(running.tree)
        except P4RuntimeError as exc:
            log.warning("job %s: removing it from the switch failed (%s): trying again",
                        running.name, exc)
            return
        _fault("removed")
        with self.cond:
            self.store.delete_job(running.name)
            del self.removing[running.name]
            if self._seen is not None:
                self._seen = [j for j in self._seen if j.id != running.job.id]
            log.info("job %s (id %d) removed and its %d slots reset on %s", running.name,
                     running.job.id, running.job.num_slots, ", ".join(running.tree.switches))
            self._schedule()

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


def _worker(member: Member) -> dict:
    """A rank as a job file's worker: a learned host's MAC gets no L2 route (frames to
    it keep flooding), since only its answer to a nonce vouches that it is its own."""
    return {"id": member.rank, "mac": member.mac, "ip": member.ip,
            "udp_port": member.udp_port, "switch_port": member.switch_port,
            **({"l2_route": False} if member.learned else {})}


def _whose(job: InstalledJob) -> str:
    return ("marked as this manager's, unknown to its database" if job.mark == MARK
            else "not the manager's")


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
