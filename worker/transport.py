"""The worker's side of the wire: one UDP socket, a window of slots, timers.

One call aggregates N blocks through the job's W slots (W = num_slots). Chunk c
uses slot c mod W; a slot holds one packet in flight, and its result frees it for
chunk c + W. Sends and receives are batched (sendmmsg/recvmmsg, ``batchio``), and
results are handled as arrays, one pass per batch.

**Exponents without a bootstrap round.** A packet carries its own block exponent,
and its values are quantized with a scale exponent ``S`` that every worker derives
identically from the maxima the previous call of the same shape agreed on
(``quantize.speculate``; a call with no history probes). The result returns the
switch's maximum; where it shows the scale was too small (some worker's values
were clipped) or wasted precision (``quantize.usable``), every worker redoes that
block with the now known maximum, as the slot's next packet. So a steady training
loop sends N packets per call, not N + W.

Everything on the wire is a deterministic function of the call sequence and of
the results, which every worker receives identically: a slot's set alternates with
every new packet sent in it, across calls (a contribution to set s re-arms set 1-s
in the switch), and its packet id counts the packets sent in it. A result is
accepted only if slot, set and packet id all match the packet in flight; anything
else is a duplicate or stale copy and is ignored.

**Loss.** A result missing while results of packets sent after it arrive is a
loss (RACK, RFC 8985: results return through one switch in about the order their
slots were sent): it is resent after one round trip plus a reordering window,
without waiting for a timer. Every packet also has a retransmission timer: the RFC
6298 estimate with Karn's rule, its floor twice the smoothed round trip (so it
follows the switch, not a constant chosen for the slowest one), doubled once per
timeout period until a fresh sample comes (one back-off for all packets: backing
off per packet as well compounded to 4^k after k rounds of loss, and through a
tree's four lossy passes at 10 % stretched calls 37-fold). Any error on the socket (an ICMP error queued by a stale
or forged frame, a full buffer) counts as a lost packet for the same machinery. A
slot that gets no result within ``peer_timeout`` ends the call with
AggregationTimeout; after that the switch's per-slot state for this job is unknown
(some workers may have contributed, others not), so the transport refuses further
calls: reset the job's slots (``python -m switch_ctl reset job.toml``) and start
new sessions on every worker.

A session starts at set 0 in every slot, which is right on a fresh switch and
after a session that ended with ``park()`` (every worker, at close): parking gives
each slot whose last packet used set 0 one more, empty, round in set 1.
"""

from __future__ import annotations

import copy
import select
import socket
import time
from dataclasses import asdict, dataclass, fields

import numpy as np

from p4src.protocol import EXPONENT_OF_ZERO, MsgType, PacketFormat

from . import quantize
from .batchio import BatchSocket

PKT_ID_MASK = 0xFFFFFFFF
RECV_BATCH = 512              # results drained from the socket per system call
COALESCE_BATCH = 8            # fewer results than this per wake-up: wait for more
HISTORY_SHAPES = 256          # call shapes whose exponents are remembered (DDP: its buckets)
SOCKET_BUFFER = 4 << 20       # bytes; a window's results arrive in bursts


class AggregationTimeout(RuntimeError):
    """No result for some slots within the configured time: a peer or the switch is gone."""


class TransportBroken(RuntimeError):
    """A previous call failed, so the switch's slot state for this job is unknown."""


