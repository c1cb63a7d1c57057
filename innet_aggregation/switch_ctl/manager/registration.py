"""The waiting room: a rank's registration checked against the fabric map and the
pool (``member``, before the port proof), entered into its job (``register``), and
watched until the job is installed, refused or the rank gives up (``status``,
``withdraw``).

A job is known by its key, its name and its owner (wire.job_key), within its
tenant's space (tenants.scoped): what one tenant sends never reaches another's job.
A rank's lease token is the one it drew itself; a second registration of a waiting
rank with another token is refused. A tenant's jobs, slots, service addresses and
waiting registrations are bounded by its quotas, and waiting registrations by
address and in all (sharing.admit); a registration whose job has not filled within
manager.join_seconds is refused.

A host the fabric map does not list (``learn_hosts``) may claim only a MAC that no
rank the manager holds has behind another port, and never a pool service address;
its job gets no L2 route to it (placement.worker): the switch's mac_table, which
every job shares, holds listed hosts at their listed ports only.

A room of ``Jobs`` (jobs.py): it reads and changes the jobs' state (jobstate.py)
under ``cond``, and asks the scheduler to try a job that became complete.
"""

from __future__ import annotations

import logging
import time

from . import sharing
from .records import Member, Pending, same_token
from .scheduling import Scheduling
from .tenants import tenant_of
from .wire import BadRequest, Register

log = logging.getLogger("innet_aggregation.manager")


class Registration(Scheduling):
    """Registration, the waiting room's side of ``Jobs``."""

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
                    and same_token(running.tokens[request.rank], request.token_hash)):
                # The same client again (its answer was lost): the same lease. Another
                # token waits below until the running job is gone, and gets nothing of it.
                return Pending(request.job, request.world, slots, outcome=("ready", running)), 0
            pending = self.pending.get(request.job)
            again = pending is not None and member.rank in pending.members and same_token(
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
            if first is not None and not same_token(pending.tokens[member.rank], request.token_hash):
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
                # A preempted job waits at the place it had (sharing.preempt).
                pending.complete_since = self._places.get(request.job, time.monotonic())
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
