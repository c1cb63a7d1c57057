"""Start a worker module once every worker of its run is ready:

    python -m tests.worker.together GATE PARTIES DELAY MODULE ARGS...

imports MODULE (and loads the worker's fast path), marks itself ready in the folder
GATE, waits until PARTIES workers are, and DELAY seconds more (a straggler's), then
runs ``MODULE.main(ARGS)``. Their
sessions then start within a scheduling delay of each other, however long each
interpreter took to start on a busy machine: what a test that judges the order of
the workers' first packets (who had contributed when another gave up) needs."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path


def main() -> int:
    gate, parties, delay = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    name, argv = sys.argv[4], sys.argv[5:]
    module = importlib.import_module(name)
    from innet_aggregation.worker import fastpath
    fastpath.library()              # compiled (or found in the cache) before the gate
    (gate / str(os.getpid())).touch()
    while sum(1 for _ in gate.iterdir()) < parties:
        time.sleep(0.005)
    time.sleep(delay)
    return module.main(argv)


if __name__ == "__main__":
    sys.exit(main())
