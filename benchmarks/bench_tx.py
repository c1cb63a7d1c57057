"""What a frame's send costs through each interface the kernel offers, on a veth pair.

benchmarks/native/txbench.c (compiled now) sends frames of each size out of one end of
a veth pair whose other end sits in a namespace made here (frames to a MAC nobody
has: the peer's stack drops them, as a worker's host drops results it does not take),
for ``--seconds`` per method, in ``--repeats`` rounds over all methods (order reversed
every other round), so the machine's load hits them alike. Prints, per size and
method, frames per second and CPU ns per frame (the process's user + system time,
which holds the peer's receive: veth runs it on the sending core), each the median
with its min-max. No record is written: it chose the switch's send path (issue 50).

    sudo .venv/bin/python benchmarks/bench_tx.py [--seconds 0.5] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parent / "native"
METHODS = ["mmsg", "mmsg-bypass", "ring", "ring-bypass", "uring", "xdp"]
NS, END, PEER = "benchtx", "benchtx-a", "benchtx-b"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def spread(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[300, 1100, 4138])
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = str(Path(tmp) / "txbench")
        sh(shutil.which("cc") or "gcc", "-O2", "-o", exe, str(NATIVE / "txbench.c"))
        sh("ip", "netns", "add", NS)
        try:
            sh("ip", "link", "add", END, "type", "veth", "peer", "name", PEER, "netns", NS)
            sh("ip", "link", "set", END, "mtu", "9000", "up")
            sh("ip", "-n", NS, "link", "set", PEER, "mtu", "9000", "up")
            sh("ethtool", "-K", END, "tx", "off")
            results: dict[tuple[int, str], list[tuple[float, float]]] = {}
            errors: dict[tuple[int, str], str] = {}
            for r in range(args.repeats):
                order = [(s, m) for s in args.sizes for m in args.methods]
                for size, method in order if r % 2 == 0 else order[::-1]:
                    if (size, method) in errors:
                        continue
                    p = subprocess.run([exe, END, method, str(size), str(args.seconds)],
                                       capture_output=True, text=True)
                    if p.returncode:
                        errors[size, method] = p.stderr.strip()
                        continue
                    frames, cpu, wall = map(float, p.stdout.split())
                    results.setdefault((size, method), []).append((frames / wall, cpu / frames * 1e9))
        finally:
            subprocess.run(["ip", "link", "del", END], capture_output=True)
            subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    print(f"{'bytes':>6} {'method':12s} {'frames/s':>28} {'CPU ns/frame':>22} {'/ mmsg CPU':>10}")
    for size in args.sizes:
        base = results.get((size, "mmsg"))
        for method in args.methods:
            if (size, method) in errors:
                print(f"{size:>6} {method:12s} failed: {errors[size, method]}")
                continue
            got = results[size, method]
            ratio = (f"{statistics.median(c for _, c in got) / statistics.median(c for _, c in base):.2f}"
                     if base else "")
            print(f"{size:>6} {method:12s} {spread([f for f, _ in got], ',.0f'):>28} "
                  f"{spread([c for _, c in got], '.0f'):>22} {ratio:>10}")


if __name__ == "__main__":
    main()
