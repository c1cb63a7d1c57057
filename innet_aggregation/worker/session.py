"""A worker's aggregation session: ``allreduce`` of tensors through the switch.

Every rank of the job must issue the same calls, with tensors of the same sizes,
in the same order: the switch matches contributions by slot and set, which follow
from the call sequence alone. Where they do not, every rank raises
``CallMismatch`` on the first call that differs (the switch sums each call's
fingerprint, see ``transport``); a call may be named, so that two of the same
size cannot be swapped unseen. Calls run one at a time, in call order, on one
background thread, so ``allreduce_async`` lets the caller (e.g. DDP's backward
pass) continue while the packets fly.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl import config as config_mod
from innet_aggregation.switch_ctl import jobfile

from . import metrics, quantize
from .breakdown import (NONE, CallBreakdown, ProfilerRanges, combine, debug_every,
                        debug_level, ranks_wait)
from .carry import Carry
from .transport import RetransmitPolicy, Stats, Transport


@dataclass(frozen=True)
class CallStats:
    """What one allreduce cost."""
    elements: int
    blocks: int
    seconds: float
    counters: Stats
    max_error_bound: float   # largest per-element quantization bound of the call (see quantize)

    @property
    def goodput_mbps(self) -> float:
        """Megabytes of float32 gradient aggregated per second."""
        return self.elements * 4 / self.seconds / 1e6 if self.seconds else 0.0


class AggregationSession:
    """One worker of one job: owns the transport and the background thread."""

    def __init__(self, worker_id: int, num_workers: int, switch_ip: str, job_id: int,
                 job_udp_port: int, first_slot: int, num_slots: int, local_ip: str,
                 local_port: int, *, local_workers=None,
                 policy: RetransmitPolicy = RetransmitPolicy(),
                 packet_format: protocol.PacketFormat | None = None, fast_path: bool = True,
                 deadline: float = 0.0, peers: list[tuple[str, int]] = ()):
        if not 0 <= worker_id < protocol.MAX_WORKERS or not 1 <= num_workers <= protocol.MAX_WORKERS:
            raise ValueError(f"worker_id {worker_id} / num_workers {num_workers} out of range "
                             f"(at most {protocol.MAX_WORKERS} workers)")
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.fmt = packet_format or protocol.packet_format()
        self._policy = policy
        self.carry = Carry()
        self.transport = Transport(self.fmt, job_id=job_id, worker_id=worker_id,
                                   num_workers=num_workers, switch_ip=switch_ip,
                                   job_udp_port=job_udp_port, local_ip=local_ip,
                                   local_port=local_port, first_slot=first_slot,
                                   num_slots=num_slots, local_workers=local_workers,
                                   policy=policy, fast_path=fast_path, deadline=deadline,
                                   carry=self.carry, peers=peers)
        self._start(worker_id)

    def _start(self, worker_id: int) -> None:
        self._debug = debug_level() == "INFO"
        self._debug_every = debug_every()
        self._metrics = metrics.from_environment(worker_id)   # INA_METRICS_ADDR: opt-in
        self._executor = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix=f"aggregation-{worker_id}")
        self._lock = threading.Lock()
        self.last_call: CallStats | None = None
        self.last_breakdown: CallBreakdown | None = None    # the last call's, either path
        self.breakdown_total = NONE                          # every call's, summed
        self._unreported: list[CallBreakdown] = []
        self.fallback = None        # fallback.Fallback, if attached: gloo when the switch fails

    @classmethod
    def on_gloo(cls, worker_id: int, num_workers: int, fallback) -> "AggregationSession":
        """A session with no switch yet (no manager reachable, or no free slots): its
        calls go through ``fallback``'s gloo group until it has joined the job."""
        session = cls.__new__(cls)
        session.worker_id, session.num_workers = worker_id, num_workers
        session.fmt, session.transport, session._policy = None, None, RetransmitPolicy()
        session.carry = Carry()
        session._start(worker_id)
        session.attach(fallback)
        return session

    def attach(self, fallback) -> None:
        """Calls that fail on the switch go to ``fallback`` (gloo) from now on; a
        switch call that hears nothing from the switch for its ``switch_timeout`` (no
        result, no WAITING reply) has failed. One the switch says waits for a slow
        peer waits up to the peer timeout (the group's), as gloo would."""
        self.fallback = fallback
        fallback.bind(self)
        if self.transport is not None:
            self._bound(self.transport, fallback)

    def _bound(self, transport: Transport, fallback) -> None:
        # A waiting call hears a WAITING reply once a backed-off timer (max_rto): at
        # least four in a switch timeout, so that a slow peer never looks like silence.
        quarter = fallback.policy.switch_timeout / 4
        p = transport.policy
        transport.policy = replace(p, switch_silence=fallback.policy.switch_timeout,
                                   max_rto=min(p.max_rto, quarter),
                                   initial_rto=min(p.initial_rto, quarter),
                                   min_rto=min(p.min_rto, quarter))
        transport.rto.policy = transport.policy
        transport.abort = fallback.abort_reason

    def use_transport(self, transport: Transport) -> None:
        """The fallback's way back to the switch: every rank has a transport for the
        job the manager installed again (``transport_for``), and the next call uses it."""
        self.transport = transport

    def transport_for(self, config) -> Transport:
        """A fresh transport of this worker in the job of ``config`` (a new session)."""
        fmt, args = _transport_args(config, self.worker_id, None)
        transport = Transport(fmt, **args, policy=self._policy, carry=self.carry)
        if self.fallback is not None:
            self._bound(transport, self.fallback)
        return transport

    @classmethod
    def from_config(cls, config: config_mod.Config | str | Path, worker_id: int,
                    **kwargs) -> "AggregationSession":
        """The session of worker ``worker_id`` of the job in a TOML file (or a Config,
        or a Tree): the switch is the service address of the worker's own switch,
        reached through its ARP responder."""
        fmt, args = _transport_args(config, worker_id, kwargs.get("packet_format"))
        kwargs["packet_format"] = fmt
        return cls(worker_id, args["num_workers"], args["switch_ip"], args["job_id"],
                   args["job_udp_port"], args["first_slot"], args["num_slots"],
                   args["local_ip"], args["local_port"],
                   local_workers=args["local_workers"], deadline=args["deadline"],
                   peers=args["peers"], **kwargs)

    def last_blocks(self) -> tuple[int, np.ndarray | None]:
        """The last switch call's values per block and, per block, the bitmap of the
        workers in its final round where a deadline released one (None: every worker in
        every block): what a rank that did not complete the call needs (``lead.py``)."""
        return self.transport.fmt.values_per_packet, self.transport.last_members

    @property
    def deadline(self) -> float:
        """The switch job's deadline in seconds (0: none, or no switch job yet)."""
        return self.transport.deadline if self.transport is not None else 0.0

    @property
    def stats(self) -> Stats:
        """Counters of the switch's transport since it started (none: zeros)."""
        return self.transport.stats.copy() if self.transport is not None else Stats()

    def allreduce(self, tensor, average: bool = False, *, name: str | None = None):
        """Sum (or average) ``tensor`` over all workers, in place; returns it.

        Accepts numpy float arrays and torch tensors (float32, float16, bfloat16,
        float64; CPU, or any device by copying) of any strides, summed by index
        (``_host_copy``); not sparse ones, nor ones whose elements share memory
        (``expand()``). The dtype and shape go into the call's fingerprint: every
        worker must pass the same. If any worker's values hold NaN,
        Inf or magnitudes of 2**126 or more, every worker raises ``NonFiniteError``
        for this call (the affected blocks are NaN in the tensor) and the session
        stays usable (see ``quantize``). ``name``, if given, must be the same on
        every worker: calls of one size in another order then raise
        ``CallMismatch`` too, and the call keeps an exponent history of its own
        (``transport.history_key``). Any other failure leaves the session
        unusable, and the tensor partly summed: each block's result is written as
        soon as it is final (host memory in place; other devices only at the end)."""
        work, finish, signature = _host_copy(tensor)
        self._submit(lambda: (self._call(work, average, name, signature), finish())).result()
        return tensor

    def allreduce_async(self, tensor, average: bool = False, *, name: str | None = None):
        """Like ``allreduce``, returning at once a ``torch.futures.Future`` of the tensor
        (which holds the error, if the call fails); once done, its ``breakdown`` is
        the call's (``last_breakdown``)."""
        import torch  # here, so numpy-only users never pay for importing torch

        future = torch.futures.Future()
        try:
            work, finish, signature = _host_copy(tensor)   # on the caller's thread
        except Exception as exc:
            future.set_exception(exc)
            return future

        def run():
            try:
                self._call(work, average, name, signature)
                finish()
            except BaseException as exc:  # delivered to whoever waits on the future
                future.breakdown = self.last_breakdown
                future.set_exception(exc)
            else:
                future.breakdown = self.last_breakdown     # the backend's Work sums them
                future.set_result(tensor)

        self._submit(run)
        return future

    def _submit(self, fn) -> Future:
        with self._lock:
            return self._executor.submit(fn)

    def _call(self, values: np.ndarray, average: bool, name: str | None,
              signature: tuple) -> None:
        started = time.perf_counter()
        t, fallback = self.transport, self.fallback
        gloo = fallback.counts["gloo"] if fallback is not None else 0
        torch = ProfilerRanges.active()
        ranges = ProfilerRanges(torch) if torch is not None else None
        if t is not None:
            before, counted = t.timing.snapshot(), t.stats.copy()
            t.waits, t.timing.ranges = (None, ()), ranges
        if ranges is not None:
            ranges.enter(f"allreduce ({values.size} elements{f', {name!r}' if name else ''})")
        key = self.carry.key(name, values.size)
        try:
            if fallback is None:
                self.reduce_on_switch(values, average, name, signature, key)
            else:
                fallback.run(self, values, average, name, signature, key)
        finally:
            seconds = time.perf_counter() - started
            fell_back = fallback is not None and fallback.counts["gloo"] > gloo
            if t is None:
                breakdown = CallBreakdown(seconds, {"fallback": seconds}, fell_back=1)
            else:
                t.timing.ranges = None
                breakdown = _breakdown(t, seconds, before, counted, fell_back)
            if ranges is not None:
                ranges.mark(f"breakdown: {breakdown.line()}")
                ranges.leave()
            self.last_breakdown = breakdown
            self.breakdown_total = combine([self.breakdown_total, breakdown])
            if self._debug:
                self._report(breakdown)
            if self._metrics is not None:
                self._metrics.observe(breakdown)

    def _report(self, breakdown: CallBreakdown) -> None:
        """``INA_DEBUG=INFO``: a line per call, or per INA_DEBUG_EVERY calls summed."""
        self._unreported.append(breakdown)
        if len(self._unreported) >= self._debug_every:
            print(f"[ina rank {self.worker_id}] {combine(self._unreported).line()}",
                  file=sys.stderr, flush=True)
            self._unreported.clear()

    def reduce_on_switch(self, values: np.ndarray, average: bool, name: str | None,
                         signature: tuple, key: tuple) -> None:
        """Aggregate a C-contiguous float array, writing the result into it, block by
        block as results become final (float32 arrays are read and written in place;
        others are quantized from a float32 copy). ``signature``, the caller's dtype
        and shape, goes into the call's fingerprint. The first call that sends starts
        the session (``Transport.start``): its time and counters include the start's
        two rounds."""
        start = time.perf_counter()
        before = self.transport.stats.copy()
        k = self.transport.fmt.values_per_packet
        flat = values.reshape(-1)       # a view (C-contiguous): the sums land in ``values``
        out = quantize.Blocks(flat, k)
        blocks = out if flat.dtype == np.float32 else quantize.Blocks(flat.astype(np.float32), k)
        with self.transport.timing.phase("prepare"):
            own = np.concatenate([quantize.block_exponents(part) for part in blocks.parts])
            # Read before the results overwrite the values.
            mine = (quantize.nonfinite(blocks.flat) if (own == quantize.POISON_EXPONENT).any()
                    else None)
        scale = self.transport.aggregate(blocks, own, out, key=key, average=average, name=name,
                                         signature=signature)
        poisoned = scale == quantize.POISON_EXPONENT
        bound = quantize.error_bound(scale[~poisoned], self.num_workers, average=average)
        self.last_call = CallStats(elements=flat.size, blocks=len(blocks),
                                   seconds=time.perf_counter() - start,
                                   counters=self.transport.stats - before,
                                   max_error_bound=float(bound.max()) if bound.size else 0.0)
        if poisoned.any():
            raise quantize.NonFiniteError(quantize.describe_poison(mine, scale, k))

    def close(self) -> None:
        """Wait for the queued calls, park the slots (collective: every worker closes,
        so the next session on the job finds them as its start needs), release the
        socket. A session that failed (its transport is broken) does not park: the
        switch's slot state is unknown, and the error said to reset it. With a
        fallback, the ranks first agree (``Fallback.settle``), and park only if all
        are on the switch and the lease holds; a park that fails then is reported,
        not raised (the manager resets a job's slots when it leaves). Values still
        carried (their keys never came back) are not dropped: they stay in
        ``self.carry`` for the caller (``Carry.pending``), and a warning names them."""
        with self._lock:
            self._executor.shutdown(wait=True)
        if held := self.carry.values:
            print(f"ina: worker {self.worker_id}: closing with {held} left-out values not yet "
                  f"applied, of calls {sorted(self.carry.store, key=repr)}: they are in "
                  f"session.carry.pending()", file=sys.stderr, flush=True)
        fallback = self.fallback
        try:
            if fallback is None:
                self.transport.park()
            elif fallback.settle() and fallback.abort_reason() is None:
                try:
                    self.transport.park()
                except Exception as exc:     # noqa: BLE001  bounded by switch_timeout
                    print(f"ina: worker {self.worker_id}: parking the slots failed: {exc}",
                          file=sys.stderr, flush=True)
        finally:
            try:
                if self.transport is not None:
                    self.transport.close()
            finally:
                if fallback is not None:
                    fallback.close()
                if self._metrics is not None:
                    self._metrics.close()

    def __enter__(self) -> "AggregationSession":
        return self

    def __exit__(self, *exc) -> None:
        # Parks on any exception the transport survived (the caller's own included):
        # the other workers, closing too, park the same slots.
        self.close()


