"""Hands out what keeps jobs apart on one switch: a job id, a contiguous slot range,
a UDP aggregation port and a service address (one per switch, for a job across a
tree of switches), none shared with a job that holds
them (ours, or one someone else installed on the switch).

Ids, ports and addresses are taken in turn after the last one handed out, so the
one a finished job freed is the last to be used again: a straggler of the old job
finds no job that takes its packets.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Pool, Service


@dataclass(frozen=True)
class Holding:
    """What one job holds (None where an installed job's tables do not say)."""
    name: str
    job_id: int
    first_slot: int | None
    num_slots: int | None
    udp_port: int | None
    service_ip: str | None = None
    service_mac: str | None = None
    macs: frozenset[str] = frozenset()
    more_services: frozenset[str] = frozenset()   # a tree job's other IPs and MACs


@dataclass(frozen=True)
class Allocation:
    job_id: int
    first_slot: int
    num_slots: int
    udp_port: int
    service: Service
    more_services: tuple[Service, ...] = ()     # a tree job's, one per further switch

    @property
    def services(self) -> tuple[Service, ...]:
        return (self.service, *self.more_services)


class Allocator:
    def __init__(self, pool: Pool):
        self.pool = pool
        self._last = {"id": None, "port": None, "service": None}

    def allocate(self, num_slots: int, macs: frozenset[str], held: list[Holding],
                 services: int = 1, trial: bool = False) -> Allocation | str:
        """An allocation with ``services`` service addresses, or why none fits now, in
        words for the waiting ranks; a ``trial`` leaves the turn where it was."""
        busy = sorted((h for h in held if h.macs & macs), key=lambda h: h.name)
        if busy:
            return (f"waiting for hosts: job {busy[0].name} runs on "
                    f"{', '.join(sorted(busy[0].macs & macs))} (one job per host interface)")
        first = self._slots(num_slots, held)
        if first is None:
            used = sum(h.num_slots or 0 for h in held)
            return (f"waiting for slots: {len(held)} job{'s' * (len(held) != 1)} hold "
                    f"{used} of the pool's {len(self.pool.slots)} slots; this job needs "
                    f"{num_slots} in one range")
        job_id = self._next("id", self.pool.job_ids, {h.job_id for h in held})
        if job_id is None:
            return f"waiting for a job id: {len(held)} jobs hold all {len(self.pool.job_ids)}"
        port = self._next("port", self.pool.udp_ports, {h.udp_port for h in held})
        if port is None:
            return (f"waiting for a UDP port: {len(held)} jobs hold all "
                    f"{len(self.pool.udp_ports)} of the pool's")
        taken = set().union(*({h.service_ip, h.service_mac} | h.more_services for h in held))
        free = [n for n, s in enumerate(self.pool.services)
                if s.ip not in taken and s.mac not in taken]
        if len(free) < services:
            return (f"waiting for service addresses: this job needs {services}, "
                    f"{len(held)} jobs hold {len(self.pool.services) - len(free)} of the "
                    f"pool's {len(self.pool.services)}"
                    if services > 1 else
                    f"waiting for a service address: {len(held)} jobs hold all "
                    f"{len(self.pool.services)} of the pool's")
        first_index = self._next("service", range(len(self.pool.services)), None, free)
        indices = (free[free.index(first_index):] + free[:free.index(first_index)])[:services]
        for key, value in (("id", job_id), ("port", port), ("service", indices[-1])):
            if not trial:
                self._last[key] = value
        chosen = [self.pool.services[i] for i in indices]
        return Allocation(job_id, first, num_slots, port, chosen[0], tuple(chosen[1:]))

    def _slots(self, count: int, held: list[Holding]) -> int | None:
        """The lowest start of ``count`` free slots in a row, or None."""
        taken = sorted((h.first_slot, h.first_slot + h.num_slots) for h in held
                       if h.first_slot is not None and h.num_slots is not None)
        start = self.pool.slots.start
        for begin, end in taken:
            if begin - start >= count and start + count <= self.pool.slots.stop:
                return start
            start = max(start, end)
        return start if start + count <= self.pool.slots.stop else None

    def _next(self, key: str, values: range, taken: set | None,
              free: list[int] | None = None) -> int | None:
        """The first free value after the last one handed out, wrapping around."""
        free = [v for v in values if v not in taken] if free is None else free
        if not free:
            return None
        last = self._last[key]
        later = [v for v in free if last is not None and v > last]
        return (later or free)[0]
