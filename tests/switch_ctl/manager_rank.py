"""One rank of a job run through the job manager, in a host's namespace: join (the
environment's INA_* settings), then sessions of allreduce calls on integer-valued
float32 inputs whose exact sum the rank computes itself; one JSON line per event.

    python -m tests.switch_ctl.manager_rank --rank 0 --world 2 --reps 3
        [--hold FILE] [--between FILE] [--sessions 2] [--pause S] [--until FILE] [--no-close]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from innet_aggregation.switch_ctl.manager import JoinError, join_from_env
from innet_aggregation.worker.session import AggregationSession
from innet_aggregation.worker.transport import RetransmitPolicy


def inputs(size: int, seed: int, rep: int, rank: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rep, rank])
    return rng.integers(-1000, 1001, size).astype(np.float32)


def say(**event) -> None:
    print(json.dumps(event), flush=True)


def wait_for(path: Path | None) -> None:
    while path is not None and not path.exists():
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between calls")
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--between", type=Path, help="wait for FILE between sessions")
    parser.add_argument("--hold", type=Path, help="wait for FILE before closing")
    parser.add_argument("--until", type=Path,
                        help="once FILE exists, stop after as many calls as it says (every "
                             "rank at the same call)")
    parser.add_argument("--no-close", action="store_true")
    args = parser.parse_args()
    try:
        membership = join_from_env(args.rank, args.world)
    except JoinError as exc:
        say(error=f"JoinError: {exc}")
        return 2
    job = membership.config.job
    say(event="joined", job_id=job.id, first_slot=job.first_slot, num_slots=job.num_slots,
        udp_port=job.udp_port, service_ip=job.service_ip, service_mac=job.service_mac,
        ip=[w.ip for w in job.workers if w.id == args.rank][0], deadline_ms=job.deadline_ms)
    policy = RetransmitPolicy(peer_timeout=20.0)
    call = 0
    for session_number in range(args.sessions):
        if session_number:
            wait_for(args.between)
        with AggregationSession.from_config(membership.config, args.rank, policy=policy) as s:
            for _ in range(args.reps):
                if args.until is not None and args.until.exists() and (
                        call >= int(args.until.read_text())):
                    break
                tensor = inputs(args.size, args.seed, call, args.rank)
                try:
                    s.allreduce(tensor)
                except Exception as exc:
                    say(error=f"{type(exc).__name__}: {exc}", call=call)
                    return 1
                exact = sum(inputs(args.size, args.seed, call, r).astype(np.float64)
                            for r in range(args.world))
                wrong = int(np.count_nonzero(tensor.astype(np.float64) != exact))
                say(event="call", call=call, session=session_number, wrong=wrong)
                if wrong:
                    return 1
                call += 1
                time.sleep(args.pause)
    say(event="held")
    wait_for(args.hold)
    if membership.lost:
        say(error=f"lost: {membership.lost}")
        return 3
    if not args.no_close:
        membership.close()
    say(event="closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
