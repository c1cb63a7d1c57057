"""The worker's side of the wire: one UDP socket, a window of slots, timers.

One call aggregates N blocks through the job's W slots (W = num_slots). Chunk c
uses slot c mod W. Every packet carries the block exponent of the chunk that uses
the same slot next (c + W), and the result of chunk c returns the switch's maximum
of those, so chunk c + W can be quantized when the result of chunk c frees its
slot (SwitchML's one-ahead scheme). A call starts with one bootstrap packet per
used slot (zero values) carrying the exponents of the first min(N, W) chunks.

Everything on the wire is a deterministic function of the call sequence, the same
on every worker: the set of a slot alternates with every new packet sent in it,
across calls (a contribution to set s re-arms set 1-s in the switch), and packet
ids count packets per session in a fixed order (bootstraps, then chunks). So a
result is accepted only if slot, set and packet id all match the packet in flight;
anything else is a duplicate or stale copy and is ignored.

Loss is repaired by retransmitting the identical packet when its timer expires.
The timeout adapts to measured round trips (Jacobson/Karels, RFC 6298; Karn's rule:
no samples from retransmitted packets) and backs off exponentially, per packet and
(once per timeout period) for the shared estimate, up to a cap. A slot that gets no result within ``peer_timeout`` ends the call with
AggregationTimeout. After that the switch's per-slot state for this job is
unknown (some workers may have contributed, others not), so the transport refuses
further calls: re-apply the job with a fresh slot range, or restart the switch,
and start new sessions on every worker.

A session starts at set 0 in every slot, which is right on a fresh switch and
after a session that ended with ``park()`` (every worker, at close): parking gives
each slot whose last packet used set 0 one more, empty, round in set 1.
"""

from __future__ import annotations

import errno
import heapq
import select
import socket
import time
from dataclasses import asdict, dataclass, fields

import numpy as np

from p4src.protocol import EXPONENT_OF_ZERO, MsgType, PacketFormat

from . import quantize

PKT_ID_MASK = 0xFFFFFFFF
RECV_BATCH = 256              # results drained from the socket per loop iteration
SOCKET_BUFFER = 4 << 20       # bytes; a window's results arrive in bursts


class AggregationTimeout(RuntimeError):
    """No result for some slots within the configured time: a peer or the switch is gone."""


class TransportBroken(RuntimeError):
    """A previous call failed, so the switch's slot state for this job is unknown."""


@dataclass(frozen=True)
class RetransmitPolicy:
    """Timer settings, in seconds.

    ``min_rto`` suits software switches, whose round trips under a full window reach
    100-300 ms (BMv2 queues every contribution); lower it for a hardware switch.
    ``peer_timeout`` bounds how long one packet may wait for its result, and so how
    long a call can hang on a dead worker or an unreachable switch."""
    initial_rto: float = 0.5
    min_rto: float = 0.1
    max_rto: float = 2.0
    peer_timeout: float = 30.0

    def __post_init__(self):
        if not 0 < self.min_rto <= self.initial_rto <= self.max_rto:
            raise ValueError("need 0 < min_rto <= initial_rto <= max_rto")
        if self.peer_timeout <= 0:
            raise ValueError("peer_timeout must be positive")


@dataclass
class Stats:
    """Counters; a session's totals, or one call's (the difference of two totals)."""
    packets_sent: int = 0
    bytes_sent: int = 0
    retransmissions: int = 0
    results_received: int = 0
    duplicates_ignored: int = 0
    malformed_ignored: int = 0
    timeouts: int = 0

    def __sub__(self, other: "Stats") -> "Stats":
        return Stats(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                        for f in fields(self)})

    def copy(self) -> "Stats":
        return Stats(**asdict(self))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class RtoEstimator:
    """Smoothed RTT and variance (RFC 6298), giving the retransmission timeout."""

    GRANULARITY = 0.001

    def __init__(self, policy: RetransmitPolicy):
        self.policy = policy
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = policy.initial_rto
        self._backed_off_at = -float("inf")

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        rto = self.srtt + max(self.GRANULARITY, 4 * self.rttvar)
        self.rto = min(max(rto, self.policy.min_rto), self.policy.max_rto)

    def timed_out(self, now: float) -> None:
        """Double the timeout (RFC 6298 5.5) until a fresh sample resets it: with
        Karn's rule, a timeout below the real RTT would otherwise never get a sample
        to grow from. Once per timeout period, as many slots time out together."""
        if now - self._backed_off_at >= self.rto:
            self.rto = min(2 * self.rto, self.policy.max_rto)
            self._backed_off_at = now

    def backoff(self, retries: int) -> float:
        # The exponent is capped: 2.0 ** 1024 overflows, and any cap above
        # log2(max_rto / min_rto) changes nothing.
        return min(self.rto * 2.0 ** min(retries, 64), self.policy.max_rto)


