"""One aggregation's state machine: per chunk its scale and fingerprint, per slot the
chunk in flight and what the switch last said; results taken, stored, redone, and the
next chunks sent. The transport (transport.py) owns the socket and the batch I/O; the
call consults its loss recovery (recovery.py) for what to resend and its bounded time
(bounded.py) for release, quorum and carry, and hands the common results to the
compiled fast path (fastpath.py) where it can.

**One result path.** Every result, whole or released, final or to be redone, goes
through ``Call.settle``: a released round is a result with a bitmap of who is in it.
The fast path does the same for the common case (a whole, final float32 result) in C,
and hands anything else to ``settle``.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from innet_aggregation.p4src.protocol import EXPONENT_OF_ZERO, MsgType

from . import quantize
from .bounded import BoundedCall
from .breakdown import timed
from .errors import START, RECOVER, AggregationTimeout, CallAborted, CallMismatch, stale
from .fastpath import FastCall
from .recovery import LossRecovery
from .wire import FINGERPRINT_MASK, PKT_ID_MASK, leading_bytes

RECV_BATCH = 512              # results drained from the socket per system call
COALESCE_BATCH = 8            # fewer results than this per wake-up: wait for more
ABORT_POLL = 0.5              # seconds: a waiting call asks whether to give up this often

log = logging.getLogger("worker")


class Call:
    """The state of one call: per chunk its scale and fingerprint, per slot the
    chunk in flight, its loss recovery and what the switch last said it waits for.
    ``slots`` (the session's start, parking) puts chunk i alone in slot ``slots[i]``.
    ``quantized``: ``blocks`` are floats, quantized and redone as the results say,
    and a final result is dequantized (``average``: the mean) into ``out``;
    otherwise int32 values sent as they are, each result final and stored in
    ``out`` as it is. ``fingerprints``: per chunk, what its packets carry, and its
    result n times; ``signature``, the caller's (dtype, shape) in them, is named
    where they differ."""

    def __init__(self, transport, blocks: quantize.Blocks, out: quantize.Blocks,
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
        # Per slot of the window: the chunk in flight (-1: none).
        self.chunk = np.full(w, -1, dtype=np.int64)
        if slots is None:
            self.step = w
            first = np.arange(min(n, w))
            self.chunk[first] = first
        else:
            self.step = n                    # one chunk per slot, nothing after it
            self.chunk[slots] = np.arange(n)
        self.in_flight = int(np.count_nonzero(self.chunk >= 0))
        self.loss = LossRecovery(t.rto, t.policy, w)
        self.started = time.monotonic()
        self.progress_at = -np.inf      # when the call last got an answer
        self.first_result = np.inf      # when it got its first
        self.missing = 0                # the workers the switch last said it waited for
        self.heard_at = self.started    # when the switch last said anything (a WAITING reply)
        self.logged_at = self.started   # when it last logged whom it waits for
        # The switch's last WAITING reply per slot: the bitmap of who had contributed.
        self.told = np.zeros(w, dtype=bool)
        self.contributors = np.zeros(w, dtype=np.int64)
        self.expect = np.zeros((w, t.identity_bytes), dtype=np.uint8)   # see answers
        self.expect_id = self.expect.view(f"V{t.identity_bytes}")[:, 0]  # as one value each
        self.bounded = BoundedCall(self, quantized)
        self.fast = FastCall.bind(self)  # the common results in C, if it handles this call

    @property
    def members(self) -> np.ndarray | None:
        """Per chunk, who is in its last round (a bitmap), if a round was released."""
        return self.bounded.members

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        """Aggregate every chunk; returns per chunk its scale and the agreed maximum."""
        t = self.t
        loaded = np.flatnonzero(self.chunk >= 0)
        self.bounded.before_start()
        self._load(loaded, self.chunk[loaded], time.monotonic())
        self.bounded.batch_ends(time.monotonic())
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
                self.bounded.batch_begins()
                while True:
                    packets, headers, datagrams = t.receive()
                    drained += datagrams
                    if len(packets):
                        self._on_results(packets)
                    if len(headers):
                        self._on_waiting(headers)
                    if datagrams < RECV_BATCH:
                        break
                repair = t.bounded.repair
                if repair is not None and len(repaired := repair.receive()):
                    drained += len(repaired)
                    self._on_results(repaired)
                self.bounded.batch_ends(time.monotonic())
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

    @timed("wait")
    def _poll(self, seconds: float) -> bool:
        """Whether a datagram came within ``seconds``."""
        return bool(self.t.poller.poll(max(seconds * 1000.0, 0.0)))

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
        t.bounded.contribution(slots)
        self.expect_id[slots] = t.tx_identity[slots]
        self.expect[slots, t.type_offset] = int(MsgType.RESULT)
        blocks = self.blocks.rows(chunks)
        if self.quantized:
            blocks = quantize.quantize(blocks, own, self.scale[chunks], t.num_workers,
                                       out=t.work[:len(slots)])
        t.tx_values[slots] = blocks
        self.loss.loaded(slots, now)
        self.told[slots] = False
        if self.bounded.loaded(slots):
            self.loss.resent[slots] = True     # answered before it goes out: no RTT sample
        else:
            self.transmit(slots, now)

    def transmit(self, slots: np.ndarray, now: float) -> int:
        """Send the slots' packets and arm their timers; what failed to go out is
        lost, and the timers repair it."""
        sent = self.t.send(slots)
        self.loss.sent(slots, now)
        return sent

    def _idle(self, slots: np.ndarray) -> None:
        """The slots' last chunk is final: nothing in flight there any more."""
        self.chunk[slots] = -1
        self.loss.idle(slots)
        self.in_flight -= len(slots)

    def _next_wakeup(self) -> float:
        """The earliest timer, RACK or release deadline, and at most ``ABORT_POLL`` away,
        so a waiting call asks ``Transport.abort`` that often: before it, ``_recover``
        has nothing to do."""
        return min(self._timers(), time.monotonic() + ABORT_POLL)

    def _timers(self) -> float:
        if self.fast is not None:
            return self.fast.next_wakeup()
        return min(self.loss.next_timer(self.progress_at),
                   self.bounded.timer(self.loss.first_sent_at))

    def answers(self, records: np.ndarray, kind: MsgType) -> tuple[np.ndarray, np.ndarray]:
        """Which of the datagrams answer a slot's packet in flight (type ``kind``,
        and the packet's identity bytes: job, set and slot, packet id), and the
        window slot each names (clipped into the window: a slot outside it has
        other identity bytes than the one it is clipped to)."""
        t = self.t
        slot = t.fmt.unpack(records, ("slot",))["slot"] - t.first_slot
        ident = leading_bytes(records, t.identity_bytes)
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
        packets = self.bounded.split_released(packets, now)
        match, slot = self.answers(packets, MsgType.RESULT)
        match &= packets["contributions"] == t.num_workers
        index, s = self.once(match, slot)
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
        self.bounded.whole(chunks)
        self.measure(s, now)
        self.settle(packets, rows, index, s, chunks, now)

    @staticmethod
    def once(match: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The matching datagrams and their slots, a slot's first only: a result twice
        in one batch (resent by the switch) counts once; arrival order is kept, so
        every worker sends its next packets in the same order."""
        index = match.nonzero()[0]
        s = slot[index]
        if len(s) > 1 and np.bincount(s).max() > 1:
            first = np.sort(np.unique(s, return_index=True)[1])
            index, s = index[first], s[first]
        return index, s

    def settle(self, packets: np.ndarray, rows, index: np.ndarray, s: np.ndarray,
               chunks: np.ndarray, now: float, left_out: np.ndarray | None = None) -> None:
        """The results (``packets[rows]``, datagrams ``index``) of slots ``s``, chunks
        ``chunks``: final ones stored, those to redo sent again, the next chunks sent.
        ``left_out``: released results, and which of them lack this worker's values."""
        t = self.t
        agreed = packets["exponent"][rows]
        self.agreed[chunks] = agreed
        keep = None
        if self.quantized:
            keep, self.scale[chunks] = quantize.settle(self.scale[chunks], agreed)
            if keep.all():
                keep = None
        self.bounded.settled(packets[rows], chunks, keep, left_out)
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
        match, slot = self.answers(headers, MsgType.WAITING)
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
            raise CallMismatch(stale(t, self.label, int(slot[stuck][0]), "the switch counts "
                                     "as many contributions there as there are workers, and "
                                     "no result"))

    def measure(self, slots: np.ndarray, now: float) -> None:
        """Answers of the slots came: the call's first result, and loss recovery's
        samples (RTT, RACK)."""
        self.first_result = min(self.first_result, now)
        self.loss.measure(slots, now)

    @timed("repair")
    def _recover(self, now: float) -> None:
        """Resend what loss recovery finds lost (RACK, expired timers), release what
        has waited the deadline; a packet waiting ``peer_timeout``, or a switch silent
        for ``switch_silence``, ends the call."""
        t, loss = self.t, self.loss
        dead = now - loss.first_sent_at >= t.policy.peer_timeout
        if dead.any() or now - max(self.heard_at, self.progress_at) >= t.policy.switch_silence:
            self._give_up(now)
        if (reason := t.abort()) is not None:
            raise CallAborted(f"job {t.job_id}, worker {t.worker_id}, {self.label}: given up "
                              f"after {now - self.started:.1f} s: {reason}")
        self.bounded.release(now)
        expired, lost = loss.expired_and_lost(now, self.progress_at)
        if expired.any() and t.bounded.repair is not None:
            t.bounded.ask_peers(np.flatnonzero(expired & (self.chunk >= 0)))
        if expired.any():
            t.stats.timeouts += int(expired.sum())
            loss.timed_out(expired, now)
            # From its first timeout on, a packet asks the switch to answer it, if
            # its slot is unfinished, with whom it waits for (a WAITING reply).
            t.tx["contributions"][expired] = 1
        again = np.flatnonzero(expired | lost)
        if again.size:
            t.bounded.resending(again)
            sent = self.transmit(again, now)
            t.stats.retransmissions += sent
            t.stats.fast_retransmissions += int(min(sent, lost.sum()))
            loss.resent[again] = True

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
        oldest = now - self.loss.first_sent_at[waiting].min()
        silent = now - max(self.heard_at, self.progress_at)
        slots = (t.first_slot + waiting).tolist()
        shown = ", ".join(map(str, slots[:16])) + (", ..." if len(slots) > 16 else "")
        bound = (f"peer_timeout {t.policy.peer_timeout:g} s" if oldest >= t.policy.peer_timeout
                 else f"the switch silent for {silent:.1f} s, switch_silence "
                      f"{t.policy.switch_silence:g} s")
        raise AggregationTimeout(
            f"job {t.job_id}, worker {t.worker_id}, {self.label}: no result for {len(slots)} "
            f"slot(s) [{shown}] after {oldest:.1f} s ({bound}, "
            f"{int(self.loss.retries[waiting].sum())} timer expiries); {self._waiting_for()}. "
            f"The switch's slot state for this job is now unknown: {RECOVER}",
            switch_answered=bool(self.told[waiting].any()))

    def _mismatch(self, chunk: int, got: int) -> None:
        t = self.t
        if self.label == START:           # the start's chunk i is in slot i
            raise CallMismatch(stale(t, START, chunk, "its sum holds other contributions "
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
