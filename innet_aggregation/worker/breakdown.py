"""Where a call's time goes: its phases, timed exclusively, and the summary a person
reads (``INA_DEBUG=INFO``) or a profiler shows.

A call interleaves everything at the granularity of a batch of packets (results in,
their blocks dequantized, the slots' next packets quantized and sent), so a phase is
the sum of the intervals the worker spent in it; the clock is read at batch edges,
never per packet, and the compiled fast path keeps its own sums (fastpath.c). What no
phase claims (Python's bookkeeping between them) is ``other``, so the phases add up
to the call's time by construction. Waiting is split by what the round trips show:
the time from the call's first packet to its first result beyond one round trip is
spent waiting for the last rank to reach the call (the switch answers a round only
when every rank is in); the rest is the switch and the wire. Which rank that was, the
switch says in its WAITING replies, which come only once a timer has expired: a rank
late by less than a timeout is waited for unnamed.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

# In the order the summary line and the profiler's ranges give them.
PHASES = ("prepare", "quantize", "send", "wait", "receive", "results", "repair", "fallback")
LEVELS = ("WARN", "INFO")


class Timing:
    """A transport's running sums of seconds per phase, each interval counted in one
    phase only: entering a phase inside another pauses the outer one."""

    def __init__(self):
        self.spent = dict.fromkeys(PHASES, 0.0)
        self.stack: list[str] = []
        self.mark = 0.0
        self.ranges = None          # a profiler's open ranges, while one records

    def enter(self, phase: str) -> None:
        now = time.perf_counter()
        if self.stack:
            self.spent[self.stack[-1]] += now - self.mark
        self.stack.append(phase)
        self.mark = now
        if self.ranges is not None:
            self.ranges.enter(phase)

    def leave(self) -> None:
        now = time.perf_counter()
        self.spent[self.stack.pop()] += now - self.mark
        self.mark = now
        if self.ranges is not None:
            self.ranges.leave()

    def credit(self, phase: str, seconds: float) -> None:
        """Seconds spent in ``phase`` that the compiled path measured, inside whatever
        phase Python is in (which loses them)."""
        if seconds:
            self.spent[phase] += seconds
            if self.stack:
                self.spent[self.stack[-1]] -= seconds

    @contextmanager
    def phase(self, name: str):
        self.enter(name)
        try:
            yield
        finally:
            self.leave()

    @contextmanager
    def region(self, name: str):
        """A profiler range only (the compiled path's loop, whose phases C times)."""
        if self.ranges is None:
            yield
            return
        self.ranges.enter(name)
        try:
            yield
        finally:
            self.ranges.leave()

    def snapshot(self) -> dict[str, float]:
        return dict(self.spent)


class ProfilerRanges:
    """The phases as named ranges (``ina::PHASE``) in a running torch.profiler trace,
    under the collective's own range."""

    def __init__(self, torch):
        self.record_function = torch.autograd.profiler.record_function
        self.open: list = []

    @staticmethod
    def active():
        """torch, if it is imported and a profiler records now; else None (the phases
        then cost no range)."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.autograd.profiler._is_profiler_enabled:
            return None
        return torch

    def enter(self, name: str) -> None:
        rf = self.record_function(f"ina::{name}")
        rf.__enter__()
        self.open.append(rf)

    def leave(self) -> None:
        self.open.pop().__exit__(None, None, None)

    def mark(self, text: str) -> None:
        """A zero-length range whose name carries ``text`` (the call's breakdown)."""
        self.enter(text)
        self.leave()


def timed(phase: str):
    """A method of an object with a ``timing`` (Timing) whose time is ``phase``'s."""
    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            timing = self.timing
            timing.enter(phase)
            try:
                return method(self, *args, **kwargs)
            finally:
                timing.leave()
        return run
    return wrap


@dataclass(frozen=True)
class CallBreakdown:
    """One call (or several summed): seconds per phase (``phases``; ``other`` is the
    rest), how much of the wait was for the last rank to reach the call
    (``ranks_wait_s``, the rest being the switch and the wire), and its packets.
    ``waited_for``: the ranks the switch named as missing while the call waited
    (empty: it named none)."""
    seconds: float
    phases: dict[str, float]
    ranks_wait_s: float = 0.0
    waited_for: tuple[int, ...] = ()
    packets_sent: int = 0
    bytes_sent: int = 0
    results_received: int = 0
    retransmissions: int = 0
    redone: int = 0
    calls: int = 1
    fell_back: int = 0          # of the calls, those gloo summed
    other: float = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "other", max(0.0, self.seconds - sum(self.phases.values())))

    @property
    def network_wait_s(self) -> float:
        """The wait but for the ranks': the switch and the wire (and loss not yet
        repaired)."""
        return self.phases.get("wait", 0.0) - self.ranks_wait_s


    def as_dict(self) -> dict:
        return {**asdict(self), "network_wait_s": self.network_wait_s}

    def line(self, label: str = "") -> str:
        """The ``INA_DEBUG=INFO`` line: milliseconds per phase, largest share first."""
        ms = {name: 1e3 * s for name, s in self.phases.items() if s > 0}
        if self.other > 0:
            ms["other"] = 1e3 * self.other
        parts = ", ".join(f"{name} {value:.2f}" for name, value in
                          sorted(ms.items(), key=lambda item: -item[1]))
        wait = ""
        if self.phases.get("wait"):
            wait = (f"; of the wait, ranks {1e3 * self.ranks_wait_s:.2f} ms"
                    + (f" (named: {', '.join(map(str, self.waited_for))})" if self.waited_for
                       else "")
                    + f", switch and wire {1e3 * self.network_wait_s:.2f} ms")
        calls = f"{self.calls} calls, " if self.calls > 1 else ""
        return (f"{label + ': ' if label else ''}{calls}{1e3 * self.seconds:.2f} ms ({parts}){wait}; "
                f"{self.packets_sent} packets ({self.bytes_sent} B) out, "
                f"{self.results_received} results, {self.retransmissions} resent, "
                f"{self.redone} redone"
                + (f"; {self.fell_back} on gloo (fallback)" if self.fell_back else ""))


def ranks_wait(wait: float, first_result_s: float | None, rtt_s: float | None) -> float:
    """Of ``wait``, the time before the call's first result beyond one round trip: the
    switch answers a round only once every rank is in it."""
    if first_result_s is None or rtt_s is None:
        return 0.0
    return min(wait, max(0.0, first_result_s - rtt_s))


def debug_level(environ=os.environ) -> str:
    """``INA_DEBUG`` (NCCL_DEBUG's spirit): WARN, the default, says only what goes
    wrong; INFO adds one line per call (``INA_DEBUG_EVERY``: per that many calls)."""
    level = environ.get("INA_DEBUG", "WARN").upper()
    if level not in LEVELS:
        raise ValueError(f"INA_DEBUG={level!r}: expected one of {', '.join(LEVELS)}")
    return level


def debug_every(environ=os.environ) -> int:
    text = environ.get("INA_DEBUG_EVERY", "1")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"INA_DEBUG_EVERY={text!r}: expected a whole number of calls, 1 or more")
    return int(text)


