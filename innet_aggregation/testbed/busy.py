"""CPU-bound processes beside a run: a training host is rarely idle (a data loader,
logging, the framework share its cores), and the switch path needs a core for the
switch, so a benchmark says how it fares on a busy machine by making the load itself,
the same for every backend, instead of hoping for a quiet one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


@contextlib.contextmanager
def busy(processes: int):
    """``processes`` processes spinning a core each until the block ends (stopped by
    pid, never by name: the machine is shared)."""
    if processes < 0:
        raise ValueError(f"a number of busy processes must not be negative, not {processes}")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 stdin=subprocess.DEVNULL, start_new_session=True)
                for _ in range(processes)]
    try:
        yield [p.pid for p in spinners]
    finally:
        for p in spinners:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait()
