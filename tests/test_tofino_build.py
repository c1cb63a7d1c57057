"""The committed Tofino build (make p4-tofino): it fits Tofino 1, and its summary is
what the compiler reported.

The fit is read from the committed summary, so it is checked on every machine; the
summary is compared with bf-p4c's own logs where they are (after make p4-tofino).
"""

from __future__ import annotations

import re

import pytest
from tofino_resources import summary

from p4src import protocol

SUMMARY = protocol.TNA_BUILD_DIR / f"{protocol.PROGRAM_NAME}.resources.txt"
COMPILER_OUTPUT = protocol.TNA_BUILD_DIR / "bf-p4c"

pytestmark = pytest.mark.skipif(
    not SUMMARY.exists(), reason=f"{SUMMARY.name} is missing: make p4-tofino writes it with "
                                 f"bf-p4c (README, 'Tofino')")


def used_of(name: str) -> tuple[int, int]:
    match = re.search(rf"^{name}: (\d+) of (\d+)$", SUMMARY.read_text(), re.M)
    assert match, f"no '{name}: N of M' line in {SUMMARY.name}"
    return int(match[1]), int(match[2])


def test_it_fits_tofino_1():
    assert "target: tofino" in SUMMARY.read_text()
    stages, available = used_of("stages used")
    assert available == 12 and stages <= 12
    for resource in ("stateful ALUs", "SRAM blocks", "TCAM blocks"):
        used, total = used_of(resource)
        assert used <= total, resource


def test_phv_use_is_reported_within_what_tofino_1_has():
    lines = re.findall(r"^PHV (\w+) (\d+)-bit: (\d+) of (\d+) containers, (\d+) bits$",
                       SUMMARY.read_text(), re.M)
    assert {(kind, int(width)) for kind, width, *_ in lines} >= {
        ("normal", 8), ("normal", 16), ("normal", 32)}
    for kind, width, used, available, bits in lines:
        assert 0 < int(used) <= int(available), (kind, width)
        assert int(bits) <= int(used) * int(width), (kind, width)


def test_every_sum_has_its_stateful_alu():
    """1 bitmap + 1 count + 1 exponent + one per pair of values."""
    used, _ = used_of("stateful ALUs")
    assert used == 3 + protocol.packet_format().values_per_packet // 2


@pytest.mark.skipif(not COMPILER_OUTPUT.exists(),
                    reason="bf-p4c's own output is not here (make p4-tofino writes it)")
def test_the_summary_is_the_compilers():
    assert summary(COMPILER_OUTPUT) == SUMMARY.read_text()
