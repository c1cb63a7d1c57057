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
import math
import re
from dataclasses import dataclass

from innet_aggregation.p4src import protocol

MAX_LINE = 64 * 1024
MAX_DEPTH = 16       # arrays and objects inside each other: a request needs 3, an answer 6
MAX_NUMBER = 24      # characters of one number: any int64, and any double as repr writes it
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
    """A line as a JSON object, or BadRequest. Its length, encoding and nesting are
    checked on the raw bytes before it is parsed, and each number before it is
    converted, so no line can make the parser recurse or convert thousands of digits."""
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise BadRequest(f"a request is one JSON line of at most {MAX_LINE} bytes")
    try:
        text = line.decode()
    except UnicodeDecodeError as exc:
        raise BadRequest(f"not UTF-8: {exc.reason} at byte {exc.start}") from None
    if _too_deep(line):
        raise BadRequest(f"arrays and objects nest more than {MAX_DEPTH} deep")
    try:
        message = json.loads(text, parse_int=_json_int, parse_float=_json_float,
                             parse_constant=_json_constant)
    except BadRequest:
        raise
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise BadRequest("a request is a JSON object")
    return message


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def _too_deep(line: bytes) -> bool:
    """Whether the brackets outside strings nest deeper than MAX_DEPTH: each pass drops
    the innermost pairs, so MAX_DEPTH passes leave no pair of a line nested no deeper;
    what never closes is left to the parser (refused, after at most MAX_DEPTH more
    levels). Bytes operations only: a 64 KiB line takes a millisecond or two."""
    nesting = _STRING.sub(b"", line).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        inner = nesting.replace(b"()", b"")
        if len(inner) == len(nesting):
            break
        nesting = inner
    return b"()" in nesting or nesting.count(b"(") > MAX_DEPTH


def _digits(text: str) -> str:
    if len(text) > MAX_NUMBER:
        raise BadRequest(f"a number of {len(text)} characters; at most {MAX_NUMBER}")
    return text


def _json_int(text: str) -> int:
    return int(_digits(text))


def _json_float(text: str) -> float:
    value = float(_digits(text))
    if not math.isfinite(value):
        raise BadRequest(f"the number {text} is beyond a double's range")
    return value


def _json_constant(name: str):
    raise BadRequest(f"{name} is not a number JSON allows")


def secret_of(message: dict) -> bytes:
    secret = message.get("secret")
    if not isinstance(secret, str):
        raise BadRequest("the request carries no secret (INA_SECRET or INA_SECRET_FILE)")
    try:
        return secret.encode()
    except UnicodeEncodeError:          # a lone surrogate escaped as \udXXX
        raise BadRequest("the secret is not valid Unicode") from None


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
