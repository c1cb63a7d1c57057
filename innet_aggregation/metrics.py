"""The Prometheus endpoints' one listener: the embedded switch's, the job manager's and
a worker's. Whoever reaches one learns what the process carries (its traffic, its
tenants' jobs), so it listens on loopback unless TLS is configured; prometheus-client
is imported only by a process that serves."""

from __future__ import annotations

from innet_aggregation.addresses import is_loopback


def listen_address(addr: str, tls: bool, option: str) -> tuple[str, int]:
    """(host, port) of ``addr``, given as ``option``; ValueError for a malformed one, or
    one off loopback without TLS."""
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{option}: expected HOST:PORT, got {addr!r}")
    if not tls and not is_loopback(host):
        raise ValueError(f"{option} {addr} is not a loopback address: metrics leave this host "
                         "only over TLS (a certificate and its key)")
    return host, int(port)


def serve(registry, host: str, port: int, certfile: str | None = None,
          keyfile: str | None = None):
    """Serve ``registry`` on (host, port) from a thread of its own; returns the server
    (``shutdown()`` stops it)."""
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, host, registry=registry, certfile=certfile,
                                  keyfile=keyfile)
    return server