class Transport:
    """Owns the worker's UDP socket, the slot window and the timers of one job."""

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
        self.next_pkt_id = 0
        self.broken: BaseException | None = None
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
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self._rx = np.zeros(RECV_BATCH, dtype=fmt.dtype)
        rx_bytes = self._rx.view(np.uint8).reshape(RECV_BATCH, fmt.payload_bytes)
        self._rx_views = [memoryview(row) for row in rx_bytes]
        self._rx_spare = bytearray(fmt.payload_bytes + 1)

    def close(self) -> None:
        self.sock.close()

    # -- one call ------------------------------------------------------------------
    def aggregate(self, blocks: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sum ``blocks`` ((N, values_per_packet) float32) over the job's workers.

        ``own`` are this worker's block exponents. Returns the switch's int32 sums
        (N, values_per_packet) and the agreed exponent of each block."""
        if self.broken is not None:
            raise TransportBroken("an earlier aggregation failed, so the switch's slot state "
                                  "for this job is unknown; re-apply the job with a fresh slot "
                                  "range (or restart the switch) and open new sessions"
                                  ) from self.broken
        if blocks.ndim != 2 or blocks.shape[1] != self.fmt.values_per_packet:
            raise ValueError(f"blocks must be (N, {self.fmt.values_per_packet})")
        try:
            return _Call(self, blocks, own).run()
        except BaseException as exc:
            self.broken = exc
            raise

    def park(self) -> None:
        """Bring every slot to the same place in its set sequence (next set 0), with
        one empty round in the slots that need it, so that a later session on the
        same job, which starts at set 0 everywhere, finds the switch ready for it.
        Collective, like a call: every worker parks, when it closes its session."""
        odd = np.flatnonzero(self.next_set)
        if odd.size and self.broken is None:
            empty = np.zeros((0, self.fmt.values_per_packet), dtype=np.float32)
            try:
                _Call(self, empty, np.zeros(0), boot=odd).run()
            except BaseException as exc:
                self.broken = exc
                raise

    def _send(self, packet: memoryview) -> bool:
        try:
            self.sock.send(packet)
        except OSError as exc:
            if exc.errno not in _TRANSIENT_ERRNOS:
                raise
            return False  # treated as lost: the timer retransmits
        self.stats.packets_sent += 1
        self.stats.bytes_sent += len(packet)
        return True

    def _receive(self) -> int:
        """Drain up to RECV_BATCH whole packets into ``self._rx``; returns how many."""
        count = 0
        while count < RECV_BATCH:
            try:
                size = self.sock.recv_into(self._rx_spare, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:  # an ICMP error for an earlier send
                continue
            if size != self.fmt.payload_bytes:
                self.stats.malformed_ignored += 1
                continue
            self._rx_views[count][:] = self._rx_spare[:size]
            count += 1
        return count


_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.ENOBUFS, errno.ECONNREFUSED}


class _Call:
    """The state of one call: packets, slot progress and timers.

    Packet p < B is the bootstrap of slot ``boot[p]``; packet B + c carries chunk c,
    in slot c mod W. A call with no chunks and only bootstraps parks slots."""

    def __init__(self, transport: Transport, blocks: np.ndarray, own: np.ndarray,
                 boot: np.ndarray | None = None):
        t = self.t = transport
        fmt = t.fmt
        self.blocks = blocks
        self.own = np.asarray(own, dtype=np.int64)
        n = self.n = len(blocks)
        w = t.num_slots
        boot = np.arange(min(n, w)) if boot is None else np.asarray(boot, dtype=np.int64)
        nb = self.num_boot = len(boot)
        chunk = np.arange(n)
        slot = np.concatenate([boot, chunk % w])
        round_ = np.concatenate([np.zeros(nb, dtype=np.int64), 1 + chunk // w])
        exponent = np.full(nb + n, EXPONENT_OF_ZERO, dtype=np.int64)
        has_chunk = boot < n
        exponent[:nb][has_chunk] = self.own[boot[has_chunk]]
        exponent[nb:nb + max(0, n - w)] = self.own[w:]   # one ahead: chunk c carries c + W
        self.sets = t.next_set[slot] ^ (round_ & 1)
        self.pkt_ids = (t.next_pkt_id + np.arange(nb + n)) & PKT_ID_MASK
        self.packets = fmt.pack(count=nb + n, msg_type=int(MsgType.CONTRIBUTION), job_id=t.job_id,
                                set=self.sets, slot=t.first_slot + slot, pkt_id=self.pkt_ids,
                                exponent=exponent)
        self.wire = memoryview(self.packets.view(np.uint8).reshape(-1))
        self.results = np.zeros(n, dtype=fmt.dtype)
        self.agreed = np.full(n, EXPONENT_OF_ZERO, dtype=np.int64)
        # Per slot of the window: packet in flight (-1: none), its timing.
        self.current = np.full(w, -1, dtype=np.int64)
        self.current[boot] = np.arange(nb)
        self.sent_at = np.zeros(w)
        self.first_sent_at = np.zeros(w)
        self.retries = np.zeros(w, dtype=np.int64)
        self.timers: list[tuple[float, int, int, int]] = []
        self.active = nb
        # Advance the session's deterministic sequence now: every worker does the same.
        rounds = 1 + np.maximum(0, (n - boot + w - 1) // w)
        t.next_set[boot] ^= rounds & 1
        t.next_pkt_id = (t.next_pkt_id + nb + n) & PKT_ID_MASK

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        t = self.t
        now = time.monotonic()
        for slot in np.flatnonzero(self.current >= 0):
            self._transmit(int(slot), now)
        while self.active:
            wait = max(0.0, self.timers[0][0] - time.monotonic())
            if t._poll.poll(wait * 1000.0):
                count = t._receive()
                if count:
                    self._on_results(count)
            self._expire_timers(time.monotonic())
        return self.results["values"], self.agreed

    def _packet(self, p: int) -> memoryview:
        size = self.t.fmt.payload_bytes
        return self.wire[p * size:(p + 1) * size]

    def _transmit(self, slot: int, now: float) -> None:
        self.t._send(self._packet(self.current[slot]))
        self.sent_at[slot] = self.first_sent_at[slot] = now
        self.retries[slot] = 0
        self._arm(slot, now)

    def _arm(self, slot: int, now: float) -> None:
        deadline = min(now + self.t.rto.backoff(int(self.retries[slot])),
                       self.first_sent_at[slot] + self.t.policy.peer_timeout)
        heapq.heappush(self.timers, (deadline, slot, int(self.current[slot]),
                                     int(self.retries[slot])))

    def _on_results(self, count: int) -> None:
        t = self.t
        now = time.monotonic()
        rx = t._rx[:count]
        header = t.fmt.unpack(rx)
        slot = header["slot"] - t.first_slot
        ok = ((header["msg_type"] == MsgType.RESULT) & (header["job_id"] == t.job_id)
              & (header["contributions"] == t.num_workers))
        t.stats.malformed_ignored += int(count - ok.sum())
        ready = []
        for i in np.flatnonzero(ok):
            s = int(slot[i])
            p = int(self.current[s]) if 0 <= s < t.num_slots else -1
            if p < 0 or header["pkt_id"][i] != self.pkt_ids[p] or header["set"][i] != self.sets[p]:
                t.stats.duplicates_ignored += 1
                continue
            t.stats.results_received += 1
            if self.retries[s] == 0:
                t.rto.sample(now - self.sent_at[s])
            exponent = int(header["exponent"][i])
            if p < self.num_boot:        # bootstrap: the exponent of chunk s, if any
                nxt = s
            else:
                c = p - self.num_boot
                self.results[c] = rx[i]
                nxt = c + t.num_slots
            if nxt < self.n:
                self.agreed[nxt] = exponent
                self.current[s] = self.num_boot + nxt   # a second copy of this result is stale now
                ready.append(s)
            else:
                self.current[s] = -1
                self.active -= 1
        if ready:
            self._send_next(ready, now)

    def _send_next(self, ready: list[int], now: float) -> None:
        """Quantize the freed slots' next chunks in one go, then send them."""
        packets = self.current[ready]
        chunks = packets - self.num_boot
        values = quantize.quantize(self.blocks[chunks], self.own[chunks], self.agreed[chunks],
                                   self.t.num_workers)
        self.packets["values"][packets] = values
        for s in ready:
            self._transmit(s, now)

    def _expire_timers(self, now: float) -> None:
        t = self.t
        while self.timers and self.timers[0][0] <= now:
            _, s, p, retries = heapq.heappop(self.timers)
            if self.current[s] != p or self.retries[s] != retries:
                continue  # answered, or superseded by a later timer
            t.stats.timeouts += 1
            if now - self.first_sent_at[s] >= t.policy.peer_timeout:
                self._give_up(now)
            t.rto.timed_out(now)
            self.retries[s] += 1
            if t._send(self._packet(p)):
                t.stats.retransmissions += 1
            self.sent_at[s] = now
            self._arm(s, now)

    def _give_up(self, now: float) -> None:
        t = self.t
        waiting = np.flatnonzero(self.current >= 0)
        oldest = now - self.first_sent_at[waiting].min()
        slots = (t.first_slot + waiting).tolist()
        shown = ", ".join(map(str, slots[:16])) + (", ..." if len(slots) > 16 else "")
        raise AggregationTimeout(
            f"job {t.job_id}: no result for {len(slots)} slot(s) [{shown}] after {oldest:.1f} s "
            f"(peer_timeout {t.policy.peer_timeout:g} s, {int(self.retries[waiting].sum())} "
            f"retransmissions): a worker is not sending or the switch is unreachable. The "
            f"switch's slot state for this job is now unknown: re-apply the job with a fresh "
            f"slot range (or restart the switch) before aggregating again")
