"""The job manager's TOML, checked whole when it is read (every problem, one per line).

    [manager]
    listen = "0.0.0.0:7070"            # where ranks register (host:port)
    secret_file = "secret"             # or secret = "..." (16 characters or more): the
                                       #   tenant "default"; or [tenants.NAME] (tenants.py)
    cert = "tls/manager.pem"           # TLS on the listener, with its key: required off
    key = "tls/manager.key"            #   loopback unless insecure = true
    insecure = false                   # true: plaintext off loopback (a warning at start)
    database = "manager.db"            # SQLite: the jobs that are installed
    lease_seconds = 10                 # a rank that does not renew for this long loses its job
    sweep_seconds = 1                  # how often leases and the switch are checked
    default_slots = 64                 # a job's window unless its ranks ask (INA_SLOTS)
    prove_ports = true                 # a rank proves its host's port by a nonce the switch
                                       # sends it (PacketOut); false for a program without
                                       # PacketOut (TNA): the fabric map is then trusted
    learn_hosts = false                # true: a host fabric.hosts does not list is learned
                                       # (needs prove_ports): its nonce leaves by every
                                       # host port, and the job gets no L2 route to it
    max_connections = 512              # open at once, all addresses together
    max_connections_per_peer = 32      # from one address, still sending their request
    request_seconds = 10               # for the TLS handshake and the request line together
    join_seconds = 120                 # a registration waits this long for its job to fill
    max_pending = 512                  # registrations waiting, all addresses together
    max_pending_per_peer = 16          # registrations waiting from one address
    metrics = "127.0.0.1:9470"         # Prometheus metrics (metrics.py); default none.
                                       #   Off loopback only with cert and key (TLS)

    [switch]                           # as a job file's [switch], ports from the fabric
    grpc_addr = "127.0.0.1:9559"
    device_id = 0
    election_id = 100                  # above the CLI's 1: the manager stays primary
    values_per_packet = 256            # the build pushed where the switch has no program

    [pool]                             # first..last, inclusive
    job_ids = [1, 32]
    slots = [0, 1023]
    udp_ports = [48864, 48879]         # default: all the program's aggregation ports
    [[pool.services]]                  # one per job at a time: the switch's address for it
    ip = "10.0.0.254"
    mac = "02:00:00:00:00:fe"

    [[fabric.hosts]]                   # the switch port behind each data-plane MAC
    mac = "02:00:00:00:00:01"
    switch_port = 1

Or a tree of switches instead of [switch], in the shape of a tree job file
(switch_ctl/tree.py), each switch's fabric hosts naming it:

    [tree]
    root = "spine"
    values_per_packet = 256            # every switch's program

    [switches.spine]
    grpc_addr = "127.0.0.1:9559"       # device_id, election_id, TLS keys as in [switch]
    ports = [1, 2]

    [switches.leaf0]
    grpc_addr = "127.0.0.1:9560"
    ports = [1, 2, 3]
    parent = "spine"
    uplink_port = 3                    # leaf0's port to the spine
    parent_port = 1                    # the spine's port to leaf0

    [[fabric.hosts]]
    mac = "02:00:00:00:00:01"
    switch = "leaf0"
    switch_port = 1

A tree job takes one service address of the pool per switch it spans.

Paths are relative to the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from innet_aggregation.addresses import is_loopback
from innet_aggregation.metrics import listen_address
from innet_aggregation.p4src import protocol

from ..config import TLS_KEYS, ConfigError, TLSConfig, _check_ip, _check_mac, tls_config
from ..tree import _parents_first, _structure
from .tenants import MIN_SECRET, Tenant, parse_tenants

STAR = "switch"     # the name of a star manager's one switch
DEFAULT_LEASE_SECONDS = 10    # long enough for a rank's renewals to cross a loaded host
MANAGER_KEYS = ("listen", "secret", "secret_file", "cert", "key", "insecure", "database",
                "lease_seconds", "sweep_seconds", "default_slots", "max_connections",
                "max_connections_per_peer", "request_seconds", "prove_ports", "learn_hosts",
                "join_seconds", "max_pending", "max_pending_per_peer", "metrics")


@dataclass(frozen=True)
class Service:
    ip: str
    mac: str


@dataclass(frozen=True)
class Pool:
    job_ids: range
    slots: range
    udp_ports: range
    services: tuple[Service, ...]


@dataclass(frozen=True)
class ManagerSwitch:
    grpc_addr: str
    device_id: int
    ports: tuple[int, ...]
    values_per_packet: int
    election_id: int = 100
    tls: TLSConfig | None = None


@dataclass(frozen=True)
class TreeLinks:
    """How a tree manager's switches hang together: the root, and each other
    switch's parent, its port to the parent and the parent's port to it."""
    root: str
    parents: dict[str, str]
    uplink_ports: dict[str, int]
    parent_ports: dict[str, int]


@dataclass(frozen=True)
class ManagerConfig:
    listen: tuple[str, int]
    tenants: dict[str, Tenant]      # by name; manager.secret's is tenants.DEFAULT
    cert: Path | None
    key: Path | None
    database: Path
    lease_seconds: float
    sweep_seconds: float
    default_slots: int
    switches: dict[str, ManagerSwitch]   # parents first; a star's one is named STAR
    pool: Pool
    fabric: dict[str, int]          # data-plane MAC -> switch port
    homes: dict[str, str]           # data-plane MAC -> the switch (name) it is behind
    tree: TreeLinks | None = None   # None: one switch
    prove_ports: bool = True
    learn_hosts: bool = False       # hosts fabric.hosts does not list: learned by the proof
    max_connections: int = 512
    max_connections_per_peer: int = 32
    request_seconds: float = 10.0
    insecure: bool = False          # plaintext allowed off loopback
    join_seconds: float = 120.0     # a registration's wait for its job's other ranks
    max_pending: int = 512          # registrations waiting, in all
    max_pending_per_peer: int = 16  # registrations waiting from one address
    metrics: str | None = None      # host:port of the Prometheus endpoint, if any

    @property
    def switch(self) -> ManagerSwitch:
        """A star manager's switch."""
        return self.switches[STAR]

    @property
    def values_per_packet(self) -> int:
        return next(iter(self.switches.values())).values_per_packet


