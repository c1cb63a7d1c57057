"""A rank's side of the job manager: register, get the job's Config, keep the lease.

    membership = join_from_env(rank, world)   # INA_MANAGER=host:port, INA_SECRET, INA_JOB_CREDENTIAL...
    session = AggregationSession.from_config(membership.config, rank)
    ...
    membership.close()

The rank finds its own data-plane interface (INA_IFNAME, or every non-loopback IPv4
interface, of which the manager takes the one its fabric knows) and a free UDP port.
It draws its own lease token and sends the job's credential, which every rank of the
job shares and no other tenant has (wire.py says why).
Needs no grpc or finsy: a numpy-only worker install imports it.
"""

from __future__ import annotations

import fcntl
import hmac
import os
import re
import secrets
import socket
import ssl
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from innet_aggregation.addresses import is_loopback
from innet_aggregation.p4src import protocol

from .. import config as config_mod
from ..tree import parse_tree
from .wire import (CREDENTIAL, JOB_NAME, MAX_LINE, decode_line, encode, job_key, needs_secret,
                   proof_tag, token_hash)

SIOCGIFADDR = 0x8915
READ_TIMEOUT = 15.0          # the manager sends a progress line every second
DEFAULT_TIMEOUT = 600.0
PROOF_WAIT = 3.0             # the nonce crosses one switch: milliseconds, unless lost
PROOF_TRIES = 3
IP_PKTINFO = 8               # Linux: each datagram's arrival interface and destination


class JoinError(RuntimeError):
    """The manager refused the rank, or could not be reached in time; says why."""


class _Unreachable(OSError):
    """Worth trying again: the manager is away (restarting), or the connection broke."""


class _NoAnswer(_Unreachable):
    """Closed or reset before any answer: a manager that died then, or a TLS listener
    that a plaintext client cannot talk to."""

    TRIES = 3


def interfaces(ifname: str | None = None) -> list[dict]:
    """This host's IPv4 interfaces other than loopback (or ``ifname`` alone):
    name, address and MAC."""
    found = []
    names = [ifname] if ifname else [name for _, name in socket.if_nameindex()]
    for name in names:
        try:
            mac = Path(f"/sys/class/net/{name}/address").read_text().strip().lower()
        except OSError:
            if ifname:
                raise JoinError(f"INA_IFNAME={ifname}: no such interface here") from None
            continue
        ip = _ipv4(name)
        if ip is None or ip.startswith("127.") or mac in ("", "00:00:00:00:00:00"):
            if ifname:
                raise JoinError(f"INA_IFNAME={ifname} has no IPv4 address and MAC to aggregate on")
            continue
        found.append({"ifname": name, "ip": ip, "mac": mac})
    if not found:
        raise JoinError("this host has no IPv4 interface besides loopback to aggregate on")
    return found


