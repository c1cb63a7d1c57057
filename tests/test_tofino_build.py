"""The Tofino build's recorded figures: what the last `make p4-tofino` wrote.

No compile runs here (bf-p4c is in no registry). These tests read the resource
summary committed in innet_aggregation/p4src/tna/build/ and check the figures it records: the fit in
Tofino 1's 12 stages, the PHV, one stateful ALU per value pair. The summary is only
worth what ties it to a compile, so each of them first checks that tie, in the
manifest the build wrote beside it: the summary's hash is the one the build
recorded (a summary edited by hand fails), its compiler is the manifest's (version
and commit), and the sources are the ones the manifest hashed (a source changed
since fails). Where bf-p4c's own output is present (after make p4-tofino), the
summary is also recomputed from it.
"""

from __future__ import annotations

import json
import re

import pytest
from p4build import sha256, stale_sources
from tofino_resources import summary

from innet_aggregation.p4src import protocol

SUMMARY = protocol.TNA_BUILD_DIR / f"{protocol.PROGRAM_NAME}.resources.txt"
MANIFEST = protocol.TNA_BUILD_DIR / f"{protocol.PROGRAM_NAME}.manifest.json"
COMPILER_OUTPUT = protocol.TNA_BUILD_DIR / "bf-p4c"
REBUILD = "run 'make p4-tofino' with bf-p4c (docs/p4/tofino.md) and commit innet_aggregation/p4src/tna/build"

pytestmark = pytest.mark.skipif(
    not SUMMARY.exists(), reason=f"{SUMMARY.name} is missing: make p4-tofino writes it with "
                                 f"bf-p4c (docs/p4/tofino.md)")


def recorded_summary() -> str:
    """The summary, once shown to be the one the build recorded for these sources."""
    manifest = json.loads(MANIFEST.read_text())
    recorded = manifest["outputs"]
    assert isinstance(recorded, dict) and SUMMARY.name in recorded, \
        f"{MANIFEST.name} records no hash of {SUMMARY.name}: {REBUILD}"
    assert sha256(SUMMARY) == recorded[SUMMARY.name], \
        f"{SUMMARY.name} is not the summary the build wrote (its hash differs from " \
        f"{MANIFEST.name}'s): {REBUILD}"
    text = SUMMARY.read_text()
    commit = re.search(r"SHA: (\w+)", manifest["compiler"])
    named = re.search(r"^compiler: bf-p4c \S+ \((\w+)\)$", text, re.M)
    assert commit and named and named[1] == commit[1], \
        f"{SUMMARY.name}'s compiler line is not {MANIFEST.name}'s compiler {manifest['compiler']!r}"
    stale = stale_sources(MANIFEST)
    assert not stale, f"the figures are for other sources: {', '.join(stale)} changed; {REBUILD}"
    return text


def used_of(text: str, name: str) -> tuple[int, int]:
    match = re.search(rf"^{name}: (\d+) of (\d+)$", text, re.M)
    assert match, f"no '{name}: N of M' line in {SUMMARY.name}"
    return int(match[1]), int(match[2])


def test_the_summary_is_the_one_the_manifest_records_for_these_sources():
    assert "target: tofino" in recorded_summary()


def test_the_recorded_figures_fit_tofino_1():
    text = recorded_summary()
    stages, available = used_of(text, "stages used")
    assert available == 12 and stages <= 12
    for resource in ("stateful ALUs", "SRAM blocks", "TCAM blocks"):
        used, total = used_of(text, resource)
        assert used <= total, resource


def test_the_recorded_phv_use_is_within_what_tofino_1_has():
    lines = re.findall(r"^PHV (\w+) (\d+)-bit: (\d+) of (\d+) containers, (\d+) bits$",
                       recorded_summary(), re.M)
    assert {(kind, int(width)) for kind, width, *_ in lines} >= {
        ("normal", 8), ("normal", 16), ("normal", 32)}
    for kind, width, used, available, bits in lines:
        assert 0 < int(used) <= int(available), (kind, width)
        assert int(bits) <= int(used) * int(width), (kind, width)


def test_the_recorded_stateful_alus_are_one_per_value_pair():
    """1 bitmap + 2 round states (a deadline job's release: tna/control/round_tracker.p4)
    + 1 count + 1 exponent + 1 fingerprint sum + one per pair of values."""
    used, _ = used_of(recorded_summary(), "stateful ALUs")
    # The TNA build takes size.p4's own packet size (no -D), 64 values.
    assert json.loads(MANIFEST.read_text())["defines"] == []
    values = protocol.parse_defines((protocol.P4SRC_DIR / "shared/size.p4").read_text())
    assert used == 6 + values["VALUES_PER_PACKET"] // 2


def test_the_round_state_sits_beside_the_bitmap_before_every_value():
    """The release's state is read and written in the bitmap's stage, behind the same
    admission, so no value register of a later stage adds a packet of a released or
    stale round."""
    stages = {int(m[1]): m[2].split(", ") for m in re.finditer(
        r"^\s*(\d+): \d+ \(([^)]*)\)", recorded_summary(), re.M)}
    where = {name: stage for stage, names in stages.items() for name in names}
    assert where["round_tracker.rounds"] == where["round_tracker.ages"] \
        == where["bitmap_checker.bitmaps"]
    values = [stage for name, stage in where.items() if name.startswith("value_aggregator.")]
    assert values and min(values) > where["bitmap_checker.bitmaps"]


@pytest.mark.skipif(not COMPILER_OUTPUT.exists(),
                    reason="bf-p4c's own output is not here (make p4-tofino writes it)")
def test_the_summary_is_what_bf_p4cs_output_gives():
    assert summary(COMPILER_OUTPUT) == SUMMARY.read_text()
