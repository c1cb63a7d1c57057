"""The worker's fast path: ``fastpath.c`` compiled on first use, bound to one call.

Each wake-up of a call used to cost about 160 Python and numpy calls, whatever the
number of results, and a worker shares two cores with the others and the switch. The
common case (a result that is final, for a whole float32 block) is handled in C, on
the call's own numpy arrays, with the next packets sent from there, and so is the
waiting between batches (``FastCall.run``): a wake-up costs no Python. Anything
else goes to the Python code, unchanged, and so do the timers' expiries. Without a
C compiler the transport runs the Python path (one info line says so).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import numpy as np

from innet_aggregation import cbuild
from innet_aggregation.p4src.protocol import EXPONENT_OF_ZERO, MsgType

from . import quantize
from .batchio import BATCHED

SOURCE = Path(__file__).resolve().parent / "fastpath.c"
log = logging.getLogger("worker")

_I32 = ("off_type", "off_set_slot", "off_pkt_id", "off_exponent", "off_contributions",
        "off_fingerprint", "off_values", "identity_bytes", "values", "packet_bytes",
        "result_type", "slot_shift", "slot_mask", "exponent_of_zero", "poison", "slack",
        "num_workers", "bits", "dequantize_shift", "average", "power_of_two")
_I64 = ("n", "step", "whole_in", "whole_out", "num_slots", "first_slot")
_RUN_F64 = ("progress_at", "rack_rtt", "srtt", "rttvar", "min_rtt", "rto", "min_rto",
            "max_rto", "granularity", "peer_timeout", "wake")
_PTRS = ("tx", "set_slot_words", "expect", "in_whole", "in_tail", "out_whole", "chunk",
         "scale", "agreed", "own", "next_set", "next_pkt_id", "fingerprints", "expected",
         "sent_at", "first_sent_at", "sent_seq", "retries", "resent", "told", "queue", "rx")


# What the C unit times, and the phase (breakdown.PHASES) each is credited to.
TIMED = ("t_wait", "t_receive", "t_results", "t_send")
_PHASE = {"t_wait": "wait", "t_receive": "receive", "t_results": "results", "t_send": "send"}


class CallState(ctypes.Structure):
    """``struct fp_call``, field for field."""
    _fields_ = ([(f, ctypes.c_int32) for f in _I32] + [(f, ctypes.c_int64) for f in _I64]
                + [(f, ctypes.c_void_p) for f in _PTRS]
                + [(f, ctypes.c_int64) for f in ("next_seq", "rack_seq", "results", "idle",
                                                 "queued", "sent", "failed_rows", "rtt_count",
                                                 "datagrams", "rx_stride")]
                + [("rtt_sum", ctypes.c_double), ("rack_sent_at", ctypes.c_double),
                   ("err", ctypes.c_int32), ("recv_err", ctypes.c_int32)]
                + [(f, ctypes.c_double) for f in _RUN_F64]
                + [(f, ctypes.c_int64) for f in ("in_flight", "has_srtt", "run_results",
                                                 "run_sent", "handled")]
                + [(f, ctypes.c_double) for f in (*TIMED, "first_result_at")])


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled fast path, or None (logged once) where it cannot be built."""
    if not BATCHED:
        log.info("worker fast path off: no sendmmsg/recvmmsg here")
        return None
    try:
        so = cbuild.shared_object("worker-fastpath", (SOURCE.read_bytes(),),
                                  SOURCE.read_text, what=SOURCE.name)
    except cbuild.BuildUnavailable as exc:
        log.info("worker fast path off (%s): results are handled in Python", exc)
        return None
    lib = ctypes.CDLL(str(so))
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    lib.fp_results.argtypes = [P, P, I64, I64, ctypes.c_double, ctypes.c_int, ctypes.c_int]
    lib.fp_results.restype = I64
    D = ctypes.c_double
    lib.fp_run.argtypes = [P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, D, D, D, D, I64]
    lib.fp_run.restype = ctypes.c_int
    lib.fp_next_wakeup.argtypes = [P, D, D, D, I64, D, D]
    lib.fp_next_wakeup.restype = D
    lib.fp_quantize.argtypes = [P, P, I64, I64, P]
    lib.fp_dequantize.argtypes = [P, P, I64, P]
    lib.fp_quantize.restype = lib.fp_dequantize.restype = None
    return lib


