"""The records the benchmarks and experiments write: what the docs' figures come from."""

from __future__ import annotations

import json

import render_results  # tools/, on pytest's pythonpath (pyproject.toml)

from innet_aggregation.testbed import baseline_experiment, loss_experiment, record


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


def test_the_sweep_records_the_rows_the_docs_render(tmp_path):
    rows = [{"topo": "star", "workers": 4, "values": 1024, "mtu": 4138, "size": 262144, "bytes": 1 << 20,
             "bw_mbit": 100, "backend": b, "rep": r, "time_s": t, "cpu_worker_s": 0.01,
             "cpu_switch_s": 0.02, "first_tx": 3000, "retransmissions": 0}
            for b, times in (("switch", (0.082, 0.084, 0.081)), ("gloo", (0.123, 0.124, 0.126)))
            for r, t in enumerate(times)]
    lines = baseline_experiment.table(rows)
    path = record.write("bench-allreduce", {"rows": lines, "tree": []}, out=tmp_path)
    (line,) = json.loads(path.read_text())["figures"]["rows"]
    assert line["t_switch_ms"]["median"] == 82.0 and round(line["ratio"], 3) == round(82 / 124, 3)
    assert set(line) >= {"limit_headers", "bound", "first_tx_share", "cpu_worker_ms_per_mb"}
    rendered = render_results.bench_allreduce(json.loads(path.read_text()))["bench_allreduce.md"]
    assert "| 4 | 1024 | 100 | 82.0 (81.0-84.0) | 124.0 (123.0-126.0) | **0.66** |" in rendered
    assert "source" not in rendered and "measured" in rendered


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
