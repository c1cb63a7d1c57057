"""How the testbed shapes its links, and what it refuses to build.

A shaped link is an HTB class of ``rate`` with a bucket of ``HTB_BURST_S`` at that
rate (``burst_bytes``), which refills in every pause (before a call, between a
ring's steps): the bucket is kept small against a call, so that a call goes out at
the rate and not at the bucket's. What the links then deliver is measured, not
assumed, by the experiments (experiments/link_model.py). Rates the links cannot be
shaped to and more workers than the switch or the machine holds are refused before
anything starts.
"""

from __future__ import annotations

from innet_aggregation.p4src import protocol

# HTB's bucket in seconds at the link's rate (topology.ShapedIntf). With 8 ms the bucket
# carried 1 MiB calls past what the links delivered to a bulk transfer (n = 4: the switch
# path at 105 % and 111 %, gloo's ring at 107 % and 117 %, at 200 and 500 Mbit/s): a limit
# the links did not follow. With 1 ms (a 1 MiB call is 16 bucketfuls at 500 Mbit/s) no path
# passed it by more than the 15 kB floor's 1 % at 20 Mbit/s; at 500 Mbit/s HTB, serviced
# late on 2 busy cores, then keeps both paths below the link (79-90 %), which their link
# shares say.
HTB_BURST_S = 0.001
MIN_BURST_BYTES = 15000       # Mininet's own bucket; below a few frames HTB under-delivers
MAX_SHAPED_MBIT = 1000.0      # Mininet's TCIntf ignores a higher rate: the link stays unshaped
MAX_TESTBED_WORKERS = min(protocol.MAX_WORKERS, 250)   # the switch's lanes; 10.0.0.0/24 hosts
# One testbed host: its worker process (Python, torch, the session, gloo: 250-280 MB
# resident here with 1 MiB calls of recorded gradients), with room for larger tensors;
# more workers than memory holds swap or die.
WORKER_MEMORY_MB = 450


def burst_bytes(mbit: float) -> int:
    """HTB's bucket (burst and cburst) for a link of ``mbit`` Mbit/s."""
    return max(MIN_BURST_BYTES, int(mbit * 1e6 / 8 * HTB_BURST_S))


def check_rate(mbit: float) -> None:
    """Refuse a rate the links cannot be shaped to (0 is unshaped)."""
    if not 0 <= mbit <= MAX_SHAPED_MBIT:
        raise ValueError(f"a link rate of {mbit:g} Mbit/s cannot be shaped: Mininet's HTB "
                         f"shaping takes 0 < rate <= {MAX_SHAPED_MBIT:g} Mbit/s (0: unshaped) "
                         f"and would leave the links unshaped above it")


def available_memory_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def check_workers(n: int, memory_mb: float | None = None) -> None:
    """Refuse a worker count the switch or this machine cannot run, before anything starts."""
    if not 2 <= n <= MAX_TESTBED_WORKERS:
        raise ValueError(f"{n} workers: the testbed runs 2..{MAX_TESTBED_WORKERS} (the "
                         f"program aggregates at most {protocol.MAX_WORKERS})")
    memory_mb = available_memory_mb() if memory_mb is None else memory_mb
    if n * WORKER_MEMORY_MB > memory_mb:
        raise ValueError(f"{n} workers need about {n * WORKER_MEMORY_MB} MB "
                         f"({WORKER_MEMORY_MB} MB each) and this machine has {memory_mb:.0f} MB "
                         f"available: at most {int(memory_mb // WORKER_MEMORY_MB)} workers")
