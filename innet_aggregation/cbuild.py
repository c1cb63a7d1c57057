"""Compile a C unit with the system compiler into a per-machine cache, on first use.

Shared by the softswitch's native backend and the worker's fast path, so that both
find the compiler, key the cache and build the same way. A shared object is keyed
by a hash of everything it is a function of (its sources, the compiler, its
version and flags, the CPU), so it is compiled once per machine and never reused
stale. A unit is compiled on the machine that runs it, so it may use all of that
machine's CPU (``-march=native``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterable


CFLAGS = ("-O3", "-march=native")


class BuildUnavailable(Exception):
    """No shared object can be built here; the message says why."""


def compiler() -> str | None:
    """The C compiler to use ($CC, else cc), or None if there is none."""
    return shutil.which(os.environ.get("CC") or "cc")


def no_compiler() -> str:
    return f"no C compiler ({os.environ.get('CC') or 'cc'} is not on PATH)"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "innet-softswitch"   # where the softswitch first put it; the worker's too


@functools.cache
def _compiler_identity(cc: str) -> bytes:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return b""


@functools.cache
def _cpu_identity() -> bytes:
    """The CPU's model and flags: -march=native code from a cache shared with another
    machine could stop on an instruction this one lacks."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return b"".join(sorted({line for line in f
                                    if line.startswith((b"model name", b"flags"))}))
    except OSError:
        return b""


def shared_object(name: str, key: Iterable[bytes], source: Callable[[], str], *,
                  what: str = "the generated code", libs: tuple[str, ...] = ()) -> Path:
    """The shared object ``name-<hash>.so`` for the inputs ``key``, from the cache, or
    compiled now from ``source()`` (called only then). Raises BuildUnavailable."""
    cc = compiler()
    if cc is None:
        raise BuildUnavailable(no_compiler())
    digest = hashlib.sha256()
    for part in (*key, Path(__file__).read_bytes(), cc.encode(), _compiler_identity(cc),
                 " ".join(CFLAGS).encode(), _cpu_identity()):
        digest.update(hashlib.sha256(part).digest())
    out_dir = cache_dir()
    so = out_dir / f"{name}-{digest.hexdigest()[:32]}.so"
    if so.exists():
        return so
    text = source()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        c_file = Path(tmp) / f"{name}.c"
        c_file.write_text(text)
        tmp_so = Path(tmp) / f"{name}.so"
        cmd = [cc, *CFLAGS, "-shared", "-fPIC", "-fvisibility=hidden", "-o", str(tmp_so),
               str(c_file), *libs]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildUnavailable(f"the C compiler failed on {what}: "
                                   + (result.stderr.strip().splitlines() or ["?"])[-1])
        os.replace(tmp_so, so)    # atomic: a concurrent build of the same unit is harmless
    return so
