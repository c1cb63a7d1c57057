"""``ina``: a torch.distributed backend whose all_reduce goes through the switch.

    import innet_aggregation.worker.backend      # registers "ina"
    dist.init_process_group("cpu:ina")            # or backend="ina", "cpu:ina,cuda:nccl"

all_reduce (and all_reduce_coalesced) with SUM or AVG of strided float16, bfloat16,
float32 and float64 tensors, on the CPU or CUDA (copied to the host), go through
the job's ``AggregationSession``; everything else (other collectives, ops and
dtypes) goes to a gloo backend (NCCL for CUDA tensors where it is built) that the
group creates from the same store, rank and size. So DDP needs no comm hook, and
FSDP2 and DeviceMesh use the group unchanged.

Why a Python ``ProcessGroup`` and not a ``Backend``: torch 2.13 defines no Python
constructor for ``Backend``, and a ``ProcessGroup`` returned by the creation
function replaces the group torch made, backends and all. So the group registers
its fallback backends on itself (``_register_backend``): the collectives it does
not override in Python reach them through c10d's dispatcher, and so does DDP's and
FSDP2's lookup of the group's backend for a device.

The session's parameters are resolved once, when the group is made: from the job
manager if ``INA_MANAGER`` is set (``switch_ctl.manager.join_from_env``, with the
job's credential from INA_JOB_CREDENTIAL, else one that rank 0 draws into the
group's own store, which only the job's ranks reach), else
from the job file ``INA_JOB_CONFIG`` (worker id = rank); ``pg_options=InaOptions(
session=...)`` hands one in instead. Destroying the group closes the session
(collective: it parks the slots) and leaves the manager's job.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work

from .breakdown import combine
from .fallback import GLOO, Fallback, FallbackPolicy, SwitchUnavailable
from .session import AggregationSession, refuse_overlap
from .transport import RetransmitPolicy

NAME = "ina"
SWITCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class InaOptions:
    """``pg_options`` of ``init_process_group(backend="ina")``: a session made by the
    caller (tests, a caller with its own parameters), instead of the environment's
    (the group closes it when it is destroyed); and the fallback policy, instead of
    INA_FALLBACK and INA_SWITCH_TIMEOUT (``fallback.FallbackPolicy``)."""
    session: AggregationSession | None = None
    fallback: FallbackPolicy | None = None


class InaProcessGroup(ProcessGroup):
    """A process group of the job's ranks whose all_reduce calls go through
    ``session`` (None for a group of some of the ranks: gloo, NCCL only).

    Calls are not named: the session keys a call's exponent history by its size and
    its place among consecutive calls of that size (``transport.history_key``),
    which the backend cannot do better, as it does not know a call's place in the
    training step; DDP's buckets, whose sizes repeat step after step, keep one
    history each that way. The fingerprints still check every call's number and
    size on every rank.
    """

    def __init__(self, store, rank: int, size: int, timeout: timedelta,
                 session: AggregationSession | None, owner=None):
        super().__init__(rank, size)
        self._session = session
        self._owner = owner        # closes the session and the membership, or None
        self._backends = {}
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        gloo._set_sequence_number_for_group()
        self._register(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)
        if torch.cuda.is_available():
            if dist.is_nccl_available():
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size,
                                             options)
                self._register(torch.device("cuda"), ProcessGroup.BackendType.NCCL, nccl)
            else:
                self._register(torch.device("cuda"), ProcessGroup.BackendType.GLOO, gloo)
        self._set_default_backend(ProcessGroup.BackendType.GLOO)

    def _register(self, device: torch.device, kind, backend) -> None:
        self._register_backend(device, kind, backend)
        self._backends[device.type] = backend

    @property
    def session(self) -> AggregationSession | None:
        """The switch's session, or None for a group of part of the job (gloo only)."""
        return self._session

    def getBackendName(self) -> str:
        return NAME

    def name(self) -> str:
        return NAME

    def _fallback(self, tensors):
        device = tensors[0].device.type if tensors else "cpu"
        if device not in self._backends:
            raise RuntimeError(f"the {NAME} backend has no backend for {device} tensors "
                               f"(it serves cpu, and cuda where torch has CUDA)")
        return self._backends[device]

    def _through_switch(self, tensors, op) -> bool | None:
        """average (False: sum) if the switch serves these tensors and op, else None:
        strided (dense) float tensors on the CPU or CUDA; sparse and other layouts go
        to gloo, as every other dtype."""
        if self._session is None or not (op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG):
            return None
        if not all(t.layout == torch.strided and t.dtype in SWITCH_DTYPES
                   and t.device.type in ("cpu", "cuda") for t in tensors):
            return None
        return op == dist.ReduceOp.AVG

    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        _refuse_overlaps(tensors)
        average = self._through_switch(tensors, opts.reduceOp)
        if average is None:
            return _contiguous(tensors, lambda ts: self._fallback(ts).allreduce(ts, opts))
        if len(tensors) != 1:
            raise ValueError(f"all_reduce takes one tensor, got {len(tensors)} "
                             f"(all_reduce_coalesced takes several)")
        return _SwitchWork([self._session.allreduce_async(tensors[0], average)], tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """One session call per tensor, in order: no flattening copy, and each
        tensor's size keeps its own exponent history."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        _refuse_overlaps(tensors)
        average = self._through_switch(tensors, opts.reduceOp) if tensors else None
        if average is None:
            return _contiguous(tensors,
                               lambda ts: self._fallback(ts).allreduce_coalesced(ts, opts))
        return _SwitchWork([self._session.allreduce_async(t, average) for t in tensors],
                           tensors)

    # Every other collective that torch's Python ProcessGroup trampoline intercepts is
    # forwarded here, from Python, to the backend's binding, which releases the GIL:
    # the trampoline's own fallback calls the backend with the GIL held, and gloo's
    # worker thread, dropping a finished work's tensors, waits for the GIL while
    # holding the queue's lock that the caller then needs (a deadlock within a few
    # hundred DTensor all-gathers, as FSDP2 issues them).

    def broadcast(self, tensors, opts=None):
        return self._fallback(tensors).broadcast(tensors, opts or dist.BroadcastOptions())

    def allgather(self, output_lists, tensors, opts=None):
        return self._fallback(tensors).allgather(output_lists, tensors,
                                                 opts or dist.AllgatherOptions())

    def reduce_scatter(self, outputs, input_lists, opts=None):
        return self._fallback(outputs).reduce_scatter(outputs, input_lists,
                                                      opts or dist.ReduceScatterOptions())

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        backend, opts = self._fallback(inputs), opts or dist.AllgatherOptions()
        return _all([backend._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        backend, opts = self._fallback(inputs), opts or dist.ReduceScatterOptions()
        return _all([backend._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)])

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        return self._fallback([input]).alltoall_base(output, input, output_splits,
                                                     input_splits, opts or dist.AllToAllOptions())

    def barrier(self, opts=None):
        return self._backends["cpu"].barrier(opts or dist.BarrierOptions())

    def send(self, tensors, dst, tag):
        return self._fallback(tensors).send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._fallback(tensors).recv(tensors, src, tag)

    def shutdown(self) -> None:
        """Closes the session (collective: every rank destroys the group, and the
        slots are parked for the job's next session) and leaves the manager's job,
        then the fallback backends."""
        try:
            if self._owner is not None:
                owner, self._owner = self._owner, None
                owner.close()
        finally:
            for backend in {id(b): b for b in self._backends.values()}.values():
                backend.shutdown()


class _SwitchWork(Work):
    """The Work of a call through the switch: ``wait()`` raises the transport's own
    error (CallMismatch, AggregationTimeout, NonFiniteError, ...), or, past a
    ``timeout`` given to it, RuntimeError as c10d's ``Work::wait`` does (the call goes
    on); the future that ``get_future()`` gives holds the tensors as a list, as
    c10d's do, and fails as an error DDP's C++ raises from ``backward()`` (a Python
    exception set as a future's result would reach it as a value)."""

    def __init__(self, futures, tensors):
        super().__init__()
        self._futures = futures
        self._tensors = tensors
        self._future = None
        self._done = [_done_event(f) for f in futures]

    def wait(self, timeout=None) -> bool:
        """``timeout`` (a timedelta; None or zero: none, as c10d's kNoTimeout)."""
        seconds = timeout.total_seconds() if timeout is not None else 0.0
        deadline = time.monotonic() + seconds
        if seconds > 0 and not all(done.wait(max(0.0, deadline - time.monotonic()))
                                   for done in self._done):
            raise RuntimeError(f"Operation timed out! The {NAME} all_reduce of "
                               f"{len(self._tensors)} tensor(s) did not finish within "
                               f"{seconds:g} s (Work.wait's timeout); it goes on")
        for future in self._futures:
            future.wait()
        return True

    def is_completed(self) -> bool:
        return all(f.done() for f in self._futures)

    @property
    def breakdown(self):
        """Where the call's time went (worker/breakdown.py), its tensors' calls summed;
        None until it is done."""
        calls = [getattr(f, "breakdown", None) for f in self._futures]
        if not self.is_completed() or None in calls:
            return None
        return combine(calls)

    def get_future(self):
        if self._future is None:        # made on demand: a plain all_reduce only waits
            futures, tensors = self._futures, self._tensors

            def done(_):      # the session runs calls in order: the last is done last
                for future in futures:
                    future.wait()
                return list(tensors)

            self._future = futures[-1].then(done)
        return self._future


def _refuse_overlaps(tensors) -> None:
    for t in tensors:
        if t.layout == torch.strided:
            refuse_overlap(t.shape, t.stride())


def _contiguous(tensors, reduce):
    """``reduce`` (a fallback backend's all-reduce) on contiguous tensors, the sums
    copied back into the caller's strided ones: gloo (torch 2.13) sums a view with
    gaps between its rows as the memory from its first element to its last, gaps
    included, and sums a dense one in memory order, so ranks whose layouts differ
    would add unrelated elements. Contiguous tensors are reduced as they are."""
    if all(t.layout != torch.strided or t.is_contiguous() for t in tensors):
        return reduce(tensors)
    copies = [t.contiguous() if t.layout == torch.strided else t for t in tensors]
    return _CopyBackWork(reduce(copies), tensors, copies)


class _CopyBackWork(Work):
    """A fallback's work on contiguous copies: done, the sums go into the caller's
    tensors, once, on ``wait()`` or through the future (made on demand)."""

    def __init__(self, work, tensors, copies):
        super().__init__()
        self._work = work
        self._tensors = tensors
        self._pairs = [(t, c) for t, c in zip(tensors, copies) if t is not c]
        self._lock = threading.Lock()
        self._future = None

    def _copy_back(self) -> None:
        with self._lock:        # held while copying: a second caller returns after it
            for tensor, copy in self._pairs:
                tensor.copy_(copy)
            self._pairs = []

    def wait(self, timeout=None) -> bool:
        self._work.wait(timeout) if timeout is not None else self._work.wait()
        self._copy_back()
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        if self._future is None:
            tensors = self._tensors
            self._future = self._work.get_future().then(
                lambda _: self._copy_back() or list(tensors))
        return self._future


def _done_event(future) -> threading.Event:
    """Set when ``future`` is done: torch's futures wait without a timeout."""
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    return done


class _AllWork(Work):
    """Several backend works as one (the coalesced forms, one call per tensor)."""

    def __init__(self, works):
        super().__init__()
        self._works = works
        self._future = torch.futures.collect_all([w.get_future() for w in works]).then(
            lambda done: [t for f in done.value() for t in f.value()])

    def wait(self, timeout=None) -> bool:
        for work in self._works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def get_future(self):
        return self._future


def _all(works):
    return works[0] if len(works) == 1 else _AllWork(works)


class _Owner:
    """The job's session in this process, which closes its fallback and the
    membership of the manager's job. One at a time (``_open``): two sessions of
    one job would share its slots."""

    def __init__(self, session: AggregationSession):
        self.session = session

    def close(self) -> None:
        global _open
        if _open is self:
            _open = None
        self.session.close()


_open: _Owner | None = None


def job_credential(store, rank: int) -> str:
    """The job manager's proof that a rank belongs to this job: INA_JOB_CREDENTIAL if
    set, else a secret rank 0 draws into the group's store for the others to read."""
    from innet_aggregation.switch_ctl.manager.client import job_credential_from_env
    credential = job_credential_from_env()
    if credential is not None:
        return credential
    store = dist.PrefixStore(f"{NAME}/", store)
    if rank == 0:
        store.set("job-credential", secrets.token_hex(32))
    return store.get("job-credential").decode()


class _Joiner:
    """Joins the manager's job in the background: the group starts on gloo if that
    takes longer than the switch timeout (no manager reachable, no free slots), and
    the fallback takes the join's result when it comes (``__call__``), or joins anew."""

    def __init__(self, rank: int, world: int, credential: str):
        from innet_aggregation.switch_ctl.manager.client import join_from_env
        self._join = lambda: join_from_env(rank, world, credential, progress=self._said)
        self.said = "no answer from the manager yet"
        self._result = None
        self._thread = threading.Thread(target=self._first, daemon=True,
                                        name=f"{NAME}-join-{rank}")
        self._thread.start()

    def _said(self, line: str) -> None:
        self.said = line.removeprefix("ina: ")
        print(line, file=sys.stderr, flush=True)

    def _first(self) -> None:
        try:
            self._result = ("ok", self._join())
        except Exception as exc:       # noqa: BLE001  handed to whoever waits
            self._result = ("error", exc)

    def wait(self, timeout: float):
        """The membership, if the job started within ``timeout`` seconds (taken: the
        next call joins anew), else None."""
        self._thread.join(timeout)
        if self._result is None:
            return None
        if self._result[0] == "error":
            self.said = str(self._result[1])
            return None
        return self()

    def __call__(self):
        if self._thread is not None:        # the first join, still going or done
            thread, self._thread = self._thread, None
            thread.join()
            kind, value = self._result
            self._result = None
            if kind == "error":
                raise value
            return value
        return self._join()


def _signals(store):
    """The part of the group's store where a rank says it went to gloo (``Fallback``)."""
    return dist.PrefixStore(f"{NAME}-to-gloo/", store)


def open_session(rank: int, world_size: int, timeout: timedelta, store, group,
                 policy: FallbackPolicy) -> _Owner:
    """The session of ``rank`` from the environment (see the module's docstring),
    with ``group`` (gloo, the session's alone) to fall back on. Collective: with a
    manager, the ranks go to the switch only if every one of them joined within
    the switch timeout; else they start on gloo, joining in the background (with
    INA_FALLBACK=error: raise, naming why)."""
    retransmit = replace(RetransmitPolicy(), peer_timeout=timeout.total_seconds())
    if os.environ.get("INA_MANAGER"):
        joiner = _Joiner(rank, world_size, job_credential(store, rank))
        membership = joiner.wait(policy.switch_timeout)
        joined = torch.tensor([float(membership is not None)])
        group.allreduce([joined]).wait()
        if joined.item() < world_size:
            why = f"not joined within {policy.switch_timeout:g} s: {joiner.said}"
            if policy.mode == "error":
                if membership is not None:
                    membership.close()
                raise SwitchUnavailable(f"rank {rank}: the job is not on the switch: {why} "
                                        f"(INA_FALLBACK=error; =gloo starts on gloo)")
            fallback = Fallback(group, policy, membership=membership, rejoin=joiner,
                                path=GLOO, why=why, store=_signals(store))
            session = AggregationSession.on_gloo(rank, world_size, fallback)
            print(f"{NAME}: rank {rank}: from call 1 on, through gloo: {why}",
                  file=sys.stderr, flush=True)
            fallback.leave_and_rejoin(session, leave=False)
            return _Owner(session)
        config, rejoin = membership.config, joiner
    elif os.environ.get("INA_JOB_CONFIG"):
        config, membership, rejoin = os.environ["INA_JOB_CONFIG"], None, None
    else:
        raise RuntimeError(f"the {NAME} backend needs the job's switch: set INA_MANAGER "
                           f"(host:port of the job manager) or INA_JOB_CONFIG (the job's "
                           f"TOML file, worker id = rank)")
    try:
        session = AggregationSession.from_config(config, rank, policy=retransmit)
    except BaseException:
        if membership is not None:
            membership.close()
        raise
    asked = os.environ.get("INA_DEADLINE_MS")
    if membership is None and asked and session.transport.deadline * 1000 != float(asked):
        session.close()
        raise RuntimeError(f"INA_DEADLINE_MS={asked}, but the job file (INA_JOB_CONFIG) says "
                           f"job.deadline_ms = {session.transport.deadline * 1000 or 'none'}: "
                           f"the switch's job and its workers must agree; set it in the file")
    session.attach(Fallback(group, policy, membership=membership, rejoin=rejoin,
                            store=_signals(store)))
    return _Owner(session)


def create(options, pg_options) -> InaProcessGroup:
    """``register_backend``'s creation function (extended API).

    The first group of every rank in order (the default group, usually) opens the
    job's session, or takes ``pg_options``' one, and closes it when destroyed; later
    groups of every rank share it (their calls join its call sequence, so every
    rank must order them alike, as the fingerprints check). A group of part of the
    job cannot use the job's slots: it is gloo (NCCL) only. The session falls back
    on a gloo group of its own (``fallback``), never on the group's: their
    collectives come from other threads, in another order."""
    global _open
    rank, size, timeout = options.group_rank, options.group_size, options.timeout
    ranks = list(options.global_ranks_in_group)
    if pg_options is not None and not isinstance(pg_options, InaOptions):
        raise TypeError(f"pg_options of the {NAME} backend must be InaOptions, "
                        f"not {type(pg_options).__name__}")
    if ranks and ranks != list(range(dist.get_world_size())):
        return InaProcessGroup(options.store, rank, size, timeout, None)
    given = pg_options.session if pg_options is not None else None
    if _open is not None:
        if given is not None:
            raise ValueError(f"an {NAME} group of this job holds a session already; "
                             f"its other groups share it")
        return InaProcessGroup(options.store, rank, size, timeout, _open.session)
    policy = ((pg_options.fallback if pg_options is not None else None)
              or FallbackPolicy.from_env())
    group = dist.ProcessGroupGloo(dist.PrefixStore(f"{NAME}-fallback/", options.store), rank,
                                  size, timeout)
    if given is not None:
        given.attach(Fallback(group, policy, store=_signals(options.store)))
        owner = _Owner(given)
    else:
        owner = open_session(rank, size, timeout, options.store, group, policy)
    if owner.session.num_workers != size:
        owner.close()
        raise ValueError(f"the job has {owner.session.num_workers} workers, the process group "
                         f"{size} ranks: start one rank per worker of the job")
    _open = owner
    return InaProcessGroup(options.store, rank, size, timeout, owner.session, owner)


def session_of(group=None) -> AggregationSession:
    """The session of an ``ina`` group (the default group if None), e.g. for the DDP
    hook: ``SwitchHookState(session_of())``."""
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(group, InaProcessGroup):
        raise TypeError(f"not a process group of the {NAME} backend: {group!r}")
    if group.session is None:
        raise ValueError(f"this {NAME} group covers part of the job and has no session")
    return group.session


dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])
