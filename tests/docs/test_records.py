"""The records the benchmarks and experiments write: what the docs' figures come from."""

from __future__ import annotations

import json

import render_results  # tools/, on pytest's pythonpath (pyproject.toml)

from innet_aggregation.experiments import baseline as baseline_experiment
from innet_aggregation.experiments import loss as loss_experiment
from innet_aggregation.experiments import record
from innet_aggregation.experiments import scaling as scaling_experiment
from innet_aggregation.experiments import straggler as straggler_experiment


def test_a_record_names_its_commit_date_machine_and_load(tmp_path):
    path = record.write("x", {"t": record.spread([3.0, 1.0, 2.0], 1000)}, params={"out": tmp_path},
                        load_before=0.5, out=tmp_path)
    r = json.loads(path.read_text())
    assert r["figures"]["t"] == {"median": 2000.0, "min": 1000.0, "max": 3000.0}
    assert r["commit"] != "unknown" and r["date"] and r["machine"]["cpus"] >= 1
    assert r["load"][0] == 0.5 and r["source"] == "measured" and r["params"]["out"] == str(tmp_path)


def _loss_row(size, loss, rep, time_s, dropped):
    return {"workers": 3, "values": 1024, "size": size, "direction": "none" if not loss else "both",
            "loss_pct": loss, "rep": rep, "time_s": time_s, "retransmissions": 2 * dropped,
            "exact": True, "identical": True, "dropped_ingress": dropped, "dropped_egress": 0,
            "resent_by_switch": 0, "duplicates_dropped": 0}


def test_the_loss_experiment_records_each_point_as_it_prints_it():
    rows = [_loss_row(1024, 0, r, t, 0) for r, t in enumerate((0.010, 0.012, 0.011))]
    rows += [_loss_row(1024, 1, r, t, 1) for r, t in enumerate((0.022, 0.033, 0.011))]
    points = {p["loss_pct"]: p for p in loss_experiment.figures(rows)}
    assert points[0]["time_ms"] == {"median": 11.0, "min": 10.0, "max": 12.0}
    assert points[1]["slowdown"] == 2.0 and points[1]["needed"] == 3 and points[1]["retransmissions"] == 2
    assert points[1]["exact"] == points[1]["calls"] == 3


def _sweep_row(backend, rep, time_s, tx_bytes, workers=4):
    """A row as baseline_experiment.measure and run() make it (CSV_FIELDS): 1024
    values, 1 MiB on 100 Mbit/s links that delivered 100 Mbit/s."""
    row = {"topo": "star", "workers": workers, "values": 1024, "mtu": 4138, "size": 262144,
           "bytes": 1 << 20, "bw_mbit": 100, "data": "recorded", "backend": backend, "rep": rep,
           "time_s": time_s, "cpu_worker_s": 0.01, "cpu_switch_s": 0.02,
           "first_tx": 256 if backend == "switch" else 390, "retransmissions": 0,
           "redone": 3 if backend == "switch" else 0, "tx_bytes": tx_bytes, "capacity_mbit": 100.0}
    assert set(row) == set(baseline_experiment.CSV_FIELDS)
    return row


