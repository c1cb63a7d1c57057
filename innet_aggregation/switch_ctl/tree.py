"""A job over a tree of switches, from one description, checked whole before any write.

    [job]
    id = 1
    udp_port = 48864
    first_slot = 0
    num_slots = 64

    [tree]
    root = "spine"

    [switches.spine]                 # the root: its workers are its child switches
    grpc_addr = "127.0.0.1:9559"
    ca_cert = "tls/ca.pem"           # optional, per switch: TLS as in a one-switch [switch]
    ports = [1, 2]
    service_ip = "10.0.0.250"        # each switch's own address for the job
    service_mac = "02:00:00:00:00:fa"

    [switches.leaf1]
    grpc_addr = "127.0.0.1:9560"
    ports = [1, 2, 3]
    service_ip = "10.0.0.251"
    service_mac = "02:00:00:00:00:fb"
    parent = "spine"
    uplink_port = 3                  # this switch's port to its parent
    parent_port = 1                  # the parent's port to this switch
    [[switches.leaf1.workers]]       # as [[job.workers]] of a one-switch job
    id = 0
    mac = "02:00:00:00:00:01"
    ip = "10.0.0.1"
    udp_port = 40000
    switch_port = 1

    [loss]                           # every port of every switch ...
    ingress = 0.0
    [switches.leaf1.loss]            # ... unless a switch says otherwise
    egress = 0.01

Each switch gets the one-switch configuration of ``config.parse``, so every check of
a one-switch job holds per switch; a child switch is one worker of its parent (its
service address, the job's UDP port, ``parent_port``), numbered after the parent's
own workers. Workers talk to their own switch's service address and take the total
worker count for their quantization headroom.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from innet_aggregation.p4src import protocol

from .config import TLS_KEYS, Config, ConfigError, ParentLink, parse


@dataclass(frozen=True)
class Tree:
    root: str
    switches: dict[str, Config]    # parents before children
    parents: dict[str, str]        # child switch -> parent switch
    homes: dict[int, str]          # worker id -> the switch it is attached to

    @property
    def job_id(self) -> int:
        return self.switches[self.root].job.id

    @property
    def num_workers(self) -> int:
        return len(self.homes)

    def for_worker(self, worker_id: int) -> Config:
        """The configuration worker ``worker_id`` uses: its own switch's."""
        if worker_id not in self.homes:
            raise ValueError(f"worker {worker_id} is not in job {self.job_id} "
                             f"(workers {sorted(self.homes)})")
        return self.switches[self.homes[worker_id]]

    def children(self, name: str) -> list[str]:
        return [c for c, p in self.parents.items() if p == name]


def parse_tree(raw: dict, pool_size: int | None = None, base: Path | None = None) -> Tree:
    """``base``: the directory relative TLS paths start from."""
    problems: list[str] = []
    job = raw.get("job", {})
    switches = raw.get("switches", {})
    root = raw.get("tree", {}).get("root") if isinstance(raw.get("tree"), dict) else None
    if not isinstance(job, dict) or not isinstance(switches, dict) or not switches:
        raise ConfigError(["[job] and [switches.NAME] must be tables, with at least one switch"])
    if "workers" in job or "service_ip" in job or "switch" in raw:
        problems.append("a tree lists workers and service addresses per switch "
                        "([switches.NAME]), not in [job] or [switch]")
    bad = [name for name, sw in switches.items() if not isinstance(sw, dict)]
    if bad:
        raise ConfigError([f"switches.{name} must be a table" for name in bad])
    if root not in switches:
        problems.append(f"tree.root must name one of the switches {sorted(switches)}, "
                        f"not {root!r}")
        raise ConfigError(problems)

    parents = _structure(switches, root, problems)
    homes = _homes(switches, problems)
    _check_addresses(switches, problems)
    if problems:
        raise ConfigError(problems)

    order = _parents_first(root, parents)
    total = len(homes)
    configs: dict[str, Config] = {}
    for name in order:
        sw = switches[name]
        children = [c for c in order if parents.get(c) == name]
        own = list(sw.get("workers", []))
        free = sorted(set(range(protocol.MAX_WORKERS))
                      - {w.get("id") for w in own if isinstance(w, dict)})
        if len(children) > len(free):
            problems.append(f"switches.{name} has {len(own)} workers and {len(children)} child "
                            f"switches; the bitmap holds {protocol.MAX_WORKERS}")
            continue
        for child, local_id in zip(children, free):
            c = switches[child]
            own.append({"id": local_id, "mac": c.get("service_mac"), "ip": c.get("service_ip"),
                        "udp_port": job.get("udp_port"), "switch_port": c.get("parent_port")})
        single = {
            "switch": {k: sw[k] for k in ("grpc_addr", "device_id", "ports", *TLS_KEYS)
                       if k in sw},
            "job": dict(job, service_ip=sw.get("service_ip"), service_mac=sw.get("service_mac"),
                        workers=own),
            "loss": dict(raw.get("loss", {}), **sw.get("loss", {})),
        }
        try:
            config = parse(single, pool_size, base)
        except ConfigError as exc:
            problems += [f"switches.{name}: {p}" for p in exc.problems]
            continue
        parent = None
        if name in parents:
            p = switches[parents[name]]
            parent = ParentLink(port=sw.get("uplink_port"), mac=str(p.get("service_mac")).lower(),
                                ip=str(p.get("service_ip")))
        configs[name] = dataclasses.replace(
            config, job=dataclasses.replace(config.job, parent=parent, total_workers=total),
            l2_routes=_routes(name, switches, parents, homes))
    if problems:
        raise ConfigError(problems)
    return Tree(root=root, switches=configs, parents=parents, homes=homes)


