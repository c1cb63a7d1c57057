"""make bench-backend: what the ``ina`` torch.distributed backend adds to the session.

Four worker processes in network namespaces behind one switch (the embedded
softswitch's native backend unless ``--target``) send the same float32 tensors
through ``AggregationSession.allreduce`` and through ``dist.all_reduce`` on a
``cpu:ina`` group of that session, call by call in turns (the first of each pair
alternating; benchmarks/backend_worker.py). Per size it prints the median time of
each path (over workers and calls, min-max beside), backend / session as the
ratio of those medians and as the median of the rounds' ratios (each round's the
ratio of the workers' median times), and what each path adds around the session's
own aggregation of the call (its ``last_call.seconds``): the call's time minus that,
medians, and the backend's extra as a share of the session path's median time.
The backend's goal: at most 5 % more than the session. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from innet_aggregation.testbed.stopping import stop_on_signals  # noqa: E402
from namespace_job import install_job  # noqa: E402  (beside this file)

from innet_aggregation.experiments import record  # noqa: E402

WORKERS = 4
PORT = 29650


def spread(values, fmt: str) -> str:
    return (f"{statistics.median(values):{fmt}} "
            f"({min(values):{fmt}}-{max(values):{fmt}})")


def run(target: str, sizes: list[int], reps: int, slots: int) -> list[dict]:
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    with tempfile.TemporaryDirectory() as tmp, \
            Namespaces(WORKERS, tag=f"bb{os.getpid() % 100000}") as topo, \
            SwitchProcess(target, topo.switch_ports, log_path=Path(tmp) / "switch.log") as switch:
        path = install_job(switch, topo, slots, Path(tmp))
        env = dict(os.environ, PYTHONPATH=str(REPO), GLOO_SOCKET_IFNAME=topo.hosts[0].ifname)
        procs = [h.popen([sys.executable, str(REPO / "benchmarks/backend_worker.py"),
                          "--config", str(path), "--worker-id", str(i), "--world", str(WORKERS),
                          "--master", f"{topo.hosts[0].ip}:{PORT}", "--reps", str(reps),
                          "--sizes", *map(str, sizes)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=REPO) for i, h in enumerate(topo.hosts)]
        # Drained together: a worker blocked on a full pipe would stall the others.
        with ThreadPoolExecutor(len(procs)) as pool:
            try:
                outputs = list(pool.map(lambda p: p.communicate(timeout=900), procs))
            except BaseException:   # a stop signal: the pool would wait for the workers
                for proc in procs:
                    proc.kill()
                raise
    for proc, (_, err) in zip(procs, outputs):
        if proc.returncode:
            raise SystemExit(f"a worker failed ({proc.returncode}):\n{err.strip()[-3000:]}")
    return [json.loads(line) for out, _ in outputs for line in out.splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="softswitch",
                        help="softswitch (native), softswitch-python or bmv2")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2410, 65536, 1 << 20],
                        help="float32 per call (2410: the DDP test's model, whole)")
    parser.add_argument("--reps", type=int, default=40, help="calls of each path per size")
    parser.add_argument("--slots", type=int, default=128, help="the job's window")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench-backend needs root (network namespaces)")
    stop_on_signals()       # a stop signal tears down as the end does
    print(f"{WORKERS} workers, {args.target}, float32, session.allreduce and dist.all_reduce "
          f"on a cpu:ina group in turns, {args.reps} calls each per size after one to warm "
          f"up; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    load, figures = os.getloadavg()[0], []
    reports = run(args.target, args.sizes, args.reps, args.slots)
    print(f"\n  {'float32':>9} {'session ms':>22} {'backend ms':>22} {'ratio of medians':>17} "
          f"{'rounds ratio':>20} {'around the work, us: session, backend':>38} {'extra':>7}")
    for size in args.sizes:
        mine = [r for r in reports if r["size"] == size]
        ms = {p: [1e3 * r["seconds"] for r in mine if r["path"] == p]
              for p in ("session", "backend")}
        around = {p: statistics.median(1e6 * (r["seconds"] - r["inner"]) for r in mine
                                       if r["path"] == p) for p in ms}
        ratios = [statistics.median(r["seconds"] for r in mine if r["rep"] == rep
                                    and r["path"] == "backend")
                  / statistics.median(r["seconds"] for r in mine if r["rep"] == rep
                                      and r["path"] == "session")
                  for rep in range(args.reps)]
        extra = (around["backend"] - around["session"]) / 1e3 / statistics.median(ms["session"])
        print(f"  {size:>9,} {spread(ms['session'], '.2f'):>22} {spread(ms['backend'], '.2f'):>22} "
              f"{statistics.median(ms['backend']) / statistics.median(ms['session']):>17.3f} "
              f"{spread(ratios, '.3f'):>20} "
              f"{around['session']:>18.0f}, {around['backend']:<18.0f} {100 * extra:>6.2f}%")
        figures.append({"size": size, "session_ms": record.spread(ms["session"]),
                        "backend_ms": record.spread(ms["backend"]),
                        "ratio": statistics.median(ms["backend"]) / statistics.median(ms["session"]),
                        "rounds_ratio": record.spread(ratios), "around_us": around,
                        "extra": extra})
    record.write("bench-backend", figures, params=vars(args), load_before=load)
    print(f"  load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