NONE = CallBreakdown(0.0, dict.fromkeys(PHASES, 0.0), calls=0)   # no call: what sums start from
_COUNTS = ("packets_sent", "bytes_sent", "results_received", "retransmissions", "redone",
           "calls", "fell_back")


def since(after: CallBreakdown, before: CallBreakdown) -> CallBreakdown:
    """The calls summed into ``after`` since ``before`` (two running sums), as their
    mean call (the counts stay sums)."""
    calls = after.calls - before.calls
    if calls < 1:
        return NONE
    return CallBreakdown(
        (after.seconds - before.seconds) / calls,
        {p: (after.phases.get(p, 0.0) - before.phases.get(p, 0.0)) / calls for p in PHASES},
        (after.ranks_wait_s - before.ranks_wait_s) / calls, after.waited_for,
        **{name: getattr(after, name) - getattr(before, name) for name in _COUNTS})


def combine(calls: list[CallBreakdown]) -> CallBreakdown:
    """Several calls as one: their sums."""
    return CallBreakdown(
        seconds=sum(c.seconds for c in calls),
        phases={p: sum(c.phases.get(p, 0.0) for c in calls) for p in PHASES},
        ranks_wait_s=sum(c.ranks_wait_s for c in calls),
        waited_for=tuple(sorted({r for c in calls for r in c.waited_for})),
        **{name: sum(getattr(c, name) for c in calls) for name in _COUNTS})
