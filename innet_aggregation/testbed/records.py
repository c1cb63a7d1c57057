"""Benchmark results as data: one JSON record per run, from which the README's
figures are taken (commit, date, machine and load beside every figure)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

from innet_aggregation import IMPORT_ROOT


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(IMPORT_ROOT), "describe", "--always", "--dirty",
                              "--abbrev=12"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def write_record(name: str, figures: dict, out_dir) -> Path:
    """``figures`` (JSON-serialisable) with what they were measured on, as
    ``<out_dir>/<name>-<UTC time>.json``; returns the path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    record = {"name": name, "commit": _commit(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                          "platform": platform.platform(), "python": platform.python_version()},
              "load": dict(zip(("1min", "5min", "15min"), os.getloadavg())),
              "figures": figures}
    path = Path(out_dir) / f"{name}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=float) + "\n")
    return path
