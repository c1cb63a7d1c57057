"""Which backend runs a program: native (C) where it can, else Python, saying why."""

from __future__ import annotations

import gc
import logging
from contextlib import contextmanager

from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends.native.printer import NativeUnsupported
from innet_aggregation.softswitch.frontend import DROP_PORT
from innet_aggregation.softswitch.backends.native.loader import NativePipeline, NativeUnavailable
from innet_aggregation.softswitch.backends.python.pipeline import Pipeline

log = logging.getLogger("softswitch")

BACKENDS = ("native", "python")


def load_pipeline(json_text: str | bytes, drop_port: int = DROP_PORT, backend: str | None = None):
    """A Pipeline or NativePipeline for the program; Unsupported/ValueError if neither runs it.

    A program the native backend cannot run (no compiler, a construct it refuses)
    runs on the Python backend, with one log line naming the reason.
    """
    backend = backend or "native"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    with _collector_paused():
        program = frontend.load(json_text, drop_port)
        if backend == "native":
            try:
                return NativePipeline(json_text, drop_port, program)
            except (NativeUnsupported, NativeUnavailable) as exc:
                log.warning("native backend: %s; running this program on the Python backend", exc)
        return Pipeline(json_text, drop_port, program)


@contextmanager
def _collector_paused():
    """The lowered program is 10^4-10^5 small acyclic nodes that live until printed:
    the cycle collector would walk them again and again for nothing (a third of the
    aggregation program's load time); it runs as usual once the pipeline is built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
