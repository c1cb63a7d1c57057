"""Compile one of our P4 programs with p4c-bm2-ss and record what it was built from.

Writes NAME.json (BMv2), NAME.p4info.txtpb and NAME.manifest.json into --out. The
manifest holds a hash of every source file, so tests/test_p4_builds.py can tell a
committed build from a stale one on machines that have no p4c.

    python tools/p4build.py --p4c p4c-bm2-ss --out p4src/build p4src/v1model/aggregation.p4 \
        --sources 'p4src/**/*.p4'
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def source_hashes(patterns: list[str]) -> dict[str, str]:
    files = sorted({Path(p) for pattern in patterns
                    for p in glob.glob(str(REPO / pattern), recursive=True)})
    if not files:
        raise SystemExit(f"no source files match {patterns}")
    return {str(f.relative_to(REPO)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def stale_sources(manifest_path: Path) -> list[str]:
    """Sources that changed, appeared or vanished since the build (empty: fresh)."""
    manifest = json.loads(manifest_path.read_text())
    recorded = manifest["sources"]
    current = source_hashes(manifest["patterns"])
    return sorted(name for name in set(recorded) | set(current)
                  if recorded.get(name) != current.get(name))


def compile_program(p4c: str, program: Path, out: Path, patterns: list[str],
                    defines: list[str]) -> None:
    compiler = shutil.which(p4c)
    if compiler is None:
        raise SystemExit(f"{p4c} not found: build p4c (see README, 'Real BMv2') or pass P4C=")
    out.mkdir(parents=True, exist_ok=True)
    name = program.stem
    cmd = [compiler, "--arch", "v1model", "--std", "p4-16",
           *[f"-D{d}" for d in defines],
           "-o", str(out / f"{name}.json"),
           "--p4runtime-files", str(out / f"{name}.p4info.txtpb"),
           str(program)]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)
    version = subprocess.run([compiler, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True).stdout
    manifest = {
        "program": str(program.resolve().relative_to(REPO)),
        "compiler": next((l.strip() for l in version.splitlines() if "Version" in l), "unknown"),
        "defines": defines,
        "patterns": patterns,
        "sources": source_hashes(patterns),
    }
    (out / f"{name}.manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", type=Path)
    parser.add_argument("--p4c", default="p4c-bm2-ss")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sources", nargs="*",
                        help="globs, relative to the repo, of every file the build depends on "
                             "(default: the program file)")
    parser.add_argument("-D", dest="defines", action="append", default=[])
    args = parser.parse_args()
    program = args.program.resolve()
    patterns = args.sources or [str(program.relative_to(REPO))]
    try:
        compile_program(args.p4c, program, args.out, patterns, args.defines)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"p4c failed with exit code {exc.returncode}")


if __name__ == "__main__":
    main()
