"""What a listening address exposes: shared by the embedded switch's P4Runtime server
and the job manager, which each refuse or warn about what a network could reach."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or localhost) is reachable from this machine alone;
    any other name counts as reachable from elsewhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
