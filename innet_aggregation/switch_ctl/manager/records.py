"""The manager's jobs in memory: a registered rank (Member), a job gathering its
ranks or waiting for room (Pending), and a job on, or on its way on or off, the
switches (Running). The database's rows (store.py) are what survives a restart."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from ..tree import Tree
from .config import STAR
from .pool import Holding
from .wire import job_name_of


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
    queued: float | None = None        # when it became complete (monotonic): its place
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



def same_token(a: str, b: str) -> bool:
    """Token hashes compared in constant time."""
    return hmac.compare_digest(a.encode(), b.encode())
