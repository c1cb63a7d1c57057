"""A rank proves that it sits behind the switch port it claims: the manager sends a
nonce through the switch (PacketOut, op SEND_FRAME) out of the port the fabric map
names for the claimed MAC, addressed to the claimed IP and UDP port, and the rank
registers again echoing it. Only the host behind that port receives it, so a tenant
holding the manager's secret cannot enter another's host in its job (which would
send that host results and keep its owner's jobs off it).

A host the fabric map does not list is learned the same way: a nonce of its own goes
out of every port that faces hosts (on every switch of a tree), and the one the rank
echoes names the port it is behind. Learning trusts whoever answers at that MAC, so
list the hosts you know; an unlisted MAC is only ever learned for one registration.

A nonce is good for one registration of one (job, rank, token), for
``PROOF_SECONDS`` from when it left. A rank that asked again (its nonce late: a switch
that stalled delivers its PacketOuts when it resumes, oldest first) may echo any of
its last ``NONCES_KEPT``; the table of outstanding registrations is bounded, oldest
dropped first.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from innet_aggregation.p4src import protocol

from .config import ManagerConfig
from .jobs import Member
from .wire import BadRequest, Register

PROOF_SECONDS = 30.0
MAX_OUTSTANDING = 4096
NONCES_KEPT = 16


@dataclass
class _Nonce:
    switch: str
    port: int
    expires: float = float("inf")         # set when its frame has left


@dataclass
class _Challenge:
    member: Member
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

    def challenge(self, request: Register, member: Member) -> list[tuple[str, int, bytes]]:
        """The frames to send, (switch, port, frame): out of the member's port, or, for a
        host to learn (``member.switch_port`` None), one out of every host port."""
        ports = ([(member.switch, member.switch_port)] if member.switch_port is not None
                 else self._candidates)
        fresh = {secrets.token_hex(protocol.PROOF_NONCE_BYTES): _Nonce(switch, port)
                 for switch, port in ports}
        key = (request.job, request.rank, request.token_hash)
        with self._lock:
            earlier = self._outstanding.pop(key, None)
            kept = (dict(list(earlier.nonces.items())[-NONCES_KEPT:])
                    if earlier is not None and earlier.member == member else {})
            self._outstanding[key] = _Challenge(member, {**kept, **fresh})
            while len(self._outstanding) > MAX_OUTSTANDING:
                self._outstanding.popitem(last=False)
        mac, ip = self._source
        return [(n.switch, n.port, protocol.proof_frame(member.mac, member.ip, member.udp_port,
                                                        mac, ip, bytes.fromhex(nonce)))
                for nonce, n in fresh.items()]

    def sent(self, request: Register) -> None:
        """The frames left: their nonces' time starts."""
        now = time.monotonic()
        with self._lock:
            challenge = self._outstanding.get((request.job, request.rank, request.token_hash))
            for nonce in challenge.nonces.values() if challenge is not None else ():
                if nonce.expires == float("inf"):
                    nonce.expires = now + PROOF_SECONDS

    def check(self, request: Register, member: Member) -> Member:
        """The member, proven (a learned host's port filled in); BadRequest unless
        ``request.proof`` is a nonce sent to this very host."""
        with self._lock:
            challenge = self._outstanding.pop((request.job, request.rank, request.token_hash),
                                              None)
        where = (f"{member.mac} / {member.ip} UDP {member.udp_port} through "
                 + (f"{member.switch} port {member.switch_port}" if member.switch_port is not None
                    else "every port that faces hosts"))
        if challenge is None or challenge.member != member:
            raise BadRequest(f"rank {request.rank} of job {request.name} echoed a port proof "
                             f"the manager did not send to {where}: register without one to "
                             f"get a nonce")
        match = next((n for nonce, n in challenge.nonces.items()
                      if hmac.compare_digest(nonce, request.proof)), None)
        if match is None:
            raise BadRequest(f"rank {request.rank} of job {request.name} echoed a wrong port "
                             f"proof: the nonce went to {where}, and this host did not get it"
                             + (" (is it behind that port? the fabric map says it is)"
                                if member.switch_port is not None else ""))
        if time.monotonic() > match.expires:
            raise BadRequest(f"rank {request.rank} of job {request.name}: the port proof sent "
                             f"to {where} expired ({PROOF_SECONDS:g} s)")
        return dataclasses.replace(member, switch=match.switch, switch_port=match.port)