def layout(state: CallState, fmt, num_workers: int, average: bool) -> None:
    """The packet's layout and the numbers' constants, from the program and the job."""
    fields = fmt.dtype.fields
    word = fmt.word("slot")
    shift, mask = fmt.bits("slot")
    if fmt.dtype[word] != np.dtype(">u2"):
        raise ValueError("the fast path expects the slot in a 16-bit word")
    state.off_type = fields["msg_type"][1]
    state.off_set_slot = fields[word][1]
    state.off_pkt_id = fields["pkt_id"][1]
    state.off_exponent = fields["exponent"][1]
    state.off_contributions = fields["contributions"][1]
    state.off_fingerprint = fields["fingerprint"][1]
    state.off_values = fields["values"][1]
    state.identity_bytes = state.off_pkt_id + 4
    state.values = fmt.values_per_packet
    state.packet_bytes = fmt.payload_bytes
    state.result_type = int(MsgType.RESULT)
    state.slot_shift, state.slot_mask = shift, mask
    state.exponent_of_zero = EXPONENT_OF_ZERO
    state.poison = quantize.POISON_EXPONENT
    state.slack = quantize.SLACK
    state.num_workers = num_workers
    state.bits = quantize.scale_bits(num_workers)
    power_of_two = num_workers & (num_workers - 1) == 0
    state.power_of_two = power_of_two
    state.average = average
    state.dequantize_shift = state.bits + (num_workers.bit_length() - 1
                                           if average and power_of_two else 0)


def _ptr(array: np.ndarray) -> int:
    if not array.flags.c_contiguous:
        raise ValueError("the fast path needs contiguous arrays")
    return array.ctypes.data


