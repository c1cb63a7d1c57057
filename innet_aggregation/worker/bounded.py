"""Bounded-time aggregation (a job's ``deadline_ms``; off by default): release, quorum,
carry and the late worker's catching up, one object per session (``BoundedTime``) and one
per call (``BoundedCall``) that the call consults; nothing else holds its state.

A slot that has waited the deadline since this worker's contribution asks the switch to
release its round (RELEASE, ``BoundedCall.release``): the switch sends what it holds to
every worker as RELEASED, with the bitmap of who is in it, and answers any later packet
of that round with the same bits (p4src/shared/deadline.p4). A released round is a
result like any other (the call's one result path, ``Call.settle``); a worker that is
not in it keeps its blocks' values and adds them to the same blocks of the next call of
the same history key (``carry``, ``add_carried``): a gradient is applied one call late,
never dropped, and AVG still divides by the job's size. The session's start and parking
never release.

A call spans many rounds of each slot, and a rank late for one is late for the next ones
too: once a round was released without some workers, every round goes out as a QUORUM
contribution naming how many workers the release held (from the workers it held; the
ones it awaits send plain contributions), and the switch releases each the
moment that many are in, so the deadline is waited once, not once a round, until a
released round has the missing workers in again (``BoundedTime.follow_releases``; the
Tofino program counts a QUORUM as a plain contribution, so there the deadline is waited
each round). A late worker takes the released results it finds queued as the others did
(sorted by round, ``BoundedCall.take_early``), and sends nothing for a round whose result
it holds; the others' lead is bounded by what it can hold: once a worker has been left
out of LEAD_LIMIT released rounds in a row, the others neither release nor send quorums
(``BoundedTime.lead_ok``) until a round has every worker again, and a deadline job's
socket buffer holds twice that many results (``lead_buffer``). A result lost on its way
to a late worker, of a round the switch no longer holds (its resends are stale there),
comes from the peers, who keep what they took (``repair.py``): a timer's expiry asks them,
and so does a slot before its release, since a switch that restarted would release a
round the others took with this worker's values alone (``BoundedCall.release``); for the
same reason a QUORUM goes out again as a plain contribution (``BoundedTime.resending``).
"""

from __future__ import annotations

import logging
import socket

import numpy as np

from innet_aggregation.p4src.protocol import (MSG_QUORUM, MSG_RELEASE, MSG_RELEASED, STALE_ROUNDS,
                                              MsgType)

from . import quantize
from .errors import CallMismatch, stale
from .repair import ASK_MAX, Repair
from .wire import PKT_ID_MASK

# Released rounds in a row a worker may miss before the others wait for it again: what a
# late worker must hold, queued in its socket and then kept (``early``), to catch up. At
# 1,024 values a packet, about 8 MiB of results. Half the switch's stale window: with one
# slot every such round is a packet id of that slot, and a late worker's packet as many
# ids behind as STALE_ROUNDS would count as newer and restart its round there (the
# others' window in flight and the redone blocks stay within the other half).
LEAD_LIMIT = STALE_ROUNDS // 2
EARLY_ROUNDS = 1 << 16        # a released round this many ahead of its slot's is a duplicate
# A slot that waited the deadline asks its peers for its round first, and releases it
# only if none answered within this share of the deadline (``BoundedCall.release``).
ASK_GRACE = 0.5
SO_RCVBUFFORCE = 33           # asm-generic/socket.h: past rmem_max, with CAP_NET_ADMIN

log = logging.getLogger("worker")


