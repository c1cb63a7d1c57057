"""The worker's side of the wire: one UDP socket, a window of slots, timers.

One call aggregates N blocks through the job's W slots (W = num_slots). Chunk c
uses slot c mod W; a slot holds one packet in flight, and its result frees it for
chunk c + W. Sends and receives are batched (sendmmsg/recvmmsg, ``batchio``), and
results are handled as arrays, one pass per batch; the common ones (final, whole
float32 blocks) in C where it can be compiled (``fastpath``), the rest here.

**Exponents without a bootstrap round.** A packet carries its own block exponent,
and its values are quantized with a scale exponent ``S`` that every worker derives
identically from the maxima the same call agreed on its last few times (``history_key``:
its place in the step; ``quantize.speculate``; a named call of a new size starts
from its name's last, ``same_name``; a call with no history probes). The result
returns the switch's maximum; where it shows the scale was too small (some worker's values
were clipped) or wasted precision (``quantize.usable``), every worker redoes that
block with the now known maximum, as the slot's next packet. So a steady training
loop sends N packets per call, not N + W.

Everything on the wire is a deterministic function of the call sequence and of
the results, which every worker receives identically: a slot's set alternates with
every new packet sent in it, across calls (a contribution to set s re-arms set 1-s
in the switch), and its packet id counts the packets sent in it, from a base the
session's epoch gives. A result is accepted only if slot, set and packet id all
match the packet in flight; anything else is a duplicate or stale copy and is
ignored.

**Every worker checks that all sent the same call.** Each packet carries the
call's fingerprint (``call_fingerprints``: the session's epoch, the call's number,
its size, the caller's dtype and shape, its name if it has one, the block's place
in it), which the switch sums
like a value. A result whose sum is not n times this worker's own means that some
worker issued another call (another size, calls in another order, a rank ahead or
behind) or that the slot held another session's sums. Every worker sees the same
sum, so every worker raises CallMismatch on that call; no sum of different calls is
ever returned.

**A session never takes another session's sum.** Its start (``start``, before the
first call that sends) gives it an epoch, which every fingerprint then holds:
every worker sends one packet into set 0 of every slot of the window, a random
number in its own lane and zeros elsewhere, with the start's fingerprint. A
session that closed parked its slots (``park``: each slot's next set is 0, and set
0 is empty), so the start's sums are fresh: each worker finds its own numbers in
its lane, and the sums' hash is the epoch, the same on every worker. Whatever
another session left there instead (one killed mid-call, or that failed) shows:
a stored sum answers the start with its own fingerprint, or without this worker's
number; a half-vacated (slot, set) counts past the workers and never finishes,
which a WAITING reply shows (below). Every worker then raises CallMismatch saying
to reset the job's slots, at once, and none takes a stale sum. (Only leftovers of
another session's own start can be seen by some workers alone, those whose lane
they hold; the others then wait for them, naming them, up to ``peer_timeout``.)

**Loss.** A result missing while results of packets sent after it arrive is a
loss (RACK, RFC 8985: results return through one switch in about the order their
slots were sent): it is resent after one round trip plus a reordering window,
without waiting for a timer. Every packet also has a retransmission timer: the RFC
6298 estimate with Karn's rule, its floor twice the smoothed round trip (so it
follows the switch, not a constant chosen for the slowest one), doubled once per
timeout period until a fresh sample comes (one back-off for all packets: backing
off per packet as well compounded to 4^k after k rounds of loss, and through a
tree's four lossy passes at 10 % stretched calls 37-fold). Before a call's first
result, a timeout resends one packet a period, not the window (``_Call._probe``): a
call's first results wait for the last worker to reach the call, which on a busy
host is late by more than a timeout, and resending every slot then only loads the
switch (in DDP on 2 shared cores this was 1 % of all packets, all spurious). Any
error on the socket (an ICMP error queued by a stale or forged frame, a full buffer)
counts as a lost packet for the same machinery: the kernel reports such an error
once, on the next send or receive. A send error that persists (the route refuses
the packets: an MTU below theirs, no route, a firewall) is no loss: the unsent rest
is resent at once, and where it fails ``SEND_TRIES`` times in a row the call ends
(SendRefused), naming the errno and the destination. ICMP "fragmentation needed"
never shrinks the packets (IP_PMTUDISC_INTERFACE): the program's frame is fixed, and
anyone on the segment can forge one.

**Slow is not dead.** A packet whose timer has expired asks (``contributions``
1), and the switch answers a retransmission that asks, for a slot it has not
finished, with a short WAITING reply: the bitmap of the workers that have
contributed, and their count. A WAITING reply moves no timer, so it never speeds
up the retransmissions that bring it: they stay as few as the backed-off timers
make them. While a call waits, a log line every ``progress_interval`` says whom the
switch waits for. A slot that gets no result within ``peer_timeout`` (minutes, as
gloo's timeout) ends the call with AggregationTimeout, naming them. After a
timeout or a mismatch the switch's slot state for this job is unknown (some
workers may have contributed, others not), so the transport refuses further
calls: reset the job's slots (``python -m innet_aggregation.switch_ctl reset job.toml``) and open
new sessions on every worker.

**Bounded time** (a job's ``deadline_ms``; off by default). A slot that has waited the
deadline since this worker's contribution asks the switch to release its round
(RELEASE, ``_release``): the switch sends what it holds to every worker as RELEASED,
with the bitmap of who is in it, and answers any later packet of that round with the
same bits (p4src/shared/deadline.p4). A worker that is not in a released round keeps
its blocks' values and adds them to the same blocks of the next call of the same
history key (``carry``): a gradient is applied one call late, never dropped, and AVG
still divides by the job's size. The session's start and parking never release.
A call spans many rounds of each slot, and a rank late for one is late for the next
ones too: once a round was released without some workers, every round goes out as a
QUORUM contribution naming how many workers the release held, and the switch releases
each the moment that many are in, so the deadline is waited once, not once a round,
until a released round has the missing workers in again (``follow_releases``; the
Tofino program counts a QUORUM as a plain contribution, so there the deadline is waited
each round). A late
worker takes the released results it finds queued as the others did (sorted by
round, ``_take_early``), and sends nothing for a round whose result it holds; the
others' lead is bounded by what it can hold: once a worker has been left out of
LEAD_LIMIT released rounds in a row, the others neither release nor send quorums
(``Transport.lead_ok``) until a round has every worker again, and a deadline job's
socket buffer holds twice that many results (``_lead_buffer``). A result lost on its
way to a late worker, of a round the switch no longer holds (its resends are stale
there), comes from the peers, who keep what they took (``repair.py``): a timer's
expiry asks them.
"""

from __future__ import annotations

import copy
import errno
import functools
import hashlib
import logging
import os
import secrets
import select
import socket
import time
from dataclasses import asdict, dataclass, fields

import numpy as np

from innet_aggregation.p4src.protocol import (EXPONENT_OF_ZERO, MSG_QUORUM, MSG_RELEASE,
                                              MSG_RELEASED, STALE_ROUNDS, MsgType,
                                              PacketFormat)

from . import quantize
from .batchio import BatchSocket
from .breakdown import Timing, timed
from .carry import Carry, history_key
from .fastpath import FastCall
from .repair import ASK_MAX, Repair

PKT_ID_MASK = 0xFFFFFFFF
FINGERPRINT_MASK = 0xFFFFFFFF
FINGERPRINT_STEP = 0x9E3779B1  # odd: the blocks of one call get distinct fingerprints
RECV_BATCH = 512              # results drained from the socket per system call
COALESCE_BATCH = 8            # fewer results than this per wake-up: wait for more
HISTORY_CALLS = 256           # calls whose exponents are remembered (DDP: its buckets)
SOCKET_BUFFER = 4 << 20       # bytes; a window's results arrive in bursts
IP_MTU_DISCOVER, IP_PMTUDISC_INTERFACE, IP_MTU = 10, 4, 14   # linux/in.h; not in Python's socket
SO_RCVBUFFORCE = 33           # asm-generic/socket.h: past rmem_max, with CAP_NET_ADMIN
TRANSIENT_ERRORS = frozenset({errno.ENOBUFS, errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})
SEND_TRIES = 3                # a non-transient send error this often in a row: the route's
START = "session start"       # the two rounds of ``Transport.start``, in messages
RECOVER = ("reset the job's slots (python -m innet_aggregation.switch_ctl reset <job.toml>) and open new "
           "sessions on every worker")
