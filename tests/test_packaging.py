"""`pip install .` into a fresh venv installs one top-level name, ours, with the P4
programs the workers read and the C source of their fast path: nothing named
``worker`` or ``testbed`` lands in site-packages to collide with other projects."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("p4src", "switch_ctl", "worker", "softswitch", "testbed")

CHECK = f"""
import importlib, sys
for name in {OURS!r}:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        continue
    sys.exit(f"'import {{name}}' works: it must not be a top-level package")
import innet_aggregation
from innet_aggregation.p4src import protocol
from innet_aggregation.worker import AggregationSession, fastpath
assert fastpath.SOURCE.is_file(), "the worker's fast path source is not installed"
print(innet_aggregation.__file__)
print(protocol.packet_format().values_per_packet, *(b.values_per_packet for b in protocol.builds()))
"""


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "install", "-q", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("install")
    source = root / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    venv.create(root / "venv", with_pip=True)
    python = root / "venv/bin/python"
    # numpy alone first: an index that cannot serve it is this machine's limit, not ours.
    if _pip(python, "numpy").returncode != 0:
        pytest.skip("no package index reachable: a fresh venv cannot get numpy")
    done = _pip(python, str(source))
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def test_only_the_projects_namespace_is_installed(installed, tmp_path):
    site = subprocess.run([str(installed), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    top = {p.name for p in Path(site).iterdir()
           if p.is_dir() and not p.name.endswith((".dist-info", ".egg-info")) and p.name != "__pycache__"}
    assert not top & set(OURS), top
    assert "innet_aggregation" in top
    # Run away from the checkout, so only the installed copy can be imported.
    done = subprocess.run([str(installed), "-c", CHECK], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    path, sizes = done.stdout.splitlines()
    assert Path(path).is_relative_to(site), path
    assert sizes.split() == ["256", "64", "256", "1024"]   # the default, then every build
    assert (Path(installed).parent / "switch-ctl").exists()
