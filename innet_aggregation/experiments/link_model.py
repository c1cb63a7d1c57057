"""The links' model: the bytes each path puts on the wire, and the time they take there.

A testbed's links are shaped to a nominal rate (testbed/links.py), but what they
deliver is measured: a TCP bulk transfer of a call's bytes, after the same pause as
a call (``Host.bulk`` in testbed/train.py), gives each testbed's capacity
(``capacity_mbit``), and each path's link time is the bytes it actually put on the
wire at that capacity (``link_time_s``). First transmissions above the nominal rate
are flagged ("burst"), never called bound by the links (``bound``). The frames'
sizes (``agg_frame_bytes``, ``IP_TCP``) give the nominal model printed beside the
measured one.
"""

from __future__ import annotations

from innet_aggregation.p4src import protocol
from innet_aggregation.testbed.layout import link_mtu

ETH = 14
IP_TCP = 20 + 32                # TCP with timestamps, as Linux sends it
LINK_BOUND = 0.8                # first transmissions at this share of the link: bound by it


def agg_frame_bytes(values: int) -> int:
    """An aggregation packet of ``values`` values on the wire, Ethernet header included."""
    return ETH + protocol.packet_format(values).ip_bytes


def mtu_for(values: int) -> int:
    """The MTU of a testbed whose program carries ``values`` values a packet."""
    return link_mtu(protocol.packet_format(values))


def capacity_mbit(wire_bytes: int, payload: int, first_chunk: int, seconds: float) -> float:
    """A bulk transfer's delivered rate in Mbit/s of frames on the wire: the sender
    put ``wire_bytes`` on its link for ``payload`` bytes of data; the receiver timed
    ``seconds`` from its first read (``first_chunk`` bytes, already there) to its last,
    so those bytes' share of the frames is not counted."""
    if seconds <= 0 or not 0 <= first_chunk < payload:
        raise ValueError(f"no rate from {payload} bytes, {first_chunk} before the clock, "
                         f"in {seconds} s")
    return 8 * wire_bytes * (payload - first_chunk) / payload / seconds / 1e6


def link_time_s(wire_bytes: float, mbit: float) -> float:
    """The least time ``wire_bytes`` take on a link delivering ``mbit`` Mbit/s."""
    return 8 * wire_bytes / (mbit * 1e6)


def bound(first_tx_share: float | None) -> str:
    """What set a call's time, from its first transmissions' share of the nominal rate:
    "burst" above 100 % (the bucket, not the link), "links" from ``LINK_BOUND``, else
    "hosts" (the CPU the workers and the switch share); unshaped links: "hosts"."""
    if first_tx_share is None or first_tx_share < LINK_BOUND:
        return "hosts"
    return "burst" if first_tx_share > 1.0 else "links"