NONCE_BITS = 26               # |nonce| < 2**26: 32 workers' sum cannot saturate
IDLE_SEQ = np.iinfo(np.int64).max   # a slot without a packet in flight: sent after every other
# Released rounds in a row a worker may miss before the others wait for it again: what a
# late worker must hold, queued in its socket and then kept (``early``), to catch up. At
# 1,024 values a packet, about 8 MiB of results. Half the switch's stale window: with one
# slot every such round is a packet id of that slot, and a late worker's packet as many
# ids behind as STALE_ROUNDS would count as newer and restart its round there (the
# others' window in flight and the redone blocks stay within the other half).
LEAD_LIMIT = STALE_ROUNDS // 2
EARLY_ROUNDS = 1 << 16        # a released round this many ahead of its slot's is a duplicate
ABORT_POLL = 0.5              # seconds: a waiting call asks whether to give up this often

log = logging.getLogger("worker")


class AggregationTimeout(RuntimeError):
    """No result for some slots within ``peer_timeout``: a worker or the switch is gone.
    ``switch_answered``: the switch said whom it waits for (it is alive; a worker is
    slow or its results are lost), or not (it is gone, restarted or unreachable)."""

    def __init__(self, message: str, switch_answered: bool = False):
        super().__init__(message)
        self.switch_answered = switch_answered


class CallAborted(RuntimeError):
    """The call was given up on the caller's word (``Transport.abort``): the job's
    lease is lost, so the switch no longer serves it."""


class CallMismatch(RuntimeError):
    """The workers did not all issue the same call, or the slots held another
    session's sums: every worker raises it, on the first call where it happens."""


class TransportBroken(RuntimeError):
    """A previous call failed, so the switch's slot state for this job is unknown."""


class SendRefused(RuntimeError):
    """The kernel refuses the worker's packets to the switch, again at once after the
    socket's queued error was cleared: no retransmission can cure it."""


def call_fingerprints(epoch: int, call: int | str, elements: int, name: str | None,
                      blocks: int, signature: tuple = ()) -> np.ndarray:
    """Per block of a call, the 32-bit fingerprint it carries (as uint64): the same
    on every worker that issues this call in this session, unrelated otherwise.
    ``signature`` is the caller's (dtype name, shape): calls of one size but another
    shape or dtype differ, as torch's TORCH_DISTRIBUTED_DEBUG=DETAIL checks them."""
    digest = hashlib.blake2b(repr((epoch, call, elements, name, signature)).encode(),
                             digest_size=4)
    base = int.from_bytes(digest.digest(), "big")
    return (base + np.arange(blocks, dtype=np.uint64) * FINGERPRINT_STEP) & FINGERPRINT_MASK


def same_name(history: dict, name: str, num_blocks: int) -> np.ndarray | None:
    """For a named call of a size new to its name: the maxima the name last agreed on
    at another size, block by block from the start (``quantize.resized``); None for a
    new name. DDP rebuilds its buckets after the first step, and a rebuilt bucket
    mostly starts with the parameters its index's first one did (the demo's large
    model: bucket 0, 4,401 blocks, became 4,141 and a bucket 1 of 260; so predicted,
    720 of the 4,141 were redone in the second step instead of every non-zero one)."""
    for key in reversed(history):
        if key[0] == "named" and key[1] == name:
            return quantize.resized(history[key], num_blocks)
    return None


def _leading_bytes(records: np.ndarray, count: int) -> np.ndarray:
    """The first ``count`` bytes of every record, as one opaque (void) value each, a
    view whatever the records' stride: compared with one call per batch."""
    return records.view(_prefix(records.dtype.itemsize, count))["b"]


@functools.cache
def _prefix(itemsize: int, count: int) -> np.dtype:
    return np.dtype({"names": ["b"], "formats": [f"V{count}"], "offsets": [0],
                     "itemsize": itemsize})


@dataclass(frozen=True)
class RetransmitPolicy:
    """Timer settings, in seconds.

    Timeouts follow the measured round trips; ``min_rto`` is only an absolute floor
    under them (the adaptive floor is twice the smoothed round trip).
    ``initial_rto`` applies until the first round trip is measured. ``peer_timeout``
    bounds how long one packet may wait for its result, and so how long a call can
    wait for a dead worker or an unreachable switch: 30 minutes by default, torch's
    and gloo's, as a rank may be busy for minutes (a checkpoint) without being
    dead. ``switch_silence`` bounds how long a call may hear nothing from the switch
    (no result, no WAITING reply; a fallback's INA_SWITCH_TIMEOUT): the switch is
    gone, whereas WAITING replies say it is there, waiting for a slow peer.
    ``progress_interval`` is how often a waiting call logs whom it waits for.
    ``coalesce`` is the longest a wake-up that found only a few results waits for
    more (0: never)."""
    initial_rto: float = 0.2
    min_rto: float = 0.001
    max_rto: float = 2.0
    peer_timeout: float = 1800.0
    switch_silence: float = float("inf")
    coalesce: float = 0.0005
    progress_interval: float = 10.0

    def __post_init__(self):
        if not 0 < self.min_rto <= self.initial_rto <= self.max_rto:
            raise ValueError("need 0 < min_rto <= initial_rto <= max_rto")
        if self.peer_timeout <= 0 or self.progress_interval <= 0 or self.switch_silence <= 0:
            raise ValueError("peer_timeout, switch_silence and progress_interval must be "
                             "positive")
        if self.coalesce < 0:
            raise ValueError("coalesce must not be negative")


@dataclass
class Stats:
    """Counters; a session's totals, or one call's (the difference of two totals)."""
    packets_sent: int = 0
    bytes_sent: int = 0
    retransmissions: int = 0          # by timer or by loss detection
    fast_retransmissions: int = 0     # of which by loss detection (before the timer)
    redone: int = 0                   # blocks sent again with the agreed exponent
    results_received: int = 0
    fast_results: int = 0             # of which handled by the compiled fast path
    waiting_replies: int = 0          # the switch's WAITING answers: who has contributed
    duplicates_ignored: int = 0       # answering no packet in flight: duplicate, stale, foreign
    malformed_ignored: int = 0        # datagrams of the wrong length
    timeouts: int = 0
    socket_errors: int = 0            # failed sends/receives, repaired as losses
    releases: int = 0                 # RELEASE packets sent: a slot waited the job's deadline
    released: int = 0                 # results the switch released before every worker was in
    late: int = 0                     # of which this worker's contribution was not in
    carried_values: int = 0           # values carried into the next call of the same name
    repairs_asked: int = 0            # rounds asked of the peers (a timer expired under a deadline)

    def __sub__(self, other: "Stats") -> "Stats":
        return Stats(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                        for f in fields(self)})

    def copy(self) -> "Stats":
        return copy.copy(self)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class RtoEstimator:
    """Smoothed RTT and variance (RFC 6298), giving the retransmission timeout, and
    the minimum RTT (RACK's reordering window)."""

    GRANULARITY = 0.0001

    def __init__(self, policy: RetransmitPolicy):
        self.policy = policy
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.min_rtt = float("inf")
        self.rto = policy.initial_rto
        self._backed_off_at = -float("inf")

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.min_rtt = min(self.min_rtt, rtt)
        rto = self.srtt + max(self.GRANULARITY, 4 * self.rttvar)
        floor = max(self.policy.min_rto, 2 * self.srtt)
        self.rto = min(max(rto, floor), self.policy.max_rto)

    def timed_out(self, now: float) -> None:
        """Double the timeout (RFC 6298 5.5) until a fresh sample resets it: with
        Karn's rule, a timeout below the real RTT would otherwise never get a sample
        to grow from. Once per timeout period, as many slots time out together."""
        if now - self._backed_off_at >= self.rto:
            self.rto = min(2 * self.rto, self.policy.max_rto)
            self._backed_off_at = now

    @property
    def reorder_window(self) -> float:
        """RACK's allowance for results that are only reordered, not lost."""
        return self.min_rtt / 4 if self.min_rtt < float("inf") else self.rto


