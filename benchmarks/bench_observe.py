"""make bench-observe: what seeing where the time goes costs a call.

Four worker processes in network namespaces behind one switch (the embedded
softswitch's native backend unless ``--target``) run 1 MiB calls
(``innet_aggregation.worker.run``), in rounds: each round every condition once, the
order turned every other round so a change in the machine's load hits them alike:

- ``off``: nothing asked for (the breakdown's own timing, always on, included);
- ``on``: ``INA_DEBUG=INFO`` (a line per call) and ``INA_METRICS_ADDR`` (each call
  observed into Prometheus histograms);
- ``before`` (with ``--before DIR``, a checkout of the code without the breakdown):
  what the breakdown's timing costs against no breakdown at all.

Per round and condition the median over calls (after two to warm up) of the slowest
worker's time; printed per condition with min-max over rounds, and each condition
over ``off`` as the median of the rounds' ratios. The goal: ``on`` within 3 % of
``off``. A profiler is not part of ``on``: recording a trace costs what the profiler
costs. Needs root.
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

from innet_aggregation.experiments import record  # noqa: E402
from innet_aggregation.experiments.progress import Progress  # noqa: E402
from innet_aggregation.testbed.stopping import stop_on_signals  # noqa: E402
from namespace_job import install_job  # noqa: E402  (beside this file)

WORKERS = 4
WARMUP = 2
GOAL = 1.03
METRICS_PORT = 9460


def spread(values, fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def one_run(topo, path: Path, condition: str, args, rnd: int) -> float:
    """The condition's median call time (the slowest worker's each call), in seconds."""
    code = args.before if condition == "before" else REPO
    env = dict(os.environ, PYTHONPATH=str(code))
    for name in ("INA_DEBUG", "INA_METRICS_ADDR"):
        env.pop(name, None)
    if condition == "on":
        env.update(INA_DEBUG="INFO", INA_METRICS_ADDR=f"127.0.0.1:{METRICS_PORT}")
    procs = [h.popen([sys.executable, "-m", "innet_aggregation.worker.run", "--config",
                      str(path), "--worker-id", str(i), "--size", str(args.size), "--reps",
                      str(args.calls + WARMUP), "--seed", str(rnd)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                     cwd=code) for i, h in enumerate(topo.hosts)]
    with ThreadPoolExecutor(len(procs)) as pool:     # drained together: no full pipe
        try:
            outputs = list(pool.map(lambda p: p.communicate(timeout=600), procs))
        except BaseException:
            for proc in procs:
                proc.kill()
            raise
    times = []
    for proc, (out, err) in zip(procs, outputs):
        if proc.returncode:
            raise SystemExit(f"{condition}: a worker failed ({proc.returncode}):\n"
                             f"{err.strip()[-3000:]}")
        reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        times.append([r["seconds"] for r in reports][WARMUP:])
    return statistics.median(max(call) for call in zip(*times))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="softswitch",
                        help="softswitch (native), softswitch-python or bmv2")
    parser.add_argument("--size", type=int, default=1 << 18, help="float32 per call (1 MiB)")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per run")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slots", type=int, default=128, help="the job's window")
    parser.add_argument("--before", type=Path, default=None, metavar="DIR",
                        help="a checkout without the breakdown, run as a third condition")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench-observe needs root (network namespaces)")
    stop_on_signals()
    from innet_aggregation.testbed.netns import Namespaces
    from innet_aggregation.testbed.targets import SwitchProcess

    conditions = ["off", "on"] + (["before"] if args.before else [])
    load = os.getloadavg()[0]
    print(f"{WORKERS} workers, {args.target}, {args.size} float32 a call, {args.calls} timed "
          f"calls a run, {args.rounds} rounds of {', '.join(conditions)}; load average "
          f"{load:.2f} on {os.cpu_count()} cores")
    medians = {c: [] for c in conditions}
    progress = Progress(args.rounds * len(conditions), "bench-observe")
    with tempfile.TemporaryDirectory() as tmp, \
            Namespaces(WORKERS, tag=f"bo{os.getpid() % 100000}") as topo, \
            SwitchProcess(args.target, topo.switch_ports,
                          log_path=Path(tmp) / "switch.log") as switch:
        path = install_job(switch, topo, args.slots, Path(tmp))
        for rnd in range(args.rounds):
            for condition in conditions if rnd % 2 == 0 else conditions[::-1]:
                medians[condition].append(one_run(topo, path, condition, args, rnd))
                progress.advance(f"round {rnd + 1}, {condition}")
    ratios = {c: [x / o for x, o in zip(medians[c], medians["off"])] for c in conditions}
    print(f"\n{'condition':<10} {'ms a call, median (min-max over rounds)':>40} "
          f"{'over off, median of the rounds (min-max)':>42}")
    for c in conditions:
        print(f"{c:<10} {spread([1e3 * m for m in medians[c]], '.2f'):>40} "
              f"{spread(ratios[c], '.3f'):>42}")
    on = statistics.median(ratios["on"])
    print(f"\non / off: {on:.3f} (goal at most {GOAL}: {'met' if on <= GOAL else 'missed'})")
    figures = {c: {"ms": record.spread([1e3 * m for m in medians[c]]),
                   "over_off": record.spread(ratios[c])} for c in conditions}
    record.write("bench-observe", {**figures, "goal": GOAL}, params=vars(args),
                 load_before=load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