def test_the_sweep_records_the_points_the_docs_render(tmp_path):
    # 15 calls a path (the least judged): 80-84 ms through the switch, 122-126 through
    # the ring; 256 frames of 4,152 B against the ring's 1,598,400 B on the wire.
    rows = [_sweep_row(b, r, t / 1000, wire)
            for b, base, wire in (("switch", 80, 1_062_912), ("gloo", 122, 1_598_400))
            for r, t in enumerate(base + i for i in range(5) for _ in range(3))]
    lines = baseline_experiment.table(rows)
    path = record.write("bench-allreduce", {"warmup_calls": baseline_experiment.WARMUP,
                                            "goal": baseline_experiment.GOAL, "points": lines,
                                            "tree": None}, out=tmp_path)
    r = json.loads(path.read_text())
    (point,) = r["figures"]["points"]
    assert point["switch"]["time_ms"]["median"] == 82.0 and point["gloo"]["time_ms"]["median"] == 124.0
    assert round(point["ratio"]["median"], 6) == round(82 / 124, 6) and round(point["limit"], 4) == round(1_062_912 / 1_598_400, 4)
    # 256 first transmissions in 82 ms pass the link's 3,011 frames/s: the bucket, flagged
    assert (point["goal"], point["bound"]) == ("met", "burst")
    md = render_results.bench_allreduce(r)
    rendered = md["bench_allreduce.md"]
    assert ("| 4 | 1024 | 100 (100) | 1 MiB | 82.0 (81.0-83.0) | 124.0 (123.0-125.0) | "
            "**0.66 (0.65-0.67)** | 0.66 (0.67) | 0.99 (0.97-1.01) | met | burst (104%) | "
            "104%, 103% | 3.0 / 256 | 0 | 10, 19 (10, 19) |") in rendered
    assert "15 timed calls a point after 2 warm-up calls, recorded data" in rendered
    assert "- n = 4, 1024 values per packet, 1 MiB: within 10 % of the limit at every rate up to 100 Mbit/s\n" in rendered
    assert "source" not in rendered and "measured" in rendered
    text = md["switch_vs_ring.md"]
    assert "took 0.66 for n = 4 (limit 0.66) of gloo's ring allreduce time at shaped link rates of 100 Mbit/s" in text
    assert "at every rate up to 100 Mbit/s for every n (first transmissions above" in text


def test_the_scaling_record_renders_ms_per_mib_against_both_limits(tmp_path):
    rows = [_sweep_row(b, r, t / 1000, wire, workers=n)
            for n, gloo_ms, gloo_wire in ((2, 130, 1_065_000), (8, 230, 1_865_000))
            for b, base, wire in (("switch", 86, 1_062_912), ("gloo", gloo_ms, gloo_wire))
            for r, t in enumerate(base + i for i in range(5) for _ in range(3))]
    lines = scaling_experiment.table(rows, 1024, 100)
    path = record.write("bench-scaling", {"warmup_calls": baseline_experiment.WARMUP,
                                          "points": lines},
                        params={"bw": 100.0, "values": 1024, "target": "softswitch",
                                "data": "recorded"}, out=tmp_path)
    rendered = render_results.bench_scaling(json.loads(path.read_text()))["bench_scaling.md"]
    # 1,062,912 B at 100 Mbit/s: 85.0 ms; nominally 1 MiB in frames of 4,152 B for 4,096 of values
    assert "| 2 | 100 | 88.0 (87.0-89.0) | 85.0 | 85.0 | 97% | 132.0 (131.0-133.0) | 85.2 |" in rendered
    assert "| 8 | 100 | 88.0 (87.0-89.0) | 85.0 | 85.0 | 97% | 232.0 (231.0-233.0) | 149.2 |" in rendered
    assert render_results.bench_scaling(None)["bench_scaling.md"].startswith("*Not measured yet")


def test_the_p4c_samples_record_counts_against_what_bmv2_passes():
    import stf_samples

    def result(sample, target, outcome, fallback=""):
        return stf_samples.Result(sample, target, outcome, "", "", fallback, False, 0.1)

    results = [result("a", "bmv2", "pass"), result("a", "softswitch", "pass", "wide field"),
               result("b", "bmv2", "pass"), result("b", "softswitch", "fail"),
               result("c", "bmv2", "fail"), result("c", "softswitch", "pass")]
    f = stf_samples.figures(results, ["bmv2", "softswitch"])
    assert f["samples"] == 3 and f["bmv2_passes"] == 2
    sw = f["targets"]["softswitch"]
    assert sw["outcomes"] == {"pass": 2, "fail": 1}
    assert (sw["pass_where_bmv2_passes"], sw["python_fallback"], sw["wrong_where_bmv2_passes"]) == (1, 1, 1)
    assert "| softswitch | 2 | 1 |" in render_results.p4c_samples(
        {"experiment": "p4c-samples", "commit": "abcdef0", "date": "d", "machine": {"cpus": 2},
         "load": None, "source": "measured", "figures": f})["p4c_samples.md"]


