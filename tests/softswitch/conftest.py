"""Fixtures for the softswitch tests: compiled test programs and an in-process server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from softswitch.p4runtime import Device, serve
from softswitch.pipeline import Pipeline

PROGRAMS = Path(__file__).parent / "programs"


def program_files(name: str) -> tuple[Path, Path]:
    """(BMv2 JSON, P4Info) of a committed test program build."""
    json_path = PROGRAMS / "build" / f"{name}.json"
    p4info_path = PROGRAMS / "build" / f"{name}.p4info.txtpb"
    assert json_path.exists(), f"{json_path} is missing: compile {name}.p4 with tools/p4build.py"
    return json_path, p4info_path


def load(name: str) -> Pipeline:
    return Pipeline(program_files(name)[0].read_bytes())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Switch:
    """A P4Runtime server in this process; packets go straight into its pipeline."""

    def __init__(self, device_id: int = 0):
        self.device = Device(device_id, on_pipeline=self._set)
        self.addr = f"127.0.0.1:{free_port()}"
        self.server = serve(self.device, self.addr)
        self.pipeline: Pipeline | None = None

    def _set(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def send(self, frame: bytes, port: int) -> list[tuple[int, bytes]]:
        with self.pipeline.lock:
            return self.pipeline.process(frame, port)

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def switch():
    sw = Switch()
    yield sw
    sw.stop()
