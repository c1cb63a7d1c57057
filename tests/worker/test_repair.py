"""A deadline job's results kept for peers (worker/repair.py), on real sockets over
loopback: a peer's request gets back the bytes this worker took, and a request that is
not well formed, names another job or comes from no worker of the job gets nothing."""

from __future__ import annotations

import socket
import time

import numpy as np

from innet_aggregation.p4src import protocol
from innet_aggregation.worker.repair import HEADER, MAGIC, PORT_OFFSET, Repair

JOB = 7


def answers(sock: socket.socket, fmt, wait: float = 0.5) -> list[np.ndarray]:
    sock.settimeout(wait)
    got = []
    try:
        while True:
            data = sock.recv(fmt.payload_bytes + 1)
            got.append(np.frombuffer(data, dtype=fmt.dtype)[0])
            sock.settimeout(0.1)
    except socket.timeout:
        return got


def test_a_peer_gets_the_rounds_it_asks_for_and_nothing_else():
    fmt = protocol.packet_format()
    keeper = Repair(fmt, JOB, "127.0.0.1", 47000, [("127.0.0.1", 47010)], kept=4)
    asker = Repair(fmt, JOB, "127.0.0.1", 47010, [("127.0.0.1", 47000)], kept=4)
    try:
        rounds = fmt.pack(count=6, msg_type=int(protocol.MSG_RELEASED), job_id=JOB,
                          slot=np.arange(6) + 3, pkt_id=np.arange(6) + 100)
        rounds["values"] = np.arange(6)[:, None]
        keeper.keep(rounds)                      # a ring of 4: rounds 0 and 1 are gone
        asker.ask(np.array([3, 5, 8]), np.array([100, 102, 105]))
        deadline = time.monotonic() + 2
        got = []
        while len(got) < 2 and time.monotonic() < deadline:
            got += list(asker.receive())
            time.sleep(0.02)
        assert sorted(int(p["pkt_id"]) for p in got) == [102, 105]
        assert sorted(p.tobytes() for p in got) == sorted(rounds[i].tobytes() for i in (2, 5))
        # Refused at the boundary: no answer to any of these.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            stranger.bind(("127.0.0.2", 0))          # not a worker of the job
            target = ("127.0.0.1", 47000 + PORT_OFFSET)
            good = HEADER.pack(MAGIC, JOB, 1) + np.array([[8, 105]], ">u4").tobytes()
            stranger.sendto(good, target)
            assert answers(stranger, fmt) == []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as worker:
            worker.bind(("127.0.0.1", 0))
            for bad in (HEADER.pack(MAGIC, JOB + 1, 1) + good[HEADER.size:],   # another job
                        HEADER.pack(MAGIC, JOB, 2) + good[HEADER.size:],       # short
                        HEADER.pack(b"XXXX", JOB, 1) + good[HEADER.size:],
                        HEADER.pack(MAGIC, JOB, 65) + bytes(8 * 65)):          # too many
                worker.sendto(bad, target)
            assert answers(worker, fmt) == []
            worker.sendto(good, target)                 # and the well-formed one is answered
            assert [int(p["pkt_id"]) for p in answers(worker, fmt)] == [105]
    finally:
        keeper.close()
        asker.close()