_NUMPY_FLOATS = (np.float16, np.float32, np.float64)


def _breakdown(t: Transport, seconds: float, before: dict, counted: Stats,
               fell_back: bool) -> CallBreakdown:
    """A call's breakdown from its transport's sums before and after it: what the switch
    path did; where the call went to gloo, the time beyond that is the fallback's."""
    spent = t.timing.snapshot()
    phases = {p: spent[p] - before[p] for p in spent}
    if fell_back:
        phases["fallback"] = max(0.0, seconds - sum(phases.values()))
    first, waited_for = t.waits
    rtt = t.rto.min_rtt if np.isfinite(t.rto.min_rtt) else None
    c = t.stats - counted
    return CallBreakdown(seconds, phases, ranks_wait(phases["wait"], first, rtt), waited_for,
                         packets_sent=c.packets_sent, bytes_sent=c.bytes_sent,
                         results_received=c.results_received, retransmissions=c.retransmissions,
                         redone=c.redone, fell_back=int(fell_back))


def _transport_args(config, worker_id: int, given: protocol.PacketFormat | None):
    """The packet format and ``Transport``'s arguments for
    worker ``worker_id`` of the job in ``config`` (a TOML file, a Config, or a Tree):
    the switch is the service address of the worker's own switch."""
    if isinstance(config, (str, Path)):
        config = jobfile.load(config, pool_size=given.pool_size if given else None)
    if not isinstance(config, config_mod.Config):
        config = config.for_worker(worker_id)
    job = config.job
    fmt = given or protocol.packet_format(job.values_per_packet)
    if job.values_per_packet not in (None, fmt.values_per_packet):
        raise ValueError(f"job {job.id}'s switch program carries {job.values_per_packet} "
                         f"values per packet, this worker's {fmt.values_per_packet}: "
                         f"start it with the program of the job's size")
    me = [w for w in job.workers if w.id == worker_id]
    if not me:
        raise ValueError(f"worker {worker_id} is not in job {job.id} "
                         f"(workers {[w.id for w in job.workers]})")
    args = dict(job_id=job.id, worker_id=worker_id, num_workers=job.num_workers,
                switch_ip=job.service_ip, job_udp_port=job.udp_port, local_ip=me[0].ip,
                local_port=me[0].udp_port, first_slot=job.first_slot, num_slots=job.num_slots,
                local_workers=[w.id for w in job.workers],
                deadline=(job.deadline_ms or 0.0) / 1000.0,
                peers=[(w.ip, w.udp_port) for w in job.workers if w.id != worker_id])
    return fmt, args


