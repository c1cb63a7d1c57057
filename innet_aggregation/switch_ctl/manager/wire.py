"""The manager's protocol: one JSON object per line over TCP (TLS where the manager
has a certificate), one request per connection, and every request checked here,
once, before the manager acts on it.

Requests: ``register`` (answered by ``waiting`` lines, then ``ready`` or
``refused``), ``renew``, ``close`` and ``jobs`` (answered by one ``ok`` or
``refused`` line). Every request carries the manager's secret. Importable without
grpc or finsy: the worker side uses it.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass

from innet_aggregation.p4src import protocol

MAX_LINE = 64 * 1024
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$")
_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
MAX_INTERFACES = 32
OPS = ("register", "renew", "close", "jobs")


class BadRequest(ValueError):
    """A request the manager refuses as malformed; the message says what is wrong."""


@dataclass(frozen=True)
class Interface:
    ifname: str
    ip: str
    mac: str


@dataclass(frozen=True)
class Register:
    job: str
    rank: int
    world: int
    interfaces: tuple[Interface, ...]
    udp_port: int
    slots: int | None


@dataclass(frozen=True)
class Lease:
    """A renew or close: the rank's token proves it is the rank the job was given to."""
    op: str
    job: str
    rank: int
    token: str


def encode(message: dict) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode_line(line: bytes) -> dict:
    """A line as a JSON object, or BadRequest."""
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise BadRequest(f"a request is one JSON line of at most {MAX_LINE} bytes")
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise BadRequest("a request is a JSON object")
    return message


def secret_of(message: dict) -> bytes:
    secret = message.get("secret")
    if not isinstance(secret, str):
        raise BadRequest("the request carries no secret (INA_SECRET or INA_SECRET_FILE)")
    return secret.encode()


def parse(message: dict) -> Register | Lease | str:
    """The request, checked: a Register, a Lease, or "jobs"."""
    op = message.get("op")
    if op not in OPS:
        raise BadRequest(f"op must be one of {', '.join(OPS)}, not {op!r}")
    if op == "jobs":
        _only(message, {"op", "secret"})
        return "jobs"
    job = _job_name(message.get("job"))
    if op in ("renew", "close"):
        _only(message, {"op", "secret", "job", "rank", "token"})
        rank = _int(message, "rank", 0, protocol.MAX_WORKERS - 1)
        token = message.get("token")
        if not isinstance(token, str) or not _TOKEN.match(token):
            raise BadRequest("token must be the 32 hex digits the manager handed out")
        return Lease(op, job, rank, token)
    _only(message, {"op", "secret", "job", "rank", "world", "interfaces", "udp_port", "slots"})
    world = _int(message, "world", 1, protocol.MAX_WORKERS)
    rank = _int(message, "rank", 0, protocol.MAX_WORKERS - 1)
    if rank >= world:
        raise BadRequest(f"rank {rank} is not below the world size {world}")
    udp_port = _int(message, "udp_port", 1024, 65535)
    slots = None if message.get("slots") is None else _int(message, "slots", 1, 1 << 15)
    raw = message.get("interfaces")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_INTERFACES:
        raise BadRequest(f"interfaces must list 1..{MAX_INTERFACES} interfaces, not {raw!r:.80}")
    return Register(job, rank, world, tuple(_interface(i, n) for n, i in enumerate(raw)),
                    udp_port, slots)


def _only(message: dict, allowed: set[str]) -> None:
    extra = sorted(set(message) - allowed)
    if extra:
        raise BadRequest(f"unknown fields {', '.join(map(repr, extra))} in a "
                         f"{message.get('op')} request")


def _job_name(value) -> str:
    if not isinstance(value, str) or not JOB_NAME.match(value):
        raise BadRequest(f"job must be 1-128 characters of letters, digits and _.:@+- "
                         f"(starting with a letter or digit), not {value!r:.80}")
    return value


def _int(message: dict, key: str, low: int, high: int) -> int:
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{key} must be an integer in {low}..{high}, not {value!r:.40}")
    return value


def _interface(raw, n: int) -> Interface:
    where = f"interfaces[{n}]"
    if not isinstance(raw, dict) or set(raw) != {"ifname", "ip", "mac"}:
        raise BadRequest(f"{where} must have exactly ifname, ip and mac")
    ifname, ip, mac = raw["ifname"], raw["ip"], raw["mac"]
    if not isinstance(ifname, str) or not 1 <= len(ifname) <= 15:
        raise BadRequest(f"{where}.ifname must be an interface name, not {ifname!r:.40}")
    try:
        address = ipaddress.IPv4Address(ip)
    except (ipaddress.AddressValueError, ValueError):
        raise BadRequest(f"{where}.ip {ip!r:.40} is not an IPv4 address") from None
    if address.is_unspecified or address.is_multicast or address.is_loopback:
        raise BadRequest(f"{where}.ip {ip} cannot be a worker's address")
    if not isinstance(mac, str) or not _MAC.match(mac):
        raise BadRequest(f"{where}.mac {mac!r:.40} is not a MAC address like 02:00:00:00:00:01")
    return Interface(ifname, str(address), mac.lower())