def _ipv4(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


class Membership:
    """One rank of a running job: its Config, and a thread renewing its lease.
    ``lost`` says why, if the manager no longer knows the job."""

    def __init__(self, manager: "_Manager", job: str, key: str, rank: int, token: str, config,
                 lease_seconds: float):
        self.job = job
        self.key = key
        self.rank = rank
        self.config = config
        self.lease_seconds = lease_seconds
        self.lost: str | None = None
        self.unreachable_since: float | None = None   # since when renewing fails (monotonic)
        self._manager = manager
        self._token = token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True,
                                        name=f"ina-lease-{job}-{rank}")
        self._thread.start()

    def _lease(self, op: str) -> dict:
        return self._manager.request({"op": op, "job": self.key, "rank": self.rank,
                                      "token": self._token})

    def _renew(self) -> None:
        away = False
        while not self._stop.wait(self.lease_seconds / 3):
            try:
                answer = self._lease("renew")
            except (OSError, JoinError) as exc:
                if not away:
                    _say(f"ina: cannot renew job {self.job}'s lease at "
                         f"{self._manager.address}: {exc}; retrying")
                    self.unreachable_since = time.monotonic()
                away = True
                continue
            if away:
                _say(f"ina: job {self.job}'s lease renewed again")
                away = False
                self.unreachable_since = None
            if answer.get("status") != "ok":
                self.lost = str(answer.get("error", answer))
                _say(f"ina: job {self.job} is lost: {self.lost}")
                return

    def close(self, timeout: float | None = None) -> None:
        """Stop renewing and tell the manager this rank is done (when every rank has,
        the job is removed from the switch); retried while the manager is away,
        up to ``timeout`` (the lease by default)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self.lost is not None:
            return
        deadline = time.monotonic() + (self.lease_seconds if timeout is None else timeout)
        while True:
            try:
                answer = self._lease("close")
                if answer.get("status") != "ok":
                    _say(f"ina: closing job {self.job}: {answer.get('error')}")
                return
            except (OSError, JoinError) as exc:
                if time.monotonic() > deadline:
                    _say(f"ina: could not tell the manager that rank {self.rank} of job "
                         f"{self.job} closed ({exc}); its lease will run out")
                    return
                time.sleep(0.5)

    def __enter__(self) -> "Membership":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Manager:
    """How to reach the manager: address, secret, TLS. Without TLS the secret goes only
    to a loopback manager, unless ``insecure``: anyone on the path could read it."""

    def __init__(self, address: str, secret: str, ca_cert: str | Path | None,
                 insecure: bool = False):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise JoinError(f"the manager's address {address!r} must be host:port (INA_MANAGER)")
        self.address, self.host, self.port = address, host.strip("[]"), int(port)
        if ca_cert is None and not insecure and not is_loopback(self.host):
            raise JoinError(f"refusing to send the secret in plaintext to the manager at "
                            f"{address}, which is not a loopback address: set INA_CA_CERT to "
                            f"the CA of its certificate (TLS), or INA_INSECURE=1 to send it "
                            f"in plaintext all the same")
        self.secret = secret
        self.ca_cert = ca_cert
        self.tls = None
        if ca_cert is not None:
            try:
                self.tls = ssl.create_default_context(cafile=str(ca_cert))
            except (OSError, ssl.SSLError) as exc:
                raise JoinError(f"the manager's CA {ca_cert} (INA_CA_CERT): {exc}") from None

    def lines(self, message: dict):
        """Send ``message``; yield each answer line as a dict."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=10)
        except OSError as exc:
            raise _Unreachable(f"cannot reach the manager at {self.address}: "
                               f"{exc.strerror or exc}") from None
        try:
            if self.tls is not None:
                sock = self._handshake(sock)
            sock.settimeout(READ_TIMEOUT)
            sock.sendall(encode({**message, "secret": self.secret} if needs_secret(message)
                                else message))
            answered = False
            with sock.makefile("rb") as reader:
                while True:
                    try:
                        line = reader.readline(MAX_LINE + 1)
                    except ConnectionResetError:
                        line = b""
                    if not line:
                        if answered:
                            raise _Unreachable(f"the manager at {self.address} closed the "
                                               f"connection")
                        raise _NoAnswer(self._no_answer())
                    answer = decode_line(line)
                    if not answered and answer.get("status") == "busy":    # over a cap
                        raise _Unreachable(f"the manager at {self.address} is busy: "
                                           f"{answer.get('error')}")
                    answered = True
                    yield answer
        except _Unreachable:
            raise
        except OSError as exc:          # a timeout, a reset, TLS torn down
            raise _Unreachable(f"the manager at {self.address}: {exc}") from None
        finally:
            sock.close()

    def _no_answer(self) -> str:
        said = f"the manager at {self.address} closed the connection without answering"
        if self.tls is None:
            said += ": it may require TLS (set INA_CA_CERT to the CA of its certificate)"
        return said

    def _handshake(self, sock: socket.socket) -> ssl.SSLSocket:
        try:
            return self.tls.wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            raise JoinError(f"the manager's certificate at {self.address} is not trusted by "
                            f"the CA in {self.ca_cert}: {exc.verify_message}") from None
        except ssl.SSLEOFError:         # a TLS manager over a cap closes without a line
            raise _Unreachable(f"the manager at {self.address} closed the connection in the "
                               f"TLS handshake (busy?)") from None
        except ssl.SSLError as exc:
            hint = (": does it serve plaintext? Then leave INA_CA_CERT unset"
                    if "WRONG_VERSION_NUMBER" in str(exc) else "")
            raise JoinError(f"TLS with the manager at {self.address} failed: "
                            f"{exc.reason or exc}{hint}") from None

    def request(self, message: dict) -> dict:
        for answer in self.lines(message):
            return answer
        raise _Unreachable(f"the manager at {self.address} did not answer")


