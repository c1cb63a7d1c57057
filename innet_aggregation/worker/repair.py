"""A deadline job's results a late worker lost, from its peers.

Under a deadline the others move on without a late worker, so a (slot, set) of the
switch holds a later round while the late worker still waits for an earlier one.
The switch drops its resends of that round as stale (``round_tracker.p4``), so a
result lost on the way to it (a lossy link, a full socket buffer while it slept) is
never sent again by the switch. Every other worker received that very packet, and
every worker applies the same bits: so each keeps the results it took, the last
``kept`` of them (a ring: twice the lead a late worker may have, ``LEAD_LIMIT``), and
a worker whose packet's timer expires asks its peers for that round's result (slot,
packet id), which any of them that holds it sends back, the same bytes the switch
sent. The answer is taken as the switch's would be (the identity bytes must match the
packet in flight).

The channel: UDP between the job's workers, host to host as gloo's traffic goes.
Each worker answers on its job port + ``PORT_OFFSET`` (a thread of its own, so a
worker between calls, or finished, still answers), and asks from a socket of its own.
A request is checked at the boundary: it must come from one of the job's workers'
addresses, name this job and at most ``ASK_MAX`` rounds, and be exactly as long as
that; anything else is dropped, so a forged request cannot make a worker send more
than one request's worth of the job's own results to a job's worker.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading

import numpy as np

PORT_OFFSET = 1               # a worker answers on its job port + this
ASK_MAX = 64                  # rounds one request may name
MAGIC = b"INAR"
HEADER = struct.Struct(">4sII")   # magic, job id, rounds named
POLL_MS = 200                 # the answering thread checks for close this often

log = logging.getLogger("worker")


class Repair:
    """Keeps the results this worker took (``keep``), answers its peers' requests for
    them (a thread), and asks its peers for the rounds it lost (``ask``, ``receive``).
    ``peers``: the other workers' (IPv4, job port)."""

    def __init__(self, fmt, job_id: int, local_ip: str, local_port: int,
                 peers: list[tuple[str, int]], kept: int):
        self.fmt = fmt
        self.job_id = job_id
        self.peers = [(ip, port + PORT_OFFSET) for ip, port in peers]
        self.allowed = {ip for ip, _ in peers}
        self.ring = np.zeros(kept, dtype=fmt.dtype)
        self.ring_key = np.full(kept, -1, dtype=np.int64)    # slot << 32 | packet id
        self.next = 0
        self.lock = threading.Lock()
        self.answered = 0             # rounds sent to peers that asked
        self.serve_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.ask_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.serve_sock.bind((local_ip, local_port + PORT_OFFSET))
            self.ask_sock.bind((local_ip, 0))
            self.ask_sock.setblocking(False)
        except OSError:
            self.serve_sock.close()
            self.ask_sock.close()
            raise
        self.buffer = bytearray(fmt.payload_bytes + 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"ina-repair-{job_id}")
        self._thread.start()

    def _keys(self, packets: np.ndarray) -> np.ndarray:
        slot = self.fmt.unpack(packets, ("slot",))["slot"].astype(np.int64)
        return (slot << 32) | packets["pkt_id"].astype(np.int64)

    def keep(self, packets: np.ndarray) -> None:
        """Results this worker took, for a peer that lost them; the oldest go."""
        count = min(len(packets), len(self.ring))
        if not count:
            return
        packets = packets[-count:]
        where = (self.next + np.arange(count)) % len(self.ring)
        keys = self._keys(packets)
        with self.lock:
            self.ring[where] = packets
            self.ring_key[where] = keys
        self.next = int((self.next + count) % len(self.ring))

    def ask(self, slots: np.ndarray, ids: np.ndarray) -> None:
        """Ask every peer for the results of these rounds (absolute slot, packet id)."""
        pairs = np.stack([slots, ids], axis=1).astype(">u4")
        for start in range(0, len(pairs), ASK_MAX):
            part = pairs[start:start + ASK_MAX]
            request = HEADER.pack(MAGIC, self.job_id, len(part)) + part.tobytes()
            for peer in self.peers:
                try:
                    self.ask_sock.sendto(request, peer)
                except OSError:      # a full buffer, an unreachable peer: asked again later
                    pass

    def receive(self) -> np.ndarray:
        """The results peers sent back, queued now, as packets (well-formed only)."""
        got = []
        while True:
            try:
                size = self.ask_sock.recv_into(self.buffer)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:          # an ICMP error from a peer gone: nothing to take
                continue
            if size == self.fmt.payload_bytes:
                got.append(bytes(self.buffer[:size]))
        if not got:
            return np.zeros(0, dtype=self.fmt.dtype)
        return np.frombuffer(b"".join(got), dtype=self.fmt.dtype).copy()

    def _serve(self) -> None:
        """Answer peers' requests with the rounds this worker holds."""
        poll = select.poll()
        poll.register(self.serve_sock, select.POLLIN)
        while not self._stop.is_set():
            if not poll.poll(POLL_MS):
                continue
            try:
                data, addr = self.serve_sock.recvfrom(HEADER.size + 8 * ASK_MAX + 1)
            except OSError:
                continue
            keys = self._request(data, addr)
            if keys is None:
                continue
            with self.lock:
                found = self.ring[np.isin(self.ring_key, keys)]
            for packet in found:
                try:
                    self.serve_sock.sendto(packet.tobytes(), addr)
                    self.answered += 1
                except OSError:
                    break

    def _request(self, data: bytes, addr) -> np.ndarray | None:
        """The rounds a well-formed request from one of the job's workers names."""
        if addr[0] not in self.allowed or len(data) < HEADER.size:
            return None
        magic, job, count = HEADER.unpack_from(data)
        if magic != MAGIC or job != self.job_id or not 0 < count <= ASK_MAX \
                or len(data) != HEADER.size + 8 * count:
            return None
        pairs = np.frombuffer(data, dtype=">u4", offset=HEADER.size).reshape(count, 2)
        return (pairs[:, 0].astype(np.int64) << 32) | pairs[:, 1].astype(np.int64)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        self.serve_sock.close()
        self.ask_sock.close()
