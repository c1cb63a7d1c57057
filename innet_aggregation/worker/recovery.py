"""Loss recovery for the worker's calls: when a packet counts as lost and is sent again.

The call consults it as a TCP stack consults its congestion control: it says when each
slot's packet went out (``loaded``, ``sent``), when an answer came (``measure``), when a
slot is done (``idle``), and asks when to wake (``next_timer``) and what to resend
(``expired_and_lost``).

**Loss.** A result missing while results of packets sent after it arrive is a
loss (RACK, RFC 8985: results return through one switch in about the order their
slots were sent): it is resent after one round trip plus a reordering window,
without waiting for a timer. Every packet also has a retransmission timer: the RFC
6298 estimate with Karn's rule, its floor twice the smoothed round trip (so it
follows the switch, not a constant chosen for the slowest one), doubled once per
timeout period until a fresh sample comes (one back-off for all packets: backing
off per packet as well compounded to 4^k after k rounds of loss, and through a
tree's four lossy passes at 10 % stretched calls 37-fold). Before a call's first
result, a timeout resends one packet a period, not the window (``LossRecovery.probe``): a
call's first results wait for the last worker to reach the call, which on a busy
host is late by more than a timeout, and resending every slot then only loads the
switch (in DDP on 2 shared cores this was 1 % of all packets, all spurious).

The compiled fast path (``fastpath.c``) runs the same arithmetic on these arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IDLE_SEQ = np.iinfo(np.int64).max   # a slot without a packet in flight: sent after every other


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




class LossRecovery:
    """One call's loss state: per slot of the window, when its packet was last and first
    sent, its send sequence number (RACK orders packets by it: a batch goes out in
    order), its timer expiries, and whether it was resent (Karn: no RTT sample from
    it); the newest answered send (``rack_seq``) and its round trip. A slot without a
    packet in flight was sent at +inf (IDLE_SEQ): it is never due, nor behind an
    answered one, with no mask of the waiting slots."""

    def __init__(self, rto: RtoEstimator, policy: RetransmitPolicy, num_slots: int):
        self.rto = rto
        self.policy = policy
        w = num_slots
        self.sent_at = np.full(w, np.inf)
        self.first_sent_at = np.full(w, np.inf)
        self.retries = np.zeros(w, dtype=np.int64)     # timer expiries, for the error message
        self.resent = np.zeros(w, dtype=bool)          # Karn: no RTT sample
        self.sent_seq = np.full(w, IDLE_SEQ, dtype=np.int64)
        self.ramp = np.arange(w)
        self.next_seq = 0
        self.rack_seq = -1              # the newest packet answered
        self.rack_rtt = 0.0

    def loaded(self, slots: np.ndarray, now: float) -> None:
        """The slots took their next packet: its first transmission is now."""
        self.first_sent_at[slots] = now
        self.retries[slots] = 0
        self.resent[slots] = False

    def sent(self, slots: np.ndarray, now: float) -> None:
        """The slots' packets went out (or were lost on the way out): arm their timers."""
        self.sent_at[slots] = now
        self.sent_seq[slots] = self.next_seq + self.ramp[:len(slots)]
        self.next_seq += len(slots)

    def idle(self, slots: np.ndarray) -> None:
        """The slots' last chunk is final: nothing in flight there any more."""
        self.sent_at[slots] = np.inf
        self.first_sent_at[slots] = np.inf
        self.sent_seq[slots] = IDLE_SEQ

    def due(self, progress_at: float) -> np.ndarray:
        """When each slot's timer expires: the timeout (backed off by ``timed_out``) after
        its last send or after the call's last answer (``progress_at``), whichever is
        later (RFC 6298 5.3 restarts the timer on every answer: a packet that waits
        behind a burst queued at a slow link is not lost while answers keep coming;
        RACK finds the ones that are), never past ``peer_timeout``."""
        start = np.maximum(self.sent_at, progress_at)
        return np.minimum(start + self.rto.rto,
                          self.first_sent_at + self.policy.peer_timeout)

    def next_timer(self, progress_at: float) -> float:
        """The earliest ``due`` (the same sum on the earliest times: rounding is
        monotonic) or RACK deadline."""
        wake = min(max(self.sent_at.min(), progress_at) + self.rto.rto,
                   self.first_sent_at.min() + self.policy.peer_timeout)
        if self.sent_seq.min() < self.rack_seq:       # a packet behind an answered one
            behind = self.sent_seq < self.rack_seq
            wake = min(wake, self.sent_at[behind].min() + self.rack_rtt
                       + self.rto.reorder_window)
        return wake

    def measure(self, slots: np.ndarray, now: float) -> None:
        """One RTT sample per batch, and RACK's newest answered send time, both from
        packets sent once only (Karn: an answer to a resent packet may belong to
        either copy, and taking the later one would call packets in flight lost)."""
        resent = self.resent[slots]
        clean = slots[~resent] if resent.any() else slots
        if not clean.size:
            return
        sent = self.sent_at[clean]
        self.rto.sample(float(now - sent.sum() / len(sent)))    # the mean, as numpy's
        seq = self.sent_seq[clean]
        newest = int(seq.argmax())
        if seq[newest] > self.rack_seq:
            self.rack_seq, self.rack_rtt = int(seq[newest]), now - sent[newest]

    def expired_and_lost(self, now: float, progress_at: float) -> tuple[np.ndarray, np.ndarray]:
        """Per slot, whether its timer expired, and whether RACK finds it lost: sent
        before an answered one, a round trip and the reordering window ago. Before the
        call's first answer an expiry probes (``probe``)."""
        expired = self.due(progress_at) <= now
        lost = (~expired & (self.sent_seq < self.rack_seq)
                & (self.sent_at + self.rack_rtt + self.rto.reorder_window <= now))
        if expired.any() and progress_at == -np.inf:
            expired = self.probe(expired, now)
        return expired, lost

    def probe(self, expired: np.ndarray, now: float) -> np.ndarray:
        """Before the call's first answer, a timeout is more often workers that have not
        sent yet (late to the call, descheduled on a busy host) than loss, and resending
        the window would only load the switch: resend one packet, the oldest (the same
        slot on every worker: the window goes out in one order), which asks whom the
        switch waits for, and restart the others' timers (no RTT sample from them:
        Karn). The call's first result restarts every timer from it (``due``), and
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

    def timed_out(self, expired: np.ndarray, now: float) -> None:
        """The slots' timers expired: back the timeout off, count the expiries."""
        self.rto.timed_out(now)
        self.retries[expired] += 1
