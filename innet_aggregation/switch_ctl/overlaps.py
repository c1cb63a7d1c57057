"""Jobs sharing a switch must not share what keeps them apart.

The registers are indexed by absolute slot, so two jobs on one slot corrupt each
other's sums; a PRE group delivers one job's results; the ARP and port-security
entries belong to a service address; the jobs table binds each job to one UDP port
of the program's range. ``apply`` reads the jobs the switch holds, whoever installed
them, and refuses a job that collides with another before it writes anything.

A job is its id: applying a file with an id the switch holds updates that job
(workers, slots, group, loss). A file that gives the id another UDP port or service
address, where the workers connect, describes another job with the same id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .config import JobConfig


@dataclass(frozen=True)
class InstalledJob:
    """A job as the switch's tables show it; None where they do not say (a program
    without port security records no service address; a job whose apply or remove
    stopped half-way may have port-security entries and no jobs entry)."""
    id: int
    udp_port: int | None = None
    first_slot: int | None = None
    num_slots: int | None = None
    group: int | None = None
    service_ip: str | None = None
    service_mac: str | None = None
    mark: bytes = b""      # its jobs entry's metadata: the job manager marks its own


class JobOverlap(ValueError):
    """Every collision of one job with the jobs installed on a switch, one per line."""

    def __init__(self, job_id: int, where: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"job {job_id} collides with a job installed on {where}; nothing "
                         f"written:\n" + "\n".join(f"  - {p}" for p in problems))


def conflicts(job: JobConfig, installed: Iterable[InstalledJob]) -> list[str]:
    problems = []
    for other in sorted(installed, key=lambda j: j.id):
        problems += _same_id(job, other) if other.id == job.id else _between(job, other)
    return problems


def _slots(first: int, count: int) -> str:
    return f"{first}..{first + count - 1}"


def _between(job: JobConfig, other: InstalledJob) -> list[str]:
    problems = []
    if other.first_slot is not None and (
            job.first_slot < other.first_slot + other.num_slots
            and other.first_slot < job.first_slot + job.num_slots):
        problems.append(f"job {job.id}'s slots {_slots(job.first_slot, job.num_slots)} overlap "
                        f"job {other.id}'s slots {_slots(other.first_slot, other.num_slots)}")
    for what, mine, theirs in (("UDP port", job.udp_port, other.udp_port),
                               ("service IP", job.service_ip, other.service_ip),
                               ("service MAC", job.service_mac, other.service_mac),
                               ("multicast group", job.multicast_group, other.group)):
        if mine == theirs:
            problems.append(f"job {job.id}'s {what} {mine} is job {other.id}'s too")
    return problems


def _same_id(job: JobConfig, other: InstalledJob) -> list[str]:
    differs = [f"{what} {theirs} (this file: {mine})"
               for what, mine, theirs in (("UDP port", job.udp_port, other.udp_port),
                                          ("service IP", job.service_ip, other.service_ip),
                                          ("service MAC", job.service_mac, other.service_mac))
               if theirs is not None and mine != theirs]
    if not differs:
        return []
    return [f"job {job.id} is installed with {' and '.join(differs)}: this file's job "
            f"{job.id} is another job with the same id (remove the installed one first, or "
            f"give this one another id)"]