def load(path: Path | str) -> ManagerConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    return parse(raw, path.resolve().parent)


def parse(raw: dict, base: Path | None = None) -> ManagerConfig:
    """``base``: where relative paths start (None: the current directory)."""
    base = base or Path.cwd()
    problems: list[str] = []
    is_tree = "switches" in raw or "tree" in raw
    names = ("manager", "switches", "tree", "pool", "fabric") if is_tree else (
        "manager", "switch", "pool", "fabric")
    sections = {}
    for name in names:
        section = raw.get(name, {})
        if not isinstance(section, dict):
            problems.append(f"[{name}] must be a table")
            section = {}
        sections[name] = section
    if is_tree and "switch" in raw:
        problems.append("give [switch] (one switch) or [tree] and [switches.NAME] (a tree), "
                        "not both")
    unknown = sorted(set(raw) - set(sections) - {"switch", "tenants"})
    if unknown:
        problems.append(f"unknown tables {', '.join(unknown)} (known: {', '.join(sections)})")
    mg, pl, fb = (sections[n] for n in ("manager", "pool", "fabric"))

    def get(section, key, kinds, where, default=None):
        value = section.get(key, default)
        if value is None:
            problems.append(f"{where}.{key} is missing")
            return None
        if isinstance(value, bool) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            problems.append(f"{where}.{key} must be {names}, not {value!r}")
            return None
        return value

    def path(value) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else base / p

    extra = sorted(set(mg) - set(MANAGER_KEYS))
    if extra:
        problems.append(f"manager has unknown keys {', '.join(extra)} (known: "
                        f"{', '.join(MANAGER_KEYS)})")
    listen = _address(get(mg, "listen", str, "manager"), "manager.listen", problems)
    cert, key = mg.get("cert"), mg.get("key")
    if (cert is None) != (key is None):
        problems.append("manager.cert and manager.key go together (a certificate and its key)")
    for name, value in (("cert", cert), ("key", key)):
        if value is not None and (not isinstance(value, str) or not value):
            problems.append(f"manager.{name} must be a file path, not {value!r}")
    cert = path(cert) if isinstance(cert, str) and cert else None
    key = path(key) if isinstance(key, str) and key else None
    for name, p in (("cert", cert), ("key", key)):
        if p is not None:
            try:
                if b"-----BEGIN " not in p.read_bytes():
                    problems.append(f"manager.{name} {p} is not a PEM file")
            except OSError as exc:
                problems.append(f"manager.{name} {p}: {exc.strerror}")
    database = get(mg, "database", str, "manager", "manager.db")
    lease = get(mg, "lease_seconds", (int, float), "manager", DEFAULT_LEASE_SECONDS)
    sweep = get(mg, "sweep_seconds", (int, float), "manager", 1)
    for name, value in (("lease_seconds", lease), ("sweep_seconds", sweep)):
        if value is not None and not 0 < value <= 3600:
            problems.append(f"manager.{name} must be in (0, 3600], not {value}")
    default_slots = get(mg, "default_slots", int, "manager", 64)
    prove_ports = mg.get("prove_ports", True)
    if not isinstance(prove_ports, bool):
        problems.append(f"manager.prove_ports must be true or false, not {prove_ports!r}")
    learn_hosts = mg.get("learn_hosts", False)
    if not isinstance(learn_hosts, bool):
        problems.append(f"manager.learn_hosts must be true or false, not {learn_hosts!r}")
    elif learn_hosts and prove_ports is False:
        problems.append("manager.learn_hosts = true needs prove_ports = true: a host is "
                        "learned from the port its nonce left by")
    insecure = mg.get("insecure", False)
    if not isinstance(insecure, bool):
        problems.append(f"manager.insecure must be true or false, not {insecure!r}")
    elif listen and cert is None and not insecure and not is_loopback(listen[0]):
        problems.append(f"manager.listen {listen[0]}:{listen[1]} is not a loopback address and "
                        f"the manager has no certificate: give manager.cert and manager.key "
                        f"(TLS), or set manager.insecure = true to take the secret in plaintext")
    def caps(total: str, per_peer: str, defaults: tuple[int, int]) -> tuple:
        """A cap in all (1..65536) and the share of it one address may take."""
        cap = get(mg, total, int, "manager", defaults[0])
        if cap is not None and not 1 <= cap <= 65536:
            problems.append(f"manager.{total} must be in 1..65536, not {cap}")
            cap = None
        share = get(mg, per_peer, int, "manager", defaults[1])
        if share is not None and cap is not None and not 1 <= share <= cap:
            problems.append(f"manager.{per_peer} must be in 1..{cap} ({total}), not {share}")
        return cap, share

    max_connections, per_peer = caps("max_connections", "max_connections_per_peer", (512, 32))
    request_seconds = get(mg, "request_seconds", (int, float), "manager", 10)
    if request_seconds is not None and not 0 < request_seconds <= 300:
        problems.append(f"manager.request_seconds must be in (0, 300], not {request_seconds}")
    metrics = mg.get("metrics")
    if metrics is not None and not isinstance(metrics, str):
        problems.append(f"manager.metrics must be str, not {metrics!r}")
    elif metrics is not None:
        try:
            listen_address(metrics, cert is not None, "manager.metrics")
        except ValueError as exc:
            problems.append(str(exc))
    join_seconds = get(mg, "join_seconds", (int, float), "manager", 120)
    if join_seconds is not None and not 0 < join_seconds <= 86400:
        problems.append(f"manager.join_seconds must be in (0, 86400], not {join_seconds}")
    max_pending, pending_per_peer = caps("max_pending", "max_pending_per_peer", (512, 16))

    fabric, homes = _fabric(fb, is_tree, problems)
    tree = None
    if is_tree:
        switches, tree = _tree(sections["switches"], sections["tree"], fabric, homes, base, get,
                               problems)
    else:
        switches = {STAR: _switch(sections["switch"], "switch", fabric, base, get, problems)}
    values = next(iter(switches.values())).values_per_packet if switches else 0

    pool_size = protocol.packet_format(values).pool_size if values else 0
    ports_all = protocol.AGG_UDP_PORTS
    job_ids = _range(pl, "job_ids", (0, 255), range(1, 256), problems)
    slots = _range(pl, "slots", (0, pool_size - 1), range(0, pool_size), problems)
    udp_ports = _range(pl, "udp_ports", (ports_all.start, ports_all.stop - 1), ports_all, problems)
    services = _services(pl.get("services"), fabric, problems)
    tenants = parse_tenants(mg, raw.get("tenants"),
                            lambda table, where: _secret(table, where, path, problems), problems)
    if is_tree and services and switches and len(services) < len(switches):
        problems.append(f"pool.services lists {len(services)} service addresses; a job across "
                        f"the tree takes one per switch, {len(switches)}")
    if default_slots is not None and slots is not None and not 1 <= default_slots <= len(slots):
        problems.append(f"manager.default_slots must be 1..{len(slots)} (the pool's slots), "
                        f"not {default_slots}")
    if problems:
        raise ConfigError(problems)
    for name, switch in switches.items():
        if switch.tls is not None:
            switch.tls.check("switch" if tree is None else f"switches.{name}")
    return ManagerConfig(listen=listen, tenants=tenants, cert=cert, key=key,
                         database=path(database), lease_seconds=float(lease),
                         sweep_seconds=float(sweep), default_slots=default_slots,
                         switches=switches, pool=Pool(job_ids, slots, udp_ports, services),
                         fabric=fabric, homes=homes, tree=tree, prove_ports=prove_ports,
                         learn_hosts=learn_hosts,
                         max_connections=max_connections, max_connections_per_peer=per_peer,
                         request_seconds=float(request_seconds), insecure=insecure,
                         join_seconds=float(join_seconds), max_pending=max_pending,
                         max_pending_per_peer=pending_per_peer, metrics=metrics)


