"""Fixtures for the softswitch tests: compiled test programs and an in-process server.

Every test that runs a pipeline runs it on both backends (``backend`` fixture):
native (the program compiled to C) and python.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from innet_aggregation.softswitch.backends.native.loader import NativePipeline
from innet_aggregation.softswitch.p4runtime import Device, serve
from innet_aggregation.softswitch.backends.python.pipeline import Pipeline
from innet_aggregation.switch_ctl.client import SwitchConnection

PROGRAMS = Path(__file__).parent / "programs"
BACKENDS = ("native", "python")


def program_files(name: str) -> tuple[Path, Path]:
    """(BMv2 JSON, P4Info) of a committed test program build."""
    json_path = PROGRAMS / "build" / f"{name}.json"
    p4info_path = PROGRAMS / "build" / f"{name}.p4info.txtpb"
    assert json_path.exists(), f"{json_path} is missing: compile {name}.p4 with tools/p4build.py"
    return json_path, p4info_path


def pipeline(json_text: bytes, backend: str, **kw):
    """The program on exactly this backend (no fallback: a refusal fails the test)."""
    return (NativePipeline if backend == "native" else Pipeline)(json_text, **kw)


def load(name: str, backend: str = "python", **kw):
    return pipeline(program_files(name)[0].read_bytes(), backend, **kw)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Switch:
    """A P4Runtime server in this process; packets go straight into its pipeline."""

    def __init__(self, device_id: int = 0, backend: str = "python"):
        self.device = Device(device_id, on_pipeline=self._set, backend=backend)
        self.backend = backend
        self.addr = f"127.0.0.1:{free_port()}"
        self.server = serve(self.device, self.addr)
        self.pipeline = None

    def _set(self, pipeline) -> None:
        assert getattr(pipeline, "native", False) == (self.backend == "native"), \
            "the native backend fell back to Python"
        self.pipeline = pipeline

    def send(self, frame: bytes, port: int) -> list[tuple[int, bytes]]:
        with self.pipeline.lock:
            return self.pipeline.process(frame, port)

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def switch(backend):
    sw = Switch(backend=backend)
    yield sw
    sw.stop()


def connect(addr: str, program: str | None = None, **kw) -> SwitchConnection:
    """A controller session (switch_ctl's client) with ``program`` pushed, if given."""
    conn = SwitchConnection(addr, 0, (0, 1), **kw).connect()
    if program is not None:
        try:
            conn.push_pipeline(*program_files(program))
        except BaseException:
            conn.close()
            raise
    return conn