def join(address: str, job: str, rank: int, world: int, secret: str, *, credential: str,
         ca_cert: str | Path | None = None, ifname: str | None = None,
         slots: int | None = None, timeout: float = DEFAULT_TIMEOUT,
         progress: Callable[[str], None] | None = None,
         deadline_ms: float | None = None, insecure: bool = False,
         priority: int | None = None) -> Membership:
    """Register rank ``rank`` of ``world`` in job ``job`` (whose ranks share
    ``credential``) and wait until the manager has installed the job (every rank
    registered, and room on the switch), at most ``timeout`` seconds; retried while
    the manager is away. Without ``ca_cert``, only a loopback manager unless
    ``insecure``. JoinError says why not."""
    progress = progress or _say
    if not CREDENTIAL.match(credential):
        raise JoinError("the job's credential must be 16-256 printable characters without "
                        "spaces (INA_JOB_CREDENTIAL)")
    manager = _Manager(address, secret, ca_cert, insecure)
    token = secrets.token_hex(16)    # this rank's alone: retries send the same one
    with _ProofSocket() as proofs:
        request = {"op": "register", "job": job, "rank": rank, "world": world,
                   "interfaces": interfaces(ifname), "udp_port": proofs.port,
                   "credential": credential, "token": token}
        if slots is not None:
            request["slots"] = slots
        if deadline_ms is not None:
            request["deadline_ms"] = deadline_ms
        if priority is not None:
            request["priority"] = priority
        deadline = time.monotonic() + timeout
        last, said, unanswered, unproven = "", 0.0, 0, 0
        while True:
            sent = dict(request)
            request.pop("proof", None)       # a nonce is good once: a retry asks anew
            try:
                for answer in manager.lines(sent):
                    status = answer.get("status")
                    if status == "ready":
                        return _membership(manager, job, job_key(job, credential), rank,
                                           token, answer)
                    if status == "refused":
                        raise JoinError(f"the manager refused rank {rank} of job {job}: "
                                        f"{answer.get('error')}")
                    message = str(answer.get("message", answer))
                    if status == "prove":
                        if message != last:
                            progress(f"ina: rank {rank} of job {job}: {message}")
                            last, said = message, time.monotonic()
                        request["proof"] = proofs.receive(
                            PROOF_WAIT, *_proof_path(answer, request["interfaces"]),
                            lambda nonce: proof_tag(token_hash(token), job_key(job, credential),
                                                    rank, nonce))
                        if request["proof"] is None:
                            unproven += 1
                            if unproven >= PROOF_TRIES:
                                raise JoinError(
                                    f"the manager's port proof never reached UDP port "
                                    f"{proofs.port} here in {PROOF_TRIES} tries ({message}): "
                                    f"is this host behind that switch port, as the manager's "
                                    f"fabric map says?")
                            del request["proof"]
                        break
                    if message != last or time.monotonic() - said > 30:
                        progress(f"ina: rank {rank} of job {job}: {message}")
                        last, said = message, time.monotonic()
                    if time.monotonic() > deadline:
                        break
                if time.monotonic() <= deadline:
                    continue         # proven (or the nonce lost): register again at once
            except _Unreachable as exc:
                unanswered = unanswered + 1 if isinstance(exc, _NoAnswer) else 0
                if unanswered >= _NoAnswer.TRIES:
                    raise JoinError(str(exc)) from None
                if message := str(exc):
                    if message != last:
                        progress(f"ina: {message}; trying again")
                    last = message
                if time.monotonic() <= deadline:
                    time.sleep(1.0)
                    continue
            raise JoinError(f"job {job} did not start within {timeout:g} s "
                            f"({last or 'no answer'}); gave up")


