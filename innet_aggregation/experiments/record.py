"""A JSON record of one benchmark or experiment run, beside what it prints.

Every figure the documentation quotes comes from such a record (docs/results/,
rendered by tools/render_results.py), so a record says where its figures came
from: the commit, the date, the machine and its load. Figures with a spread are
``{"median", "min", "max"}`` (see :func:`spread`)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path

RESULTS = Path("results")
SCHEMA = 1


def spread(values, scale: float = 1.0) -> dict:
    """Median and range of repeated measurements, the form every record uses."""
    values = [scale * v for v in values]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def machine() -> dict:
    return {"system": f"{platform.system()} {platform.release()}",
            "processor": platform.machine(), "cpus": os.cpu_count()}


def write(experiment: str, figures, *, params: dict | None = None, load_before=None,
          out: Path = RESULTS) -> Path:
    """Write results/<experiment>.json: the run's figures and where they come from.

    ``load_before`` is the 1-minute load average when the run started; the one at the
    end is read here."""
    record = {
        "schema": SCHEMA, "experiment": experiment, "commit": _commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load": [round(load_before, 2) if load_before is not None else None,
                 round(os.getloadavg()[0], 2)],
        "source": "measured",
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in (params or {}).items()},
        "figures": figures,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{experiment}.json"
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return path
