"""A rank proves that it sits behind the switch port it claims: the manager sends a
nonce through the switch (PacketOut, op SEND_FRAME) out of the port the fabric map
names for the claimed MAC, addressed to the claimed IP and UDP port, and the rank
registers again echoing it. Only the host behind that port receives it, so a tenant
holding the manager's secret cannot enter another's host in its job (which would
send that host results and keep its owner's jobs off it).

With ``learn_hosts`` on, a host the fabric map does not list is learned the same
way: a nonce of its own goes out of every port that faces hosts (on every switch of
a tree), and the one the rank echoes names the port it is behind. Learning trusts
whoever answers at that MAC, so the job gets no L2 route to a learned MAC (placement.py).

A nonce is bound to the registration it answers, (job, rank, token): the frame
carries a tag (wire.proof_tag) keyed by the rank's own token, so the rank ignores a
forged nonce and one sent for another's claim of its address; an echo that is wrong
leaves the registration's nonces in place, and only the right one consumes them. It
is good for ``PROOF_SECONDS`` from when it left. A rank that asked again (its nonce
late: a switch that stalled delivers its PacketOuts when it resumes, oldest first)
may echo any of its last ``NONCES_KEPT``.

Outstanding registrations are bounded per requester (the address that asked,
``MAX_PER_REQUESTER``: over it, that requester's own oldest goes) and in all
(``MAX_OUTSTANDING``: over it, the oldest of the requester holding the most goes), so
a flood of claims from one place never drops another's.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from innet_aggregation.p4src import protocol

from .config import ManagerConfig
from .records import Member
from .tenants import wire_key
from .wire import BadRequest, Register, proof_tag

PROOF_SECONDS = 30.0
MAX_OUTSTANDING = 4096
MAX_PER_REQUESTER = 64
NONCES_KEPT = 16


@dataclass
class _Nonce:
    switch: str
    port: int
    expires: float = float("inf")         # set when its frame has left


@dataclass
class _Challenge:
    member: Member
    requester: str                        # who asked: the peer's address
    nonces: dict[str, _Nonce]             # nonce -> the port it left by, newest last


def host_ports(config: ManagerConfig) -> list[tuple[str, int]]:
    """Every (switch, port) a host may be behind: the switches' ports less the links
    between switches."""
    links = config.tree
    between = set()
    if links is not None:
        between = ({(name, port) for name, port in links.uplink_ports.items()}
                   | {(links.parents[name], port) for name, port in links.parent_ports.items()})
    return [(name, port) for name, sw in config.switches.items() for port in sw.ports
            if (name, port) not in between]


class PortProofs:
    def __init__(self, config: ManagerConfig):
        service = config.pool.services[0]      # a source on the hosts' subnet
        self._source = (service.mac, service.ip)
        self._candidates = host_ports(config)
        self._lock = threading.Lock()
        self._outstanding: OrderedDict[tuple, _Challenge] = OrderedDict()
        self._per_requester: Counter[str] = Counter()

    @property
    def source_ip(self) -> str:
        """The address every proof comes from: the rank takes no datagram from another."""
        return self._source[1]

    def challenge(self, request: Register, member: Member,
                  requester: str) -> list[tuple[str, int, bytes]]:
        """The frames to send, (switch, port, frame): out of the member's port, or, for a
        host to learn (``member.switch_port`` None), one out of every host port.
        ``requester``: who asked (the peer's address), whose outstanding registrations
        are bounded; a bound per tenant would count a key of its own the same way."""
        ports = ([(member.switch, member.switch_port)] if member.switch_port is not None
                 else self._candidates)
        fresh = {secrets.token_hex(protocol.PROOF_NONCE_BYTES): _Nonce(switch, port)
                 for switch, port in ports}
        key = (request.job, request.rank, request.token_hash)
        with self._lock:
            earlier = self._forget(key)
            kept = (dict(list(earlier.nonces.items())[-NONCES_KEPT:])
                    if earlier is not None and earlier.member == member else {})
            self._outstanding[key] = _Challenge(member, requester, {**kept, **fresh})
            self._per_requester[requester] += 1
            if self._per_requester[requester] > MAX_PER_REQUESTER:
                self._forget_oldest(requester)
            while len(self._outstanding) > MAX_OUTSTANDING:
                self._forget_oldest(max(self._per_requester, key=self._per_requester.get))
        mac, ip = self._source
        return [(n.switch, n.port, protocol.proof_frame(
                    member.mac, member.ip, member.udp_port, mac, ip, bytes.fromhex(nonce),
                    bytes.fromhex(proof_tag(request.token_hash, wire_key(request.job), request.rank,
                                            nonce))))
                for nonce, n in fresh.items()]

    def _forget(self, key: tuple) -> _Challenge | None:
        challenge = self._outstanding.pop(key, None)
        if challenge is not None:
            self._per_requester[challenge.requester] -= 1
            if not self._per_requester[challenge.requester]:
                del self._per_requester[challenge.requester]
        return challenge

    def _forget_oldest(self, requester: str) -> None:
        self._forget(next(key for key, c in self._outstanding.items()
                          if c.requester == requester))

    def sent(self, request: Register) -> None:
        """The frames left: their nonces' time starts."""
        now = time.monotonic()
        with self._lock:
            challenge = self._outstanding.get((request.job, request.rank, request.token_hash))
            for nonce in challenge.nonces.values() if challenge is not None else ():
                if nonce.expires == float("inf"):
                    nonce.expires = now + PROOF_SECONDS

    def check(self, request: Register, member: Member) -> Member:
        """The member, proven (a learned host's port filled in, and marked learned);
        BadRequest unless ``request.proof`` is a nonce sent to this very host. Only the
        right nonce consumes the registration's: a wrong echo leaves them in place."""
        where = (f"{member.mac} / {member.ip} UDP {member.udp_port} through "
                 + (f"{member.switch} port {member.switch_port}" if member.switch_port is not None
                    else "every port that faces hosts"))
        key = (request.job, request.rank, request.token_hash)
        with self._lock:
            challenge = self._outstanding.get(key)
            if challenge is None or challenge.member != member:
                raise BadRequest(f"rank {request.rank} of job {request.name} echoed a port "
                                 f"proof the manager did not send to {where}: register "
                                 f"without one to get a nonce")
            match = next((nonce for nonce in challenge.nonces
                          if hmac.compare_digest(nonce, request.proof)), None)
            if match is None:
                raise BadRequest(f"rank {request.rank} of job {request.name} echoed a wrong "
                                 f"port proof: the nonce went to {where}, and this host did "
                                 f"not get it" + (" (is it behind that port? the fabric map "
                                                  "says it is)"
                                                  if member.switch_port is not None else ""))
            nonce = challenge.nonces.pop(match)
            if time.monotonic() > nonce.expires:
                if not challenge.nonces:
                    self._forget(key)
                raise BadRequest(f"rank {request.rank} of job {request.name}: the port proof "
                                 f"sent to {where} expired ({PROOF_SECONDS:g} s)")
            self._forget(key)
        return dataclasses.replace(member, switch=nonce.switch, switch_port=nonce.port,
                                   learned=member.switch_port is None)