def lead_buffer(t, socket_buffer: int) -> None:
    """A deadline job's socket (``t``: the Transport's) holds 2 LEAD_LIMIT results, what
    this worker gets while it is late (asleep, descheduled) before the others wait for
    it, if it may (beyond net.core.rmem_max only as root, SO_RCVBUFFORCE). A result lost
    to a full buffer is one the switch may no longer hold, but the peers do, as many
    (``Repair``'s ring): short of it, the late worker asks them for what it lost, a
    request's ASK_MAX rounds per timer expiry, which costs time, not values."""
    # What the kernel charges a datagram: its buffer, a power of two, and the skb.
    charged = (1 << (t.fmt.payload_bytes + 512).bit_length()) + 256
    # Twice the limit: the others stop once they see it, with a window in flight each.
    want = max(2 * LEAD_LIMIT * charged, 2 * socket_buffer)
    for option in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
        try:
            t.sock.setsockopt(socket.SOL_SOCKET, option, want // 2)  # the kernel doubles it
            break
        except PermissionError:
            continue
    got = t.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    if got < want:
        log.info("job %d, worker %d: the socket holds %d bytes of results, not the %d "
                 "a worker late by %d released rounds gets (raise net.core.rmem_max, or "
                 "run as root): results lost there are asked of the peers",
                 t.job_id, t.worker_id, got, want, LEAD_LIMIT)


class BoundedTime:
    """A session's bounded-time state, over its calls: the job's ``deadline`` (seconds,
    0: none), the released rounds this worker has not reached yet (``early``: the
    packets, and each one's window slot and packet id), per worker the released rounds
    in a row it was left out of, the quorum every round asks for while some workers are
    awaited, and the peers that send a result lost on the way (``repair``)."""

    def __init__(self, t, deadline: float, peers, local_ip: str, local_port: int):
        if deadline < 0:
            raise ValueError(f"the deadline must not be negative, not {deadline}")
        self.t = t
        self.deadline = deadline
        self.early: list[np.ndarray] = []
        self.early_slot = np.zeros(0, dtype=np.int64)
        self.early_id = np.zeros(0, dtype=np.int64)
        self.left_out = np.zeros(t.num_workers, dtype=np.int64)
        # Since a round was released without some workers (``awaited``, a bitmap) and
        # until a released round has them all again: the quorum every round asks for.
        self.quorum = 0
        self.awaited = 0
        # A deadline job's results lost on the way to this worker, from its peers
        # (``peers``: the others' address and job port; repair.py).
        self.repair = None
        if deadline and peers:
            self.repair = Repair(t.fmt, t.job_id, local_ip, local_port, list(peers),
                                 kept=2 * LEAD_LIMIT)

    def close(self) -> None:
        if self.repair is not None:
            self.repair.close()

    def follow_releases(self, bitmaps: np.ndarray, counts: np.ndarray) -> None:
        """Released rounds (who is in each, how many), in the order taken: the first one
        without some workers starts the quorum, a later one with fewer in (a deadline
        hit again) lowers it and awaits those too, and one with every awaited worker in
        ends it: the late workers are back, and rounds wait for everyone again."""
        if self.quorum and not (((bitmaps & self.awaited) == self.awaited)
                                | (counts < self.quorum)).any():
            return                      # the common batch: the awaited still out
        everyone = (1 << self.t.num_workers) - 1
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

    def everyone_in(self) -> None:
        """A whole result: every worker is in, and rounds wait for everyone again."""
        self.left_out[:] = 0
        self.quorum = self.awaited = 0

    def contribution(self, slots: np.ndarray) -> None:
        """The slots' new packets: a QUORUM names its quorum; a contribution asks for
        nothing (the call's recovery sets it to ask once a timer expires). A worker the
        quorum awaits sends plain contributions: its QUORUM, for a round the others
        took before a switch restart, would have the restarted switch release that
        round at once with its values alone, asking nobody (``BoundedCall.release``);
        the others' QUORUMs release the rounds it is in."""
        t = self.t
        awaited = self.awaited >> t.worker_id & 1
        quorum = self.quorum if self.quorum and self.lead_ok() and not awaited else 0
        t.tx_contributions[slots] = quorum
        t.tx_type[slots] = MSG_QUORUM if quorum else int(MsgType.CONTRIBUTION)

    def resending(self, slots: np.ndarray) -> None:
        """The slots' packets go out again: a QUORUM as a plain contribution that asks
        whom the switch waits for. A switch that forgot the round (its slot reset, or
        restarted) since the first copy would take a resent QUORUM as the round's first
        packet and, at a quorum as small as the workers resending, release it at once
        with their values alone, asking nobody, though the round had finished there
        (its result lost on the way to them) and the others took it whole. A plain
        contribution is counted and waits: its result comes from the peers (their
        answer to the timer's ask) or, nobody holding it, from the release the deadline
        sends after asking them (``BoundedCall.release``). The cost: a round whose
        completing QUORUM was lost on its way to the switch waits for the deadline and
        the grace."""
        t = self.t
        quorum = slots[t.tx_type[slots] == MSG_QUORUM]
        t.tx_type[quorum] = int(MsgType.CONTRIBUTION)
        t.tx_contributions[quorum] = 1

    def keep_early(self, packets: np.ndarray) -> None:
        """Released rounds of a slot that this worker has not reached yet (the others
        went on without it, into later calls): kept, for the call that reaches them
        (``BoundedCall.flush``); anything else is a duplicate. The others stop at
        LEAD_LIMIT rounds ahead of a late worker (``lead_ok``), so twice that is never
        reached but by a flood, whose oldest rounds go."""
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
            self.early.append(packets[ahead])   # a copy: ``packets`` may be the receive buffer
            self.early_slot = np.concatenate((self.early_slot, slot[ahead]))
            self.early_id = np.concatenate((self.early_id, ids[ahead]))
            while len(self.early_id) > 2 * LEAD_LIMIT:
                gone = len(self.early.pop(0))
                self.early_slot, self.early_id = self.early_slot[gone:], self.early_id[gone:]

    def ask_peers(self, slots: np.ndarray) -> None:
        """The slots' timers expired: their round may be one the switch holds no more
        (the others went on), so ask the peers that took its result to send it
        (repair.py), and the slot's next rounds, which a worker that slept lost too: as
        many as one request names."""
        t = self.t
        depth = max(1, ASK_MAX // max(len(slots), 1))
        ids = t.tx_pkt_id[slots].astype(np.int64)[:, None] + np.arange(depth)
        self.repair.ask(np.repeat(t.first_slot + slots, depth), ids.reshape(-1) & PKT_ID_MASK)
        t.stats.repairs_asked += len(slots)


class BoundedCall:
    """One call's bounded time: its deadline (``quantized`` calls only: the session's
    start and parking need every worker), the slots whose RELEASE went out, the chunks
    whose sends wait while a batch of results is taken (``deferring``, ``unsent``: a
    late worker sends nothing for a round whose result it holds), this worker's values
    that released rounds left out (``carried``), and per chunk who is in its last round
    (``members``; None: everyone in every block)."""

    def __init__(self, call, quantized: bool):
        t = call.t
        self.call = call
        self.time = t.bounded
        self.deadline = self.time.deadline if quantized else 0.0
        w = t.num_slots
        self.releasing = np.zeros(w, dtype=bool)
        self.asked = np.full(w, np.inf)       # when the peers were asked before a release
        self.grace = ASK_GRACE * self.deadline
        self.deferring = False
        self.unsent = np.zeros(w, dtype=bool)
        self.carried: list[tuple[np.ndarray, np.ndarray]] = []   # (chunks, own values) left out
        self.members: np.ndarray | None = None

    def before_start(self) -> None:
        """Results that came before this call (kept early) are taken before it sends."""
        self.deferring = bool(self.deadline and self.time.early)

    def batch_begins(self) -> None:
        self.deferring = bool(self.deadline)

    def batch_ends(self, now: float) -> None:
        if self.deferring:
            self.flush(now)

    def loaded(self, slots: np.ndarray) -> bool:
        """The slots took their next packets: their release is not asked yet; whether
        their sends wait for the end of the batch (``flush``)."""
        self.releasing[slots] = False
        self.asked[slots] = np.inf
        if self.deferring:
            self.unsent[slots] = True
            return True
        return False

    def flush(self, now: float) -> None:
        """The end of a batch of results: the released rounds kept earlier that are now
        due are taken (``take_early``), then the chunks loaded meanwhile sent."""
        call, t, bt = self.call, self.call.t, self.time
        if len(bt.early_id) and ((bt.early_id == t.tx_pkt_id[bt.early_slot].astype(np.int64))
                                 & (call.chunk[bt.early_slot] >= 0)).any():
            self.take_early(now)
        self.deferring = False
        send = np.flatnonzero(self.unsent & (call.chunk >= 0))
        self.unsent[:] = False
        if send.size:
            call.loss.resent[send] = False     # its first transmission
            call.transmit(send, now)

    def take_early(self, now: float) -> None:
        """The released rounds kept for later, in round order (a late worker finds many
        rounds of each slot): a group a round ahead of the last is due once the last
        is taken; what is still ahead is kept again."""
        t, bt = self.call.t, self.time
        early = np.empty(len(bt.early_id), dtype=t.fmt.dtype)   # without out=, native order
        np.concatenate(bt.early, out=early)
        ahead = (bt.early_id - t.tx_pkt_id[bt.early_slot].astype(np.int64)) & PKT_ID_MASK
        bt.early, bt.early_slot, bt.early_id = [], bt.early_slot[:0], bt.early_id[:0]
        order = np.argsort(ahead, kind="stable")
        early, ahead = early[order], ahead[order]
        for group in np.split(early, np.flatnonzero(np.diff(ahead)) + 1):
            self.on_released(group, now)

    def timer(self, first_sent_at: np.ndarray) -> float:
        """When the earliest slot not yet releasing has waited the deadline (and, once
        it asked its peers, the grace)."""
        if self.deadline and not self.releasing.all() and self.time.lead_ok():
            due = first_sent_at + self.deadline
            return np.where(np.isfinite(self.asked), np.maximum(due, self.asked + self.grace),
                            due)[~self.releasing].min()
        return np.inf

    def release(self, now: float) -> None:
        """Slots that have waited the job's deadline since this worker's contribution
        ask the switch to release their round with what it holds: the packet goes out
        again as a RELEASE (its retransmissions too), which every worker's copy of the
        round answers alike (RELEASED, ``on_released``).

        First its peers are asked for the round. A switch that restarted holds no round:
        a worker's packet there starts its round afresh, and released it holds that
        worker's values alone, which the others, who took the round before the
        restart, never apply (a late worker frozen across the restart sends such
        rounds). So a due slot asks its peers for its round (``repair.py``: a peer that
        took it sends it) and releases only if none answered within ``ASK_GRACE`` of
        the deadline."""
        if not self.deadline:
            return
        call, t = self.call, self.call.t
        due = ~self.releasing & (call.loss.first_sent_at + self.deadline <= now)
        if not due.any() or not self.time.lead_ok():
            return
        if self.time.repair is not None:
            ask = due & ~np.isfinite(self.asked)
            if ask.any():
                self.time.ask_peers(np.flatnonzero(ask))
                self.asked[ask] = now
            due &= self.asked + self.grace <= now
            if not due.any():
                return
        slots = np.flatnonzero(due)
        self.releasing[slots] = True
        t.tx_type[slots] = MSG_RELEASE
        t.stats.releases += call.transmit(slots, now)
        call.loss.resent[slots] = True          # Karn: the answer may be either packet's

    def split_released(self, packets: np.ndarray, now: float) -> np.ndarray:
        """The batch's released rounds taken (``on_released``); the rest returned."""
        if not self.time.deadline:
            return packets
        released = packets["msg_type"] == MSG_RELEASED
        if released.any():
            self.on_released(packets[released], now)
            packets = packets[~released]
        return packets

    def on_released(self, packets: np.ndarray, now: float) -> None:
        """Rounds the switch released at the job's deadline (RELEASED: what it held,
        ``contributions`` of them, and in the fingerprint's place the bitmap of who is
        in it). Every worker gets the same packet, the late ones too, and takes it as a
        result; a worker that is not in it keeps its blocks' values for the next call
        of the same name (``carried``). A late worker finds several rounds of a slot
        queued at once: each pass takes a slot's next one. The bitmap replaces the
        call check's sum, so it is checked for what it can say: as many bits as
        contributions, all of them the job's workers."""
        call, t, bt = self.call, self.call.t, self.time
        while len(packets):
            match, slot = call.answers(packets, MSG_RELEASED)
            index, s = call.once(match, slot)
            if not len(index):
                break
            chunks = call.chunk[s]
            bitmap = packets["fingerprint"][index].astype(np.int64)
            count = packets["contributions"][index].astype(np.int64)
            bits = np.unpackbits(bitmap.astype(">u4").view(np.uint8).reshape(-1, 4),
                                 axis=1).sum(axis=1)
            bad = (bits != count) | (count == 0) | ((bitmap & ~t.local_mask) != 0)
            if bad.any():
                first = int(np.argmax(bad))
                raise CallMismatch(stale(
                    t, call.label, int(s[first]), f"a released round names workers "
                    f"{int(bitmap[first]):#x} ({int(count[first])} contributions), which are "
                    f"not this job's"))
            t.stats.results_received += len(index)
            inside = ((bitmap[:, None] >> np.arange(t.num_workers)) & 1).any(axis=0)
            bt.left_out = np.where(inside, 0, bt.left_out + len(index))
            bt.follow_releases(bitmap, count)
            call.measure(s, now)
            if self.members is None:
                self.members = np.full(call.n, (1 << t.num_workers) - 1, dtype=np.int64)
            self.members[chunks] = bitmap
            call.settle(packets, index, index, s, chunks, now,
                        left_out=(bitmap >> t.worker_id) & 1 == 0)
            rest = np.ones(len(packets), dtype=bool)
            rest[index] = False
            packets = packets[rest]
        bt.keep_early(packets)

    def whole(self, chunks: np.ndarray) -> None:
        """Whole results (every worker in) of the chunks."""
        self.time.everyone_in()
        if self.members is not None:
            self.members[chunks] = (1 << self.call.t.num_workers) - 1

    def settled(self, results: np.ndarray, chunks: np.ndarray, keep: np.ndarray | None,
                left_out: np.ndarray | None) -> None:
        """Results taken (``results``, of ``chunks``; ``keep``: which are final, None:
        all): kept for a peer that lost them, and, of released ones (``left_out``: which
        lack this worker's values), this worker's values carried to the next call."""
        t = self.call.t
        if self.time.repair is not None:          # for a peer that lost them
            self.time.repair.keep(results)
        if left_out is None:
            return
        final = left_out if keep is None else left_out & keep
        t.stats.released += len(chunks) if keep is None else int(np.count_nonzero(keep))
        if final.any():     # its own values, before the result overwrites them in place
            late = chunks[final]
            self.carried.append((late, np.array(self.call.blocks.rows(late), copy=True)))
            t.stats.late += len(late)

    def keep_carried(self, carry, key: tuple) -> None:
        """What released rounds left out of this call, into the carry for the next call
        of ``key``, and counted."""
        if not self.carried:
            return
        t, blocks = self.call.t, self.call.blocks
        chunks = np.concatenate([c for c, _ in self.carried])
        carry.keep(key, chunks, np.concatenate([v for _, v in self.carried]))
        whole = int(np.count_nonzero(chunks < len(blocks.whole)))
        t.stats.carried_values += (whole * blocks.whole.shape[1] + (len(chunks) - whole)
                                   * (blocks.flat.size - blocks.whole.size))


def add_carried(blocks: quantize.Blocks, own: np.ndarray, chunks: np.ndarray,
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
