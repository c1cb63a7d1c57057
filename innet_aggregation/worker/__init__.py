"""Host side of in-network aggregation: quantize, packetize, retransmit, dequantize.

``AggregationSession`` is the API (``allreduce``, ``allreduce_async``);
``switch_allreduce_hook`` plugs it into torch DDP, and ``innet_aggregation.worker.backend``
(imported by the user, never here) registers the ``ina`` torch.distributed backend.
torch is imported only by what needs it (the hook, the backend, the async form,
tensors), so numpy-only workers start fast.
"""

from .quantize import NonFiniteError
from .session import AggregationSession, CallStats
from .errors import AggregationTimeout, CallMismatch, SendRefused, TransportBroken
from .transport import RetransmitPolicy, Stats

__all__ = ["AggregationSession", "AggregationTimeout", "CallMismatch", "CallStats",
           "NonFiniteError", "RetransmitPolicy", "SendRefused", "Stats", "SwitchHookState",
           "TransportBroken",
           "switch_allreduce_hook"]


def __getattr__(name: str):
    if name in ("SwitchHookState", "switch_allreduce_hook"):
        from . import ddp_hook
        return getattr(ddp_hook, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
