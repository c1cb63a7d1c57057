"""A text summary of what a bf-p4c compile uses of Tofino: stages, stateful ALUs,
SRAM/TCAM, PHV. The compiler's own reports (pipe/logs/resources.json, phv.json)
are megabytes of JSON tied to one compiler version; this is what a reader of the
repo needs, in a file small enough to commit and diff (innet_aggregation/p4src/tna/build/).

Read from the schemas in p4c's backends/tofino/compiler_interfaces/schemas:
resources.json (per-stage use, what is available), phv.json (what each PHV
container holds) and the output's manifest.json (target, compiler version).

    python tools/tofino_resources.py innet_aggregation/p4src/tna/build/bf-p4c
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _log(out: Path, name: str, required: bool = True) -> dict | None:
    hits = sorted(out.rglob(name))
    if not hits and required:
        raise SystemExit(f"no {name} under {out}: did bf-p4c run with -g?")
    return json.loads(hits[0].read_text()) if hits else None


def _short(name: str) -> str:
    """A table or register without the pipeline and top-level control in front."""
    return name.split("Agg", 1)[-1].split(".", 1)[-1] if "Agg" in name else name


def summary(out: Path) -> str:
    resources = _log(out, "resources.json")
    phv = _log(out, "phv.json")
    # bf-p4c's own manifest: target, compiler version.
    build = _log(out, "manifest.json", required=False) or {}
    mau = resources["resources"]["mau"]
    stages = sorted(mau["mau_stages"], key=lambda s: s["stage_number"])

    def tables(stage) -> list[str]:
        return sorted({_short(t["table_name"]) for t in stage["logical_tables"]["ids"]})

    def salus(stage) -> list[str]:
        return sorted({_short(u["used_by"]) for alu in stage["meter_alus"]["meters"]
                       for u in alu["usages"]})

    used = [s for s in stages if tables(s) or s["meter_alus"]["meters"]]
    n_salus = sum(len(s["meter_alus"]["meters"]) for s in stages)
    salu_total = mau["nStages"] * stages[0]["meter_alus"]["nAlus"]
    per_stage_srams = stages[0]["rams"]["nRows"] * stages[0]["rams"]["nColumns"]
    per_stage_tcams = stages[0]["tcams"]["nRows"] * stages[0]["tcams"]["nColumns"]
    srams = sum(len(s["rams"]["srams"]) for s in stages)
    tcams = sum(len(s["tcams"]["tcams"]) for s in stages)
    lines = [
        f"program: {resources.get('program_name', '?')}",
        f"compiler: bf-p4c {build.get('compiler_version', resources.get('compiler_version'))}",
        f"target: {build.get('target', '?')}",
        "",
        f"stages used: {len(used)} of {mau['nStages']}",
        f"stateful ALUs: {n_salus} of {salu_total}",
        f"SRAM blocks: {srams} of {mau['nStages'] * per_stage_srams}",
        f"TCAM blocks: {tcams} of {mau['nStages'] * per_stage_tcams}",
    ]
    available = {(kind, c["width"]): c["units"]
                 for kind in ("normal", "mocha", "dark", "tagalong")
                 for c in resources["resources"]["phv_containers"].get(kind, [])}
    occupied: dict[tuple[str, int], list[int]] = {}   # (kind, width) -> bits per container
    for c in phv["containers"]:
        bits = {b for piece in c["slices"]
                for b in range(piece["slice_info"]["lsb"], piece["slice_info"]["msb"] + 1)}
        occupied.setdefault((c["container_type"], c["bit_width"]), []).append(len(bits))
    for (kind, width), bits in sorted(occupied.items()):
        of = available.get((kind, width))
        lines.append(f"PHV {kind} {width}-bit: {len(bits)}"
                     f"{f' of {of}' if of is not None else ''} containers, "
                     f"{sum(bits)} bits")
    lines += ["", "per stage: stateful ALUs (registers) | tables"]
    for s in stages:
        lines.append(f"  {s['stage_number']:2}: {len(s['meter_alus']['meters'])} "
                     f"({', '.join(salus(s)) or '-'}) | {', '.join(tables(s)) or '-'}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="bf-p4c's output directory (its -o)")
    print(summary(parser.parse_args().out), end="")


if __name__ == "__main__":
    main()
