"""The manager's jobs: ranks gather into a job, a complete job gets resources and is
installed, its ranks renew their leases, and a job leaves when every rank closed it
or one rank's lease ran out.

A job is known by its key, its name and its owner (wire.job_key): what one tenant
sends never reaches another's job. A rank's lease token is the one it drew itself;
a second registration of a waiting rank with another token is refused.

A complete job that does not fit (slots, ids, ports, service addresses, or a host
interface another job uses) waits; the waiting jobs are tried in the order they
became complete, and one that fits goes ahead of an earlier one that does not.
Its ranks see why they wait until their own timeout ends the wait.

A tree manager's job spans the switches its ranks are behind and the switches
between them (up to the lowest one they share, its root): the same id, slots and UDP
port on each, and a service address of each switch's own.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from dataclasses import dataclass, field

from innet_aggregation.p4src import protocol

from .. import config as config_mod
from ..client import P4RuntimeError
from ..tree import Tree, parse_tree
from .config import STAR, ManagerConfig
from .installer import Switches, _broken
from .pool import Allocation, Allocator, Holding
from .store import Store, StoredJob
from .wire import BadRequest, Lease, Register, job_name_of

log = logging.getLogger("innet_aggregation.manager")


@dataclass(frozen=True)
class Member:
    """A registered rank: its data-plane interface, and the switch and port behind it."""
    rank: int
    ifname: str
    ip: str
    mac: str
    udp_port: int
    switch_port: int
    switch: str = STAR


@dataclass
class Pending:
    """A job gathering its ranks, or complete and waiting for room."""
    name: str
    world: int
    slots: int
    members: dict[int, Member] = field(default_factory=dict)
    tokens: dict[int, str] = field(default_factory=dict)        # rank -> its token's hash
    generation: dict[int, int] = field(default_factory=dict)   # rank -> its registration
    complete_since: float | None = None
    message: str = ""
    outcome: tuple[str, object] | None = None   # ("ready", Running) or ("refused", why)

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
        self._generations = 0

    # -- start ---------------------------------------------------------------------
    def restore(self) -> None:
        """The jobs the database holds, with fresh leases (the manager was away, not
        their ranks), and the switch made to hold them."""
        deadline = time.monotonic() + self.config.lease_seconds
        for stored in self.store.jobs():
            running = self._running(stored, deadline)
            self.running[stored.name] = running
            log.info("job %s (id %d) restored from the database: ranks %s", stored.name,
                     running.job.id, sorted(running.tokens))
        self.installer.repair([r.tree for r in self.running.values()])

    def _running(self, stored: StoredJob, deadline: float) -> Running:
        return Running(stored.name, self._tree(stored.config), stored.config, stored.tokens,
                       {rank: deadline for rank in stored.tokens}, set(stored.closed),
                       stored.started)

    # -- registration ----------------------------------------------------------------
    def member(self, request: Register) -> Member:
        """The rank's interface the fabric knows, and the switch port behind it."""
        known = [(i, self.config.fabric[i.mac]) for i in request.interfaces
                 if i.mac in self.config.fabric]
        listed = ", ".join(f"{i.ifname} {i.mac}" for i in request.interfaces)
        if not known:
            raise BadRequest(f"none of rank {request.rank}'s interfaces ({listed}) is in the "
                             f"manager's fabric (fabric.hosts): is INA_IFNAME the data-plane "
                             f"interface, and is this host behind the switch?")
        if len(known) > 1:
            raise BadRequest(f"rank {request.rank} has several interfaces in the fabric "
                             f"({', '.join(i.ifname for i, _ in known)}): name one with INA_IFNAME")
        interface, port = known[0]
        services = {s.ip for s in self.config.pool.services}
        if interface.ip in services:
            raise BadRequest(f"rank {request.rank}'s address {interface.ip} is a service "
                             f"address of the manager's pool")
        return Member(request.rank, interface.ifname, interface.ip, interface.mac,
                      request.udp_port, port, self.config.homes[interface.mac])

    def register(self, request: Register, member: Member) -> tuple[Pending, int]:
        """Enter the rank; returns its job and its registration's generation."""
        slots = request.slots or self.config.default_slots
        if slots > len(self.config.pool.slots):
            raise BadRequest(f"job {request.name} asks for {slots} slots; the manager's pool "
                             f"has {len(self.config.pool.slots)}")
        with self.cond:
            running = self.running.get(request.job)
            if (running is not None and request.rank in running.tokens
                    and _same(running.tokens[request.rank], request.token_hash)):
                # The same client again (its answer was lost): the same lease. Another
                # token waits below until the running job is gone, and gets nothing of it.
                return Pending(request.job, request.world, slots, outcome=("ready", running)), 0
            pending = self.pending.get(request.job)
            if pending is None:
                pending = self.pending[request.job] = Pending(request.job, request.world, slots)
            if pending.world != request.world:
                raise BadRequest(f"rank {request.rank} of job {request.name} says world size "
                                 f"{request.world}; its other ranks said {pending.world}")
            if pending.slots != slots:
                raise BadRequest(f"rank {request.rank} of job {request.name} asks for {slots} "
                                 f"slots; its other ranks asked for {pending.slots}")
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
            if len(pending.members) == pending.world and pending.complete_since is None:
                pending.complete_since = time.monotonic()
            log.info("job %s: rank %d of %d registered from %s (%s, %s port %d)",
                     request.job, member.rank, request.world, member.ip, member.mac,
                     member.switch, member.switch_port)
            self._schedule()
            return pending, self._generations

    def withdraw(self, pending: Pending, rank: int, generation: int) -> None:
        """A waiting rank went away (its timeout, or it died): the job waits for it again."""
        with self.cond:
            if pending.outcome is None and pending.generation.get(rank) == generation:
                del pending.members[rank]
                del pending.tokens[rank]
                del pending.generation[rank]
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
            return "waiting", (f"waiting for ranks: {len(pending.members)} of {pending.world} "
                               f"of job {pending.title} registered")
        return "waiting", pending.message or "waiting for the switch"

    def _schedule(self) -> None:
        """Install every complete job that fits, in the order they became complete."""
        ready = sorted((p for p in self.pending.values()
                        if p.complete_since is not None and p.outcome is None),
                       key=lambda p: p.complete_since)
        if not ready:
            return
        try:
            held = self._held()
        except P4RuntimeError as exc:
            for pending in ready:
                pending.message = f"waiting for the switch: {exc}"
            return
        for pending in ready:
            if pending.name in self.running:
                pending.message = (f"waiting for job {pending.title}'s earlier ranks to close "
                                   f"or lose their lease")
                continue
            macs = frozenset(m.mac for m in pending.members.values())
            spanned = self._spanned(pending)
            allocation = self.allocator.allocate(pending.slots, macs, held, len(spanned))
            if isinstance(allocation, str):
                pending.message = allocation
                continue
            running = self._start(pending, allocation, spanned)
            if running is not None:
                held.append(running.holding())
        self.cond.notify_all()

    def _held(self) -> list[Holding]:
        """Ours, and whatever else the switch holds (a job someone applied by hand)."""
        ours = [r.holding() for r in self.running.values()]
        ids = {h.job_id for h in ours}
        return ours + [Holding(f"#{j.id} (not the manager's)", j.id, j.first_slot, j.num_slots,
                               j.udp_port, j.service_ip, j.service_mac)
                       for j in self.installer.installed() if j.id not in ids]

    def _start(self, pending: Pending, allocation: Allocation,
               spanned: list[str]) -> Running | None:
        raw = (self._job_dict(pending, allocation) if self.config.tree is None
               else self._tree_dict(pending, allocation, spanned))
        try:
            tree = self._tree(raw)
            self.installer.install(tree)
        except (P4RuntimeError, config_mod.ConfigError, ValueError) as exc:
            if isinstance(exc, P4RuntimeError) and _broken(exc):
                pending.message = f"waiting for the switch: {exc}"
                return None
            log.error("job %s cannot be installed: %s", pending.name, exc)
            pending.outcome = ("refused", f"the switch refused job {pending.title}: {exc}")
            del self.pending[pending.name]
            return None
        tokens = dict(pending.tokens)
        self.store.add_job(pending.name, raw, tokens)
        deadline = time.monotonic() + self.config.lease_seconds
        running = Running(pending.name, tree, raw, tokens, dict.fromkeys(tokens, deadline))
        self.running[pending.name] = running
        pending.outcome = ("ready", running)
        del self.pending[pending.name]
        log.info("job %s installed: id %d, slots %d..%d, UDP port %d, %s, %d ranks",
                 pending.name, allocation.job_id, allocation.first_slot,
                 allocation.first_slot + allocation.num_slots - 1, allocation.udp_port,
                 ", ".join(f"{name} service {c.job.service_ip} {c.job.service_mac}"
                           for name, c in tree.switches.items()), pending.world)
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
                     "workers": [{"id": m.rank, "mac": m.mac, "ip": m.ip,
                                  "udp_port": m.udp_port, "switch_port": m.switch_port}
                                 for m in sorted(pending.members.values(), key=lambda m: m.rank)
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
        workers = [{"id": m.rank, "mac": m.mac, "ip": m.ip, "udp_port": m.udp_port,
                    "switch_port": m.switch_port}
                   for m in sorted(pending.members.values(), key=lambda m: m.rank)]
        return {"switch": {"grpc_addr": sw.grpc_addr, "device_id": sw.device_id,
                           "ports": list(sw.ports)},
                "job": {"id": a.job_id, "udp_port": a.udp_port, "service_ip": a.service.ip,
                        "service_mac": a.service.mac, "first_slot": a.first_slot,
                        "num_slots": a.num_slots, "values_per_packet": sw.values_per_packet,
                        "workers": workers},
                "loss": {"ingress": 0.0, "egress": 0.0}}

    # -- leases ----------------------------------------------------------------------
    def lease(self, request: Lease) -> str | None:
        """Renew or close; None if done, else why refused."""
        with self.cond:
            running = self.running.get(request.job)
            token = running.tokens.get(request.rank) if running else None
            if token is None or not _same(token, request.token_hash):
                return (f"job {job_name_of(request.job)} has no rank {request.rank} with this "
                        f"lease on this manager: it was closed, or reclaimed after a lease of "
                        f"{self.config.lease_seconds:g} s ran out")
            if request.op == "renew":
                running.leases[request.rank] = time.monotonic() + self.config.lease_seconds
                return None
            if request.rank not in running.closed:
                running.closed.add(request.rank)
                self.store.close_rank(request.job, request.rank)
                log.info("job %s: rank %d closed (%d of %d)", request.job, request.rank,
                         len(running.closed), len(running.tokens))
            if running.closed == set(running.tokens):
                self._finish(running, "every rank closed it")
                self._schedule()
            return None

    def sweep(self) -> None:
        """Reclaim the jobs with a rank whose lease ran out; give waiting jobs a try;
        put back on the switch what it lost."""
        with self.cond:
            now = time.monotonic()
            for running in list(self.running.values()):
                late = sorted(r for r, deadline in running.leases.items()
                              if r not in running.closed and deadline < now)
                if late:
                    self._finish(running, f"rank{'s' * (len(late) > 1)} "
                                          f"{', '.join(map(str, late))} stopped renewing")
            self._schedule()
            trees = [r.tree for r in self.running.values()]
        try:
            self.installer.repair(trees)
        except P4RuntimeError as exc:
            log.warning("repairing the switches: %s", exc)

    def _finish(self, running: Running, why: str) -> None:
        """Remove the job from the switch, reset its slots, forget it."""
        try:
            self.installer.remove(running.tree)
        except P4RuntimeError as exc:
            # Gone with the switch (a restart), or the switch is away: the database no
            # longer holds the job, so a repair will not put it back.
            log.warning("job %s: removing it from the switch failed: %s", running.name, exc)
        self.store.delete_job(running.name)
        del self.running[running.name]
        log.info("job %s (id %d) removed and its %d slots reset on %s: %s", running.name,
                 running.job.id, running.job.num_slots, ", ".join(running.tree.switches), why)

    def listing(self) -> dict:
        with self.cond:
            running = [{"name": job_name_of(r.name), "owner": owner(r.name), "id": r.job.id,
                        "slots": [r.job.first_slot, r.job.first_slot + r.job.num_slots - 1],
                        "udp_port": r.job.udp_port, "service_ip": r.job.service_ip,
                        "switches": list(r.tree.switches), "ranks": len(r.tokens),
                        "closed": sorted(r.closed)} for r in self.running.values()]
            waiting = [{"name": job_name_of(p.name), "owner": owner(p.name),
                        "registered": sorted(p.members), "world": p.world,
                        "slots": p.slots, "message": p.message} for p in self.pending.values()]
        return {"running": running, "waiting": waiting}


def owner(key: str) -> str:
    return key.partition("/")[2]


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
