"""A job's configuration file (TOML), checked completely before anything is written.

    [switch]
    grpc_addr = "127.0.0.1:9559"
    device_id = 0
    ports = [1, 2, 3, 4]
    ca_cert = "tls/ca.pem"           # optional: TLS, trusting the switch's certificate
    client_cert = "tls/controller.pem"  # from this CA; with client_key: mutual TLS
    client_key = "tls/controller.key"   # (paths relative to this file)

    [job]
    id = 1
    udp_port = 48864                 # 0xBEE0; one of the program's aggregation ports
    service_ip = "10.0.0.254"        # the switch's address for this job (answered by ARP)
    service_mac = "02:00:00:00:00:fe"
    first_slot = 0
    num_slots = 256

    [[job.workers]]
    id = 0
    mac = "02:00:00:00:00:01"
    ip = "10.0.0.1"
    udp_port = 40000
    switch_port = 1
    l2_route = true                  # false: no L2 route to this MAC (frames to it flood)

    [loss]                           # simulated drop probability, 0..1, on every port
    ingress = 0.0
    egress = 0.0
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from innet_aggregation.p4src import protocol

_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


class ConfigError(ValueError):
    """Every problem found in a configuration, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class WorkerConfig:
    id: int
    mac: str
    ip: str
    udp_port: int
    switch_port: int
    # False: the switch gets no L2 route to this MAC, and frames to it keep flooding (a
    # host the job manager learned: only its answer to a nonce vouches for its MAC).
    l2_route: bool = True


# A deadline longer than this is a wait a worker's own timers end first
# (transport.RetransmitPolicy.peer_timeout's default is minutes; a step is seconds).
MAX_DEADLINE_MS = 60_000


@dataclass(frozen=True)
class ParentLink:
    """A leaf's way to its parent switch: out of ``port``, to the parent's service address."""
    port: int
    mac: str
    ip: str


@dataclass(frozen=True)
class JobConfig:
    id: int
    udp_port: int
    service_ip: str
    service_mac: str
    first_slot: int
    num_slots: int
    workers: tuple[WorkerConfig, ...]      # this switch's contributors (child switches too)
    multicast_group: int
    parent: ParentLink | None = None       # set on a leaf of a tree
    total_workers: int = 0                 # in a tree: workers under every leaf
    # The switch's program's packet size, if the file says it: `apply` refuses a
    # switch whose program has another, a worker starts with the build of this size.
    values_per_packet: int | None = None
    # Bounded-time aggregation: how long a worker waits for a round after its own
    # contribution before it asks the switch to release what it holds (None: never;
    # p4src/shared/deadline.p4).
    deadline_ms: float | None = None

    @property
    def num_workers(self) -> int:
        """The workers each result sums (the whole tree's)."""
        return self.total_workers or len(self.workers)


@dataclass(frozen=True)
class LossConfig:
    ingress: float = 0.0
    egress: float = 0.0


TLS_KEYS = ("ca_cert", "client_cert", "client_key")


@dataclass(frozen=True)
class TLSConfig:
    """How the controller reaches a switch over TLS (PEM files): the CA the switch's
    certificate must be signed by and, for mutual TLS, the controller's own
    certificate and key."""
    ca_cert: Path
    client_cert: Path | None = None
    client_key: Path | None = None

    def check(self, where: str = "switch") -> None:
        """Each file exists and holds PEM; a ConfigError naming each that does not.
        Done where the controller starts, not when a worker reads the same file."""
        problems = []
        for key in TLS_KEYS:
            path = getattr(self, key)
            if path is None:
                continue
            try:
                if b"-----BEGIN " not in path.read_bytes():
                    problems.append(f"{where}.{key} {path} is not a PEM file")
            except OSError as exc:
                problems.append(f"{where}.{key} {path}: {exc.strerror}")
        if problems:
            raise ConfigError(problems)


