"""Compile one of our P4 programs and record what it was built from.

Two targets, one front half (sources, hashes, manifest):
- bmv2 (p4c-bm2-ss): NAME.json and NAME.p4info.txtpb into --out;
- tofino (bf-p4c, TNA): NAME.p4info.txtpb and NAME.resources.txt, our summary of the
  compiler's resource logs, into --out; the compiler's own output (tofino.bin,
  context.json, bfrt.json, logs) stays in --out/bf-p4c, which is not committed.
Both write NAME.manifest.json: the compiler's version, a hash of every output and of
every source file, so tests/test_p4_builds.py can tell a committed build from a stale
one on machines that have no compiler, and tests/test_tofino_build.py a resource
summary edited by hand from the one the build wrote.

    python tools/p4build.py --p4c p4c-bm2-ss --out innet_aggregation/p4src/build innet_aggregation/p4src/v1model/aggregation.p4 \
        --sources 'innet_aggregation/p4src/**/*.p4'
    python tools/p4build.py --target tofino --p4c bf-p4c --out innet_aggregation/p4src/tna/build \
        innet_aggregation/p4src/tna/aggregation.p4 --sources 'innet_aggregation/p4src/shared/*.p4' 'innet_aggregation/p4src/tna/**/*.p4'
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

from tofino_resources import summary  # beside this file: on sys.path as a script, and in pytest's pythonpath

REPO = Path(__file__).resolve().parents[1]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_hashes(patterns: list[str]) -> dict[str, str]:
    files = sorted({Path(p) for pattern in patterns
                    for p in glob.glob(str(REPO / pattern), recursive=True)})
    if not files:
        raise SystemExit(f"no source files match {patterns}")
    return {str(f.relative_to(REPO)): sha256(f) for f in files}


def stale_sources(manifest_path: Path) -> list[str]:
    """Sources that changed, appeared or vanished since the build (empty: fresh)."""
    manifest = json.loads(manifest_path.read_text())
    recorded = manifest["sources"]
    current = source_hashes(manifest["patterns"])
    return sorted(name for name in set(recorded) | set(current)
                  if recorded.get(name) != current.get(name))


def bmv2(compiler: str, program: Path, out: Path, defines: list[str]) -> list[str]:
    """The program is named relative to the repository and compiled from its root, so
    the JSON's source references are too: a build from any checkout is byte-identical."""
    name = program.stem
    run([compiler, "--arch", "v1model", "--std", "p4-16", *[f"-D{d}" for d in defines],
         "-o", str(out.resolve() / f"{name}.json"),
         "--p4runtime-files", str(out.resolve() / f"{name}.p4info.txtpb"),
         str(program.relative_to(REPO))], cwd=REPO)
    return [f"{name}.json", f"{name}.p4info.txtpb"]


def tofino(compiler: str, program: Path, out: Path, defines: list[str]) -> list[str]:
    """Standard P4Runtime externs (counters, registers), as a P4Runtime server on
    Tofino (Stratum's) takes them, rather than bf-p4c's Tofino-specific ones."""
    name, scratch = program.stem, out / "bf-p4c"
    shutil.rmtree(scratch, ignore_errors=True)
    run([compiler, "--target", "tofino", "--arch", "tna", "--std", "p4-16", "-g",
         "--p4runtime-force-std-externs", *[f"-D{d}" for d in defines],
         "--p4runtime-files", str(out / f"{name}.p4info.txtpb"), "-o", str(scratch),
         str(program)])
    (out / f"{name}.resources.txt").write_text(summary(scratch))
    return [f"{name}.p4info.txtpb", f"{name}.resources.txt"]


TARGETS = {"bmv2": bmv2, "tofino": tofino}


def run(cmd: list[str], cwd: Path | None = None) -> None:
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=cwd)


def compile_program(p4c: str, program: Path, out: Path, patterns: list[str],
                    defines: list[str], target: str = "bmv2") -> None:
    compiler = shutil.which(p4c)
    if compiler is None:
        raise SystemExit(f"{p4c} not found: build it (see docs/p4/index.md for p4c, "
                         f"docs/p4/tofino.md for bf-p4c) or pass P4C= / BF_P4C=")
    out.mkdir(parents=True, exist_ok=True)
    outputs = TARGETS[target](compiler, program, out, defines)
    version = [l.strip() for l in subprocess.run(
        [compiler, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True).stdout.splitlines() if l.strip()]
    manifest = {
        "program": str(program.resolve().relative_to(REPO)),
        "target": target,
        "compiler": next((l for l in version if "Version" in l), version[0] if version else "?"),
        "defines": defines,
        "outputs": {name: sha256(out / name) for name in outputs},
        "patterns": patterns,
        "sources": source_hashes(patterns),
    }
    (out / f"{program.stem}.manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", type=Path)
    parser.add_argument("--target", choices=sorted(TARGETS), default="bmv2")
    parser.add_argument("--p4c", default="p4c-bm2-ss", help="the compiler for --target")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sources", nargs="*",
                        help="globs, relative to the repo, of every file the build depends on "
                             "(default: the program file)")
    parser.add_argument("-D", dest="defines", action="append", default=[])
    args = parser.parse_args()
    program = args.program.resolve()
    patterns = args.sources or [str(program.relative_to(REPO))]
    try:
        compile_program(args.p4c, program, args.out, patterns, args.defines, args.target)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"p4c failed with exit code {exc.returncode}")


if __name__ == "__main__":
    main()