class FastCall:
    """One call's arrays as the C unit sees them. ``None`` from ``bind`` where the
    call is not one it handles (not quantized, another output dtype, strided blocks)."""

    def __init__(self, lib, call):
        t = call.t
        self.lib = lib
        self.call = call
        s = self.state = CallState()
        layout(s, t.fmt, t.num_workers, call.average)
        s.n, s.step = call.n, call.step
        s.whole_in, s.whole_out = len(call.blocks.whole), len(call.out.whole)
        s.num_slots, s.first_slot = t.num_slots, t.first_slot
        self.queue = np.zeros(t.num_slots, dtype=np.int64)
        self.set_slot_words = np.ascontiguousarray(t.set_slot_words)
        tail = call.blocks.tail if len(call.blocks.tail) else np.zeros((1, s.values), np.float32)
        self._tail = tail                # the C unit reads it: kept alive with the call
        for name, array in (("tx", t.tx), ("set_slot_words", self.set_slot_words),
                            ("expect", call.expect), ("in_whole", call.blocks.whole),
                            ("in_tail", tail), ("out_whole", call.out.whole),
                            ("chunk", call.chunk), ("scale", call.scale),
                            ("agreed", call.agreed), ("own", call.own),
                            ("next_set", t.next_set), ("next_pkt_id", t.next_pkt_id),
                            ("fingerprints", call.fingerprints), ("expected", call.expected),
                            ("sent_at", call.loss.sent_at), ("first_sent_at", call.loss.first_sent_at),
                            ("sent_seq", call.loss.sent_seq), ("retries", call.loss.retries),
                            ("resent", call.loss.resent), ("told", call.told),
                            ("queue", self.queue), ("rx", t.rx)):
            setattr(s, name, _ptr(array))
        s.min_rto, s.max_rto = t.policy.min_rto, t.policy.max_rto
        s.granularity, s.peer_timeout = t.rto.GRANULARITY, t.policy.peer_timeout
        s.first_result_at = np.inf
        self.ref = ctypes.byref(s)
        s.rx_stride = t.rx.strides[0]
        self.fd = t.sock.fileno()
        self.no_packets = t.rx_packets[:0]

    @classmethod
    def bind(cls, call) -> "FastCall | None":
        lib = library()
        if lib is None or not call.quantized or not call.t.fast_path:
            return None
        for blocks in (call.blocks, call.out):
            if blocks.whole.dtype != np.float32 or not blocks.whole.flags.c_contiguous:
                return None
        if call.own.dtype != np.int64 or call.scale.dtype != np.int64:
            return None
        return cls(lib, call)

    def run(self, wake: float, coalesce_batch: int) -> tuple[np.ndarray, np.ndarray, float]:
        """``Call.run``'s waiting and receiving, in C until a timer or the progress log
        is due, the call is done, or a batch needs Python: that batch's rest (results,
        WAITING headers), and the next wake-up."""
        call, t, s = self.call, self.call.t, self.state
        self._state_in()
        needs_python = self.lib.fp_run(self.ref, t.io.rx_vectors, len(t.rx), self.fd, t.io.gso,
                                       wake, call.logged_at, t.policy.progress_interval,
                                       t.policy.coalesce, coalesce_batch)
        self._state_out()
        if not needs_python or s.handled == s.datagrams:
            return self.no_packets, t.no_headers, s.wake
        packets, headers = t.sort(t.io.lengths(s.datagrams)[s.handled:], s.handled)
        return packets, headers, s.wake

    def next_wakeup(self) -> float:
        """``Call._next_wakeup``, one loop over the slots."""
        call, t = self.call, self.call.t
        return self.lib.fp_next_wakeup(self.ref, t.rto.rto, t.policy.peer_timeout,
                                       call.progress_at, call.loss.rack_seq, call.loss.rack_rtt,
                                       t.rto.reorder_window)

    def results(self, packets: np.ndarray, now: float) -> int:
        """Handle the common results at the head of ``packets``; how many it handled."""
        self._state_in()
        handled = self.lib.fp_results(self.ref, packets.ctypes.data, packets.strides[0],
                                      len(packets), now, self.fd, self.call.t.io.gso)
        self._state_out()
        return handled

    def _state_in(self) -> None:
        """The call's and the RTT estimator's state, for C to go on from."""
        s, call, rto = self.state, self.call, self.call.t.rto
        loss = call.loss
        s.next_seq, s.rack_seq, s.rack_rtt = loss.next_seq, loss.rack_seq, loss.rack_rtt
        s.progress_at, s.in_flight = call.progress_at, call.in_flight
        s.has_srtt, s.srtt = rto.srtt is not None, rto.srtt or 0.0
        s.rttvar, s.min_rtt, s.rto = rto.rttvar, rto.min_rtt, rto.rto

    def _state_out(self) -> None:
        """What C did, back into the Python state: counters, RTT, RACK, progress, sends;
        a route that refuses GSO gets it turned off, and the rest of a failed send
        resent one datagram per message (batchio); any other send error is
        ``Transport.send``'s to judge, as on the Python path."""
        s, call, t = self.state, self.call, self.call.t
        if s.has_srtt:
            t.rto.srtt, t.rto.rttvar, t.rto.min_rtt, t.rto.rto = s.srtt, s.rttvar, s.min_rtt, s.rto
        call.loss.next_seq, call.loss.rack_seq, call.loss.rack_rtt = s.next_seq, s.rack_seq, s.rack_rtt
        call.progress_at, call.in_flight = s.progress_at, s.in_flight
        for name in TIMED:
            t.timing.credit(_PHASE[name], getattr(s, name))
            setattr(s, name, 0.0)
        call.first_result = min(call.first_result, s.first_result_at)
        t.stats.results_received += s.run_results
        t.stats.fast_results += s.run_results
        t.stats.packets_sent += s.run_sent
        t.stats.bytes_sent += s.run_sent * t.fmt.payload_bytes
        if s.recv_err:
            t.stats.socket_errors += 1
        if s.err:
            unsent = self.queue[s.sent:s.queued]
            if t.io.refuses_gso(s.err, s.failed_rows):
                t.stats.socket_errors += 1
                t.send(unsent)
            else:
                t.send(unsent, failed=s.err)     # Python's handling of the error