def _host_copy(tensor):
    """A C-contiguous numpy float array of the tensor's shape to aggregate in place, what
    copies it back into the caller's tensor, and the call's signature (dtype, shape).

    CPU float16/32/64 tensors and arrays that are C-contiguous are used directly;
    bfloat16 (numpy has none) goes through float32, other devices and any other
    strides through a contiguous copy: the workers' element orders must agree, and a
    tensor's memory order is its own (transposed, channels_last). Refused before any
    packet: tensors whose elements may share memory (``overlapping``) and layouts
    other than strided (the backend sends those to gloo)."""
    if isinstance(tensor, np.ndarray):
        if tensor.dtype.type not in _NUMPY_FLOATS:
            raise TypeError(f"can only aggregate float16/32/64 arrays, not {tensor.dtype}")
        if not tensor.flags.writeable:
            raise ValueError("the array is read-only; allreduce works in place")
        refuse_overlap(tensor.shape, [s // tensor.itemsize for s in tensor.strides])
        signature = (tensor.dtype.name, tensor.shape)
        if tensor.flags.c_contiguous:
            return tensor, lambda: None, signature
        work = np.ascontiguousarray(tensor)
        return work, lambda: np.copyto(tensor, work), signature
    torch = sys.modules.get("torch")    # a tensor's owner has imported it already
    if torch is None or not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch tensor or numpy array, not {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise TypeError(f"can only aggregate strided (dense) tensors, not {tensor.layout}")
    if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"can only aggregate floating point tensors, not {tensor.dtype}")
    refuse_overlap(tensor.shape, tensor.stride())
    data = tensor.detach()
    signature = (str(data.dtype).removeprefix("torch."), tuple(data.shape))
    if data.device.type == "cpu" and data.dtype != torch.bfloat16 and data.is_contiguous():
        return data.numpy(), lambda: None, signature
    work = torch.empty(data.shape, device="cpu",
                       dtype=torch.float32 if data.dtype == torch.bfloat16 else data.dtype)
    work.copy_(data)        # on the caller's thread: a device's copy in its stream's order
    return work.numpy(), lambda: data.copy_(work), signature


def overlapping(shape, strides) -> bool:
    """Whether elements of this shape and these strides (in elements) may share memory:
    a stride of 0 (``expand``, ``broadcast_to``), or dimensions whose steps do not
    clear the extent of the smaller ones (``as_strided``). The sum of a shared
    element could not be written back to each of its indices."""
    if 0 in shape:
        return False
    dims = sorted((abs(st), n) for n, st in zip(shape, strides) if n > 1)
    extent = 0
    for stride, n in dims:
        if stride <= extent:
            return True
        extent += stride * (n - 1)
    return False


def refuse_overlap(shape, strides) -> None:
    """Raises where ``overlapping``: at the boundary, before any packet."""
    if overlapping(shape, strides):
        raise ValueError(f"the tensor's elements may share memory (shape {tuple(shape)}, strides "
                         f"{tuple(strides)}, e.g. from expand()): allreduce writes each element's "
                         f"sum in place; pass a .clone() or .contiguous() copy")
