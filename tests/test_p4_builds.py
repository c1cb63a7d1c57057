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


def test_a_build_from_another_checkout_is_byte_identical(tmp_path):
    """The committed program is what p4c makes of its sources anywhere: the JSON names
    its sources relative to the repository, so a checkout at another path builds the
    same bytes (45 s of p4c on two loaded cores)."""
    import shutil
    import subprocess
    import sys
    manifest = json.loads((REPO / "innet_aggregation/p4src/build/aggregation.manifest.json")
                          .read_text())
    p4c = shutil.which("p4c-bm2-ss")
    if p4c is None:
        pytest.skip("p4c-bm2-ss is not installed (see docs: Change the P4 program)")
    version = subprocess.run([p4c, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True).stdout
    if manifest["compiler"].strip() not in version:
        pytest.skip(f"another p4c ({version.strip()}) than the build's ({manifest['compiler']})")
    other = tmp_path / "another-checkout"
    shutil.copytree(REPO / "innet_aggregation/p4src", other / "innet_aggregation/p4src",
                    ignore=shutil.ignore_patterns("build"))
    shutil.copytree(REPO / "tools", other / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    out = other / "build"
    subprocess.run([sys.executable, str(other / "tools/p4build.py"),
                    "innet_aggregation/p4src/v1model/aggregation.p4", "--p4c", p4c, "--out",
                    str(out), *[f"-D{d}" for d in manifest["defines"]],
                    "--sources", *manifest["patterns"]], cwd=other, check=True,
                   capture_output=True)
    for name in manifest["outputs"]:
        assert (out / name).read_bytes() == (REPO / "innet_aggregation/p4src/build" / name) \
            .read_bytes(), name
