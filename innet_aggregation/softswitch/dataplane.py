"""Packet I/O on Linux interfaces with AF_PACKET.

The sockets are opened here once. A Python pipeline is served by one Python thread;
a native one by C threads (receive rings, batched sendmmsg or AF_XDP sends:
SOFTSWITCH_TX, no GIL) on the same sockets, each receiving on its share of the
ports. Committing a new pipeline stops one loop and starts the other kind.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import socket
import struct
import threading

from innet_aggregation.softswitch.backends.native.loader import IO_COUNTERS, MAX_IO_THREADS

log = logging.getLogger("softswitch")

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_VLAN_TPID_VALID = 1 << 6
AUXDATA = struct.Struct("=IIIHHHH")    # struct tpacket_auxdata
ANCILLARY = socket.CMSG_SPACE(AUXDATA.size)
BATCH = 64


def with_vlan_tag(frame: bytes, ancillary) -> bytes:
    """The frame as it was on the wire. The kernel takes an 802.1Q tag off every
    frame it receives and hands it beside the frame (PACKET_AUXDATA); a switch must
    see, and forward, the tag, as BMv2 (through libpcap) does."""
    for level, kind, data in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= AUXDATA.size:
            status, _, _, _, _, tci, tpid = AUXDATA.unpack_from(data)
            if status & TP_STATUS_VLAN_VALID:
                tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID else 0x8100
                return frame[:12] + struct.pack("!HH", tpid, tci) + frame[12:]
    return frame


def io_threads_argument(text: str) -> int:
    """--io-threads, checked where it is given (the softswitch's and the testbed's)."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_IO_THREADS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_IO_THREADS} threads, got {text!r}")
    return int(text)


def default_io_threads(ports: int) -> int:
    """A quarter of the cores, at least one and at most one a port: most of a frame's
    cost is the kernel's, paid on the sending core, so more threads send more; the
    rest of the cores are left to the hosts that share the machine in a testbed."""
    return max(1, min(ports, MAX_IO_THREADS, (os.cpu_count() or 1) // 4))


TX_METHODS = ("sendmmsg", "af_xdp")


def tx_method() -> str:
    """How the native loop sends (SOFTSWITCH_TX), checked once as the switch starts:
    sendmmsg on the AF_PACKET sockets, or af_xdp, an AF_XDP socket in copy mode per
    port (backends/native/xsk.c), each port falling back to sendmmsg where it cannot
    have one."""
    method = os.environ.get("SOFTSWITCH_TX", "sendmmsg")
    if method not in TX_METHODS:
        raise ValueError(f"SOFTSWITCH_TX must be one of {', '.join(TX_METHODS)}, got {method!r}")
    return method


def describe_tx(asked: str, ports: list["Port"], states: list[int]) -> str:
    """The line said as a native loop starts: how each port sends, and why not as asked."""
    if asked == "sendmmsg":
        return "sends: sendmmsg on every port (SOFTSWITCH_TX=sendmmsg)"
    xdp = [p.ifname for p, state in zip(ports, states) if state == 1]
    refused = [f"{p.ifname} ({os.strerror(-state)})" for p, state in zip(ports, states)
               if state < 0]
    line = f"sends: AF_XDP in copy mode on {', '.join(xdp) or 'no port'}"
    if refused:
        line += ("; sendmmsg on " + ", ".join(refused)
                 + ": no AF_XDP socket could be bound there")
    return line


def check_interface(ifname: str) -> int:
    """The interface's index; raises ValueError if it does not exist here."""
    try:
        return socket.if_nametoindex(ifname)
    except OSError:
        raise ValueError(f"interface {ifname!r} does not exist in this network namespace") from None


class Port:
    def __init__(self, number: int, ifname: str):
        self.number = number
        self.ifname = ifname
        ifindex = check_interface(ifname)
        self.rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.rx.bind((ifname, ETH_P_ALL))
        self.rx.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP,
                           struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b""))
        try:
            self.rx.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            self.sees_outgoing = False
        except OSError:
            self.sees_outgoing = True   # kernels before 4.20: skipped by packet type
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.rx.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)    # VLAN tags (with_vlan_tag)
        self.rx.setblocking(False)
        # Protocol 0: a send-only socket, so the kernel queues no received copies on it.
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self.tx.bind((ifname, 0))
        self.tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)

    def close(self) -> None:
        self.rx.close()
        self.tx.close()