def _proof_path(answer: dict, sent: list[dict]) -> tuple[str, str, int]:
    """Where the manager's nonce comes from and goes to, from its ``prove`` answer:
    (source address, this rank's address, that interface's index)."""
    source, to = answer.get("source"), answer.get("to")
    ifname = next((i["ifname"] for i in sent if i["ip"] == to), None)
    if not isinstance(source, str) or ifname is None:
        raise JoinError(f"the manager's port proof names no address of this rank "
                        f"(to {to!r:.40} from {source!r:.40}; this rank sent "
                        f"{', '.join(i['ip'] for i in sent)})")
    try:
        return source, to, socket.if_nametoindex(ifname)
    except OSError:
        raise JoinError(f"the interface {ifname} went away while registering") from None


class _ProofSocket:
    """The rank's UDP port, bound while it registers: the manager's port proof arrives
    here through the switch (manager/proof.py). Closed before the session binds it.
    Anyone may send here: it takes only a datagram that came the switch's way and is
    tagged for this registration."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]

    def receive(self, wait: float, source: str, to: str, ifindex: int,
                tag: Callable[[str], str]) -> str | None:
        """The first nonce within ``wait`` seconds from ``source`` (and from this port,
        as the manager's frame is), to ``to`` through interface ``ifindex``, whose tag
        is ``tag(nonce)``; anything else is ignored. None if none came."""
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data, ancillary, _, sender = self.sock.recvmsg(2048, socket.CMSG_SPACE(12))
            except TimeoutError:
                return None
            payload = protocol.proof_payload(data)
            if (payload is None or sender != (source, self.port)
                    or _arrival(ancillary) != (ifindex, to)):
                continue
            nonce, mac = payload
            if hmac.compare_digest(mac, tag(nonce)):
                return nonce
        return None

    def __enter__(self) -> "_ProofSocket":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()


def _arrival(ancillary) -> tuple[int, str] | None:
    """(interface index, destination address) of a datagram, from its IP_PKTINFO."""
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_IP and kind == IP_PKTINFO and len(data) >= 12:
            ifindex, _, address = struct.unpack("i4s4s", data[:12])
            return ifindex, socket.inet_ntoa(address)
    return None


def _membership(manager: _Manager, job: str, key: str, rank: int, token: str,
                answer: dict) -> Membership:
    raw = answer.get("config")
    values = raw.get("job", {}).get("values_per_packet") if isinstance(raw, dict) else None
    try:
        pool = protocol.packet_format(values).pool_size
        # A tree job: the rank's own switch's Config (workers' ids are ranks).
        config = (parse_tree(raw, pool).for_worker(rank) if "switches" in raw
                  else config_mod.parse(raw, pool))
    except (config_mod.ConfigError, ValueError, AttributeError, TypeError) as exc:
        raise JoinError(f"the manager's job description for job {job} is not usable here: "
                        f"{exc}") from None
    if rank not in {w.id for w in config.job.workers}:
        raise JoinError(f"the manager's job {job} has no worker {rank}")
    return Membership(manager, job, key, rank, token, config,
                      float(answer.get("lease_seconds", 10)))


def default_job_name(env=os.environ) -> str:
    """INA_JOB, else what every rank of one torchrun job shares: its rendezvous run
    id, else MASTER_ADDR:MASTER_PORT."""
    name = env.get("INA_JOB")
    if name:
        if not JOB_NAME.match(name):
            raise JoinError(f"INA_JOB={name!r}: letters, digits and _.:@+- only, at most 128")
        return name
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        name = f"torchrun-{run_id}"
    elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        name = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    else:
        raise JoinError("name the job: INA_JOB (or run under torchrun, whose run id or "
                        "MASTER_ADDR:MASTER_PORT names it)")
    return re.sub(r"[^A-Za-z0-9_.:@+-]", "_", name)[:128]


def job_credential_from_env(env=os.environ) -> str | None:
    """INA_JOB_CREDENTIAL, or the first line of INA_JOB_CREDENTIAL_FILE, or None."""
    if env.get("INA_JOB_CREDENTIAL"):
        return env["INA_JOB_CREDENTIAL"]
    if env.get("INA_JOB_CREDENTIAL_FILE"):
        try:
            return Path(env["INA_JOB_CREDENTIAL_FILE"]).read_text().strip()
        except OSError as exc:
            raise JoinError(f"INA_JOB_CREDENTIAL_FILE={env['INA_JOB_CREDENTIAL_FILE']}: "
                            f"{exc.strerror}") from None
    return None


def join_from_env(rank: int, world: int, credential: str | None = None,
                  progress: Callable[[str], None] | None = None) -> Membership:
    """``join`` with INA_MANAGER, INA_SECRET or INA_SECRET_FILE, INA_JOB, INA_CA_CERT,
    INA_IFNAME, INA_SLOTS, INA_DEADLINE_MS (the job's deadline, milliseconds; unset or
    0: none), INA_JOIN_TIMEOUT (seconds), INA_PRIORITY (the job's priority; unset: its
    tenant's default) and INA_INSECURE (1: plaintext to a manager off loopback) from
    the environment; the
    job's credential is ``credential`` (the torch backend's, from the job's store),
    else INA_JOB_CREDENTIAL or INA_JOB_CREDENTIAL_FILE."""
    env = os.environ
    credential = credential or job_credential_from_env(env)
    if credential is None:
        raise JoinError("INA_JOB_CREDENTIAL (or INA_JOB_CREDENTIAL_FILE) must give the job's "
                        "credential, a secret every rank of this job shares and no other job "
                        "has; the torch backend draws one itself")
    address = env.get("INA_MANAGER")
    if not address:
        raise JoinError("INA_MANAGER=host:port must name the job manager")
    if env.get("INA_SECRET"):
        secret = env["INA_SECRET"]
    elif env.get("INA_SECRET_FILE"):
        try:
            secret = Path(env["INA_SECRET_FILE"]).read_text().strip()
        except OSError as exc:
            raise JoinError(f"INA_SECRET_FILE={env['INA_SECRET_FILE']}: {exc.strerror}") from None
    else:
        raise JoinError("INA_SECRET or INA_SECRET_FILE must give the manager's secret")
    try:
        slots = int(env["INA_SLOTS"]) if env.get("INA_SLOTS") else None
        timeout = float(env.get("INA_JOIN_TIMEOUT", DEFAULT_TIMEOUT))
        deadline = float(env.get("INA_DEADLINE_MS") or 0) or None
        priority = int(env["INA_PRIORITY"]) if env.get("INA_PRIORITY") else None
    except ValueError as exc:
        raise JoinError(f"INA_SLOTS / INA_JOIN_TIMEOUT / INA_DEADLINE_MS / INA_PRIORITY: "
                        f"{exc}") from None
    if deadline is not None and not 0 < deadline <= config_mod.MAX_DEADLINE_MS:
        raise JoinError(f"INA_DEADLINE_MS must be milliseconds in (0, "
                        f"{config_mod.MAX_DEADLINE_MS}], "
                        f"not {env['INA_DEADLINE_MS']}")
    insecure = env.get("INA_INSECURE", "0")
    if insecure not in ("0", "1"):
        raise JoinError(f"INA_INSECURE must be 0 or 1, not {insecure!r}")
    return join(address, default_job_name(env), rank, world, secret, credential=credential,
                ca_cert=env.get("INA_CA_CERT") or None, ifname=env.get("INA_IFNAME") or None,
                slots=slots, timeout=timeout, progress=progress, deadline_ms=deadline,
                insecure=insecure == "1", priority=priority)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
