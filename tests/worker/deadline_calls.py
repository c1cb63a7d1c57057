"""One rank of the deadline tests (a job with ``deadline_ms``; the session alone):

    python -m tests.worker.deadline_calls --config job.toml --worker-id 0 --out DIR \
        [--calls 8] [--size 16384] [--sleep 0.3 --sleep-calls 2,5] [--until-stalled]
        [--lead-limit N]

Every call all-reduces, under one name, ``run.make_inputs(size, SEED, call, rank)``
(normal values, steady scales per 64), which any process can recompute; a rank given
``--sleep`` first sleeps that long before the calls in ``--sleep-calls`` (with
``--until-stalled``, only until the other ranks' calls have stopped for ``STALLED``
seconds, at most that long: they wait for it at the lead limit, however loaded the host);
``--lead-limit`` lowers the released rounds a late rank may trail by (bounded.py's
LEAD_LIMIT, so a test reaches it in a few calls); ``--rcvbuf`` shrinks the socket's
receive buffer before a sleep, so most results sent meanwhile are lost. Per call,
DIR/RANK.CALL.npz holds the result and the blocks this rank's values were left out
of (a released round without them) with the values it carries into the next call,
and a JSON line on stdout the call's counters and error bound.
"""

import argparse
import json
import socket
import sys
import time
from pathlib import Path

import numpy as np

from innet_aggregation.worker import bounded
from innet_aggregation.worker.run import make_inputs
from innet_aggregation.worker.session import AggregationSession

SEED = 11
NAME = "bucket"
STALLED = 2.0           # seconds without another rank's call done: they wait for this one


def sleep_until_stalled(out: Path, rank: int, most: float) -> None:
    """Until no other rank has finished a call for STALLED seconds, at most ``most``."""
    end = time.monotonic() + most
    done, since = -1, time.monotonic()
    while (now := time.monotonic()) < end:
        now_done = sum(1 for f in out.glob("*.npz") if not f.name.startswith(f"{rank}."))
        if now_done != done:
            done, since = now_done, now
        elif now - since >= STALLED:
            return
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker-id", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--sleep-calls", default="")
    parser.add_argument("--until-stalled", action="store_true")
    parser.add_argument("--lead-limit", type=int, default=None)
    parser.add_argument("--rcvbuf", type=int, default=None)
    args = parser.parse_args()
    if args.lead_limit is not None:
        bounded.LEAD_LIMIT = args.lead_limit
    rank, out = args.worker_id, Path(args.out)
    sleeps = {int(c) for c in args.sleep_calls.split(",") if c}
    with AggregationSession.from_config(args.config, rank) as session:
        carry = session.carry.store
        for call in range(args.calls):
            if call in sleeps:
                if args.rcvbuf:      # what comes while it sleeps mostly lost in the kernel
                    session.transport.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF,
                                                      args.rcvbuf)
                if args.until_stalled:
                    sleep_until_stalled(out, rank, args.sleep)
                else:
                    time.sleep(args.sleep)
            values = make_inputs(args.size, SEED, call, rank, steady=True)
            session.allreduce(values, name=NAME)
            (chunks, carried), = carry.values() if carry else ((np.zeros(0, np.int64),
                                                                np.zeros((0, 0), np.float32)),)
            np.savez(out / f"{rank}.{call}.npz", result=values, left_out=chunks, carried=carried)
            stats = session.last_call
            print(json.dumps({"call": call, "bound": stats.max_error_bound,
                              "seconds": stats.seconds,
                              "srtt": session.transport.rto.srtt,
                              "rto": session.transport.rto.rto,
                              **stats.counters.as_dict()}), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
