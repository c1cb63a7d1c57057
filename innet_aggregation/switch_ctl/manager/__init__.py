"""The job manager (``switch_ctl serve``) and the ranks' side of it.

Only the ranks' side is imported here, so a numpy-only worker install can use it;
the service itself (server, jobs, installer) needs the controller's grpc and finsy.
"""

from .client import JoinError, Membership, join, join_from_env

__all__ = ["JoinError", "Membership", "join", "join_from_env"]
