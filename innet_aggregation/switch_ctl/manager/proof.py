"""A rank proves that it sits behind the switch port it claims: the manager sends a
nonce through the switch (PacketOut, op SEND_FRAME) out of the port the fabric map
names for the claimed MAC, addressed to the claimed IP and UDP port, and the rank
registers again echoing it. Only the host behind that port receives it, so a tenant
holding the manager's secret cannot enter another's host in its job (which would
send that host results and keep its owner's jobs off it).

A nonce is good for one registration of one (job, rank, token), for
``PROOF_SECONDS`` from when it left; the table of outstanding nonces is bounded,
oldest dropped first.
"""

from __future__ import annotations

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

PROOF_SECONDS = 10.0
MAX_OUTSTANDING = 4096


@dataclass
class _Challenge:
    nonce: str
    member: Member
    expires: float = float("inf")      # set when the frame has left


class PortProofs:
    def __init__(self, config: ManagerConfig):
        service = config.pool.services[0]      # a source on the hosts' subnet
        self._source = (service.mac, service.ip)
        self._lock = threading.Lock()
        self._outstanding: OrderedDict[tuple, _Challenge] = OrderedDict()

    def challenge(self, request: Register, member: Member) -> bytes:
        """The frame to send out of ``member.switch_port`` for this registration."""
        nonce = secrets.token_bytes(protocol.PROOF_NONCE_BYTES)
        key = (request.job, request.rank, request.token_hash)
        with self._lock:
            self._outstanding.pop(key, None)
            self._outstanding[key] = _Challenge(nonce.hex(), member)
            while len(self._outstanding) > MAX_OUTSTANDING:
                self._outstanding.popitem(last=False)
        mac, ip = self._source
        return protocol.proof_frame(member.mac, member.ip, member.udp_port, mac, ip, nonce)

    def sent(self, request: Register) -> None:
        """The frame left: the nonce's time starts."""
        with self._lock:
            challenge = self._outstanding.get((request.job, request.rank, request.token_hash))
            if challenge is not None:
                challenge.expires = time.monotonic() + PROOF_SECONDS

    def check(self, request: Register, member: Member) -> None:
        """BadRequest unless ``request.proof`` is the nonce sent to this very host."""
        with self._lock:
            challenge = self._outstanding.pop((request.job, request.rank, request.token_hash),
                                              None)
        where = (f"{member.mac} / {member.ip} UDP {member.udp_port} through "
                 f"{member.switch} port {member.switch_port}")
        if challenge is None or challenge.member != member:
            raise BadRequest(f"rank {request.rank} of job {request.name} echoed a port proof "
                             f"the manager did not send to {where}: register without one to "
                             f"get a nonce")
        if time.monotonic() > challenge.expires:
            raise BadRequest(f"rank {request.rank} of job {request.name}: the port proof sent "
                             f"to {where} expired ({PROOF_SECONDS:g} s)")
        if not hmac.compare_digest(challenge.nonce, request.proof):
            raise BadRequest(f"rank {request.rank} of job {request.name} echoed a wrong port "
                             f"proof: the nonce went to {where}, and this host did not get it "
                             f"(is it behind that port? the fabric map says it is)")
