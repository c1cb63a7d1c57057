"""Many datagrams per system call on a connected UDP socket: sendmmsg and recvmmsg.

Python's ``socket`` module has neither, and one ``send`` per packet costs a Python
call and a system call each, which bound the worker at a few ten thousand packets
per second. Here the message vectors are numpy arrays laid out as ``struct mmsghdr``
and ``struct iovec``, built once; a batch only rewrites the iovec base pointers
(vectorized) and makes one ctypes call, which releases the GIL. Where libc has no
sendmmsg/recvmmsg (not Linux), the same methods loop over ``send``/``recv_into``.

**UDP GSO.** The kernel's cost per datagram (the UDP and IP send path, the route, the
neighbour, the qdisc), not the bytes, is most of a worker's CPU. With UDP_SEGMENT set
to the packet's size, a run of consecutive rows goes out as one message that the
kernel cuts into one datagram per row only at the device (in software where the
device cannot, checksums included), so the path is walked once per run. The datagrams
on the wire are the same. Where the kernel refuses it (no UDP_SEGMENT, or a route
that cannot segment), one message per row, as said in a log line.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import socket

import numpy as np

MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)
SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = 103             # linux/udp.h
GSO_SEGMENTS = 64             # UDP_MAX_SEGMENTS of kernels before 6.10
GSO_BYTES = 65535 - 60 - 8    # an IPv4 datagram, its longest header, UDP's header

log = logging.getLogger("worker")


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.c_void_p), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


def _dtype(struct, fields: dict[str, tuple[int, type]]) -> np.dtype:
    """A numpy view of the C struct with only the fields we touch, at their offsets."""
    return np.dtype({"names": list(fields), "formats": [f for _, f in fields.values()],
                     "offsets": [o for o, _ in fields.values()], "itemsize": ctypes.sizeof(struct)})


_IOV = _dtype(_IoVec, {"base": (_IoVec.base.offset, np.uintp), "len": (_IoVec.len.offset, np.uintp)})
_MMSG = _dtype(_MMsgHdr, {"iov": (_MMsgHdr.hdr.offset + _MsgHdr.iov.offset, np.uintp),
                          "iovlen": (_MMsgHdr.hdr.offset + _MsgHdr.iovlen.offset, np.uintp),
                          "len": (_MMsgHdr.len.offset, np.uint32)})

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _sendmmsg = _libc.sendmmsg
    _recvmmsg = _libc.recvmmsg
except (OSError, AttributeError):
    _sendmmsg = _recvmmsg = None
else:
    _sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    _recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                          ctypes.c_void_p]
    _sendmmsg.restype = _recvmmsg.restype = ctypes.c_int

BATCHED = _sendmmsg is not None


def _vectors(count: int, base: int, stride: int, length: int):
    iov = np.zeros(count, dtype=_IOV)
    iov["base"] = base + stride * np.arange(count, dtype=np.uintp)
    iov["len"] = length
    msgs = np.zeros(count, dtype=_MMSG)
    msgs["iov"] = iov.ctypes.data + _IOV.itemsize * np.arange(count, dtype=np.uintp)
    msgs["iovlen"] = 1
    return iov, msgs


def _spans(starts: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each of a split of ``count`` rows begins (0, then ``starts``) and how long it is."""
    bounds = np.empty(len(starts) + 2, dtype=np.intp)
    bounds[0], bounds[1:-1], bounds[-1] = 0, starts, count
    return bounds[:-1], bounds[1:] - bounds[:-1]


