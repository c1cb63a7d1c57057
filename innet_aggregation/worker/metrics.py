"""A rank's calls as Prometheus metrics, opt-in: ``INA_METRICS_ADDR=HOST:PORT`` serves
rank r's on PORT + r (every rank of a host its own port, the same layout on every
host), loopback unless ``INA_METRICS_CERT`` and ``INA_METRICS_KEY`` give TLS.
Each call's breakdown (breakdown.py) is observed once it is done: nothing is added to
a call's own path."""

from __future__ import annotations

import os

from innet_aggregation.metrics import listen_address, serve

from .breakdown import PHASES, CallBreakdown

# 50 us to 60 s: a small bucket's call on a fast link up to a rank's checkpoint.
BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WorkerMetrics:
    def __init__(self, addr: str, rank: int, certfile: str | None = None,
                 keyfile: str | None = None):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        if (certfile is None) != (keyfile is None):
            raise ValueError("INA_METRICS_CERT and INA_METRICS_KEY go together")
        host, port = listen_address(addr, certfile is not None, "INA_METRICS_ADDR")
        if port + rank > 65535:
            raise ValueError(f"INA_METRICS_ADDR {addr}: rank {rank} would listen on port "
                             f"{port + rank}, past 65535")
        registry = CollectorRegistry()
        self.calls = Counter("ina_calls", "Calls, by the path that completed them",
                             ["path"], registry=registry)
        self.seconds = Histogram("ina_call_seconds", "A call's time", buckets=BUCKETS,
                                 registry=registry)
        self.phases = Histogram("ina_call_phase_seconds", "A call's time in each phase "
                                "(worker/breakdown.py; other: what no phase claims)",
                                ["phase"], buckets=BUCKETS, registry=registry)
        self.ranks_wait = Histogram("ina_call_ranks_wait_seconds", "Of a call's wait, the "
                                    "time the last rank took to reach it", buckets=BUCKETS,
                                    registry=registry)
        self.packets = Counter("ina_packets_sent", "Aggregation packets sent",
                               registry=registry)
        self.sent = Counter("ina_sent_bytes", "Aggregation packets' bytes sent (UDP payload)",
                            registry=registry)
        self.resent = Counter("ina_retransmissions", "Packets sent again after a loss or a "
                              "timer", registry=registry)
        self.redone = Counter("ina_redone_blocks", "Blocks sent again with the agreed "
                              "exponent", registry=registry)
        try:
            self.server = serve(registry, host, port + rank, certfile, keyfile)
        except OSError as exc:
            raise ValueError(f"INA_METRICS_ADDR {addr}: rank {rank} cannot listen on "
                             f"{host}:{port + rank}: {exc.strerror}") from None
        self.port = port + rank

    def observe(self, b: CallBreakdown) -> None:
        self.calls.labels("gloo" if b.fell_back else "switch").inc()
        self.seconds.observe(b.seconds)
        for phase in PHASES:
            self.phases.labels(phase).observe(b.phases.get(phase, 0.0))
        self.phases.labels("other").observe(b.other)
        self.ranks_wait.observe(b.ranks_wait_s)
        self.packets.inc(b.packets_sent)
        self.sent.inc(b.bytes_sent)
        self.resent.inc(b.retransmissions)
        self.redone.inc(b.redone)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def from_environment(rank: int, environ=os.environ) -> WorkerMetrics | None:
    """The rank's metrics where INA_METRICS_ADDR asks for them, else None."""
    addr = environ.get("INA_METRICS_ADDR")
    if not addr:
        return None
    return WorkerMetrics(addr, rank, environ.get("INA_METRICS_CERT"),
                         environ.get("INA_METRICS_KEY"))
