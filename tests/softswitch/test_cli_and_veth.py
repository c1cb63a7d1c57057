"""The ``python -m innet_aggregation.softswitch`` command line, and packets over real veth interfaces."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from innet_aggregation.switch_ctl.client import P4CounterEntry, P4MulticastGroupEntry
from tests.softswitch.conftest import connect, free_port, program_files

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "innet_aggregation.softswitch", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("args,message", [
    (["-i", "bogus", "--no-p4"], "PORT@IFACE"),
    (["--device-id", "0"], "--no-p4"),
    (["--no-p4", "--", "--grpc-server-addr", "nohost"], "HOST:PORT"),
    (["--no-p4", "--", "--frobnicate"], "unrecognized"),
    (["--no-p4", "-L", "loud"], "invalid choice"),
])
def test_bad_arguments_exit_with_a_message(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_missing_interface_is_named():
    result = run_cli("-i", "1@nosuchif0", "--no-p4")
    assert result.returncode == 1
    assert "nosuchif0" in result.stderr


def test_unsupported_program_is_refused_at_load():
    json_path, _ = program_files("unsupported_meter")
    result = run_cli(str(json_path), "--", "--grpc-server-addr", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert "meter" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
@pytest.mark.parametrize("target", ["softswitch", "softswitch-python"])
def test_frames_cross_real_veth_pairs_under_p4runtime_control(target):
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    with Namespaces(3) as topo, SwitchProcess(target, topo.switch_ports) as switch:
        conn = connect(switch.grpc_addr, "forwarding")
        try:
            conn.insert([conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": host.mac},
                                          {"port": host.switch_port}) for host in topo.hosts])
            conn.insert(P4MulticastGroupEntry(1, replicas=[(h.switch_port, 0) for h in topo.hosts]))
            socks = [h.raw_socket() for h in topo.hosts]
            src, dst = topo.hosts[0], topo.hosts[2]
            frame = (bytes.fromhex(dst.mac.replace(":", "")) + bytes.fromhex(src.mac.replace(":", ""))
                     + b"\x88\xb5" + b"unicast" + bytes(50))
            time.sleep(0.2)
            socks[0].send(frame)
            assert frame in receive(socks[2])
            broadcast = b"\xff" * 6 + frame[6:12] + b"\x88\xb5" + b"flood" + bytes(50)
            socks[0].send(broadcast)
            assert broadcast in receive(socks[1]) and broadcast in receive(socks[2])
            (cell,) = conn.read(P4CounterEntry("Ing.port_packets", index=src.switch_port))
            assert cell.data.packet_count >= 2
        finally:
            conn.close()
            for sock in locals().get("socks", []):
                sock.close()
        assert switch.process.poll() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
def test_frames_cross_again_after_the_pipeline_is_replaced():
    """A new pipeline stops the native loop and starts another on the same sockets:
    the receive rings must come down and up again (runtime.c, ss_io_stop and
    ss_io_start; a ring left up refuses the next one)."""
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    with Namespaces(2) as topo, SwitchProcess("softswitch", topo.switch_ports) as switch:
        conn = connect(switch.grpc_addr, "forwarding")
        socks = [h.raw_socket() for h in topo.hosts]
        try:
            src, dst = topo.hosts
            frames = [bytes.fromhex(dst.mac.replace(":", "") + src.mac.replace(":", ""))
                      + b"\x88\xb5" + bytes([i]) * 60 for i in range(3)]

            def crosses(frame: bytes) -> bool:
                conn.insert([conn.table_entry("Ing.mac_table", "Ing.forward", {"dst": dst.mac},
                                              {"port": dst.switch_port})])
                socks[0].send(frame)
                return frame in receive(socks[1])

            time.sleep(0.2)
            assert crosses(frames[0])
            conn.push_pipeline(*program_files("forwarding"))     # the tables start empty
            assert crosses(frames[1])
            conn.push_pipeline(*program_files("forwarding"))
            assert crosses(frames[2])
        finally:
            conn.close()
            for sock in socks:
                sock.close()
        assert switch.process.poll() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
def test_a_json_given_on_the_command_line_forwards_without_p4runtime():
    from innet_aggregation.testbed.netns import Namespaces

    from tests.softswitch.test_primitives import fields, frame

    json_path, _ = program_files("primitives")
    with Namespaces(1) as topo:
        host = topo.hosts[0]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        switch = subprocess.Popen(
            [sys.executable, "-m", "innet_aggregation.softswitch", str(json_path), "-i",
             f"{host.switch_port}@{host.switch_ifname}", "--log-level", "warn", "--",
             "--grpc-server-addr", f"127.0.0.1:{free_port()}"], env=env)
        try:
            sock = host.raw_socket()
            data = frame(1, a=40, b=2)
            deadline = time.monotonic() + 20
            replies = []
            while not replies and time.monotonic() < deadline:   # until the switch is up
                sock.send(data)
                replies = [f for f in receive(sock, timeout=0.5) if f != data]
            assert replies and fields(replies[0])["r1"] == 42
            sock.close()
        finally:
            switch.terminate()
            assert switch.wait(timeout=60) == 0   # a clean exit; generous for a loaded machine


def receive(sock, timeout: float = 3.0) -> list[bytes]:
    """Frames arriving on ``sock`` within ``timeout`` (stops early once one arrives)."""
    frames = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], 0.1)
        if ready:
            frames.append(sock.recv(65536))
        elif frames:
            break
    return frames
