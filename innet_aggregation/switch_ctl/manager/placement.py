"""Where a job goes, as the job file each rank is handed: a star's, or a tree's over
the switches it spans (those its ranks are behind and those between them, up to the
lowest one they share: the same id, slots and UDP port on each, and a service address
of each switch's own). Pure functions of the manager's configuration and an allocation.
"""

from __future__ import annotations

from .. import config as config_mod
from ..tree import Tree, parse_tree
from .config import STAR, ManagerConfig
from .pool import Allocation
from .records import Member, Pending


def as_tree(raw: dict, pool_size: int) -> Tree:
    """A job's dict as a Tree: a tree job file's form, or a star's (a tree of one)."""
    if "switches" in raw:
        return parse_tree(raw, pool_size)
    config = config_mod.parse(raw, pool_size)
    return Tree(STAR, {STAR: config}, {}, {w.id: STAR for w in config.job.workers})


def spanned(config: ManagerConfig, pending: Pending) -> list[str]:
    """The switches a job spans, parents first: those its ranks are behind and those
    between them, below the lowest switch they all share."""
    links = config.tree
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
    return [name for name in config.switches if name in used]


def job_file(config: ManagerConfig, pending: Pending, a: Allocation, over: list[str]) -> dict:
    """The job as its ranks are handed it: a star's job file, or a tree's over ``over``."""
    return (_star(config, pending, a) if config.tree is None
            else _tree(config, pending, a, over))


def _tree(config: ManagerConfig, pending: Pending, a: Allocation, over: list[str]) -> dict:
    """The job as a tree job file (switch_ctl/tree.py) over ``over``."""
    links = config.tree
    switches = {}
    for name, service in zip(over, a.services):
        sw = config.switches[name]
        entry = {"grpc_addr": sw.grpc_addr, "device_id": sw.device_id,
                 "ports": list(sw.ports), "service_ip": service.ip,
                 "service_mac": service.mac,
                 "workers": [worker(m) for m in sorted(pending.members.values(),
                                                       key=lambda m: m.rank)
                             if m.switch == name]}
        if name != over[0]:
            entry.update(parent=links.parents[name], uplink_port=links.uplink_ports[name],
                         parent_port=links.parent_ports[name])
        switches[name] = entry
    return {"job": {"id": a.job_id, "udp_port": a.udp_port, "first_slot": a.first_slot,
                    "num_slots": a.num_slots,
                    "values_per_packet": config.values_per_packet},
            "tree": {"root": over[0]}, "switches": switches,
            "loss": {"ingress": 0.0, "egress": 0.0}}


def _star(config: ManagerConfig, pending: Pending, a: Allocation) -> dict:
    sw = config.switch
    workers = [worker(m) for m in sorted(pending.members.values(), key=lambda m: m.rank)]
    return {"switch": {"grpc_addr": sw.grpc_addr, "device_id": sw.device_id,
                       "ports": list(sw.ports)},
            "job": {"id": a.job_id, "udp_port": a.udp_port, "service_ip": a.service.ip,
                    "service_mac": a.service.mac, "first_slot": a.first_slot,
                    "num_slots": a.num_slots, "values_per_packet": sw.values_per_packet,
                    "workers": workers,
                    **({} if pending.deadline_ms is None
                       else {"deadline_ms": pending.deadline_ms})},
            "loss": {"ingress": 0.0, "egress": 0.0}}


def worker(member: Member) -> dict:
    """A rank as a job file's worker: a learned host's MAC gets no L2 route (frames to
    it keep flooding), since only its answer to a nonce vouches that it is its own."""
    return {"id": member.rank, "mac": member.mac, "ip": member.ip,
            "udp_port": member.udp_port, "switch_port": member.switch_port,
            **({"l2_route": False} if member.learned else {})}
