"""The straggler experiment's figures, from every rank's answers: time to accuracy where
the accuracy holds, the time for the run's steps, and same-run ratios per seed with
their median. Arithmetic only, so that it is tested without a testbed.

A first crossing is noise here: the test set is 360 digits, one digit is 0.28 points,
and a curve near the target touches it and falls back: a ratio of first crossings
once said a deadline saved far more than the same steps' times did (issue 47). So
time to accuracy is read at the first of ``HOLD`` checks in a row at or above the
target, and the time for the run's steps (every mode runs the same steps) stands
beside it."""

from __future__ import annotations

import statistics

import numpy as np

HOLD = 3            # checks in a row at or above the target that count as reaching it
REFERENCE = ("reference", "ina")


def job_curve(answers: list[dict]) -> list[tuple[int, float, float]]:
    """(step, seconds, accuracy) per check: the slowest rank's clock at that step, and
    the accuracy of the model every rank holds (rank 0's score)."""
    first = answers[0]["curve"]
    return [(int(first[i][0]), max(a["curve"][i][1] for a in answers), float(first[i][2]))
            for i in range(len(first))]


def first_crossing(curve: list[tuple[int, float, float]], target: float) -> int | None:
    """The index of the first check at or above ``target``, or None."""
    return next((i for i, (_, _, acc) in enumerate(curve) if acc >= target), None)


def held_crossing(curve: list[tuple[int, float, float]], target: float,
                  hold: int = HOLD) -> int | None:
    """The index of the first check that starts ``hold`` checks in a row at or above
    ``target``, or None (also when the run ends before a touch was held ``hold`` checks)."""
    streak = 0
    for i, (_, _, acc) in enumerate(curve):
        streak = streak + 1 if acc >= target else 0
        if streak == hold:
            return i - hold + 1
    return None


def percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summarize(scenario: str, mode: str, seed: int, answers: list[dict], args,
              deadline_ms: float, sleep_ms: float, drops: int) -> dict:
    """One run's CSV row from every rank's answer (testbed.train with ``curve``)."""
    times = [t for a in answers for t in a["step_times_ms"]]
    results = sum(a["results_received"] for a in answers)
    values = sum(a["steps"] * a["parameters"] for a in answers)
    curve = job_curve(answers)
    held = held_crossing(curve, args.accuracy, args.hold)
    first = first_crossing(curve, args.accuracy)
    if curve[-1][0] != answers[0]["steps"]:
        raise ValueError(f"{scenario}, {mode}: the last check is at step {curve[-1][0]}, "
                         f"not the run's last ({answers[0]['steps']})")

    def share(name: str, of: int) -> float | None:
        if mode == "gloo" or not all(name in a for a in answers):
            return None         # gloo, or a worker without bounded-time aggregation
        return 100 * sum(a[name] for a in answers) / max(of, 1)
    return {"seed": seed, "scenario": scenario, "mode": mode, "workers": len(answers),
            "deadline_ms": deadline_ms if mode == "ina+deadline" else 0.0,
            "sleep_ms": sleep_ms if scenario == "straggler" else 0.0,
            "p": args.p if scenario == "straggler" else 0.0,
            "loss_pct": args.loss_pct if scenario == "loss" else 0.0,
            "steps": answers[0]["steps"], "slept": sum(len(a["slept_steps"]) for a in answers),
            "accuracy": answers[0]["accuracy"],
            "target_steps": None if held is None else curve[held][0],
            "time_to_target_s": None if held is None else curve[held][1],
            "first_crossing_s": None if first is None else curve[first][1],
            "steps_time_s": curve[-1][1],
            "step_p50_ms": percentile(times, 50), "step_p90_ms": percentile(times, 90),
            "step_p99_ms": percentile(times, 99),
            "released_pct": share("released", results), "late_pct": share("late", results),
            "carried_pct": share("carried_values", values),
            "retransmissions": sum(a["retransmissions"] for a in answers), "switch_drops": drops}


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(rows: list[dict]) -> dict:
    """One seed's same-run ratios, where both sides ran and reached: held time to
    accuracy and the time for the same steps with a deadline over without (straggler),
    final accuracy with a deadline minus the reference's, in points, and step p99 with
    loss and a deadline over the reference's."""
    by = {(r["scenario"], r["mode"]): r for r in rows}
    ref = by.get(REFERENCE)
    out = {}
    a, b = by.get(("straggler", "ina+deadline")), by.get(("straggler", "ina"))
    if a and b:
        out["straggler_time_ratio"] = _over(a["time_to_target_s"], b["time_to_target_s"])
        if a["steps"] == b["steps"]:
            out["straggler_steps_ratio"] = _over(a["steps_time_s"], b["steps_time_s"])
    if a and ref:
        out["straggler_accuracy_points"] = 100 * (a["accuracy"] - ref["accuracy"])
    a = by.get(("loss", "ina+deadline"))
    if a and ref:
        out["loss_p99_ratio"] = a["step_p99_ms"] / ref["step_p99_ms"]
    return out


def seed_ratios(rows: list[dict], seeds: list[int]) -> dict:
    """{name: {"per_seed": [one a seed, None where it could not be read], "median"}}:
    the median only where every seed gave the ratio (a run that never held the target
    has no time to it, and a median of the others would hide that)."""
    per_seed = [ratios([r for r in rows if r["seed"] == seed]) for seed in seeds]
    names = [n for n in ("straggler_time_ratio", "straggler_steps_ratio",
                         "straggler_accuracy_points", "loss_p99_ratio")
             if any(n in s for s in per_seed)]
    out = {}
    for name in names:
        values = [s.get(name) for s in per_seed]
        out[name] = {"per_seed": values,
                     "median": None if None in values else statistics.median(values)}
    return out
