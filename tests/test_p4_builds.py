"""Every committed P4 build matches its sources, so a build can never go stale.

Runs everywhere (no p4c needed): it compares the source hashes recorded by
tools/p4build.py with the files as they are now.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from p4build import stale_sources

REPO = Path(__file__).resolve().parents[1]

MANIFESTS = sorted(REPO.glob("innet_aggregation/p4src/build/**/*.manifest.json")) + sorted(
    REPO.glob("innet_aggregation/p4src/tna/build/*.manifest.json")) + sorted(
    REPO.glob("tests/**/build/*.manifest.json"))


def test_the_main_program_is_built():
    assert (REPO / "innet_aggregation/p4src/build/aggregation.manifest.json") in MANIFESTS
    assert (REPO / "innet_aggregation/p4src/build/k64/aggregation.manifest.json") in MANIFESTS
    assert (REPO / "innet_aggregation/p4src/build/k1024/aggregation.manifest.json") in MANIFESTS


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: str(p.relative_to(REPO)))
def test_build_matches_its_sources(manifest):
    stale = stale_sources(manifest)
    assert not stale, (f"{manifest.parent} is stale: {', '.join(stale)} changed since it was "
                       f"compiled; run 'make p4' (or 'make p4-test-programs', or 'make "
                       f"p4-tofino' with bf-p4c) and commit")
    for output in json.loads(manifest.read_text())["outputs"]:
        assert (manifest.parent / output).exists(), output
