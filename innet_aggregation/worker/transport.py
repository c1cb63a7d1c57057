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

**Loss** (recovery.py): RACK finds a result missing while later ones arrive, a
retransmission timer (RFC 6298, Karn) the rest, and before a call's first result a
timeout probes with one packet. Any error on the socket (an ICMP error queued by a
stale or forged frame, a full buffer) counts as a lost packet for the same machinery:
the kernel reports such an error once, on the next send or receive. A send error that
persists (the route refuses the packets: an MTU below theirs, no route, a firewall) is
no loss: the unsent rest is resent at once, and where it fails ``SEND_TRIES`` times in
a row the call ends (SendRefused), naming the errno and the destination. ICMP
"fragmentation needed" never shrinks the packets (IP_PMTUDISC_INTERFACE): the
program's frame is fixed, and anyone on the segment can forge one.

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

**Bounded time** (a job's ``deadline_ms``; bounded.py): a round that waited the deadline
is released with whom the switch holds, later rounds ask for that quorum, a worker left
out carries its values into the next call of the same key, and the others' lead over a
late worker is bounded.

**Where things live.** This module: the socket, its sizing and batch I/O, the send-error
policy, the session's start, epoch and parking, and the exponent history. call.py: one
call's state machine and its one result path. recovery.py: loss recovery. bounded.py:
bounded time. fastpath.py: the common results in C.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import logging
import os
import secrets
import select
import socket
import time
from dataclasses import asdict, dataclass, fields

import numpy as np

from innet_aggregation.p4src.protocol import EXPONENT_OF_ZERO, MsgType, PacketFormat

from . import quantize
from .batchio import BatchSocket
from .bounded import BoundedTime, add_carried, lead_buffer
from .breakdown import Timing, timed
from .call import RECV_BATCH, Call
from .carry import Carry, history_key
from .errors import RECOVER, START, CallMismatch, SendRefused, TransportBroken, stale
from .recovery import RetransmitPolicy, RtoEstimator
from .wire import FINGERPRINT_MASK, PKT_ID_MASK, leading_bytes

FINGERPRINT_STEP = 0x9E3779B1  # odd: the blocks of one call get distinct fingerprints
HISTORY_CALLS = 256           # calls whose exponents are remembered (DDP: its buckets)
SOCKET_BUFFER = 4 << 20       # bytes; a window's results arrive in bursts
IP_MTU_DISCOVER, IP_PMTUDISC_INTERFACE, IP_MTU = 10, 4, 14   # linux/in.h; not in Python's socket
TRANSIENT_ERRORS = frozenset({errno.ENOBUFS, errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})
SEND_TRIES = 3                # a non-transient send error this often in a row: the route's
NONCE_BITS = 26               # |nonce| < 2**26: 32 workers' sum cannot saturate

log = logging.getLogger("worker")


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
    repairs_asked: int = 0            # slots asked of the peers (a timer expired, a release due)

    def __sub__(self, other: "Stats") -> "Stats":
        return Stats(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                        for f in fields(self)})

    def copy(self) -> "Stats":
        return copy.copy(self)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


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
        # The job's deadline (seconds, 0: none), as the session and the fallback read it;
        # its state and its policy are bounded time's (bounded.py).
        self.deadline = deadline
        # Why a deadline job's results all go through Python (the fast path's C unit
        # implements the whole, final result of a job without one, and would be wrong
        # here): its ``load`` writes every packet as a CONTRIBUTION asking nothing, not a
        # QUORUM (``BoundedTime.contribution``); its whole results neither reset the
        # quorum and the left-out counts nor mark the blocks' members
        # (``BoundedCall.whole``), nor keep the results for the peers' repair
        # (``BoundedCall.settled``); it sends a slot's next packet at once, where a late
        # worker defers it while it takes the rounds kept early (``BoundedCall.flush``);
        # and its wake-up ignores the release deadline (``BoundedCall.timer``).
        self.fast_path = fast_path and not deadline
        # This worker's blocks a release left out, per call key, added into the same
        # blocks of the next call of that key (``aggregate``): the session's, so they
        # outlive this transport (carry.py).
        self.carry = Carry() if carry is None else carry
        # Release, quorum, the late worker's lead, and the peers' repair.
        self.bounded = BoundedTime(self, deadline, peers, local_ip, local_port)
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
        self.tx_identity = leading_bytes(self.tx, self.identity_bytes)
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
                lead_buffer(self, SOCKET_BUFFER)
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
            self.bounded.close()
            self.sock.close()
            raise
        self.io = BatchSocket(self.sock, self.tx, self.rx)
        self.poller = select.poll()   # the socket, and the repair socket if any
        self.poller.register(self.sock, select.POLLIN)
        if self.bounded.repair is not None:
            self.poller.register(self.bounded.repair.ask_sock, select.POLLIN)

    def close(self) -> None:
        self.bounded.close()
        self.sock.close()

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise TransportBroken(
                f"an earlier aggregation failed, so the switch's slot state for this job is "
                f"unknown: {RECOVER}") from self.broken

    def _run(self, call: Call) -> tuple[np.ndarray, np.ndarray]:
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
        self._run(Call(self, quantize.Blocks(values.reshape(-1), k),
                       quantize.Blocks(sums.reshape(-1), k), blank, blank, slots=slots,
                       label=START, fingerprints=call_fingerprints(0, 0, 0, START, w)))
        # Lanes are shared only if the workers outnumber the values of a packet.
        foreign = np.flatnonzero(sums[:, lane] != nonces) if self.num_workers <= k else []
        if len(foreign):
            self.broken = CallMismatch(stale(self, START, int(foreign[0]),
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
                if self.poller.poll(left * 1000.0):
                    packets, _, _ = self.receive()
                    if (leading_bytes(packets, self.identity_bytes) == echo).any():
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
        self._run(Call(self, empty, empty, zero, zero, slots=odd, label="park",
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
            own = add_carried(blocks, own, *taken)
        call = Call(self, blocks, out, own, quantize.speculate(previous, n), label=label,
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
        call.bounded.keep_carried(self.carry, key)
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