def tls_config(settings: dict, base: Path | None, where: str,
               problems: list[str]) -> TLSConfig | None:
    """``ca_cert``, ``client_cert``, ``client_key`` of ``settings`` (paths relative to
    ``base``), or None for plaintext; what is wrong goes to ``problems``."""
    paths = {}
    for key in TLS_KEYS:
        value = settings.get(key)
        if value is None:
            continue
        if not isinstance(value, (str, Path)) or not str(value):
            problems.append(f"{where}.{key} must be a file path, not {value!r}")
            continue
        path = Path(value).expanduser()
        paths[key] = path if path.is_absolute() or base is None else base / path
    if not paths:
        return None
    if ("client_cert" in paths) != ("client_key" in paths):
        given, missing = (("client_cert", "client_key") if "client_cert" in paths
                          else ("client_key", "client_cert"))
        problems.append(f"{where}.{given} needs {where}.{missing} (a certificate and its key)")
        return None
    if "ca_cert" not in paths:
        problems.append(f"{where}.client_cert needs {where}.ca_cert (the CA the switch's "
                        f"certificate is checked against)")
        return None
    return TLSConfig(**paths)


@dataclass(frozen=True)
class SwitchConfig:
    grpc_addr: str
    device_id: int
    ports: tuple[int, ...]
    tls: TLSConfig | None = None          # None: plaintext


@dataclass(frozen=True)
class Config:
    switch: SwitchConfig
    job: JobConfig
    loss: LossConfig = field(default_factory=LossConfig)
    # L2 routes to hosts that are not this switch's workers (in a tree): (MAC, port)
    l2_routes: tuple[tuple[str, int], ...] = ()


def parse(raw: dict, pool_size: int | None = None, base: Path | None = None) -> Config:
    """Build and validate a Config; ``pool_size`` defaults to the compiled program's;
    relative TLS paths start at ``base``."""
    problems: list[str] = []

    def get(section: dict, key: str, kind, where: str, default=None):
        if key not in section:
            if default is None:
                problems.append(f"{where}.{key} is missing")
            return default
        value = section[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            problems.append(f"{where}.{key} must be {kind.__name__}, not {value!r}")
            return default
        return value

    sw = raw.get("switch", {})
    jb = raw.get("job", {})
    ls = raw.get("loss", {})
    for name, section in (("switch", sw), ("job", jb), ("loss", ls)):
        if not isinstance(section, dict):
            problems.append(f"[{name}] must be a table")
    if problems:
        raise ConfigError(problems)

    ports = get(sw, "ports", list, "switch") or []
    if not all(isinstance(p, int) and 0 <= p < 511 for p in ports):
        problems.append(f"switch.ports must be integers in 0..510, not {ports}")
        ports = []
    if len(set(ports)) != len(ports):
        problems.append("switch.ports has duplicates")
    switch = SwitchConfig(grpc_addr=get(sw, "grpc_addr", str, "switch") or "",
                          device_id=get(sw, "device_id", int, "switch", 0),
                          ports=tuple(ports), tls=tls_config(sw, base, "switch", problems))

    job_id = get(jb, "id", int, "job", -1)
    if not 0 <= job_id <= 255:
        problems.append(f"job.id must be 0..255 (8 bits on the wire), not {job_id}")
    udp_port = get(jb, "udp_port", int, "job", 0)
    if udp_port not in protocol.AGG_UDP_PORTS:
        problems.append(f"job.udp_port {udp_port} is not an aggregation port of the program "
                        f"({protocol.AGG_UDP_PORTS.start}..{protocol.AGG_UDP_PORTS.stop - 1})")
    service_ip = _check_ip(get(jb, "service_ip", str, "job") or "", "job.service_ip", problems)
    service_mac = _check_mac(get(jb, "service_mac", str, "job") or "", "job.service_mac", problems)
    group = get(jb, "multicast_group", int, "job", max(job_id, 0) + 1)
    if not 1 <= group < protocol.FLOOD_MCAST_GROUP:
        problems.append(f"job.multicast_group must be 1..{protocol.FLOOD_MCAST_GROUP - 1} "
                        f"({protocol.FLOOD_MCAST_GROUP} floods), not {group}")

    if pool_size is None:
        pool_size = protocol.packet_format().pool_size
    first_slot = get(jb, "first_slot", int, "job", 0)
    num_slots = get(jb, "num_slots", int, "job", -1)
    if first_slot < 0 or num_slots < 1 or first_slot + num_slots > pool_size:
        problems.append(f"job slot range [{first_slot}, {first_slot + num_slots}) is not "
                        f"within the compiled pool of {pool_size} slots")

    values = jb.get("values_per_packet")
    if values is not None and (not isinstance(values, int) or isinstance(values, bool)
                               or values < 1):
        problems.append(f"job.values_per_packet must be a positive integer, not {values!r}")
        values = None
    deadline = jb.get("deadline_ms")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not 0 < deadline <= MAX_DEADLINE_MS):
        problems.append(f"job.deadline_ms must be a number of milliseconds in (0, "
                        f"{MAX_DEADLINE_MS}], not {deadline!r}")
        deadline = None
    workers = _workers(jb.get("workers", []), set(ports), problems, service_ip, service_mac)
    loss = LossConfig(ingress=get(ls, "ingress", float, "loss", 0.0),
                      egress=get(ls, "egress", float, "loss", 0.0))
    for name, p in (("ingress", loss.ingress), ("egress", loss.egress)):
        if not 0.0 <= p <= 1.0:
            problems.append(f"loss.{name} must be a probability in 0..1, not {p}")
    if problems:
        raise ConfigError(problems)
    job = JobConfig(id=job_id, udp_port=udp_port, service_ip=service_ip, service_mac=service_mac,
                    first_slot=first_slot, num_slots=num_slots, workers=workers,
                    multicast_group=group, values_per_packet=values,
                    deadline_ms=None if deadline is None else float(deadline))
    return Config(switch=switch, job=job, loss=loss)


