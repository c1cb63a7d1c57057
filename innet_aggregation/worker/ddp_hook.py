"""A torch DDP communication hook that averages gradient buckets through the switch.

    session = AggregationSession.from_config("job.toml", rank)
    ddp_model.register_comm_hook(SwitchHookState(session), switch_allreduce_hook)

DDP still needs a process group for its start-up (parameter broadcast); gloo is
fine. Only the gradient buckets go through the switch. On an ``ina`` process group
(``backend.py``) DDP needs no hook; with one, give it the group's own session,
``SwitchHookState(backend.session_of())``, never a second session of the job. Each call is named by its
bucket's index, which is the same on every rank (DDP's bucket rebuild after the
first iteration takes rank 0's order): each bucket keeps an exponent history of
its own, even where buckets are of equal size, and the fingerprints check the
buckets' order too. The session serializes the calls in DDP's order.
"""

import torch
import torch.distributed as dist

from .session import AggregationSession


class SwitchHookState:
    """What the hook needs: the session, and how many buckets it has averaged."""
    __slots__ = ("session", "buckets")

    def __init__(self, session: AggregationSession):
        self.session = session
        self.buckets = 0


def switch_allreduce_hook(state: SwitchHookState,
                          bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over the workers, as torch's ``allreduce_hook`` does: the
    future holds one tensor of the bucket's shape (the bucket's buffer, updated in
    place). The work runs on the session's background thread; a CUDA bucket is
    copied to the host and back. A failed call (a mismatch, a timeout) fails the
    future, and DDP raises its error from ``backward()``."""
    state.buckets += 1
    future = state.session.allreduce_async(bucket.buffer(), average=True,
                                           name=f"bucket {bucket.index()}")
    # DDP reads the future in C++, where a Python exception set as its result is a
    # value it cannot cast, not an error; raised in a callback, it is an error.
    return future.then(lambda done: done.wait())
