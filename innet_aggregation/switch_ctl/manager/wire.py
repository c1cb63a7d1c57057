"""The manager's protocol: one JSON object per line over TCP (TLS where the manager
has a certificate), one request per connection, and every request checked here,
once, before the manager acts on it.

Requests: ``register`` (answered by ``waiting`` lines, then ``ready`` or
``refused``), ``renew``, ``close`` and ``jobs`` (answered by one ``ok`` or
``refused`` line). Importable without grpc or finsy: the worker side uses it.

Who may act for a job:
- ``register`` and ``jobs`` carry a tenant's secret: it admits the tenant, whose
  space of jobs the request then reaches (tenants.py).
- A registration also carries the job's credential, which only the job's ranks share
  (the torch backend draws it into the job's own rendezvous store). A job is known by
  its name *and* its credential (``job_key``), so another tenant who picks the same
  name gathers a job of its own: it can neither join, renew nor close this one.
- A registration first proves the host: the manager sends a nonce through the switch
  (PacketOut) out of the port the fabric map names, to the MAC, address and UDP port
  claimed, and the rank registers again echoing it (``proof``). So a tenant cannot
  claim another's host, and its results never reach a host that did not ask. The
  frame's tag (``proof_tag``) binds the nonce to the registration: the rank takes no
  other, so no bystander's datagram breaks its registration.
- Each rank draws its own lease token and sends it with its registration; the
  manager keeps only its hash and never sends a token back. ``renew`` and ``close``
  carry the job's key and the token, not the secret. A second registration of a
  rank with another token is refused, never let evict the first.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import re
from dataclasses import dataclass

from innet_aggregation.p4src import protocol

from ..config import MAX_DEADLINE_MS

MAX_LINE = 64 * 1024
MAX_DEPTH = 16       # arrays and objects inside each other: a request needs 3, an answer 6
MAX_NUMBER = 24      # characters of one number: any int64, and any double as repr writes it
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$")
_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_OWNER = re.compile(r"^[0-9a-f]{32}$")
_NONCE = re.compile(rf"^[0-9a-f]{{{2 * protocol.PROOF_NONCE_BYTES}}}$")
# A credential is a secret the job's ranks share: long enough not to be guessed,
# printable so it travels in an environment variable.
CREDENTIAL = re.compile(r"^[\x21-\x7e]{16,256}$")
MAX_INTERFACES = 32
MAX_PRIORITY = 1000
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
    job: str                 # the job's key: its name and its credential's owner id
    rank: int
    world: int
    interfaces: tuple[Interface, ...]
    udp_port: int
    slots: int | None
    token_hash: str          # of the token the rank drew, which renews its lease
    proof: str | None = None # the nonce the manager sent the host through the switch
    deadline_ms: float | None = None   # the job's deadline (config.JobConfig.deadline_ms)
    priority: int | None = None        # asked; the tenant's default and cap apply (tenants.py)

    @property
    def name(self) -> str:
        return job_name_of(self.job)


@dataclass(frozen=True)
class Lease:
    """A renew or close: the rank's token proves it is the client that registered."""
    op: str
    job: str                 # the job's key
    rank: int
    token_hash: str


def owner_of(credential: str) -> str:
    """The credential's public id: a hash that names the owner without revealing it."""
    return hashlib.sha256(b"ina-job-credential\0" + credential.encode()).hexdigest()[:32]


def job_key(name: str, credential: str) -> str:
    """What the manager knows a job by: two tenants' jobs of one name stay apart."""
    return f"{name}/{owner_of(credential)}"


def job_name_of(key: str) -> str:
    return key.partition("/")[0]


def token_hash(token: str) -> str:
    """What the manager keeps of a lease token (its database never holds one)."""
    return hashlib.sha256(b"ina-lease-token\0" + token.encode()).hexdigest()


def proof_tag(token_hash: str, job: str, rank: int, nonce: str) -> str:
    """What binds a port proof's nonce to the registration it answers: keyed by the
    hash of the rank's own lease token, which only the rank and the manager hold, so
    the rank takes no forged nonce, nor one the manager sent for another's claim."""
    message = f"ina-port-proof\0{job}\0{rank}\0{nonce}".encode()
    return hmac.new(token_hash.encode(), message, hashlib.sha256).hexdigest()[
        :2 * protocol.PROOF_TAG_BYTES]


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


def needs_secret(message: dict) -> bool:
    """Whether the request must carry the manager's secret: a lease's token is its proof."""
    return message.get("op") not in ("renew", "close")


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
    if op in ("renew", "close"):
        _only(message, {"op", "job", "rank", "token"})
        key = message.get("job")
        name, _, owner = key.partition("/") if isinstance(key, str) else ("", "", "")
        if not JOB_NAME.match(name) or not _OWNER.match(owner):
            raise BadRequest(f"a {op}'s job must be the job's key (name/owner, as the "
                             f"registering rank computed it), not {key!r:.80}")
        rank = _int(message, "rank", 0, protocol.MAX_WORKERS - 1)
        return Lease(op, key, rank, token_hash(_token(message)))
    _only(message, {"op", "secret", "job", "rank", "world", "interfaces", "udp_port", "slots",
                    "credential", "token", "proof", "deadline_ms", "priority"})
    name = _job_name(message.get("job"))
    credential = message.get("credential")
    if not isinstance(credential, str) or not CREDENTIAL.match(credential):
        raise BadRequest("credential must be the job's own secret, 16-256 printable characters "
                         "its ranks share (INA_JOB_CREDENTIAL, or the torch backend's, drawn "
                         "into the job's rendezvous store)")
    token = _token(message)
    world = _int(message, "world", 1, protocol.MAX_WORKERS)
    rank = _int(message, "rank", 0, protocol.MAX_WORKERS - 1)
    if rank >= world:
        raise BadRequest(f"rank {rank} is not below the world size {world}")
    udp_port = _int(message, "udp_port", 1024, 65535)
    slots = None if message.get("slots") is None else _int(message, "slots", 1, 1 << 15)
    priority = (None if message.get("priority") is None
                else _int(message, "priority", 0, MAX_PRIORITY))
    deadline = message.get("deadline_ms")
    if deadline is not None and (isinstance(deadline, bool)
                                 or not isinstance(deadline, (int, float))
                                 or not 0 < deadline <= MAX_DEADLINE_MS):
        raise BadRequest(f"deadline_ms must be a number of milliseconds in (0, "
                         f"{MAX_DEADLINE_MS}], not {deadline!r:.40}")
    raw = message.get("interfaces")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_INTERFACES:
        raise BadRequest(f"interfaces must list 1..{MAX_INTERFACES} interfaces, not {raw!r:.80}")
    return Register(job_key(name, credential), rank, world,
                    tuple(_interface(i, n) for n, i in enumerate(raw)), udp_port, slots,
                    token_hash(token), _proof(message.get("proof")),
                    None if deadline is None else float(deadline), priority)


def _proof(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _NONCE.match(value):
        raise BadRequest(f"proof must be the {2 * protocol.PROOF_NONCE_BYTES} hex digits the "
                         f"switch delivered, not {value!r:.80}")
    return value


def _token(message: dict) -> str:
    token = message.get("token")
    if not isinstance(token, str) or not _TOKEN.match(token):
        raise BadRequest("token must be 32 hex digits the rank drew (secrets.token_hex(16))")
    return token


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
