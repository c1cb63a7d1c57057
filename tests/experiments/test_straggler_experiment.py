"""`make straggler-experiment`, run small: every mode's row in the CSV and the record with
plausible figures, and the straggler's sleeps in its step times (and in the others'
while they wait for it); bad settings refused before anything starts."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from innet_aggregation.experiments import straggler as se
from innet_aggregation.testbed.train import straggler_sleeps
from tests.testbed.test_topology import _skip_reason

REPO = Path(__file__).resolve().parents[2]
STEPS, SLEEP_MS, P, SEED = 8, 300.0, 0.5, 3


def settled(*argv: str):
    return se.settle(se._parser().parse_args(list(argv)))


@pytest.mark.parametrize("argv, message", [
    (("--p", "1.5"), r"--p is a fraction of steps in \[0, 1\]"),
    (("--p", "-0.1"), r"--p is a fraction"),
    (("--sleep-ms", "-1"), "--sleep-ms must not be negative"),
    (("--deadline-ms", "-5"), "--deadline-ms must not be negative"),
    (("--modes", "gloo", "--deadline-ms", "50"), "only the ina\\+deadline runs have a deadline"),
    (("--modes", "ina,ina+deadline", "--deadline-ms", "0"), "needs a deadline"),
    (("--modes", "ina,nccl"), "--modes: choose from"),
    (("--scenarios", "straggler,flood"), "--scenarios: choose from"),
    (("--straggler-rank", "4"), r"--straggler-rank must be 0\.\.3"),
    (("--loss-pct", "101"), "--loss-pct is a percentage"),
    (("--warmup", "2"), "--warmup must be more than 2"),
    (("--accuracy", "0"), "--accuracy is a fraction"),
    (("--seeds", "0"), "--seeds and --hold must be at least 1, not 0 and 3"),
    (("--hold", "0"), "--seeds and --hold must be at least 1, not 3 and 0"),
    (("--workers", "1"), "the testbed runs 2"),
    (("--bw", "5000"), "cannot be shaped"),
])
def test_settings_that_cannot_run_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        settled(*argv)


def test_the_deadline_mode_runs_by_default_and_not_with_deadline_0():
    assert settled().modes == ["ina", "ina+deadline", "gloo"]
    assert settled("--deadline-ms", "0").modes == ["ina", "gloo"]
    assert settled().straggler_rank == 3 and settled().epochs == 8
    assert (settled().seeds, settled().seed, settled().hold) == (3, 0, 3)


def test_a_refusal_is_one_line_before_anything_starts():
    done = subprocess.run([sys.executable, "-m", "innet_aggregation.experiments.straggler",
                           "--p", "2"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("--p is a fraction of steps in [0, 1], not 2.0")


@pytest.mark.slow
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
def test_a_small_run_records_every_mode(tmp_path):
    """2 workers, the small model, a few steps, deadline off, 2 seeds: 40-80 s."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "innet_aggregation.experiments.straggler", "--workers", "2",
         "--model", "small", "--steps", str(STEPS), "--warmup", "4", "--eval-every", "2",
         "--sleep-ms", str(SLEEP_MS), "--p", str(P), "--seed", str(SEED), "--seeds", "2", "--bw", "0",
         "--loss-pct", "20", "--deadline-ms", "0", "--target", "softswitch", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = list(csv.DictReader(open(out / "straggler.csv")))
    kinds = [("reference", "ina"), ("straggler", "ina"), ("straggler", "gloo"), ("loss", "ina"),
             ("loss", "gloo")]
    assert [(int(r["seed"]), r["scenario"], r["mode"]) for r in rows] == [
        (seed, *kind) for seed in (SEED, SEED + 1) for kind in kinds]
    runs = {(r["scenario"], r["mode"]): r for r in rows if int(r["seed"]) == SEED}
    plans = {seed: [i for i, s in enumerate(straggler_sleeps(
        {"rank": 1, "ms": SLEEP_MS, "p": P, "seed": seed}, 1, STEPS)) if s] for seed in (SEED, SEED + 1)}
    slept = plans[SEED]
    assert 0 < len(slept) < STEPS and plans[SEED] != plans[SEED + 1]
    for r in rows:
        assert int(r["slept"]) == (len(plans[int(r["seed"])]) if r["scenario"] == "straggler" else 0)
        # the held check and the last step's time on the same clock
        assert r["time_to_target_s"] == "" or 0 < float(r["time_to_target_s"]) <= float(r["steps_time_s"])
    for (scenario, mode), r in runs.items():
        assert int(r["steps"]) == STEPS
        assert 0 <= float(r["accuracy"]) <= 1
        assert 0 < float(r["step_p50_ms"]) <= float(r["step_p90_ms"]) <= float(r["step_p99_ms"])
        assert int(r["slept"]) == (len(slept) if scenario == "straggler" else 0)
        # deadline off: nothing released, late or carried (blank: a worker without the counters)
        assert r["released_pct"] in ("", "0.0") and r["carried_pct"] in ("", "0.0")
    assert int(runs[("loss", "ina")]["switch_drops"]) > 0       # 20 % of its packets
    assert int(runs[("loss", "gloo")]["switch_drops"]) == 0     # the simulator spares TCP
    assert float(runs[("straggler", "ina")]["step_p99_ms"]) >= SLEEP_MS

    steps = list(csv.DictReader(open(out / "straggler_steps.csv")))
    for mode in ("ina", "gloo"):
        mine = {(int(s["rank"]), int(s["step"])): float(s["step_ms"]) for s in steps
                if (int(s["seed"]), s["scenario"], s["mode"]) == (SEED, "straggler", mode)}
        assert len(mine) == 2 * STEPS
        # the straggler slept in its drawn steps; rank 0 waited for it there
        assert all(mine[(1, i)] >= SLEEP_MS for i in slept), mine
        assert all(mine[(0, i)] >= SLEEP_MS / 2 for i in slept), mine
    reference = [float(s["step_ms"]) for s in steps if s["scenario"] == "reference"]
    assert max(reference) < SLEEP_MS

    record = json.loads((out / "straggler-experiment.json").read_text())
    assert record["experiment"] == "straggler-experiment"
    f = record["figures"]
    assert [(r["seed"], r["scenario"], r["mode"]) for r in f["runs"]] == [
        (int(r["seed"]), r["scenario"], r["mode"]) for r in rows]
    assert f["sleep_ms"] == SLEEP_MS and f["deadline_ms"] == 0 and f["warmup_step_ms"] > 0
    assert f["seeds"] == [SEED, SEED + 1] and f["hold"] == 3
    assert [(c["seed"], c["scenario"], c["mode"]) for c in f["curves"]] == [
        (r["seed"], r["scenario"], r["mode"]) for r in f["runs"]]
    assert all([p[0] for p in c["points"]] == list(range(2, STEPS + 1, 2)) for c in f["curves"])
    for r in f["runs"]:
        curve = next(c["points"] for c in f["curves"]
                     if (c["seed"], c["scenario"], c["mode"]) == (r["seed"], r["scenario"], r["mode"]))
        assert r["steps_time_s"] == curve[-1][1]
    for name in ("straggler_accuracy.png", "straggler_steps.png"):
        assert (out / name).stat().st_size > 10_000
    assert f"{SEED + 1} reference  ina" in done.stdout and "straggler  gloo" in done.stdout
