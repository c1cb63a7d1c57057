"""The P4Runtime server: P4Info joined to the JSON, device state and arbitration,
entities to and from the protos, and the gRPC service."""

from innet_aggregation.softswitch.p4runtime.device import Device
from innet_aggregation.softswitch.p4runtime.service import serve

__all__ = ["Device", "serve"]