def _switch(sw: dict, where: str, fabric: dict[str, int], base: Path, get,
            problems: list[str], values: int | None = None) -> ManagerSwitch:
    """One switch: a star's [switch] (ports default to the fabric's), or a tree's
    [switches.NAME] (``values`` from [tree])."""
    ports = sw.get("ports", sorted(set(fabric.values())))
    if not isinstance(ports, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 <= p < 511 for p in ports):
        problems.append(f"{where}.ports must be integers in 0..510, not {ports!r}")
        ports = []
    if values is None:
        missing = sorted({p for p in fabric.values()} - set(ports))
        if missing:
            problems.append(f"fabric.hosts name switch ports {missing} that switch.ports lacks")
        values = get(sw, "values_per_packet", int, "switch",
                     protocol.packet_format().values_per_packet)
        values = _values(values, "switch", problems)
    return ManagerSwitch(grpc_addr=get(sw, "grpc_addr", str, where) or "",
                         device_id=get(sw, "device_id", int, where, 0) or 0,
                         ports=tuple(ports), values_per_packet=values or 0,
                         election_id=get(sw, "election_id", int, where, 100) or 100,
                         tls=tls_config(sw, base, where, problems))


def _values(values, where: str, problems: list[str]) -> int | None:
    if values is not None:
        try:
            protocol.packet_format(values)
        except ValueError as exc:
            problems.append(f"{where}.values_per_packet: {exc}")
            return None
    return values


