"""A picture of a torch.profiler trace's switch calls: when each call ran and, inside
it, each phase's intervals (worker/breakdown.py's ranges), under the training
thread's forward, backward and optimizer steps. The demo draws one from its
``--profile`` traces, so the picture in the docs is what a run recorded."""

from __future__ import annotations

import json
from pathlib import Path

from innet_aggregation.worker.breakdown import PHASES
from .output import pyplot

# The training thread's ranges that frame a step, as the rows' first.
STEP = {"DistributedDataParallel.forward": "forward", "Optimizer.step": "optimizer"}
ROWS = ("forward", "backward", "optimizer", "allreduce", "compiled", *PHASES)


def intervals(trace: dict) -> dict[str, list[tuple[float, float]]]:
    """Each row's (start, duration) in ms from the trace's first call's start, from
    complete events ("X") of the ina:: ranges and the training thread's steps."""
    rows: dict[str, list[tuple[float, float]]] = {row: [] for row in ROWS}
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    calls = [e for e in events if e["name"].startswith("ina::allreduce")]
    if not calls:
        raise ValueError("the trace holds no ina::allreduce range (was it recorded with "
                         "profile_all_threads?)")
    origin = min(e["ts"] for e in events)
    for e in events:
        name = e["name"]
        row = None
        if name.startswith("ina::"):
            row = name[5:].split(" ", 1)[0]
        elif name.startswith("autograd::engine::evaluate_function"):
            row = "backward"
        else:
            row = next((r for prefix, r in STEP.items() if name.startswith(prefix)), None)
        if row in rows:
            rows[row].append(((e["ts"] - origin) / 1e3, e["dur"] / 1e3))
    return {row: spans for row, spans in rows.items() if spans}


def draw(trace_path: Path, out: Path, title: str) -> None:
    plt = pyplot()

    rows = intervals(json.loads(Path(trace_path).read_text()))
    names = list(rows)
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(names) + 1.4))
    colors = plt.get_cmap("tab10")
    for i, name in enumerate(names):
        ax.broken_barh(rows[name], (len(names) - 1 - i - 0.4, 0.8), color=colors(i % 10),
                       linewidth=0)
    ax.set_yticks(range(len(names)), [f"ina::{n}" if n in ROWS[3:] else n
                                      for n in reversed(names)])
    ax.set_xlabel("ms from the first profiled event")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
