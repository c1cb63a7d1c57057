"""Stopping on a signal as at a normal end.

A job scheduler or ``timeout`` stops a run with SIGTERM, a closed terminal with
SIGHUP; Python's default for both ends the process at once, with no ``finally``
and no ``__exit__``, and the switch processes, worker processes and links it made
outlive it. ``stop_on_signals`` (called by every entry point that starts them)
turns each of those signals into ``Stopped`` in the main thread, so the teardown a
normal end runs runs. ``Stopped`` is a SystemExit, not a KeyboardInterrupt:
Mininet's CLI swallows KeyboardInterrupt (Ctrl-C there interrupts a command) and
``except Exception`` catches neither.

A teardown (``whole``) is not cut short by a signal: one that arrives meanwhile is
raised when it is done. Later signals are ignored: the first one's teardown runs.

``dies_with_parent`` guards what a signal cannot: a parent killed with SIGKILL.
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(SystemExit):
    """A stop signal arrived; the exit status is the shell's for it (128 + number)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


_depth = 0                      # teardowns under way in the main thread
_pending: list[int] = []        # the first signal, while a teardown holds it back
_stopping = False


def _handler(signum, _frame):
    global _stopping
    if _stopping:
        return
    _stopping = True
    if _depth:
        _pending.append(signum)
    else:
        raise Stopped(signum)


def stop_on_signals(signals=STOP_SIGNALS) -> None:
    """From now on each of ``signals`` raises ``Stopped`` in the main thread."""
    for signum in signals:
        signal.signal(signum, _handler)


def whole(teardown):
    """Decorator: ``teardown`` runs to its end; a stop signal that arrives meanwhile is
    raised after it (unless an exception is already on its way out)."""
    @functools.wraps(teardown)
    def run(*args, **kwargs):
        global _depth
        if threading.current_thread() is not threading.main_thread():
            return teardown(*args, **kwargs)    # signals are raised in the main thread only
        _depth += 1
        try:
            result = teardown(*args, **kwargs)
        finally:
            _depth -= 1
        if not _depth and _pending:
            raise Stopped(_pending.pop())
        return result
    return run


def terminate(process, timeout: float = 10.0) -> None:
    """Stop a process we started: SIGTERM, and SIGKILL if it is not gone in ``timeout``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def dies_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that the kernel sends it SIGTERM when its parent dies, even by
    SIGKILL (util-linux's setpriv sets PR_SET_PDEATHSIG and execs it: same pid). A
    preexec_fn would do the same, but Python then runs its fork handlers, and gRPC's
    abort the child while the parent has channels open. Unchanged off the main
    thread: the kernel ties this to the thread that forked, and a helper thread's end
    would stop the child; and where setpriv is missing."""
    if threading.current_thread() is not threading.main_thread() or not _SETPRIV:
        return argv
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]


_SETPRIV = shutil.which("setpriv")
