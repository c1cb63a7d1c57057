"""Host side of in-network aggregation: quantize, packetize, retransmit, dequantize.

``AggregationSession`` is the API (``allreduce``, ``allreduce_async``);
``switch_allreduce_hook`` plugs it into torch DDP.
"""

from .ddp_hook import SwitchHookState, switch_allreduce_hook
from .session import AggregationSession, CallStats
from .transport import AggregationTimeout, RetransmitPolicy, Stats, TransportBroken

__all__ = ["AggregationSession", "AggregationTimeout", "CallStats", "RetransmitPolicy", "Stats",
           "SwitchHookState", "TransportBroken", "switch_allreduce_hook"]
