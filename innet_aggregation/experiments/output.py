"""What an experiment writes beside its JSON record (record.py): a CSV of every row it
measured, and figures drawn off-screen as PNG files."""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path: Path, fields: list[str], rows: list[dict], extra: str = "raise") -> None:
    """``rows`` under a header of ``fields``; a row's other keys raise, or with
    ``extra="ignore"`` are left out (rows that carry more than the CSV keeps)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction=extra)
        writer.writeheader()
        writer.writerows(rows)


def pyplot():
    """matplotlib's pyplot on the Agg backend: the experiments run where no display is
    (a testbed needs root, often over ssh), and write their figures to files."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
