"""The ``python -m innet_aggregation.softswitch`` command line, and packets over real veth interfaces."""

from __future__ import annotations

import ctypes
import os
import select
import signal
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
    (["--no-p4", "--io-threads", "0"], "1 to 16 threads"),
    (["--no-p4", "--io-threads", "17"], "1 to 16 threads"),
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


@pytest.mark.skipif(os.geteuid() != 0, reason="veth pairs and namespaces need root")
def test_every_frame_the_native_loop_loses_is_counted():
    """A flood to a multicast group of 5 replicas on a port the switch does not have
    and 600 on two real ports, more than a port's two send stages hold: per frame, 5
    counted no_port and all 600 sent (a full stage is sent before the next copy is
    staged: none is lost, none counted no_room). Then a burst faster than the
    loop drains: what the receive ring had no slot for is counted ring_drops (the
    kernel's tp_drops, read on TP_STATUS_LOSING and with the counters), so that
    received + ring_drops is exactly what was sent. Read where the testbed reads
    them: the switch's --counters-file."""
    import re
    import socket as socket_mod

    from innet_aggregation.softswitch.backends.native.loader import RUNTIME
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    txmax = 2 * int(re.search(r"#define SS_PORT_TXMAX (\d+)", RUNTIME.read_text())[1])
    real, missing = 600, 5

    def settled(switch, before: dict, key: str, want: int, deadline: float = 20) -> dict:
        """The counters' growth since ``before`` once ``key`` grew by ``want`` (the file
        is rewritten once a second), and a second more for the rest."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            now = switch.io_counters()
            if now and now[key] - before.get(key, 0) >= want:
                time.sleep(1.5)
                now = switch.io_counters()
                return {k: v - before.get(k, 0) for k, v in now.items()}
            time.sleep(0.2)
        raise AssertionError(f"{key} did not grow by {want}: {switch.io_counters()}")

    with Namespaces(3) as topo, SwitchProcess("softswitch", topo.switch_ports) as switch:
        conn = connect(switch.grpc_addr, "forwarding")
        socks = [h.raw_socket() for h in topo.hosts]
        try:
            replicas = [(77, i) for i in range(missing)] + [(topo.hosts[1 + i % 2].switch_port, i)
                                              for i in range(real)]
            conn.insert(P4MulticastGroupEntry(1, replicas=replicas))
            for sock in socks[1:]:
                sock.setsockopt(socket_mod.SOL_SOCKET, 33, 16 << 20)   # SO_RCVBUFFORCE
            src = topo.hosts[0]
            flood = b"\xff" * 6 + bytes.fromhex(src.mac.replace(":", "")) + b"\x88\xb5"
            time.sleep(1.5)
            before = switch.io_counters()
            frames = 3
            got = 0
            for i in range(frames):          # one at a time
                mark = flood + b"copy" + bytes([i]) * 50
                socks[0].send(mark)
                deadline = time.monotonic() + 5
                arrived = 0
                while arrived < real and time.monotonic() < deadline:
                    for sock in socks[1:]:
                        sock.settimeout(0.05)
                        try:
                            while True:
                                arrived += sock.recv(65536) == mark
                        except (socket_mod.timeout, BlockingIOError):
                            pass
                got += arrived
            grown = settled(switch, before, "received", frames)
            assert grown["received"] == frames, grown
            assert grown["no_port"] == frames * missing, grown
            assert txmax < real and grown["no_room"] == 0, grown
            assert grown["sent"] == got == frames * real, (grown, got)
            assert grown["send_errors"] == grown["ring_drops"] == grown["dropped"] == 0, grown
            for sock in socks[1:]:
                sock.close()
            socks = socks[:1]

            burst = 400                      # each costs the loop 600 sends: the ring fills
            before = switch.io_counters()
            for i in range(burst):
                socks[0].send(flood + b"burst" + bytes([i % 256]) * 50)
            grown = settled(switch, before, "received", 1, deadline=30)
            end = time.monotonic() + 30
            while grown["received"] + grown["ring_drops"] < burst and time.monotonic() < end:
                time.sleep(0.5)
                grown = {k: v - before[k] for k, v in switch.io_counters().items()}
            assert grown["ring_drops"] > 0, grown
            assert grown["received"] + grown["ring_drops"] == burst, grown
            assert grown["no_room"] == 0, grown
            assert grown["no_port"] == grown["received"] * missing, grown
        finally:
            conn.close()
            for sock in socks:
                sock.close()
        assert switch.process.poll() is None
    assert "ring_drops" in switch.log_tail(3)


def test_a_stop_signal_the_kernel_gives_another_thread_stops_it():
    """The kernel may hand a process's SIGTERM to any of its threads (gRPC's, the
    counters'); Python runs the handler in the main thread only when that next runs
    Python, so a main thread blocked for good in a wait never would (as a switch once
    outlived a killed demo). tgkill aims the signal at each other thread in turn, one
    switch process each (about half a second a thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    turn, threads = 0, None
    while threads is None or turn < threads:
        switch = subprocess.Popen([sys.executable, "-m", "innet_aggregation.softswitch",
                                   "--no-p4", "--", "--grpc-server-addr",
                                   f"127.0.0.1:{free_port()}"],
                                  env=env, stderr=subprocess.PIPE, text=True)
        try:
            assert "waiting for a pipeline" in switch.stderr.readline()
            others = sorted(int(t) for t in os.listdir(f"/proc/{switch.pid}/task")
                            if int(t) != switch.pid)
            threads = threads or len(others)
            assert others, "the switch runs no thread besides the main one"
            target = others[turn % len(others)]
            name = Path(f"/proc/{switch.pid}/task/{target}/comm").read_text().strip()
            assert libc.tgkill(switch.pid, target, signal.SIGTERM) == 0, ctypes.get_errno()
            try:
                code = switch.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pytest.fail(f"SIGTERM given to thread {turn} ({name}) of {len(others) + 1} "
                            "did not stop the switch within 5 s")
            assert code == 0 and "stopped after" in switch.stderr.read(), name
        finally:
            if switch.poll() is None:
                switch.kill()
                switch.wait()
        turn += 1
