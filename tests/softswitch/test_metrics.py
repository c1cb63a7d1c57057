"""The embedded switch's Prometheus metrics: what a real Prometheus server scrapes from
a switch forwarding real frames, against what was sent."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from innet_aggregation.softswitch.metrics import check_listen, interface_counts
from innet_aggregation.switch_ctl.client import P4CounterEntry
from tests.prometheus import Prometheus, scrape
from tests.softswitch.conftest import connect, free_port
from tests.softswitch.test_cli_and_veth import run_cli

PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1200      12    0    0    0     0          0         0     1200      12    0    0    0     0       0          0
 sw0-1:     640       5    0    0    0     0          0         0     3000      30    0    0    0     0       0          0
"""


def test_interface_counts_reads_both_directions():
    counts = interface_counts(PROC_NET_DEV)
    assert counts["sw0-1"] == (5, 640, 30, 3000)
    assert counts["lo"] == (12, 1200, 12, 1200)


@pytest.mark.parametrize("addr,tls,message", [
    ("10.0.0.1:9100", False, "not a loopback address"),
    ("0.0.0.0:9100", False, "not a loopback address"),
    ("127.0.0.1", False, "HOST:PORT"),
    ("127.0.0.1:0", False, "HOST:PORT"),
])
def test_metrics_address_is_checked(addr, tls, message):
    with pytest.raises(ValueError, match=message):
        check_listen(addr, tls)


def test_metrics_off_loopback_need_tls():
    assert check_listen("10.0.0.1:9100", True) == ("10.0.0.1", 9100)
    result = run_cli("--no-p4", "--metrics-addr", "0.0.0.0:9100")
    assert result.returncode == 2 and "over TLS" in result.stderr
    result = run_cli("--no-p4", "--metrics-addr", "127.0.0.1:9100", "--metrics-cert", "x.pem")
    assert result.returncode == 2 and "go together" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="Debian's prometheus is not installed (make setup installs it)")
@pytest.mark.parametrize("target", ["softswitch", "softswitch-python"])
def test_prometheus_scrapes_what_the_switch_forwarded(target):
    """Frames sent host to host through the switch: the scraped port, data-plane and P4
    counters equal what was sent and what a P4Runtime Read of the same counter says."""
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    metrics_addr = f"127.0.0.1:{free_port()}"
    with Namespaces(2) as topo, SwitchProcess(target, topo.switch_ports,
                                              metrics_addr=metrics_addr) as switch:
        prometheus = Prometheus({"softswitch": [metrics_addr]})
        conn = connect(switch.grpc_addr, "forwarding")
        try:
            src, dst = topo.hosts
            port, ifname = src.switch_port, topo.switch_ports[src.switch_port]
            conn.insert([conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": h.mac},
                                          {"port": h.switch_port}) for h in topo.hosts])
            before = scrape(metrics_addr)
            key = ("softswitch_port_frames_total",
                   tuple(sorted({"port": str(port), "interface": ifname,
                                 "direction": "received"}.items())))
            p4_key = ("softswitch_p4_counter_packets_total",
                      (("counter", "Ing.port_packets"), ("index", str(port))))
            sock = src.raw_socket()
            frame = (bytes.fromhex(dst.mac.replace(":", "")) + bytes.fromhex(src.mac.replace(":", ""))
                     + b"\x88\xb5" + bytes(100))
            sent = 50
            for _ in range(sent):
                sock.send(frame)
            deadline = time.monotonic() + 20     # a loaded machine's Python switch lags
            while True:
                after = scrape(metrics_addr)
                if (after.get(p4_key, 0) - before.get(p4_key, 0) >= sent
                        or time.monotonic() > deadline):
                    break
                time.sleep(0.2)
            # Other frames (the kernel's own) may cross the port too, never fewer.
            assert after[key] - before.get(key, 0) >= sent
            assert after[p4_key] - before.get(p4_key, 0) >= sent
            (cell,) = conn.read(P4CounterEntry("Ing.port_packets", index=port))
            # Prometheus' own view, through its query API, of the same counters.
            seen = prometheus.value(
                f'softswitch_p4_counter_packets_total{{counter="Ing.port_packets",index="{port}"}}'
                f' >= {cell.data.packet_count}')
            assert seen >= cell.data.packet_count
            received = prometheus.value('softswitch_frames_total{direction="received"}'
                                        f' >= {after[("softswitch_frames_total", (("direction", "received"),))]}')
            assert received >= sent
            assert prometheus.value('sum(softswitch_frames_lost_total)') == 0
            assert prometheus.value('up{job="softswitch"}') == 1
        finally:
            prometheus.stop()
            conn.close()