def _workers(raw: list, ports: set[int], problems: list[str], service_ip: str,
             service_mac: str) -> tuple[WorkerConfig, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append("job.workers must list at least one worker")
        return ()
    if len(raw) > protocol.MAX_WORKERS:
        problems.append(f"job has {len(raw)} workers; the bitmap holds {protocol.MAX_WORKERS}")
    workers = []
    seen: dict[str, dict] = {"id": {}, "mac": {}, "ip": {}, "address": {}}
    for n, w in enumerate(raw):
        where = f"job.workers[{n}]"
        if not isinstance(w, dict):
            problems.append(f"{where} must be a table")
            continue
        missing = [k for k in ("id", "mac", "ip", "udp_port", "switch_port") if k not in w]
        if missing:
            problems.append(f"{where} is missing {', '.join(missing)}")
            continue
        wid, port, udp = w["id"], w["switch_port"], w["udp_port"]
        if not isinstance(wid, int) or not 0 <= wid < protocol.MAX_WORKERS:
            problems.append(f"{where}.id must be 0..{protocol.MAX_WORKERS - 1}, not {wid!r}")
        if not isinstance(udp, int) or not 1 <= udp <= 65535:
            problems.append(f"{where}.udp_port must be 1..65535, not {udp!r}")
        if port not in ports:
            problems.append(f"{where}.switch_port {port!r} is not a port of the switch "
                            f"{sorted(ports)}")
        mac = _check_mac(w["mac"], f"{where}.mac", problems)
        ip = _check_ip(w["ip"], f"{where}.ip", problems)
        if ip and ip == service_ip:
            problems.append(f"{where}.ip {ip} is the job's service address")
        if mac and mac == service_mac:
            problems.append(f"{where}.mac {mac} is the job's service address")
        l2_route = w.get("l2_route", True)
        if not isinstance(l2_route, bool):
            problems.append(f"{where}.l2_route must be true or false, not {l2_route!r}")
        for key, value in (("id", wid), ("mac", mac), ("ip", ip), ("address", (ip, udp))):
            if value in seen[key]:
                problems.append(f"{where} has the same {key} {value} as "
                                f"job.workers[{seen[key][value]}]")
            seen[key][value] = n
        workers.append(WorkerConfig(id=wid, mac=mac, ip=ip, udp_port=udp, switch_port=port,
                                    l2_route=l2_route is not False))
    return tuple(workers)


def _check_mac(value, where: str, problems: list[str]) -> str:
    if not isinstance(value, str) or not _MAC.match(value):
        problems.append(f"{where} {value!r} is not a MAC address like 02:00:00:00:00:01")
        return ""
    return value.lower()


def _check_ip(value, where: str, problems: list[str]) -> str:
    try:
        return str(ipaddress.IPv4Address(value))
    except (ipaddress.AddressValueError, ValueError):
        problems.append(f"{where} {value!r} is not an IPv4 address")
        return ""