class BatchSocket:
    """Sends rows of one packet array and receives into another, in batches.

    ``tx`` is a contiguous array of packet records; ``rx`` a 2-D uint8 array, one
    datagram per row (make rows a byte longer than a packet, so that a longer
    datagram shows as the wrong length). Both are kept alive by this object. Errors are
    returned, never raised: the transport tells a lost packet (an ICMP error queued by
    a forged or stale frame, a full buffer) from a route that refuses its packets."""

    def __init__(self, sock: socket.socket, tx: np.ndarray, rx: np.ndarray):
        if not (tx.flags.c_contiguous and rx.flags.c_contiguous) or rx.ndim != 2:
            raise ValueError("tx must be contiguous records, rx a contiguous 2-D byte array")
        self.sock = sock
        self.fd = sock.fileno()
        self.tx, self.rx = tx, rx
        self.tx_size = tx.dtype.itemsize
        self._tx_iov, self._tx_msgs = _vectors(len(tx), tx.ctypes.data, self.tx_size, self.tx_size)
        self._rx_iov, self._rx_msgs = _vectors(len(rx), rx.ctypes.data, rx.strides[0],
                                               rx.strides[0])
        self._tx_ptr = self._tx_msgs.ctypes.data
        self._rx_ptr = self.rx_vectors = self._rx_msgs.ctypes.data   # struct mmsghdr[len(rx)]
        # Field views made once: a batch's few numpy calls are its cost, not the bytes.
        self._tx_base, self._tx_len = self._tx_iov["base"], self._tx_iov["len"]
        self._rx_len = self._rx_msgs["len"]
        self._tx_data = tx.ctypes.data
        self.gso = 1              # rows per message at most; more than 1 once UDP_SEGMENT is set
        if _sendmmsg is not None:
            try:
                sock.setsockopt(SOL_UDP, UDP_SEGMENT, self.tx_size)
            except OSError as exc:
                log.info("UDP GSO unavailable (%s): one system call's datagrams go through "
                         "the kernel one by one", exc.strerror)
            else:
                self.gso = max(1, min(GSO_SEGMENTS, GSO_BYTES // self.tx_size))

    def send(self, rows: np.ndarray) -> tuple[int, int]:
        """Send ``tx[rows]`` in order; returns (packets sent, errno of the first
        failure or 0). Packets after a failure are not sent."""
        if _sendmmsg is None:
            return self._send_each(rows)
        rows = np.asarray(rows, dtype=np.intp)
        count = len(rows)
        firsts, lengths = self._runs(rows)
        done_msgs = 0
        while done_msgs < len(firsts):
            chunk = min(len(firsts) - done_msgs, len(self._tx_iov))
            batch = slice(done_msgs, done_msgs + chunk)
            self._tx_base[:chunk] = self._tx_data + self.tx_size * rows[firsts[batch]]
            self._tx_len[:chunk] = self.tx_size * lengths[batch]
            done = _sendmmsg(self.fd, self._tx_ptr, chunk, 0)
            err = ctypes.get_errno() if done < 0 else 0
            done_msgs += max(done, 0)
            if err or done <= 0:
                sent = int(lengths[:done_msgs].sum())
                if self.refuses_gso(err, int(lengths[done_msgs]) if err else 0):
                    more, err = self.send(rows[sent:])
                    return sent + more, err
                return sent, err or errno.EAGAIN
        return count, 0

    def _runs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The messages: where each starts in ``rows`` and how many rows it sends, one
        run of consecutive rows each, at most ``gso`` long."""
        count = len(rows)
        if self.gso == 1 or count < 2:
            return np.arange(count), np.ones(count, dtype=np.intp)
        starts = (rows[1:] - rows[:-1] != 1).nonzero()[0]
        if not starts.size:               # the common case: one run
            firsts = np.arange(0, count, self.gso)
            return firsts, np.minimum(count - firsts, self.gso)
        firsts, lengths = _spans(starts + 1, count)
        if lengths.max() > self.gso:      # a long run: cut it every ``gso`` rows
            run_start = np.repeat(firsts, lengths)
            firsts, lengths = _spans(
                ((np.arange(1, count) - run_start[1:]) % self.gso == 0).nonzero()[0] + 1, count)
        return firsts, lengths

    def refuses_gso(self, err: int, rows: int) -> bool:
        """Whether a message of ``rows`` rows that failed with ``err`` was the route
        refusing a segmented message; if so, GSO is off for this socket from now on."""
        if err in (errno.EIO, errno.EINVAL) and self.gso > 1 and rows > 1:
            self.no_gso(err)
            return True
        return False

    def no_gso(self, err: int) -> None:
        """The route refused a segmented message (a device or tunnel that cannot cut
        it): one datagram per message from now on, on this socket."""
        self.gso = 1
        self._tx_iov["len"] = self.tx_size
        try:
            self.sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
        except OSError:
            pass
        log.warning("UDP GSO refused on this route (%s): one system call's datagrams go "
                    "through the kernel one by one", errno.errorcode.get(err, err))

    def clear_error(self) -> None:
        """Take the error queued on the socket (an ICMP error's), so that the next
        send's result is the route's own."""
        self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)

    def _send_each(self, rows) -> tuple[int, int]:
        """Without sendmmsg: one ``send`` per packet."""
        view = memoryview(self.tx.view(np.uint8).reshape(-1))
        for i, row in enumerate(rows):
            try:
                self.sock.send(view[row * self.tx_size:(row + 1) * self.tx_size])
            except OSError as exc:
                return i, exc.errno or errno.EIO
        return len(rows), 0

    def receive(self) -> tuple[np.ndarray, int]:
        """Whatever is queued, without waiting: the datagram lengths of rows
        ``rx[:k]`` (valid, as the rows, until the next receive), and errno of a
        failure (0 if none)."""
        if _recvmmsg is None:
            return self._receive_each()
        got = _recvmmsg(self.fd, self._rx_ptr, len(self._rx_iov), MSG_DONTWAIT, None)
        if got < 0:
            err = ctypes.get_errno()
            return np.zeros(0, dtype=np.int64), (0 if err in (errno.EAGAIN, errno.EWOULDBLOCK)
                                                 else err)
        return self._rx_len[:got], 0

    def lengths(self, count: int) -> np.ndarray:
        """The lengths of the last ``recvmmsg``'s first ``count`` datagrams (one made
        outside, through ``rx_vectors``)."""
        return self._rx_len[:count]

    def _receive_each(self) -> tuple[np.ndarray, int]:
        lengths = []
        rows = self.rx
        err = 0
        while len(lengths) < len(rows):
            try:
                lengths.append(self.sock.recv_into(memoryview(rows[len(lengths)]), 0,
                                                   MSG_DONTWAIT))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                err = exc.errno or errno.EIO
                break
        return np.asarray(lengths, dtype=np.int64), err