TREE_SWITCH_KEYS = {"grpc_addr", "device_id", "ports", "election_id", "parent", "uplink_port",
                    "parent_port", *TLS_KEYS}


def _tree(raw: dict, tr: dict, fabric: dict[str, int], homes: dict[str, str], base: Path, get,
          problems: list[str]) -> tuple[dict[str, ManagerSwitch], TreeLinks | None]:
    """A tree's switches (parents first) and how they link, checked as a tree job
    file's are (tree.py), with the fabric's hosts as the workers under each switch."""
    root = tr.get("root")
    if not raw or not all(isinstance(sw, dict) for sw in raw.values()):
        problems.append("[switches.NAME] must be tables, at least one")
        return {}, None
    if root not in raw:
        problems.append(f"tree.root must name one of the switches {sorted(raw)}, not {root!r}")
        return {}, None
    unknown = sorted(set(tr) - {"root", "values_per_packet"})
    if unknown:
        problems.append(f"tree has unknown keys {', '.join(unknown)} "
                        f"(known: root, values_per_packet)")
    values = _values(get(tr, "values_per_packet", int, "tree",
                         protocol.packet_format().values_per_packet), "tree", problems)
    for name, sw in raw.items():
        extra = sorted(set(sw) - TREE_SWITCH_KEYS)
        if extra:
            problems.append(f"switches.{name} has unknown keys {', '.join(extra)} (known: "
                            f"{', '.join(sorted(TREE_SWITCH_KEYS))})")
        if "ports" not in sw:
            problems.append(f"switches.{name}.ports is missing")
        for key in ("uplink_port", "parent_port"):
            if key in sw and (not isinstance(sw[key], int) or isinstance(sw[key], bool)):
                problems.append(f"switches.{name}.{key} must be int, not {sw[key]!r}")
    for mac, name in homes.items():
        if name not in raw:
            problems.append(f"fabric.hosts: {mac} is behind switch {name!r}, which "
                            f"[switches] lacks ({', '.join(sorted(raw))})")
        elif fabric[mac] not in raw[name].get("ports", []):
            problems.append(f"fabric.hosts: {mac} is behind port {fabric[mac]} of {name}, "
                            f"which switches.{name}.ports lacks")
    shape = {name: {**sw, "workers": [{"id": mac, "switch_port": fabric[mac]}
                                      for mac, home in homes.items() if home == name]}
             for name, sw in raw.items()}
    parents = _structure(shape, root, problems)
    addresses: dict[str, str] = {}
    for name, sw in raw.items():
        addr = sw.get("grpc_addr")
        if addr in addresses:
            problems.append(f"switches.{name} and switches.{addresses[addr]} are both at {addr}")
        addresses[addr] = name
    order = _parents_first(root, parents)
    if len(order) != len(raw):    # a cycle, or a switch under none: said above
        order += [name for name in raw if name not in order]
    switches = {name: _switch(raw[name], f"switches.{name}", fabric, base, get, problems,
                              values) for name in order}
    return switches, TreeLinks(root, parents,
                               {c: raw[c].get("uplink_port") for c in parents},
                               {c: raw[c].get("parent_port") for c in parents})