@dataclass(frozen=True)
class RetransmitPolicy:
    """Timer settings, in seconds.

    Timeouts follow the measured round trips; ``min_rto`` is only an absolute floor
    under them (the adaptive floor is twice the smoothed round trip).
    ``initial_rto`` applies until the first round trip is measured. ``peer_timeout``
    bounds how long one packet may wait for its result, and so how long a call can
    hang on a dead worker or an unreachable switch. ``coalesce`` is the longest a
    wake-up that found only a few results waits for more (0: never)."""
    initial_rto: float = 0.2
    min_rto: float = 0.001
    max_rto: float = 2.0
    peer_timeout: float = 30.0
    coalesce: float = 0.0005

    def __post_init__(self):
        if not 0 < self.min_rto <= self.initial_rto <= self.max_rto:
            raise ValueError("need 0 < min_rto <= initial_rto <= max_rto")
        if self.peer_timeout <= 0:
            raise ValueError("peer_timeout must be positive")
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
    duplicates_ignored: int = 0       # answering no packet in flight: duplicate, stale, foreign
    malformed_ignored: int = 0        # datagrams of the wrong length
    timeouts: int = 0
    socket_errors: int = 0            # failed sends/receives, repaired as losses

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
    """Owns the worker's UDP socket, the slot window, the timers of one job, and
    the exponent history that speculation predicts from."""

    def __init__(self, fmt: PacketFormat, *, job_id: int, num_workers: int, switch_ip: str,
                 job_udp_port: int, local_ip: str, local_port: int, first_slot: int,
                 num_slots: int, policy: RetransmitPolicy = RetransmitPolicy()):
        if not 1 <= num_slots <= fmt.pool_size or not 0 <= first_slot <= fmt.pool_size - num_slots:
            raise ValueError(f"slots [{first_slot}, {first_slot + num_slots}) are not within the "
                             f"pool of {fmt.pool_size}")
        self.fmt = fmt
        self.job_id = job_id
        self.num_workers = num_workers
        self.first_slot = first_slot
        self.num_slots = num_slots
        self.policy = policy
        self.rto = RtoEstimator(policy)
        self.stats = Stats()
        self.next_set = np.zeros(num_slots, dtype=np.int64)
        self.next_pkt_id = np.zeros(num_slots, dtype=np.int64)
        self.history: dict[int, np.ndarray] = {}   # blocks per call -> last agreed maxima
        self.broken: BaseException | None = None
        # One packet per slot, rewritten when the slot takes its next chunk; a
        # retransmission resends the row as it is.
        self.tx = fmt.pack(count=num_slots, msg_type=int(MsgType.CONTRIBUTION), job_id=job_id)
        self.tx_bytes = self.tx.view(np.uint8).reshape(num_slots, -1)
        # A result echoes its packet's header up to the packet id (the type aside).
        self.type_offset = fmt.dtype.fields["msg_type"][1]
        self.identity_bytes = fmt.dtype.fields["pkt_id"][1] + fmt.dtype["pkt_id"].itemsize
        self.rx = np.zeros((RECV_BATCH, fmt.payload_bytes + 1), dtype=np.uint8)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                self.sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            self.sock.bind((local_ip, local_port))
            # Connected: the kernel delivers only the switch's results for this job.
            self.sock.connect((switch_ip, job_udp_port))
        except OSError:
            self.sock.close()
            raise
        self.io = BatchSocket(self.sock, self.tx, self.rx)
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)

    def close(self) -> None:
        self.sock.close()

    # -- one call ------------------------------------------------------------------
    def aggregate(self, blocks: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sum ``blocks`` ((N, values_per_packet) float32) over the job's workers.

        ``own`` are this worker's block exponents. Returns the switch's int32 sums
        (N, values_per_packet) and the scale exponent each block was quantized with
        (``POISON_EXPONENT`` for a block some worker could not carry)."""
        if self.broken is not None:
            raise TransportBroken("an earlier aggregation failed, so the switch's slot state "
                                  "for this job is unknown; reset the job's slots "
                                  "(python -m switch_ctl reset <job.toml>) and open new sessions"
                                  ) from self.broken
        if blocks.ndim != 2 or blocks.shape[1] != self.fmt.values_per_packet:
            raise ValueError(f"blocks must be (N, {self.fmt.values_per_packet})")
        n = len(blocks)
        scale = quantize.speculate(self.history.get(n), n)
        try:
            call = _Call(self, blocks, own, scale)
            sums, scale, agreed = call.run()
        except BaseException as exc:
            self.broken = exc
            raise
        self.history.pop(n, None)          # most recent last; the oldest shape goes first
        self.history[n] = quantize.remember(agreed)
        if len(self.history) > HISTORY_SHAPES:
            del self.history[next(iter(self.history))]
        return sums, scale

    def park(self) -> None:
        """Bring every slot to the same place in its set sequence (next set 0), with
        one empty round in the slots that need it, so that a later session on the
        same job, which starts at set 0 everywhere, finds the switch ready for it.
        Collective, like a call: every worker parks, when it closes its session."""
        odd = np.flatnonzero(self.next_set)
        if odd.size and self.broken is None:
            empty = np.zeros((odd.size, self.fmt.values_per_packet), dtype=np.float32)
            zero = np.full(odd.size, EXPONENT_OF_ZERO, dtype=np.int64)
            try:
                _Call(self, empty, zero, zero + 1, slots=odd).run()
            except BaseException as exc:
                self.broken = exc
                raise

    def send(self, slots: np.ndarray) -> int:
        """Send the slots' packets in one batch; a failure loses the rest of it."""
        sent, err = self.io.send(slots)
        if err:
            self.stats.socket_errors += 1
        self.stats.packets_sent += sent
        self.stats.bytes_sent += sent * self.fmt.payload_bytes
        return sent

    def receive(self) -> tuple[np.ndarray, int]:
        """The well-formed datagrams queued now (at most RECV_BATCH), as packets,
        and how many datagrams were read."""
        lengths, err = self.io.receive()
        if err:
            self.stats.socket_errors += 1
        whole = lengths == self.fmt.payload_bytes
        self.stats.malformed_ignored += int(len(lengths) - whole.sum())
        rows = self.rx[:len(lengths)][whole, :self.fmt.payload_bytes]
        return np.ascontiguousarray(rows).view(self.fmt.dtype).reshape(-1), len(lengths)


class _Call:
    """The state of one call: per chunk its scale, per slot the chunk in flight and
    its timing. ``slots`` (parking) puts chunk i alone in slot ``slots[i]``."""

    def __init__(self, transport: Transport, blocks: np.ndarray, own: np.ndarray,
                 scale: np.ndarray, slots: np.ndarray | None = None):
        t = self.t = transport
        w = t.num_slots
        self.blocks = blocks
        self.own = np.asarray(own, dtype=np.int64)
        self.scale = np.array(scale, dtype=np.int64)
        n = self.n = len(blocks)
        self.sums = np.zeros((n, t.fmt.values_per_packet), dtype=np.int32)
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
        self.sent_at = np.zeros(w)
        self.first_sent_at = np.zeros(w)
        self.retries = np.zeros(w, dtype=np.int64)     # timer expiries, for the error message
        self.resent = np.zeros(w, dtype=bool)          # Karn: no RTT sample
        self.progress_at = -np.inf      # when the call last got an answer
        self.expect = np.zeros((w, t.identity_bytes), dtype=np.uint8)   # see _on_results
        # RACK orders packets by when they were sent; a batch goes out in order, so
        # a send sequence number, not a timestamp, tells its packets apart.
        self.sent_seq = np.zeros(w, dtype=np.int64)
        self.next_seq = 0
        self.rack_seq = -1              # the newest packet answered
        self.rack_rtt = 0.0

    def run(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = self.t
        self._load(np.flatnonzero(self.chunk >= 0), time.monotonic())
        while (self.chunk >= 0).any():
            wait = self._next_wakeup() - time.monotonic()
            if wait <= 0 or t._poll.poll(max(wait * 1000.0, 0.0)):
                # Drain the socket first: after a stall, answers queued behind the
                # first batch must not look lost.
                drained = 0
                while True:
                    packets, datagrams = t.receive()
                    drained += datagrams
                    if len(packets):
                        self._on_results(packets)
                    if datagrams < RECV_BATCH:
                        break
                if 0 < drained < COALESCE_BATCH:
                    self._coalesce()
            self._recover(time.monotonic())
        return self.sums, self.scale, self.agreed

    def _coalesce(self) -> None:
        """Results trickling in at the links' pace would wake this thread once each,
        at a cost in Python that, on a host shared by several workers and a
        software switch, outweighs the wait: let a few gather first (as a NIC's
        interrupt moderation does), never past a timer."""
        if (self.chunk >= 0).any():
            pause = min(self.t.policy.coalesce, self._next_wakeup() - time.monotonic())
            if pause > 0:
                time.sleep(pause)

    def _load(self, slots: np.ndarray, now: float) -> None:
        """Put each slot's chunk in its packet, quantized, and send them all."""
        if not slots.size:
            return
        t = self.t
        chunks = self.chunk[slots]
        sets = t.next_set[slots]
        ids = t.next_pkt_id[slots]
        t.next_set[slots] ^= 1
        t.next_pkt_id[slots] = (ids + 1) & PKT_ID_MASK
        t.fmt.write_header(t.tx, slots, set=sets, slot=t.first_slot + slots, pkt_id=ids,
                           exponent=self.own[chunks])
        self.expect[slots] = t.tx_bytes[slots, :t.identity_bytes]
        self.expect[slots, t.type_offset] = int(MsgType.RESULT)
        t.tx["values"][slots] = quantize.quantize(self.blocks[chunks], self.own[chunks],
                                                  self.scale[chunks], t.num_workers)
        self.first_sent_at[slots] = now
        self.retries[slots] = 0
        self.resent[slots] = False
        self._transmit(slots, now)

    def _transmit(self, slots: np.ndarray, now: float) -> int:
        """Send the slots' packets and arm their timers; what failed to go out is
        lost, and the timers repair it."""
        sent = self.t.send(slots)
        self.sent_at[slots] = now
        self.sent_seq[slots] = self.next_seq + np.arange(len(slots))
        self.next_seq += len(slots)
        return sent

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
        waiting = self.chunk >= 0
        wake = self._due()[waiting].min()
        behind = waiting & (self.sent_seq < self.rack_seq)
        if behind.any():
            wake = min(wake, self.sent_at[behind].min() + self.rack_rtt
                       + self.t.rto.reorder_window)
        return wake

    def _on_results(self, packets: np.ndarray) -> None:
        t = self.t
        now = time.monotonic()
        h = t.fmt.unpack(packets, ("slot", "exponent", "contributions"))
        slot = np.clip(h["slot"] - t.first_slot, 0, t.num_slots - 1)
        # The answer to a slot's packet in flight: its identity bytes (type RESULT,
        # job, set and slot, packet id), all workers counted, the right slot range.
        raw = packets.view(np.uint8).reshape(len(packets), -1)[:, :t.identity_bytes]
        match = ((raw == self.expect[slot]).all(axis=1) & (self.chunk[slot] >= 0)
                 & (h["contributions"] == t.num_workers)
                 & (h["slot"] - t.first_slot == slot))
        index = np.flatnonzero(match)
        s = slot[index]
        # A result twice in one batch (resent by the switch) counts once; arrival
        # order is kept, so every worker sends its next packets in the same order.
        first = np.sort(np.unique(s, return_index=True)[1])
        index, s = index[first], s[first]
        t.stats.duplicates_ignored += len(packets) - len(index)
        if not len(index):
            return
        t.stats.results_received += len(index)
        self._measure(s, now)
        chunks = self.chunk[s]
        agreed = h["exponent"][index]
        self.agreed[chunks] = agreed
        keep = quantize.usable(self.scale[chunks], agreed)
        done, redo = chunks[keep], chunks[~keep]
        self.sums[done] = packets["values"][index[keep]]
        self.scale[done] = np.where(agreed[keep] == quantize.POISON_EXPONENT,
                                    quantize.POISON_EXPONENT, self.scale[done])
        self.scale[redo] = agreed[~keep]
        t.stats.redone += len(redo)
        following = np.where(keep, chunks + self.step, chunks)
        following[following >= self.n] = -1
        self.chunk[s] = following
        self.progress_at = now
        self._load(s[following >= 0], now)

    def _measure(self, slots: np.ndarray, now: float) -> None:
        """One RTT sample per batch, and RACK's newest answered send time, both from
        packets sent once only (Karn: an answer to a resent packet may belong to
        either copy, and taking the later one would call packets in flight lost)."""
        clean = slots[~self.resent[slots]]
        if not clean.size:
            return
        self.t.rto.sample(float(now - self.sent_at[clean].mean()))
        newest = clean[np.argmax(self.sent_seq[clean])]
        if self.sent_seq[newest] > self.rack_seq:
            self.rack_seq, self.rack_rtt = int(self.sent_seq[newest]), now - self.sent_at[newest]

    def _recover(self, now: float) -> None:
        """Resend what is lost: packets sent before an answered one, once a round
        trip and the reordering window have passed (RACK), and packets whose timer
        expired. A packet waiting ``peer_timeout`` ends the call."""
        t = self.t
        waiting = self.chunk >= 0
        dead = waiting & (now - self.first_sent_at >= t.policy.peer_timeout)
        if dead.any():
            self._give_up(now)
        expired = waiting & (self._due() <= now)
        lost = (waiting & ~expired & (self.sent_seq < self.rack_seq)
                & (self.sent_at + self.rack_rtt + t.rto.reorder_window <= now))
        if expired.any():
            t.stats.timeouts += int(expired.sum())
            t.rto.timed_out(now)
            self.retries[expired] += 1
        again = np.flatnonzero(expired | lost)
        if again.size:
            sent = self._transmit(again, now)
            t.stats.retransmissions += sent
            t.stats.fast_retransmissions += int(min(sent, lost.sum()))
            self.resent[again] = True

    def _give_up(self, now: float) -> None:
        t = self.t
        waiting = np.flatnonzero(self.chunk >= 0)
        oldest = now - self.first_sent_at[waiting].min()
        slots = (t.first_slot + waiting).tolist()
        shown = ", ".join(map(str, slots[:16])) + (", ..." if len(slots) > 16 else "")
        raise AggregationTimeout(
            f"job {t.job_id}: no result for {len(slots)} slot(s) [{shown}] after {oldest:.1f} s "
            f"(peer_timeout {t.policy.peer_timeout:g} s, {int(self.retries[waiting].sum())} "
            f"timer expiries): a worker is not sending or the switch is unreachable. The "
            f"switch's slot state for this job is now unknown: reset the job's slots "
            f"(python -m switch_ctl reset <job.toml>) before aggregating again")
