"""The embedded switch's Prometheus metrics (``--metrics-addr``), read at each scrape.

Nothing is counted for them: a scrape reads what the switch already keeps (the P4
counters, under the pipeline's lock as a P4Runtime Read does; the data plane's loss
counters; the kernel's counts on each port's interface), so the fast path pays nothing
whether or not anyone scrapes. Whoever reaches the port learns the switch's traffic, so
it listens on loopback unless TLS is configured.
"""

from __future__ import annotations

import logging

from innet_aggregation.metrics import listen_address, serve
from innet_aggregation.softswitch.backends.native.loader import IO_COUNTERS

log = logging.getLogger("softswitch")

PREFIX = "softswitch"
# DataPlane.counters' loss entries, as the ``cause`` label.
LOSS_CAUSES = tuple(name for name in IO_COUNTERS if name not in ("received", "sent"))


def check_listen(addr: str, tls: bool) -> tuple[str, int]:
    """(host, port) of ``--metrics-addr``: loopback unless TLS is given."""
    return listen_address(addr, tls, "--metrics-addr")


def interface_counts(text: str) -> dict[str, tuple[int, int, int, int]]:
    """/proc/net/dev's (received frames, received bytes, sent frames, sent bytes) by
    interface: the kernel's own counts, in the reading process's namespace."""
    out = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) >= 10:
            out[name.strip()] = (int(fields[1]), int(fields[0]), int(fields[9]), int(fields[8]))
    return out


class SwitchCollector:
    """prometheus_client's custom collector over a running switch."""

    def __init__(self, dataplane, device, ports: dict[int, str]):
        self.dataplane = dataplane
        self.device = device
        self.ports = ports

    def describe(self):
        return []       # no probe collect at registration: the switch may have no program yet

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        frames = CounterMetricFamily(f"{PREFIX}_frames", "Frames the data plane received "
                                     "and sent, by direction", labels=["direction"])
        lost = CounterMetricFamily(f"{PREFIX}_frames_lost", "Frames the data plane lost, by "
                                   "where (dataplane.DataPlane.counters)", labels=["cause"])
        counts = self.dataplane.counters()
        frames.add_metric(["received"], counts["received"])
        frames.add_metric(["sent"], counts["sent"])
        for cause in LOSS_CAUSES:
            lost.add_metric([cause], counts.get(cause, 0))
        yield frames
        yield lost
        yield from self._ports(CounterMetricFamily)
        yield from self._p4_counters(CounterMetricFamily)

    def _ports(self, family):
        frames = family(f"{PREFIX}_port_frames", "Frames on each switch port's interface, "
                        "as the kernel counts them (received: into the switch)",
                        labels=["port", "interface", "direction"])
        octets = family(f"{PREFIX}_port_bytes", "Bytes on each switch port's interface, as "
                        "the kernel counts them", labels=["port", "interface", "direction"])
        try:
            with open("/proc/net/dev") as f:
                kernel = interface_counts(f.read())
        except OSError as exc:
            log.warning("metrics: cannot read /proc/net/dev: %s", exc)
            kernel = {}
        for port, ifname in sorted(self.ports.items()):
            if ifname not in kernel:
                continue        # the interface went away; its series stop
            rx, rx_bytes, tx, tx_bytes = kernel[ifname]
            frames.add_metric([str(port), ifname, "received"], rx)
            frames.add_metric([str(port), ifname, "sent"], tx)
            octets.add_metric([str(port), ifname, "received"], rx_bytes)
            octets.add_metric([str(port), ifname, "sent"], tx_bytes)
        yield frames
        yield octets

    def _p4_counters(self, family):
        """Every cell of every indirect P4 counter that has counted, read as one
        snapshot; cells still at zero are left out (the deadline counter alone has
        1,280)."""
        from finsy.proto import p4i as p4info_pb2

        packets = family(f"{PREFIX}_p4_counter_packets", "A P4 counter cell's packets",
                         labels=["counter", "index"])
        octets = family(f"{PREFIX}_p4_counter_bytes", "A P4 counter cell's bytes",
                        labels=["counter", "index"])
        config = self.device.config
        if config is not None:
            cells = []
            with config.pipeline.lock:
                for info, spec in config.counters.values():
                    cells.append((info.preamble.name, info.spec.unit,
                                  list(spec.packets), list(spec.bytes)))
            unit = p4info_pb2.CounterSpec
            for name, kind, pkts, byts in cells:
                for index, (p, b) in enumerate(zip(pkts, byts)):
                    if p and kind != unit.BYTES:
                        packets.add_metric([name, str(index)], int(p))
                    if b and kind != unit.PACKETS:
                        octets.add_metric([name, str(index)], int(b))
        yield packets
        yield octets


def serve_metrics(addr: str, dataplane, device, ports: dict[int, str],
                  certfile: str | None = None, keyfile: str | None = None):
    """Start the scrape endpoint (its own thread); returns the server, to shut down."""
    from prometheus_client import CollectorRegistry

    host, port = check_listen(addr, certfile is not None)
    registry = CollectorRegistry()
    registry.register(SwitchCollector(dataplane, device, ports))
    return serve(registry, host, port, certfile, keyfile)