class Transport:
    """Owns the worker's UDP socket, the slot window, the timers of one job, the
    session's epoch and call count, and the exponent history that speculation
    predicts from. ``local_workers`` are the ids of the workers at this worker's
    switch (all of them, but in a tree: the leaf's), whose bits WAITING replies
    carry."""

    def __init__(self, fmt: PacketFormat, *, job_id: int, worker_id: int, num_workers: int,
                 switch_ip: str, job_udp_port: int, local_ip: str, local_port: int,
                 first_slot: int, num_slots: int, local_workers=None,
                 policy: RetransmitPolicy = RetransmitPolicy(), fast_path: bool = True,
                 deadline: float = 0.0, carry: Carry | None = None,
                 peers: list[tuple[str, int]] = ()):
        if not 1 <= num_slots <= fmt.pool_size or not 0 <= first_slot <= fmt.pool_size - num_slots:
            raise ValueError(f"slots [{first_slot}, {first_slot + num_slots}) are not within the "
                             f"pool of {fmt.pool_size}")
        self.fmt = fmt
        self.job_id = job_id
        self.worker_id = worker_id
        self.num_workers = num_workers
        local = range(num_workers) if local_workers is None else local_workers
        self.local_mask = sum(1 << w for w in local)
        self.local_count = len(local)
        self.first_slot = first_slot
        self.num_slots = num_slots
        self.policy = policy
        if deadline < 0:
            raise ValueError(f"the deadline must not be negative, not {deadline}")
        # The job's deadline (seconds, 0: none): a slot that has waited it since this
        # worker's contribution asks the switch to release the round (``_release``).
        self.deadline = deadline
        # Released results are handled in Python only.
        self.fast_path = fast_path and not deadline   # False: every result through Python
        # This worker's blocks a release left out, per call key, added into the same
        # blocks of the next call of that key (``aggregate``): the session's, so they
        # outlive this transport (carry.py).
        self.carry = Carry() if carry is None else carry
        # Released rounds not reached yet (``_Call._keep_early``): the packets, and
        # each one's window slot and packet id.
        self.early: list[np.ndarray] = []
        self.early_slot = np.zeros(0, dtype=np.int64)
        self.early_id = np.zeros(0, dtype=np.int64)
        # Per worker, the released rounds in a row it was left out of (``lead_ok``).
        self.left_out = np.zeros(num_workers, dtype=np.int64)
        # Since a round was released without some workers (``awaited``, a bitmap) and
        # until a released round has them all again: the quorum every round asks for.
        self.quorum = 0
        self.awaited = 0
        self.rto = RtoEstimator(policy)
        self.stats = Stats()
        self.timing = Timing()          # seconds per phase (breakdown.py)
        self.waits = (None, ())         # the last call's (first result after, ranks waited for)
        self.next_set = np.zeros(num_slots, dtype=np.int64)
        self.next_pkt_id = np.zeros(num_slots, dtype=np.int64)
        self.history: dict[tuple, np.ndarray] = {}  # history_key -> its last agreed maxima (quantize.remember)
        self.epoch: int | None = None               # set by start()
        self.calls = 0                              # calls issued, the empty ones included
        self.broken: BaseException | None = None
        # Per block of the last call, who was in its final round (a bitmap), if a round
        # was released; None: everyone in every block (fallback.py hands it to a laggard).
        self.last_members: np.ndarray | None = None
        self.label = ""                             # the call running, for errors
        # Asked on every timer wake-up (at most ``max_rto`` apart): a reason to give
        # up the call now (the job's lease is lost), or None.
        self.abort = lambda: None
        # One packet per slot, rewritten when the slot takes its next chunk; a
        # retransmission resends the row as it is.
        self.tx = fmt.pack(count=num_slots, msg_type=int(MsgType.CONTRIBUTION), job_id=job_id)
        # The fields a send rewrites, as views made once (a field lookup costs a call).
        self.set_slot_word = fmt.word("set")
        self.tx_type, self.tx_set_slot, self.tx_pkt_id, self.tx_exponent, self.tx_fingerprint, \
            self.tx_contributions, self.tx_values = (
                self.tx[f] for f in ("msg_type", self.set_slot_word, "pkt_id", "exponent",
                                     "fingerprint", "contributions", "values"))
        # Per set (rows) and slot (columns), the word holding both, as sent.
        words = np.zeros(2 * num_slots, dtype=fmt.header_dtype)
        fmt.write_header(words, set=np.repeat([0, 1], num_slots),
                         slot=first_slot + np.tile(np.arange(num_slots), 2))
        self.set_slot_words = words[self.set_slot_word].reshape(2, num_slots)
        # A result echoes its packet's header up to the packet id (the type aside).
        self.type_offset = fmt.dtype.fields["msg_type"][1]
        self.identity_bytes = fmt.dtype.fields["pkt_id"][1] + fmt.dtype["pkt_id"].itemsize
        self.tx_identity = _leading_bytes(self.tx, self.identity_bytes)
        # Received datagrams, one a row, rows 64-byte aligned and longer than a packet
        # (a longer datagram shows as the wrong length); results are read in place.
        row = (fmt.payload_bytes // 64 + 1) * 64
        self.rx = np.zeros((RECV_BATCH, row), dtype=np.uint8)
        self.rx_packets = np.ndarray((RECV_BATCH,), dtype=fmt.dtype, buffer=self.rx,
                                     strides=(row,))
        self.no_headers = np.zeros(0, dtype=fmt.header_dtype)
        self.work = np.empty((num_slots, fmt.values_per_packet), dtype=np.float32)  # quantizing
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                self.sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            if deadline:
                self._lead_buffer()
            self.sock.bind((local_ip, local_port))
            # Connected: the kernel delivers only the switch's results for this job.
            self.sock.connect((switch_ip, job_udp_port))
            # Never fragmented (the switch parses whole packets): the kernel refuses a
            # packet larger than the interface's MTU (EMSGSIZE), and a route whose MTU
            # is smaller is refused here, naming both sizes. The frame is the program's,
            # so path-MTU updates (ICMP "fragmentation needed", which anyone on the
            # segment can forge) are ignored, not obeyed by failing every send.
            self.sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_INTERFACE)
            mtu = self.sock.getsockopt(socket.IPPROTO_IP, IP_MTU)
            if mtu < fmt.ip_bytes:
                raise ValueError(
                    f"the program's packets ({fmt.values_per_packet} values) need an MTU of "
                    f"{fmt.ip_bytes} B; the route to {switch_ip} has {mtu} B")
        except (OSError, ValueError):
            self.sock.close()
            raise
        self.io = BatchSocket(self.sock, self.tx, self.rx)
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        # A deadline job's results lost on the way to this worker, from its peers
        # (``peers``: the others' address and job port; repair.py).
        self.repair = None
        if deadline and peers:
            try:
                self.repair = Repair(fmt, job_id, local_ip, local_port, list(peers),
                                     kept=2 * LEAD_LIMIT)
            except OSError:
                self.sock.close()
                raise
            self._poll.register(self.repair.ask_sock, select.POLLIN)

    def close(self) -> None:
        if self.repair is not None:
            self.repair.close()
        self.sock.close()

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise TransportBroken(
                f"an earlier aggregation failed, so the switch's slot state for this job is "
                f"unknown: {RECOVER}") from self.broken

    def _run(self, call: "_Call") -> tuple[np.ndarray, np.ndarray]:
        self.label = call.label
        try:
            return call.run()
        except BaseException as exc:
            self.broken = exc
            raise

    # -- the session's start -------------------------------------------------------
    def start(self) -> None:
        """Agree on the session's epoch with the other workers, and make sure that the
        job's slots hold no other session's state (see the module's docstring); once,
        before the first call that sends. Collective: every worker's start waits for
        all of theirs."""
        if self.epoch is not None:
            return
        self._check_usable()
        w, k = self.num_slots, self.fmt.values_per_packet
        slots = np.arange(w)
        blank = np.full(w, EXPONENT_OF_ZERO, dtype=np.int64)
        values = np.zeros((w, k), dtype=np.int32)
        lane = self.worker_id % k
        nonces = np.array([secrets.randbelow(2 << NONCE_BITS) - (1 << NONCE_BITS)
                           for _ in range(w)], dtype=np.int32)
        values[:, lane] = nonces
        sums = np.zeros((w, k), dtype=np.int32)
        self._run(_Call(self, quantize.Blocks(values.reshape(-1), k),
                        quantize.Blocks(sums.reshape(-1), k), blank, blank, slots=slots,
                        label=START, fingerprints=call_fingerprints(0, 0, 0, START, w)))
        # Lanes are shared only if the workers outnumber the values of a packet.
        stale = np.flatnonzero(sums[:, lane] != nonces) if self.num_workers <= k else []
        if len(stale):
            self.broken = CallMismatch(_stale(self, START, int(stale[0]),
                                              "its sum lacks this worker's contribution"))
            raise self.broken
        self.epoch = int.from_bytes(hashlib.blake2b(sums.tobytes(), digest_size=8).digest(),
                                    "big")
        if self.deadline:
            self._check_deadline()
        # Packet ids from here on are the epoch's: a result of another session still
        # on its way matches none of them.
        self.next_pkt_id = (self.next_pkt_id + (self.epoch & PKT_ID_MASK)) & PKT_ID_MASK

    def _check_deadline(self) -> None:
        """A deadline shorter than the round trip to the switch would release every
        round before the others' contributions could be in: refused, naming both. The
        round trip is the start's first slot resent: finished, the switch answers it at
        once (the start's own results waited for every worker)."""
        # Slot 0's packet as its result echoes it: the type byte set to RESULT.
        echo = np.frombuffer(self.tx_identity[:1].tobytes(), dtype=np.uint8).copy()
        echo[self.type_offset] = int(MsgType.RESULT)
        echo = echo.view(self.tx_identity.dtype)[0]
        rtt = None
        for _ in range(3):                  # a lost answer: try again
            sent_at = time.monotonic()
            self.send(np.zeros(1, dtype=np.int64))
            while rtt is None and (left := sent_at + max(4 * self.deadline, 1.0)
                                   - time.monotonic()) > 0:
                if self._poll.poll(left * 1000.0):
                    packets, _, _ = self.receive()
                    if (_leading_bytes(packets, self.identity_bytes) == echo).any():
                        rtt = time.monotonic() - sent_at
            if rtt is not None:
                break
        if rtt is None:
            log.warning("job %d, worker %d: no round trip to the switch measured in 3 tries; "
                        "the deadline (%.1f ms) is not checked against it",
                        self.job_id, self.worker_id, 1000 * self.deadline)
        elif rtt >= self.deadline:
            self.broken = ValueError(
                f"job {self.job_id}: its deadline_ms, {1000 * self.deadline:g} ms, is below the "
                f"round trip to the switch measured at worker {self.worker_id}'s start, "
                f"{1000 * rtt:.1f} ms: every round would be released before the others' "
                f"contributions could be in; give the job a longer deadline")
            raise self.broken

    def park(self) -> None:
        """Bring every slot to the same place in its set sequence (next set 0), with
        one empty round in the slots that need it, so that the next session's start,
        which uses set 0 everywhere, finds it empty. Collective, like a call: every
        worker parks, when it closes its session."""
        odd = np.flatnonzero(self.next_set)
        if not odd.size or self.broken is not None:
            return
        k = self.fmt.values_per_packet
        empty = quantize.Blocks(np.zeros(odd.size * k, dtype=np.int32), k)
        zero = np.full(odd.size, EXPONENT_OF_ZERO, dtype=np.int64)
        self._run(_Call(self, empty, empty, zero, zero, slots=odd, label="park",
                        fingerprints=call_fingerprints(self.epoch, "park", 0, None, odd.size)))

    # -- one call ------------------------------------------------------------------
    def aggregate(self, blocks: quantize.Blocks, own: np.ndarray, out: quantize.Blocks, *,
                  key: tuple, average: bool, name: str | None = None,
                  signature: tuple = ()) -> np.ndarray:
        """Sum (``average``: the mean of) float32 ``blocks`` over the job's workers into
        ``out`` (any float dtype; ``blocks`` itself to work in place): each block is
        dequantized there as soon as its result is final, from the received packet.

        ``own`` are this worker's block exponents; the size and ``name`` (the
        caller's, if any) go into the call's fingerprint with its number and the
        caller's ``signature`` (dtype name, shape); ``key`` (``Carry.key``) chooses its
        exponent history and its carry. Returns the scale exponent
        each block was quantized with (``POISON_EXPONENT`` for a block some worker
        could not carry)."""
        self._check_usable()
        k = self.fmt.values_per_packet
        if blocks.whole.shape[1] != k or out.whole.shape[1] != k or len(out) != len(blocks):
            raise ValueError(f"blocks and out must be as many blocks of {k} values")
        self.calls += 1
        self.last_members = None
        n, elements = len(blocks), blocks.flat.size
        if not n:
            return np.zeros(0, np.int64)
        self.start()
        place = key[2] if name is None else 0
        previous = self.history.get(key)
        if previous is None and name is None and place:
            # A place of a run seen for the first time: the call before it, the same size.
            previous = self.history.get(history_key(None, elements, place - 1))
        if previous is None and name is not None:
            previous = same_name(self.history, name, n)
        label = f"call {self.calls} ({elements} elements" + (f", {name!r})" if name else ")")
        fingerprints = call_fingerprints(self.epoch, self.calls, elements, name, n, signature)
        if (taken := self.carry.take(key)) is not None:
            own = _add_carried(blocks, own, *taken)
        call = _Call(self, blocks, out, own, quantize.speculate(previous, n), label=label,
                     fingerprints=fingerprints, quantized=True, average=average,
                     signature=signature)
        try:
            scale, agreed = self._run(call)
        except BaseException:
            if taken is not None:   # owed again: the call is redone elsewhere, or never
                self.carry.restore(key, *taken)
            raise
        self.waits = call.waits()
        self.last_members = call.members
        if call.carried:
            chunks = np.concatenate([c for c, _ in call.carried])
            self.carry.keep(key, chunks, np.concatenate([v for _, v in call.carried]))
            whole = int(np.count_nonzero(chunks < len(blocks.whole)))
            self.stats.carried_values += (whole * blocks.whole.shape[1] + (len(chunks) - whole)
                                          * (blocks.flat.size - blocks.whole.size))
        # Most recent last; the oldest call goes first.
        self.history[key] = quantize.remember(agreed, self.history.pop(key, None))
        if len(self.history) > HISTORY_CALLS:
            del self.history[next(iter(self.history))]
        return scale

    @timed("send")
    def send(self, slots: np.ndarray, failed: int = 0) -> int:
        """Send the slots' packets in one batch (``failed``: the fast path's send of
        them just failed with this errno). A transient failure (a full buffer) loses
        the rest, for the timers to repair. Any other is first taken for an error
        queued on the socket (an ICMP error, forged or not: reported once), and the
        rest resent at once; failing ``SEND_TRIES`` times in a row, with GSO and
        without, it is the route's, and ends the call (SendRefused)."""
        sent, err = (0, failed) if failed else self.io.send(slots)
        tries = 1
        while err and err not in TRANSIENT_ERRORS:
            self.stats.socket_errors += 1
            if tries == SEND_TRIES:
                if self.io.gso == 1:
                    raise SendRefused(self._refused(err))
                self.io.no_gso(err)       # a segmented message's EINVAL hides the errno
                tries = 0
            self.io.clear_error()
            more, err = self.io.send(slots[sent:])
            sent += more
            tries = 1 if more else tries + 1
        if err:
            self.stats.socket_errors += 1
        self.stats.packets_sent += sent
        self.stats.bytes_sent += sent * self.fmt.payload_bytes
        return sent

    def _refused(self, err: int) -> str:
        host, port = self.sock.getpeername()
        return (f"job {self.job_id}, worker {self.worker_id}, {self.label}: sending to "
                f"{host}:{port} fails with {errno.errorcode.get(err, err)} ({os.strerror(err)}) "
                f"{SEND_TRIES} times in a row: the kernel refuses this worker's "
                f"{self.fmt.ip_bytes} B packets to the switch (EMSGSIZE: an interface MTU "
                f"below that; ENETUNREACH: no route; EPERM: a firewall), which no retransmission "
                f"cures. The switch's slot state for this job is now unknown: {RECOVER}")

    def _lead_buffer(self) -> None:
        """A deadline job's socket holds 2 LEAD_LIMIT results, what this worker gets while
        it is late (asleep, descheduled) before the others wait for it, if it may
        (beyond net.core.rmem_max only as root, SO_RCVBUFFORCE). A result lost to a
        full buffer is one the switch may no longer hold, but the peers do, as many
        (``Repair``'s ring): short of it, the late worker asks them for what it lost,
        a request's ASK_MAX rounds per timer expiry, which costs time, not values."""
        # What the kernel charges a datagram: its buffer, a power of two, and the skb.
        charged = (1 << (self.fmt.payload_bytes + 512).bit_length()) + 256
        # Twice the limit: the others stop once they see it, with a window in flight each.
        want = max(2 * LEAD_LIMIT * charged, 2 * SOCKET_BUFFER)
        for option in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, option, want // 2)  # the kernel doubles it
                break
            except PermissionError:
                continue
        got = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        if got < want:
            log.info("job %d, worker %d: the socket holds %d bytes of results, not the %d "
                     "a worker late by %d released rounds gets (raise net.core.rmem_max, or "
                     "run as root): results lost there are asked of the peers",
                     self.job_id, self.worker_id, got, want, LEAD_LIMIT)

    def follow_releases(self, bitmaps: np.ndarray, counts: np.ndarray) -> None:
        """Released rounds (who is in each, how many), in the order taken: the first one
        without some workers starts the quorum, a later one with fewer in (a deadline
        hit again) lowers it and awaits those too, and one with every awaited worker in
        ends it: the late workers are back, and rounds wait for everyone again."""
        if self.quorum and not (((bitmaps & self.awaited) == self.awaited)
                                | (counts < self.quorum)).any():
            return                      # the common batch: the awaited still out
        everyone = (1 << self.num_workers) - 1
        for bitmap, count in zip(bitmaps.tolist(), counts.tolist()):
            if self.quorum and bitmap & self.awaited == self.awaited:
                self.quorum = self.awaited = 0
            elif not self.quorum or count < self.quorum:
                self.quorum = count
                self.awaited |= everyone & ~bitmap

    def lead_ok(self) -> bool:
        """Whether every worker can still catch up: none has been left out of LEAD_LIMIT
        released rounds in a row. Every worker sees the same released rounds, so all
        stop releasing about together, and wait for the late one."""
        return bool(self.left_out.max() < LEAD_LIMIT)

    @timed("receive")
    def receive(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The datagrams queued now (at most RECV_BATCH): the well-formed results as
        packets (a view of the receive buffer, valid until the next receive, when
        nothing else came with them), the WAITING-sized ones as headers, and how many
        datagrams were read."""
        lengths, err = self.io.receive()
        if err:
            self.stats.socket_errors += 1
        return (*self.sort(lengths), len(lengths))

    def sort(self, lengths: np.ndarray, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The received rows from ``first`` on (``lengths`` long): the well-formed
        results and the WAITING headers; anything else counted as malformed."""
        fmt = self.fmt
        rows = slice(first, first + len(lengths))
        whole = lengths == fmt.payload_bytes
        packets = self.rx_packets[rows]
        if np.count_nonzero(whole) == len(lengths):        # the common case: results only
            return packets, self.no_headers
        short = lengths == fmt.header_bytes
        self.stats.malformed_ignored += int(len(lengths) - whole.sum() - short.sum())
        packets = packets[whole]
        headers = (np.ascontiguousarray(self.rx[rows][short, :fmt.header_bytes])
                   .view(fmt.header_dtype).reshape(-1) if short.any() else self.no_headers)
        return packets, headers


class _Call:
    """The state of one call: per chunk its scale and fingerprint, per slot the
    chunk in flight, its timing and what the switch last said it waits for.
    ``slots`` (the session's start, parking) puts chunk i alone in slot ``slots[i]``.
    ``quantized``: ``blocks`` are floats, quantized and redone as the results say,
    and a final result is dequantized (``average``: the mean) into ``out``;
    otherwise int32 values sent as they are, each result final and stored in
    ``out`` as it is. ``fingerprints``: per chunk, what its packets carry, and its
    result n times; ``signature``, the caller's (dtype, shape) in them, is named
    where they differ."""

    def __init__(self, transport: Transport, blocks: quantize.Blocks, out: quantize.Blocks,
                 own: np.ndarray, scale: np.ndarray, *, label: str, fingerprints: np.ndarray,
                 slots: np.ndarray | None = None, quantized: bool = False,
                 average: bool = False, signature: tuple = ()):
        t = self.t = transport
        self.timing = t.timing
        w = t.num_slots
        self.blocks = blocks
        self.out = out
        self.own = np.asarray(own, dtype=np.int64)
        self.scale = np.array(scale, dtype=np.int64)
        self.label = label
        self.signature = signature
        self.quantized = quantized
        self.average = average
        n = self.n = len(blocks)
        # As the packets hold them (big-endian 32 bits): copied and compared as they are.
        self.fingerprints = fingerprints.astype(">u4")
        self.expected = ((fingerprints * np.uint64(t.num_workers))
                         & np.uint64(FINGERPRINT_MASK)).astype(">u4")
        self.agreed = np.full(n, EXPONENT_OF_ZERO, dtype=np.int64)
        # Per slot of the window: the chunk in flight (-1: none) and its timing.
        self.chunk = np.full(w, -1, dtype=np.int64)
        if slots is None:
            self.step = w
            first = np.arange(min(n, w))
            self.chunk[first] = first
        else:
            self.step = n                    # one chunk per slot, nothing after it
            self.chunk[slots] = np.arange(n)
        # A slot without a packet in flight was sent at +inf (IDLE_SEQ): it is never
        # due, nor behind an answered one, with no mask of the waiting slots.
        self.in_flight = int(np.count_nonzero(self.chunk >= 0))
        self.sent_at = np.full(w, np.inf)
        self.first_sent_at = np.full(w, np.inf)
        self.retries = np.zeros(w, dtype=np.int64)     # timer expiries, for the error message
        self.resent = np.zeros(w, dtype=bool)          # Karn: no RTT sample
        self.started = time.monotonic()
        self.progress_at = -np.inf      # when the call last got an answer
        self.first_result = np.inf      # when it got its first
        self.missing = 0                # the workers the switch last said it waited for
        self.heard_at = self.started    # when the switch last said anything (a WAITING reply)
        self.logged_at = self.started   # when it last logged whom it waits for
        # The switch's last WAITING reply per slot: the bitmap of who had contributed.
        self.told = np.zeros(w, dtype=bool)
        self.contributors = np.zeros(w, dtype=np.int64)
        self.expect = np.zeros((w, t.identity_bytes), dtype=np.uint8)   # see _on_results
        self.expect_id = self.expect.view(f"V{t.identity_bytes}")[:, 0]  # as one value each
        # RACK orders packets by when they were sent; a batch goes out in order, so
        # a send sequence number, not a timestamp, tells its packets apart.
        self.sent_seq = np.full(w, IDLE_SEQ, dtype=np.int64)
        self.ramp = np.arange(w)
        self.next_seq = 0
        self.rack_seq = -1              # the newest packet answered
        self.rack_rtt = 0.0
        # The job's deadline, for the calls of the caller (quantized: the session's
        # start and parking need every worker), and the slots whose RELEASE went out.
        self.deadline = t.deadline if quantized else 0.0
        self.releasing = np.zeros(w, dtype=bool)
        # While results are being taken in a batch, the next chunks wait to be sent
        # (``_flush``): a late worker sends nothing for a round whose result it holds.
        self.deferring = False
        self.unsent = np.zeros(w, dtype=bool)
        self.carried: list[tuple[np.ndarray, np.ndarray]] = []   # (chunks, own values) left out
        self.members: np.ndarray | None = None   # per chunk, who is in its last round (released)
        self.fast = FastCall.bind(self)  # the common results in C, if it handles this call

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        """Aggregate every chunk; returns per chunk its scale and the agreed maximum."""
        t = self.t
        loaded = np.flatnonzero(self.chunk >= 0)
        self.deferring = bool(self.deadline and t.early)   # results that came before this call
        self._load(loaded, self.chunk[loaded], time.monotonic())
        if self.deferring:
            self._flush(time.monotonic())
        # The earliest timer or RACK deadline; recomputed only when the state changed,
        # and nothing to recover before it (most wake-ups: results, no loss).
        wake = self._next_wakeup()
        while self.in_flight:
            if self.fast is not None:
                with self.timing.region("compiled"):
                    packets, headers, wake = self.fast.run(wake, COALESCE_BATCH)
                if len(packets):
                    self._on_results(packets)
                if len(headers):
                    self._on_waiting(headers)
                if len(packets) or len(headers):
                    wake = self._next_wakeup()
                    continue                # drain the rest before any timer
            elif (wait := wake - time.monotonic()) <= 0 or self._poll(wait):
                # Drain the socket first: after a stall, answers queued behind the
                # first batch must not look lost.
                drained = 0
                self.deferring = bool(self.deadline)
                while True:
                    packets, headers, datagrams = t.receive()
                    drained += datagrams
                    if len(packets):
                        self._on_results(packets)
                    if len(headers):
                        self._on_waiting(headers)
                    if datagrams < RECV_BATCH:
                        break
                if t.repair is not None and len(repaired := t.repair.receive()):
                    drained += len(repaired)
                    self._on_results(repaired)
                if self.deferring:
                    self._flush(time.monotonic())
                if drained:
                    wake = self._next_wakeup()
                    if drained < COALESCE_BATCH and self.in_flight:
                        self._coalesce(wake)
            now = time.monotonic()
            if now >= wake:
                self._recover(now)
                wake = self._next_wakeup()
            if now - max(self.progress_at, self.logged_at) >= t.policy.progress_interval:
                self.logged_at = now
                log.warning("%s", self._waiting_line(now))
        return self.scale, self.agreed

    def waits(self) -> tuple[float | None, tuple[int, ...]]:
        """For the breakdown: seconds from the call's start to its first result (None:
        it had none), and the workers the switch said it waited for."""
        first = self.first_result - self.started if np.isfinite(self.first_result) else None
        return first, tuple(w for w in range(self.missing.bit_length()) if self.missing >> w & 1)

    def _flush(self, now: float) -> None:
        """The end of a batch of results: the released rounds kept earlier that are now
        due are taken (``_take_early``), then the chunks loaded meanwhile sent."""
        t = self.t
        if len(t.early_id) and ((t.early_id == t.tx_pkt_id[t.early_slot].astype(np.int64))
                                & (self.chunk[t.early_slot] >= 0)).any():
            self._take_early(now)
        self.deferring = False
        send = np.flatnonzero(self.unsent & (self.chunk >= 0))
        self.unsent[:] = False
        if send.size:
            self.resent[send] = False     # its first transmission
            self._transmit(send, now)

    def _take_early(self, now: float) -> None:
        """The released rounds kept for later, in round order (a late worker finds many
        rounds of each slot): a group a round ahead of the last is due once the last
        is taken; what is still ahead is kept again."""
        t = self.t
        early = np.empty(len(t.early_id), dtype=t.fmt.dtype)   # without out=, native order
        np.concatenate(t.early, out=early)
        ahead = (t.early_id - t.tx_pkt_id[t.early_slot].astype(np.int64)) & PKT_ID_MASK
        t.early, t.early_slot, t.early_id = [], t.early_slot[:0], t.early_id[:0]
        order = np.argsort(ahead, kind="stable")
        early, ahead = early[order], ahead[order]
        for group in np.split(early, np.flatnonzero(np.diff(ahead)) + 1):
            self._on_released(group, now)

    @timed("wait")
    def _poll(self, seconds: float) -> bool:
        """Whether a datagram came within ``seconds``."""
        return bool(self.t._poll.poll(max(seconds * 1000.0, 0.0)))

    @timed("wait")
    def _coalesce(self, wake: float) -> None:
        """Results trickling in at the links' pace would wake this thread once each,
        at a cost in Python that, on a host shared by several workers and a
        software switch, outweighs the wait: let a few gather first (as a NIC's
        interrupt moderation does), never past a timer (``wake``)."""
        pause = min(self.t.policy.coalesce, wake - time.monotonic())
        if pause > 0:
            time.sleep(pause)

    @timed("quantize")
    def _load(self, slots: np.ndarray, chunks: np.ndarray, now: float) -> None:
        """Put each slot's chunk (``chunks``) in its packet, quantized (in a scratch
        that stays in the cache, then once into the packets), and send them all."""
        if not slots.size:
            return
        t = self.t
        sets = t.next_set[slots]
        ids = t.next_pkt_id[slots]
        own = self.own[chunks]
        t.next_set[slots] = sets ^ 1
        t.next_pkt_id[slots] = (ids + 1) & PKT_ID_MASK
        t.tx_set_slot[slots] = t.set_slot_words[sets, slots]
        t.tx_pkt_id[slots] = ids
        t.tx_exponent[slots] = own
        t.tx_fingerprint[slots] = self.fingerprints[chunks]
        # A QUORUM names its quorum; a contribution asks for nothing (see _recover).
        quorum = t.quorum if t.quorum and t.lead_ok() else 0
        t.tx_contributions[slots] = quorum
        t.tx_type[slots] = MSG_QUORUM if quorum else int(MsgType.CONTRIBUTION)
        self.releasing[slots] = False
        self.expect_id[slots] = t.tx_identity[slots]
        self.expect[slots, t.type_offset] = int(MsgType.RESULT)
        blocks = self.blocks.rows(chunks)
        if self.quantized:
            blocks = quantize.quantize(blocks, own, self.scale[chunks], t.num_workers,
                                       out=t.work[:len(slots)])
        t.tx_values[slots] = blocks
        self.first_sent_at[slots] = now
        self.retries[slots] = 0
        self.resent[slots] = False
        self.told[slots] = False
        if self.deferring:
            self.unsent[slots] = True
            self.resent[slots] = True     # answered before it goes out: no RTT sample
        else:
            self._transmit(slots, now)

    def _transmit(self, slots: np.ndarray, now: float) -> int:
        """Send the slots' packets and arm their timers; what failed to go out is
        lost, and the timers repair it."""
        sent = self.t.send(slots)
        self.sent_at[slots] = now
        self.sent_seq[slots] = self.next_seq + self.ramp[:len(slots)]
        self.next_seq += len(slots)
        return sent

    def _idle(self, slots: np.ndarray) -> None:
        """The slots' last chunk is final: nothing in flight there any more."""
        self.chunk[slots] = -1
        self.sent_at[slots] = np.inf
        self.first_sent_at[slots] = np.inf
        self.sent_seq[slots] = IDLE_SEQ
        self.in_flight -= len(slots)

    def _due(self) -> np.ndarray:
        """When each slot's timer expires: the timeout (backed off by ``timed_out``) after
        its last send or after the call's last answer, whichever is later (RFC 6298
        5.3 restarts the timer on every answer: a packet that waits behind a burst
        queued at a slow link is not lost while answers keep coming; RACK finds
        the ones that are), never past ``peer_timeout``."""
        t = self.t
        start = np.maximum(self.sent_at, self.progress_at)
        return np.minimum(start + t.rto.rto,
                          self.first_sent_at + t.policy.peer_timeout)

    def _next_wakeup(self) -> float:
        """The earliest ``_due`` (the same sum on the earliest times: rounding is
        monotonic) or RACK deadline, and at most ``ABORT_POLL`` away, so a waiting call
        asks ``Transport.abort`` that often: before it, ``_recover`` has nothing to do."""
        return min(self._timers(), time.monotonic() + ABORT_POLL)

    def _timers(self) -> float:
        if self.fast is not None:
            return self.fast.next_wakeup()
        t = self.t
        wake = min(max(self.sent_at.min(), self.progress_at) + t.rto.rto,
                   self.first_sent_at.min() + t.policy.peer_timeout)
        if self.sent_seq.min() < self.rack_seq:       # a packet behind an answered one
            behind = self.sent_seq < self.rack_seq
            wake = min(wake, self.sent_at[behind].min() + self.rack_rtt
                       + t.rto.reorder_window)
        if self.deadline and not self.releasing.all() and t.lead_ok():
            wake = min(wake, self.first_sent_at[~self.releasing].min() + self.deadline)
        return wake

    def _answers(self, records: np.ndarray, kind: MsgType) -> tuple[np.ndarray, np.ndarray]:
        """Which of the datagrams answer a slot's packet in flight (type ``kind``,
        and the packet's identity bytes: job, set and slot, packet id), and the
        window slot each names (clipped into the window: a slot outside it has
        other identity bytes than the one it is clipped to)."""
        t = self.t
        slot = t.fmt.unpack(records, ("slot",))["slot"] - t.first_slot
        ident = _leading_bytes(records, t.identity_bytes)
        ok = self.chunk.take(slot, mode="clip") >= 0
        if kind != MsgType.RESULT:        # ``expect`` holds a result's type byte
            # A copy (ascontiguousarray would give a lone record's own bytes back, and
            # the type written below would turn a kept RELEASED into a RESULT).
            raw = np.array(ident).view(np.uint8).reshape(len(records), -1)
            ok &= raw[:, t.type_offset] == int(kind)
            raw[:, t.type_offset] = int(MsgType.RESULT)
            ident = raw.view(ident.dtype)[:, 0]
        return ok & (ident == self.expect_id.take(slot, mode="clip")), slot

    @timed("results")
    def _on_results(self, packets: np.ndarray) -> None:
        t = self.t
        now = time.monotonic()
        if self.fast is not None:         # the common results at the batch's head
            handled = self.fast.results(packets, now)
            if handled == len(packets):
                return
            packets = packets[handled:]
        if t.deadline:
            released = packets["msg_type"] == MSG_RELEASED
            if released.any():
                self._on_released(packets[released], now)
                packets = packets[~released]
        match, slot = self._answers(packets, MsgType.RESULT)
        match &= packets["contributions"] == t.num_workers
        index, s = self._once(match, slot)
        t.stats.duplicates_ignored += len(packets) - len(index)
        if not len(index):
            return
        # Ascending: as many as the datagrams is all of them, read without a gather.
        rows = slice(None) if len(index) == len(packets) else index
        chunks = self.chunk[s]
        got = packets["fingerprint"][rows]
        wrong = got != self.expected[chunks]
        if wrong.any():
            first = int(np.argmax(wrong))
            self._mismatch(int(chunks[first]), int(got[first]))
        t.stats.results_received += len(index)
        t.left_out[:] = 0                 # a whole result: every worker is in
        if self.members is not None:
            self.members[chunks] = (1 << t.num_workers) - 1
        t.quorum = t.awaited = 0
        self._measure(s, now)
        self._settle(packets, rows, index, s, chunks, now)

    @staticmethod
    def _once(match: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The matching datagrams and their slots, a slot's first only: a result twice
        in one batch (resent by the switch) counts once; arrival order is kept, so
        every worker sends its next packets in the same order."""
        index = match.nonzero()[0]
        s = slot[index]
        if len(s) > 1 and np.bincount(s).max() > 1:
            first = np.sort(np.unique(s, return_index=True)[1])
            index, s = index[first], s[first]
        return index, s

    def _on_released(self, packets: np.ndarray, now: float) -> None:
        """Rounds the switch released at the job's deadline (RELEASED: what it held,
        ``contributions`` of them, and in the fingerprint's place the bitmap of who is
        in it). Every worker gets the same packet, the late ones too, and takes it as a
        result; a worker that is not in it keeps its blocks' values for the next call
        of the same name (``carried``). A late worker finds several rounds of a slot
        queued at once: each pass takes a slot's next one. The bitmap replaces the
        call check's sum, so it is checked for what it can say: as many bits as
        contributions, all of them the job's workers."""
        t = self.t
        while len(packets):
            match, slot = self._answers(packets, MSG_RELEASED)
            index, s = self._once(match, slot)
            if not len(index):
                break
            chunks = self.chunk[s]
            bitmap = packets["fingerprint"][index].astype(np.int64)
            count = packets["contributions"][index].astype(np.int64)
            bits = np.unpackbits(bitmap.astype(">u4").view(np.uint8).reshape(-1, 4),
                                 axis=1).sum(axis=1)
            bad = (bits != count) | (count == 0) | ((bitmap & ~t.local_mask) != 0)
            if bad.any():
                first = int(np.argmax(bad))
                raise CallMismatch(_stale(
                    t, self.label, int(s[first]), f"a released round names workers "
                    f"{int(bitmap[first]):#x} ({int(count[first])} contributions), which are "
                    f"not this job's"))
            t.stats.results_received += len(index)
            inside = ((bitmap[:, None] >> np.arange(t.num_workers)) & 1).any(axis=0)
            t.left_out = np.where(inside, 0, t.left_out + len(index))
            t.follow_releases(bitmap, count)
            self._measure(s, now)
            if self.members is None:
                self.members = np.full(self.n, (1 << t.num_workers) - 1, dtype=np.int64)
            self.members[chunks] = bitmap
            self._settle(packets, index, index, s, chunks, now,
                         left_out=(bitmap >> t.worker_id) & 1 == 0)
            rest = np.ones(len(packets), dtype=bool)
            rest[index] = False
            packets = packets[rest]
        self._keep_early(packets)

    def _keep_early(self, packets: np.ndarray) -> None:
        """Released rounds of a slot that this worker has not reached yet (the others
        went on without it, into later calls): kept, for the call that reaches them
        (``_flush``); anything else is a duplicate. The others stop at LEAD_LIMIT rounds
        ahead of a late worker (``Transport.lead_ok``), so twice that is never reached
        but by a flood, whose oldest rounds go."""
        t = self.t
        if not len(packets):
            return
        slot = t.fmt.unpack(packets, ("slot",))["slot"] - t.first_slot
        inside = (slot >= 0) & (slot < t.num_slots)
        slot = slot.clip(0, t.num_slots - 1)
        ids = packets["pkt_id"].astype(np.int64)
        ahead = inside & (((ids - t.next_pkt_id[slot]) & PKT_ID_MASK) < EARLY_ROUNDS)
        t.stats.duplicates_ignored += len(packets) - int(np.count_nonzero(ahead))
        if ahead.any():
            t.early.append(packets[ahead])      # a copy: ``packets`` may be the receive buffer
            t.early_slot = np.concatenate((t.early_slot, slot[ahead]))
            t.early_id = np.concatenate((t.early_id, ids[ahead]))
            while len(t.early_id) > 2 * LEAD_LIMIT:
                gone = len(t.early.pop(0))
                t.early_slot, t.early_id = t.early_slot[gone:], t.early_id[gone:]

    def _settle(self, packets: np.ndarray, rows, index: np.ndarray, s: np.ndarray,
                chunks: np.ndarray, now: float, left_out: np.ndarray | None = None) -> None:
        """The results (``packets[rows]``, datagrams ``index``) of slots ``s``, chunks
        ``chunks``: final ones stored, those to redo sent again, the next chunks sent.
        ``left_out``: released results, and which of them lack this worker's values."""
        t = self.t
        agreed = packets["exponent"][rows]
        self.agreed[chunks] = agreed
        if t.repair is not None:          # for a peer that lost them
            t.repair.keep(packets[rows])
        keep = None
        if self.quantized:
            keep, self.scale[chunks] = quantize.settle(self.scale[chunks], agreed)
            if keep.all():
                keep = None
        if left_out is not None:
            final = left_out if keep is None else left_out & keep
            t.stats.released += len(chunks) if keep is None else int(np.count_nonzero(keep))
            if final.any():     # its own values, before the result overwrites them in place
                late = chunks[final]
                self.carried.append((late, np.array(self.blocks.rows(late), copy=True)))
                t.stats.late += len(late)
        if keep is None:                  # every result final: the common case
            self._store(chunks, packets["values"][rows])
            following = chunks + self.step
        else:
            if keep.any():
                self._store(chunks[keep], packets["values"][index[keep]])
            t.stats.redone += len(keep) - int(np.count_nonzero(keep))
            following = np.where(keep, chunks + self.step, chunks)
        self.progress_at = now
        if following.max() >= self.n:     # the call's last chunks are final
            going = following < self.n
            self._idle(s[~going])
            s, following = s[going], following[going]
        self.chunk[s] = following
        self._load(s, following, now)

    def _store(self, chunks: np.ndarray, sums: np.ndarray) -> None:
        """Final results (the switch's sums, as the packets hold them) into the
        caller's output: straight into its memory where the chunks are consecutive
        whole blocks, else through a scatter. Only final blocks are written, so a
        block still to be redone reads its input unchanged (in place: the same memory)."""
        view = self.out.view(chunks)
        if self.quantized:
            sums = quantize.dequantize(sums, self.scale[chunks], self.t.num_workers,
                                       average=self.average, out=view,
                                       dtype=self.out.flat.dtype)
        elif view is not None:
            np.copyto(view, sums)
        if view is None:
            self.out.write(chunks, sums)

    @timed("results")
    def _on_waiting(self, headers: np.ndarray) -> None:
        """The switch's WAITING replies: per slot, who had contributed. They move no
        timer: a reply comes only for a retransmission, and answering it with a
        sooner one would turn a long wait into a storm."""
        t = self.t
        h = t.fmt.unpack(headers, ("contributions", "fingerprint"))
        match, slot = self._answers(headers, MsgType.WAITING)
        t.stats.waiting_replies += int(match.sum())
        if match.any():
            self.heard_at = time.monotonic()
        t.stats.duplicates_ignored += int((~match).sum())
        self.told[slot[match]] = True
        self.contributors[slot[match]] = h["fingerprint"][match]
        if match.any():                 # the breakdown names whom the latest replies wait for
            self.missing = 0
            for bits in np.unique(h["fingerprint"][match]).tolist():
                self.missing |= t.local_mask & ~bits
        # Unfinished, yet every worker has contributed, or more contributions counted
        # than there are workers: the count went past them, which only another
        # session's leftovers can make it do (it adds to a round finished there).
        stuck = match & (((h["fingerprint"] & t.local_mask) == t.local_mask)
                         | (h["contributions"] >= t.local_count))
        if stuck.any():
            raise CallMismatch(_stale(t, self.label, int(slot[stuck][0]), "the switch counts "
                                      "as many contributions there as there are workers, and "
                                      "no result"))

    def _measure(self, slots: np.ndarray, now: float) -> None:
        """One RTT sample per batch, and RACK's newest answered send time, both from
        packets sent once only (Karn: an answer to a resent packet may belong to
        either copy, and taking the later one would call packets in flight lost)."""
        self.first_result = min(self.first_result, now)
        resent = self.resent[slots]
        clean = slots[~resent] if resent.any() else slots
        if not clean.size:
            return
        sent = self.sent_at[clean]
        self.t.rto.sample(float(now - sent.sum() / len(sent)))    # the mean, as numpy's
        seq = self.sent_seq[clean]
        newest = int(seq.argmax())
        if seq[newest] > self.rack_seq:
            self.rack_seq, self.rack_rtt = int(seq[newest]), now - sent[newest]

    @timed("repair")
    def _recover(self, now: float) -> None:
        """Resend what is lost: packets sent before an answered one, once a round
        trip and the reordering window have passed (RACK), and packets whose timer
        expired. A packet waiting ``peer_timeout`` ends the call."""
        t = self.t
        dead = now - self.first_sent_at >= t.policy.peer_timeout
        if dead.any() or now - max(self.heard_at, self.progress_at) >= t.policy.switch_silence:
            self._give_up(now)
        if (reason := t.abort()) is not None:
            raise CallAborted(f"job {t.job_id}, worker {t.worker_id}, {self.label}: given up "
                              f"after {now - self.started:.1f} s: {reason}")
        if self.deadline:
            self._release(now)
        expired = self._due() <= now
        lost = (~expired & (self.sent_seq < self.rack_seq)
                & (self.sent_at + self.rack_rtt + t.rto.reorder_window <= now))
        if expired.any() and self.progress_at == -np.inf:
            expired = self._probe(expired, now)
        if expired.any() and t.repair is not None:
            # Its round may be one the switch holds no more (the others went on): the
            # peers that took its result send it (repair.py).
            # and the slot's next rounds, which a worker that slept lost too: as many as
            # one request names.
            slots = np.flatnonzero(expired & (self.chunk >= 0))
            depth = max(1, ASK_MAX // max(len(slots), 1))
            ids = t.tx_pkt_id[slots].astype(np.int64)[:, None] + np.arange(depth)
            t.repair.ask(np.repeat(t.first_slot + slots, depth), ids.reshape(-1) & PKT_ID_MASK)
            t.stats.repairs_asked += len(slots)
        if expired.any():
            t.stats.timeouts += int(expired.sum())
            t.rto.timed_out(now)
            self.retries[expired] += 1
            # From its first timeout on, a packet asks the switch to answer it, if
            # its slot is unfinished, with whom it waits for (a WAITING reply); a
            # QUORUM's field is its quorum.
            t.tx["contributions"][expired & (t.tx_type != MSG_QUORUM)] = 1
        again = np.flatnonzero(expired | lost)
        if again.size:
            sent = self._transmit(again, now)
            t.stats.retransmissions += sent
            t.stats.fast_retransmissions += int(min(sent, lost.sum()))
            self.resent[again] = True

    def _release(self, now: float) -> None:
        """Slots that have waited the job's deadline since this worker's contribution
        ask the switch to release their round with what it holds: the packet goes out
        again as a RELEASE (its retransmissions too), which every worker's copy of the
        round answers alike (RELEASED, ``_on_released``)."""
        due = ~self.releasing & (self.first_sent_at + self.deadline <= now)
        if not due.any() or not self.t.lead_ok():
            return
        slots = np.flatnonzero(due)
        self.releasing[slots] = True
        self.t.tx_type[slots] = MSG_RELEASE
        self.t.stats.releases += self._transmit(slots, now)
        self.resent[slots] = True          # Karn: the answer may be either packet's

    def _probe(self, expired: np.ndarray, now: float) -> np.ndarray:
        """Before the call's first answer, a timeout is more often workers that have not
        sent yet (late to the call, descheduled on a busy host) than loss, and resending
        the window would only load the switch: resend one packet, the oldest (the same
        slot on every worker: the window goes out in one order), which asks whom the
        switch waits for, and restart the others' timers (no RTT sample from them:
        Karn). The call's first result restarts every timer from it (``_due``), and
        RACK and the timers then resend what was lost."""
        candidates = np.flatnonzero(expired)
        probe = candidates[np.argmin(self.sent_seq[candidates])]
        quiet = expired.copy()
        quiet[probe] = False
        self.sent_at[quiet] = now
        self.resent[quiet] = True
        expired = np.zeros_like(expired)
        expired[probe] = True
        return expired

    def _waiting_for(self) -> str:
        """Whom the switch waits for, from its WAITING replies for the slots waiting."""
        t = self.t
        waiting = self.chunk >= 0
        told = waiting & self.told
        if not told.any():
            return ("the switch has not said whom it waits for (no WAITING reply: it is "
                    "unreachable, or, in a tree, waits for another switch)")
        missing = 0
        for bits in np.unique(self.contributors[told]):
            missing |= t.local_mask & ~int(bits)
        ranks = [w for w in range(missing.bit_length()) if missing >> w & 1]
        unknown = int((waiting & ~self.told).sum())
        return (f"the switch waits for worker(s) {', '.join(map(str, ranks))}"
                + (f" ({unknown} slot(s) without a reply yet)" if unknown else ""))

    def _waiting_line(self, now: float) -> str:
        t = self.t
        waited = now - max(self.progress_at, self.started)
        return (f"job {t.job_id}, worker {t.worker_id}, {self.label}: no result for "
                f"{int((self.chunk >= 0).sum())} slot(s) for {waited:.0f} s; "
                f"{self._waiting_for()}")

    def _give_up(self, now: float) -> None:
        t = self.t
        waiting = np.flatnonzero(self.chunk >= 0)
        oldest = now - self.first_sent_at[waiting].min()
        silent = now - max(self.heard_at, self.progress_at)
        slots = (t.first_slot + waiting).tolist()
        shown = ", ".join(map(str, slots[:16])) + (", ..." if len(slots) > 16 else "")
        bound = (f"peer_timeout {t.policy.peer_timeout:g} s" if oldest >= t.policy.peer_timeout
                 else f"the switch silent for {silent:.1f} s, switch_silence "
                      f"{t.policy.switch_silence:g} s")
        raise AggregationTimeout(
            f"job {t.job_id}, worker {t.worker_id}, {self.label}: no result for {len(slots)} "
            f"slot(s) [{shown}] after {oldest:.1f} s ({bound}, "
            f"{int(self.retries[waiting].sum())} timer expiries); {self._waiting_for()}. "
            f"The switch's slot state for this job is now unknown: {RECOVER}",
            switch_answered=bool(self.told[waiting].any()))

    def _mismatch(self, chunk: int, got: int) -> None:
        t = self.t
        if self.label == START:           # the start's chunk i is in slot i
            raise CallMismatch(_stale(t, START, chunk, "its sum holds other contributions "
                                      "than the workers' starts"))
        mine = (f"; this worker's: {self.signature[0]}, shape {tuple(self.signature[1])}"
                if self.signature else "")
        raise CallMismatch(
            f"job {t.job_id}, worker {t.worker_id}, {self.label}: the switch's sum of the "
            f"workers' fingerprints for block {chunk} is {got:#010x}, not {t.num_workers} "
            f"times this worker's ({int(self.expected[chunk]):#010x}): the workers did not all "
            f"issue this call (another size, shape, dtype or name{mine}; or calls in another "
            f"order, on some worker), or the slot held another session's sums. The session "
            f"is unusable: {RECOVER}")


def _add_carried(blocks: quantize.Blocks, own: np.ndarray, chunks: np.ndarray,
                 values: np.ndarray) -> np.ndarray:
    """This worker's values that a release left out of the last call of this key,
    added into the same blocks of this one (error feedback: applied a step late, never
    dropped), and the exponents of the blocks they change."""
    chunks, values = chunks[chunks < len(blocks)], values[chunks < len(blocks)]
    whole = chunks < len(blocks.whole)
    blocks.whole[chunks[whole]] += values[whole]
    if not whole.all():                  # the partial last block: its row and the array
        blocks.tail[0] += values[~whole][0]
        last = blocks.flat[blocks.whole.size:]
        last += values[~whole][0][:last.size]
    own = np.array(own, copy=True)
    own[chunks] = quantize.block_exponents(blocks.rows(chunks))
    return own


def _stale(t: Transport, label: str, window_slot: int, why: str) -> str:
    return (f"job {t.job_id}, worker {t.worker_id}, {label}: slot {t.first_slot + window_slot} "
            f"holds another session's state ({why}): a session on this job ended without "
            f"closing (killed, or after a failed call). {RECOVER[0].upper()}{RECOVER[1:]}")