def _structure(switches: dict, root: str, problems: list[str]) -> dict[str, str]:
    """Child -> parent, after checking that the parents form one tree under ``root``."""
    parents = {}
    for name, sw in switches.items():
        parent = sw.get("parent")
        if name == root:
            if parent is not None:
                problems.append(f"switches.{name} is the root and cannot have a parent "
                                f"({parent!r})")
            continue
        if parent is None:
            problems.append(f"switches.{name} is a leaf without a parent (only the root, "
                            f"{root}, has none)")
            continue
        if parent not in switches:
            problems.append(f"switches.{name}.parent {parent!r} is not a switch of the tree")
            continue
        if parent == name:
            problems.append(f"switches.{name} is its own parent")
            continue
        parents[name] = parent
        ports = sw.get("ports", [])
        up, down = sw.get("uplink_port"), sw.get("parent_port")
        if up not in ports:
            problems.append(f"switches.{name}.uplink_port {up!r} is not one of its ports {ports}")
        if down not in switches[parent].get("ports", []):
            problems.append(f"switches.{name}.parent_port {down!r} is not one of {parent}'s "
                            f"ports {switches[parent].get('ports', [])}")
    for name in parents:
        seen = [name]
        while seen[-1] in parents:
            step = parents[seen[-1]]
            if step in seen:
                loop = seen[seen.index(step):]
                start = loop.index(min(loop))   # one line per cycle, whoever found it
                loop = loop[start:] + loop[:start]
                problems.append(f"switches form a cycle: {' -> '.join(loop + loop[:1])}")
                break
            seen.append(step)
    problems[:] = list(dict.fromkeys(problems))
    # A port can carry one thing: a worker, a child switch, or the uplink.
    for name, sw in switches.items():
        used: dict[int, str] = {}
        claims = [(w.get("switch_port"), f"worker {w.get('id')}")
                  for w in sw.get("workers", []) if isinstance(w, dict)]
        claims += [(switches[c].get("parent_port"), f"child switch {c}")
                   for c, p in parents.items() if p == name]
        if name in parents:
            claims.append((sw.get("uplink_port"), "the uplink"))
        for port, what in claims:
            if port in used:
                problems.append(f"switches.{name}: port {port} is given to both {used[port]} "
                                f"and {what}")
            used[port] = what
    return parents


def _homes(switches: dict, problems: list[str]) -> dict[int, str]:
    """Worker id -> its switch; a worker (by id, MAC or IPv4) under two switches is refused."""
    homes: dict[int, str] = {}
    seen: dict[tuple, str] = {}
    for name, sw in switches.items():
        workers = sw.get("workers", [])
        if not isinstance(workers, list):
            problems.append(f"switches.{name}.workers must be a list of tables")
            continue
        for w in workers:
            if not isinstance(w, dict):
                continue
            for key in ("id", "mac", "ip"):
                value = str(w.get(key)).lower()
                if (key, value) in seen and seen[key, value] != name:
                    problems.append(f"worker {key} {w.get(key)} is under two switches: "
                                    f"{seen[key, value]} and {name}")
                seen[key, value] = name
            if isinstance(w.get("id"), int):
                homes.setdefault(w["id"], name)
    if not homes:
        problems.append("the tree has no workers")
    return homes


def _parents_first(root: str, parents: dict[str, str]) -> list[str]:
    order = [root]
    for name in order:
        order += [c for c, p in parents.items() if p == name]
    return order


def _routes(name: str, switches: dict, parents: dict[str, str],
            homes: dict[int, str]) -> tuple[tuple[str, int], ...]:
    """L2 routes at ``name`` to every worker attached elsewhere: down the child whose
    subtree holds it, or up the uplink."""
    def path_to_root(switch: str) -> list[str]:
        path = [switch]
        while path[-1] in parents:
            path.append(parents[path[-1]])
        return path

    routes = []
    for name_w, sw in switches.items():
        if name_w == name:
            continue
        path = path_to_root(name_w)
        if name in path:   # below us: through the child on the way
            child = path[path.index(name) - 1]
            port = switches[child].get("parent_port")
        else:
            port = switches[name].get("uplink_port")
        routes += [(str(w["mac"]).lower(), port) for w in sw.get("workers", [])
                   if isinstance(w, dict) and homes.get(w.get("id")) == name_w
                   and w.get("l2_route", True) is not False]
    return tuple(routes)


def _check_addresses(switches: dict, problems: list[str]) -> None:
    """Each switch's service address is its own: two switches answering ARP for one
    IPv4, or claiming one MAC, would steer frames to the wrong switch."""
    seen: dict[tuple, str] = {}
    for name, sw in switches.items():
        for key in (("ip", str(sw.get("service_ip"))), ("mac", str(sw.get("service_mac")).lower())):
            if key in seen:
                problems.append(f"switches.{name} has the same service {key[0]} {key[1]} as "
                                f"switches.{seen[key]}")
            seen[key] = name
