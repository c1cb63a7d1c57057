"""How the manager shares its switch among tenants: the caps on waiting
registrations and each tenant's quotas (checked when a rank registers), and
preemption of running jobs by a complete job of higher priority that does not fit.
Steps of the scheduler (scheduling.py) and the waiting room (registration.py), under
the jobs' cond, on the jobs' state (jobstate.py).
"""

from __future__ import annotations

from .jobstate import JobState
from .pool import Holding
from .records import Pending, Running
from .tenants import over_quota, tenant_of, wire_key
from .wire import BadRequest, Register, job_name_of

PREEMPTED_KEPT = 256         # preempted jobs whose renewals are told why, and whose place is kept


def admit(jobs: JobState, request: Register, slots: int, peer: str, new_job: bool) -> None:
    """Refuse a registration over the caps on waiting registrations (in all, from
    its address, its tenant's) or, for a new job, over its tenant's quotas; under
    cond."""
    waiting = [(name, p.peers[rank]) for name, p in jobs.pending.items()
               for rank in p.members]
    who = f"rank {request.rank} of job {request.name} of tenant {tenant_of(request.job)}"
    if len(waiting) >= jobs.config.max_pending:
        raise BadRequest(f"the manager holds {len(waiting)} waiting registrations "
                         f"(max_pending = {jobs.config.max_pending}): {who} refused")
    from_peer = sum(1 for _, p in waiting if p == peer)
    if peer and from_peer >= jobs.config.max_pending_per_peer:
        raise BadRequest(f"{peer} has {from_peer} registrations waiting "
                         f"(max_pending_per_peer = {jobs.config.max_pending_per_peer}): "
                         f"{who} refused")
    tenant = jobs.tenant(request.job)
    if tenant is None:
        return
    theirs = tenant_jobs(jobs, tenant.name)
    held = {"pending": sum(1 for name, _ in waiting if tenant_of(name) == tenant.name),
            "jobs": len(theirs), "slots": sum(n for n, _ in theirs.values()),
            "services": sum(s for _, s in theirs.values())}
    why = over_quota(tenant, held, {"pending": 1, "jobs": int(new_job),
                                    "slots": slots * new_job, "services": int(new_job)})
    if why is not None:
        raise BadRequest(f"{why}: rank {request.rank} of job {request.name} refused")


def tenant_jobs(jobs: JobState, tenant: str) -> dict[str, tuple[int, int]]:
    """The tenant's jobs that hold or ask for resources (not those leaving): name ->
    (slots, service addresses)."""
    held = {p.name: (p.slots, 1) for p in jobs.pending.values()}
    for group in (jobs.installing, jobs.running):
        held.update({r.name: (r.job.num_slots, len(r.tree.switches))
                     for r in group.values()})
    return {name: h for name, h in held.items() if tenant_of(name) == tenant}


def over_services(jobs: JobState, pending: Pending, services: int) -> str | None:
    """Why a complete tree job spanning ``services`` switches breaks its tenant's
    services quota (its first service address was counted when it registered)."""
    tenant = jobs.tenant(pending.name)
    if services < 2 or tenant is None:
        return None
    others = tenant_jobs(jobs, tenant.name)
    others.pop(pending.name, None)
    why = over_quota(tenant, {"services": sum(s for _, s in others.values())},
                     {"services": services})
    return None if why is None else f"{why}: job {pending.title} spans {services} switches"


def preempt(jobs: JobState, pending: Pending, macs: frozenset[str], held: list[Holding],
            services: int) -> None:
    """Take the running jobs of lower priority off the switch that the waiting job
    needs gone to fit (the lowest priority first, of those the newest), none more:
    their ranks' leases are revoked, so they go on on gloo and register again (the
    fallback), and wait their turn at the place they had (``_places``: when they first
    became complete), not behind the jobs that came after them. Under cond."""
    lower = sorted((r for r in jobs.running.values() if r.priority < pending.priority),
                   key=lambda r: (r.priority, -r.started))

    def fits(gone: list[Running]) -> bool:
        names = {r.name for r in gone}
        return not isinstance(jobs.allocator.allocate(
            pending.slots, macs, [h for h in held if h.name not in names], services,
            trial=True), str)

    victims: list[Running] = []
    for running in lower:
        victims.append(running)
        if fits(victims):
            break
    else:
        return
    for running in list(reversed(victims[:-1])):      # any not needed after all stays
        if fits([v for v in victims if v is not running]):
            victims.remove(running)
    for running in victims:
        why = (f"preempted by job {pending.title} of tenant {tenant_of(pending.name)} "
               f"(priority {pending.priority} over {running.priority})")
        jobs._preempted[wire_key(running.name)] = why
        if running.queued is not None:
            jobs._places[running.name] = running.queued
        for kept in (jobs._preempted, jobs._places):
            while len(kept) > PREEMPTED_KEPT:
                del kept[next(iter(kept))]
        jobs.tally.count(jobs.tally.preemptions, tenant_of(running.name))
        jobs._finish(running, why)
    pending.preempting = frozenset(r.name for r in victims)
    pending.message = (f"waiting for job{'s' * (len(victims) > 1)} "
                       f"{', '.join(job_name_of(r.name) for r in victims)} of lower priority "
                       f"to leave the switch (preempted)")
