"""Where a long run is, and the time it has left.

The experiments run for minutes; a person at a terminal wants to know how long, while
a log or CI wants plain lines that a carriage return does not mangle. So on a terminal
one status line is redrawn in place under the run's own output, and anywhere else
each step is a line of its own.
"""

from __future__ import annotations

import sys
import time


def duration(seconds: float) -> str:
    """``45 s``, ``3 min 05 s``, ``1 h 02 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """``total`` steps of ``label``'s run; the time left is the mean step so far times
    the steps still to do."""

    def __init__(self, total: int, label: str, stream=None, clock=time.monotonic):
        if total < 1:
            raise ValueError(f"{label}: a run of {total} steps has no progress to show")
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.clock = clock
        self.started = clock()
        self.done = 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.status = ""

    def line(self, what: str = "") -> str:
        elapsed = self.clock() - self.started
        text = (f"[{self.label}] {self.done}/{self.total} "
                f"({100 * self.done // self.total} %), {duration(elapsed)} elapsed")
        if 0 < self.done < self.total:
            text += f", about {duration(elapsed / self.done * (self.total - self.done))} left"
        return f"{text}: {what}" if what else text

    def advance(self, what: str = "") -> None:
        """One step done; ``what`` names it."""
        self.done = min(self.total, self.done + 1)
        self.status = self.line(what)
        if self.tty:
            end = "\n" if self.done == self.total else ""
            self.stream.write(f"\r\033[K{self.status}{end}")
        else:
            self.stream.write(self.status + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        """A line of the run's own output (stdout), kept above the status line."""
        if self.tty and self.status and self.done < self.total:
            self.stream.write("\r\033[K")
            self.stream.flush()
        print(text, flush=True)
        if self.tty and self.status and self.done < self.total:
            self.stream.write(self.status)
            self.stream.flush()