class DataPlane:
    """Receives on every port, runs the current pipeline, sends what it returns."""

    def __init__(self, ports: dict[int, str], io_threads: int | None = None,
                 tx: str = "sendmmsg"):
        """``tx``: how a native loop sends (tx_method())."""
        self.ports = {n: Port(n, ifname) for n, ifname in ports.items()}
        self.io_threads = io_threads or default_io_threads(len(ports))
        self.tx = tx
        self.pipeline = None
        self.stopping = threading.Event()
        # The Python loop's counters; the native loops' (IO_COUNTERS) are theirs, summed
        # here as each loop stops.
        self.received = 0
        self.sent = 0
        self.failed = 0
        self.send_errors = 0
        self.no_port = 0
        self.native = dict.fromkeys(IO_COUNTERS, 0)
        self.thread = None
        self.running = None          # the pipeline whose loop runs, once started
        self.started = False
        self.switching = threading.Lock()

    def set_pipeline(self, pipeline) -> None:
        with self.switching:
            if self.started:
                self._stop_loop()
            self.pipeline = pipeline
            if self.started:
                self._start_loop()

    def start(self) -> None:
        with self.switching:
            self.started = True
            self._start_loop()

    def stop(self) -> None:
        with self.switching:
            self._stop_loop()
            self.started = False
        for port in self.ports.values():
            port.close()

    def _start_loop(self) -> None:
        pipeline = self.pipeline
        if getattr(pipeline, "native", False):
            ports = [p for _, p in sorted(self.ports.items())]
            states = pipeline.start_io([(p.number, p.rx.fileno(), p.tx.fileno()) for p in ports],
                                       self.io_threads, self.tx == "af_xdp")
            log.info("%d lanes; %s", min(self.io_threads, max(len(self.ports), 1)),
                     pipeline.lanes_line)
            log.info("%s", pipeline.multicast_line)
            log.info("%s", describe_tx(self.tx, ports, states))
            self.running = pipeline
            return
        self.stopping.clear()
        self.thread = threading.Thread(target=self.run, daemon=True, name="dataplane")
        self.thread.start()

    def _stop_loop(self) -> None:
        if self.running is not None:
            self.running.stop_io()
            for name, count in self.running.stats().items():
                self.native[name] += count
            self.running = None
        if self.thread is not None:
            self.stopping.set()
            self.thread.join(timeout=2)
            self.thread = None

    def counters(self) -> dict[str, int]:
        """Every frame received, sent and lost since the start (IO_COUNTERS), the
        running native loop's read now."""
        with self.switching:
            out = dict(self.native)
            if self.running is not None:
                for name, count in self.running.stats().items():
                    out[name] += count
        for name, count in (("received", self.received), ("sent", self.sent),
                            ("dropped", self.failed), ("send_errors", self.send_errors),
                            ("no_port", self.no_port)):
            out[name] += count
        return out

    def run(self) -> None:
        poller = select.epoll()
        by_fd = {}
        for port in self.ports.values():
            poller.register(port.rx.fileno(), select.EPOLLIN)
            by_fd[port.rx.fileno()] = port
        tx = {n: p.tx for n, p in self.ports.items()}
        buf = bytearray(1 << 16)
        view = memoryview(buf)
        buffers = [buf]
        debug = log.isEnabledFor(logging.DEBUG)
        while not self.stopping.is_set():
            try:
                events = poller.poll(0.2)
            except InterruptedError:
                continue
            for fd, _ in events:
                port = by_fd[fd]
                rx, number = port.rx, port.number
                pipeline = self.pipeline
                if pipeline is None:
                    self._drain(rx, buf)
                    continue
                process = pipeline.process
                sees_outgoing = port.sees_outgoing
                with pipeline.lock:
                    for _ in range(BATCH):
                        try:
                            n, ancillary, _, addr = rx.recvmsg_into(buffers, ANCILLARY)
                            if sees_outgoing and addr[2] == PACKET_OUTGOING:
                                continue
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError as exc:
                            log.warning("receive on %s failed: %s", port.ifname, exc)
                            break
                        self.received += 1
                        frame = with_vlan_tag(bytes(view[:n]), ancillary)
                        try:
                            out = process(frame, number)
                        except Exception:   # a bug must cost one packet, never the switch
                            self.failed += 1
                            if self.failed <= 10 or self.failed % 1000 == 0:
                                log.exception("dropped a %d-byte packet from port %d "
                                              "(%d so far)", n, number, self.failed)
                            continue
                        if debug:
                            log.debug("port %d: %d bytes in, out on %s", number, n,
                                      [p for p, _ in out] or "nothing")
                        for eport, data in out:
                            sock = tx.get(eport)
                            if sock is None:
                                self.no_port += 1
                                continue
                            try:
                                sock.send(data)
                                self.sent += 1
                            except OSError as exc:   # e.g. EMSGSIZE for a frame over the MTU
                                self.send_errors += 1
                                if self.send_errors <= 10 or self.send_errors % 1000 == 0:
                                    log.warning("send of %d bytes on port %d failed: %s "
                                                "(%d so far)", len(data), eport, exc,
                                                self.send_errors)
        poller.close()

    def inject(self, frame: bytes, port: int) -> None:
        """Run a frame entering on ``port`` (the CPU port: a PacketOut) through the
        pipeline, beside the packet loop, and send what it outputs. Copies for the CPU
        port itself are dropped: this switch has no PacketIn."""
        pipeline = self.pipeline
        if pipeline is None:
            return
        if getattr(pipeline, "native", False):
            out = pipeline.process(frame, port)       # takes the runtime's lock itself
        else:
            with pipeline.lock:
                out = pipeline.process(frame, port)
        for eport, data in out:
            target = self.ports.get(eport)
            if target is not None:
                try:
                    target.tx.send(data)
                except OSError as exc:
                    log.warning("send of a packet-out's %d bytes on port %d failed: %s",
                                len(data), eport, exc)

    @staticmethod
    def _drain(rx, buf) -> None:
        """No pipeline yet: what arrives is dropped, as BMv2 does with --no-p4."""
        for _ in range(BATCH):
            try:
                rx.recvfrom_into(buf)
            except OSError:
                return