def _address(value, where: str, problems: list[str]) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        problems.append(f"{where} {value!r} must be host:port")
        return None
    return host.strip("[]"), int(port)


def _secret(table: dict, where: str, path, problems: list[str]) -> bytes:
    """``where``'s secret or secret_file (a tenant's)."""
    given = [k for k in ("secret", "secret_file") if k in table]
    if len(given) != 1:
        problems.append(f"give {where}.secret or {where}.secret_file (one of them): every "
                        f"request of the tenant must carry it")
        return b""
    value = table[given[0]]
    if not isinstance(value, str) or not value:
        problems.append(f"{where}.{given[0]} must be a string, not {value!r}")
        return b""
    if given[0] == "secret_file":
        try:
            secret = path(value).read_bytes().strip()
        except OSError as exc:
            problems.append(f"{where}.secret_file {path(value)}: {exc.strerror}")
            return b""
    else:
        secret = value.encode()
    if len(secret) < MIN_SECRET:
        problems.append(f"{where}'s secret has {len(secret)} characters; give at least "
                        f"{MIN_SECRET}")
    return secret


def _range(section: dict, key: str, bounds: tuple[int, int], default: range,
           problems: list[str]) -> range | None:
    value = section.get(key)
    if value is None:
        return default
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        problems.append(f"pool.{key} must be [first, last], not {value!r}")
        return None
    first, last = value
    if not bounds[0] <= first <= last <= bounds[1]:
        problems.append(f"pool.{key} [{first}, {last}] must lie within {bounds[0]}..{bounds[1]}, "
                        f"first <= last")
        return None
    return range(first, last + 1)


def _services(raw, fabric: dict[str, int], problems: list[str]) -> tuple[Service, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append("pool.services must list at least one service address (ip, mac)")
        return ()
    services, seen = [], set()
    for n, s in enumerate(raw):
        where = f"pool.services[{n}]"
        if not isinstance(s, dict):
            problems.append(f"{where} must be a table")
            continue
        ip = _check_ip(s.get("ip"), f"{where}.ip", problems)
        mac = _check_mac(s.get("mac"), f"{where}.mac", problems)
        for value in (ip, mac):
            if value and value in seen:
                problems.append(f"{where}: {value} is given twice")
            seen.add(value)
        if mac in fabric:
            problems.append(f"{where}.mac {mac} is a host's MAC in fabric.hosts")
        services.append(Service(ip, mac))
    return tuple(services)


def _fabric(fb: dict, is_tree: bool, problems: list[str]) -> tuple[dict[str, int],
                                                                 dict[str, str]]:
    """MAC -> switch port, and MAC -> the switch's name (a tree names it per host)."""
    hosts = fb.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        problems.append("fabric.hosts must list the hosts behind the switch (mac, switch_port"
                        + (", switch)" if is_tree else ")"))
        return {}, {}
    fabric: dict[str, int] = {}
    homes: dict[str, str] = {}
    for n, h in enumerate(hosts):
        where = f"fabric.hosts[{n}]"
        if not isinstance(h, dict):
            problems.append(f"{where} must be a table")
            continue
        mac = _check_mac(h.get("mac"), f"{where}.mac", problems)
        port = h.get("switch_port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 511:
            problems.append(f"{where}.switch_port must be 0..510, not {port!r}")
            continue
        switch = h.get("switch", STAR)
        if is_tree and not isinstance(h.get("switch"), str):
            problems.append(f"{where}.switch must name the switch it is behind, not "
                            f"{h.get('switch')!r}")
            continue
        if not is_tree and "switch" in h:
            problems.append(f"{where}.switch names a switch of a tree; this manager has one "
                            f"[switch]")
        if mac in fabric:
            problems.append(f"{where}.mac {mac} is listed twice")
        if mac:
            fabric[mac] = port
            homes[mac] = switch
    return fabric, homes