def _bench_switch():
    """benchmarks/bench_switch.py, a script (its folder is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_switch", render_results.REPO / "benchmarks"
                                                  / "bench_switch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_switch_benchmark_records_the_ratios_it_prints(tmp_path):
    from types import SimpleNamespace

    def bench(k, target, rates, cpu_us):
        return SimpleNamespace(k=k, target=target, rates=rates, cpu_us=cpu_us,
                               gbits=lambda rate, k=k: rate * k * 32 / 1e9)
    benches = [bench(64, "ceiling", [400.0, 200.0, 300.0], [2.0, 4.0, 3.0]),
               bench(64, "softswitch", [200.0, 200.0, 150.0], [3.0, 4.0, 6.0]),
               bench(64, "bmv2", [2.0, 1.0, 3.0], [50.0, 60.0, 70.0]),
               bench(256, "softswitch", [100.0, 150.0, 150.0], [4.0, 4.0, 4.0])]
    path = record.write("bench-switch", _bench_switch().figures(benches), out=tmp_path)
    rows = {(x["values"], x["target"]): x for x in json.loads(path.read_text())["figures"]}
    native = rows[64, "softswitch"]
    assert native["of_ceiling"] == {"median": 0.5, "min": 0.5, "max": 1.0}
    assert native["cpu_of_ceiling"] == {"median": 1.5, "min": 1.0, "max": 2.0}
    assert rows[64, "bmv2"]["native_over"] == {"median": 100.0, "min": 50.0, "max": 200.0}
    assert rows[256, "softswitch"]["gbits_over_smallest"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert native["native_over"] is None and rows[64, "ceiling"]["of_ceiling"] is None
    md = render_results.bench_switch(json.loads(path.read_text()))["bench_switch.md"]
    assert "| 64 | bmv2 | 2 (1-3) | 0.00 (0.00-0.00) | 0.01 (0.01-0.01) | 100 (50-200) | 60.00 (50.00-70.00) | - | - |" in md
    assert "| 64 | softswitch | 200 (150-200) | 0.00 (0.00-0.00) | 0.50 (0.50-1.00) | - | 4.00 (3.00-6.00) | 1.50 (1.00-2.00) | - |" in md
    assert "| 256 | softswitch | 150 (100-150) | 0.00 (0.00-0.00) | - | - | 4.00 (4.00-4.00) | - | 3.00 (2.00-4.00) |" in md


def test_the_tofino_figures_are_the_build_summarys(tmp_path, monkeypatch):
    """The stage table and the totals the Tofino page shows come from bf-p4c's summary
    as committed (tools/tofino_resources.py wrote it), and follow it when it changes."""
    text = render_results.TOFINO.read_text()
    md = render_results.tofino_stages(text)["tofino_stages.md"]
    assert ("| 2 | bitmap, round age, round released | the checks and the bitmap: one table, "
            "`check_and_mark`; the round's age and release, behind the same checks |") in md
    assert "| 3 | count, 3 pairs |" in md and "| 11 | exponent, fingerprint sum, 1 pair |" in md
    summary = tmp_path / "aggregation.resources.txt"
    summary.write_text(text.replace("stateful ALUs: 38 of 48", "stateful ALUs: 37 of 48")
                       .replace("   3: 4 (contribution_counter.counts, ", "   3: 4 (bitmap_checker.bitmaps, "))
    monkeypatch.setattr(render_results, "TOFINO", summary)
    assert render_results.inline_figures()["tofino-alus"] == "37 of 48"
    assert "| 3 | bitmap, 3 pairs |" in render_results.render()["tofino_stages.md"]
    assert render_results.main(["--check"]) == 1


def _straggler_answer(rank, steps_ms, checks_s, accuracies, slept=(), **counters):
    """One rank's answer as testbed.train sends it with ``curve`` (1,000 parameters), a
    check every 2 steps."""
    return {"accuracy": accuracies[-1], "steps": len(steps_ms), "target_steps": None,
            "time_to_target_s": None, "step_times_ms": steps_ms, "slept_steps": list(slept),
            "curve": [[2 * (i + 1), t, a] for i, (t, a) in enumerate(zip(checks_s, accuracies))],
            "results_received": 100, "retransmissions": 1, "parameters": 1000, **counters}


def test_the_straggler_experiment_records_each_run_as_it_prints_it(tmp_path):
    args = straggler_experiment.settle(straggler_experiment._parser().parse_args(
        ["--workers", "2", "--sleep-ms", "500", "--deadline-ms", "50", "--seeds", "2",
         "--seed", "4"]))
    held = [0.5, 0.96, 0.97, 0.96, 0.96]
    touched = [0.96, 0.5, 0.96, 0.97, 0.96]              # a touch at the first check, lost
    steps_ms = [10.0] * 10
    runs = [("reference", "ina", [steps_ms] * 2, ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]), held, {}),
            ("straggler", "ina", [steps_ms[:1] + [510.0] + steps_ms[2:]] * 2,
             ([1, 2, 3, 4, 8], [1, 2, 3, 4, 8]), touched, {}),
            ("straggler", "ina+deadline", [[10.0, 60.0] + steps_ms[2:],
                                           [10.0, 510.0] + steps_ms[2:]],
             ([1, 2, 3, 4, 5], [1.5, 2.5, 3.5, 4.5, 6]), held,
             {"released": 5, "late": 5, "carried_values": 800})]
    rows = []
    for seed in (4, 5):
        for scenario, mode, times, clocks, accuracies, counters in runs:
            answers = [_straggler_answer(rank, times[rank], clocks[rank], accuracies,
                                         slept=[1] if scenario == "straggler" and rank == 1 else [],
                                         **counters) for rank in range(2)]
            rows.append(straggler_experiment.summarize(scenario, mode, seed, answers, args, 50.0,
                                                    500.0, 0))
            rows[-1].update(load_before=2.5, load_after=3.25)
    dl, no = rows[2], rows[1]
    # held from the second check on the slowest rank's clock; the whole run's 10 steps
    assert (dl["time_to_target_s"], dl["first_crossing_s"], dl["steps_time_s"]) == (2.5, 2.5, 6)
    assert (no["time_to_target_s"], no["first_crossing_s"], no["steps_time_s"]) == (3, 1, 8)
    assert dl["slept"] == 1 and dl["seed"] == 4 and rows[5]["seed"] == 5
    # 10 of 200 results released and late; 1,600 of 20,000 gradient values carried
    assert (dl["released_pct"], dl["late_pct"], dl["carried_pct"]) == (5.0, 5.0, 8.0)
    assert rows[1]["released_pct"] is None and rows[1]["deadline_ms"] == 0.0
    assert dl["step_p50_ms"] == 10.0 and rows[1]["step_p99_ms"] > 500
    ratios = straggler_experiment.seed_ratios(rows, [4, 5])
    assert ratios["straggler_time_ratio"] == {"per_seed": [2.5 / 3, 2.5 / 3], "median": 2.5 / 3}
    assert ratios["straggler_steps_ratio"]["median"] == 0.75
    assert ratios["straggler_accuracy_points"]["median"] == 0.0
    path = record.write("straggler-experiment",
                        {"warmup_step_ms": 100.0, "sleep_ms": 500.0, "deadline_ms": 50.0,
                         "straggler_rank": 1, "values_per_packet": 1024, "seeds": [4, 5],
                         "hold": 3, "runs": rows, "ratios": ratios}, params=vars(args),
                        out=tmp_path)
    md = render_results.straggler(json.loads(path.read_text()))["straggler.md"]
    assert ("| 5 | straggler | ina+deadline | 10 | 1 | 2.5 | 2.5 | 6.0 | 0.960 | 10 | 15 | 424 | "
            "5.00 % | 5.00 % | 8.00 % | 0 | 2.5-3.2 |") in md
    assert "| ratio | seed 4 | seed 5 | median of 2 |" in md
    assert "| time to 95% held, with the deadline over without | 0.83 | 0.83 | 0.83 |" in md
    assert "| time for the same 10 steps, with the deadline over without | 0.75 | 0.75 | 0.75 |" in md
    assert ("rank 1 sleeps 500 ms in 20% of its steps; 1 % loss on its port; 50 ms deadline; "
            "seeds 4, 5; time to 95% held: the first of 3 checks in a row") in md
    # the order a reader compares: per seed, the reference, then each scenario's modes
    assert md.index("| 4 | straggler | ina+deadline") < md.index("| 5 | reference")
    assert render_results.straggler(None)["straggler.md"].startswith("*Not measured yet")
