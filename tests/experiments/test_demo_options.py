"""The demo's models and options: the quick default stays as it was, the large model
is one where communication matters, and settings that cannot run are refused."""

from __future__ import annotations

import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.experiments import demo
from innet_aggregation.testbed.model import mlp


def options(*argv: str):
    return demo.settle(demo._parser().parse_args(list(argv)))


def parameters(model: str) -> int:
    return sum(p.numel() for p in mlp(list(demo.MODELS[model].hidden)).parameters())


def test_default_is_the_quick_small_model():
    args = options()
    assert (args.model, args.epochs, args.lr, args.bw, args.accuracy) == \
        ("small", 5, 0.01, 20.0, None)
    assert parameters("small") == 2410


def test_large_model_has_a_million_parameters_and_an_accuracy_to_reach():
    args = options("--model", "large")
    assert parameters("large") >= 1_000_000
    assert demo.MODELS["large"].name() == "64-1024-1024-10 MLP"
    assert args.accuracy == 0.95 and args.bw == 100.0 and args.epochs == 8


def test_options_given_override_the_models_own():
    args = options("--model", "large", "--bw", "200", "--epochs", "3", "--accuracy", "0.9")
    assert (args.bw, args.epochs, args.accuracy, args.lr) == (200.0, 3, 0.9, 0.001)


@pytest.mark.parametrize("argv, message", [
    (("--accuracy", "1.5"), "--accuracy is a fraction"),
    (("--accuracy", "0"), "--accuracy is a fraction"),
    (("--eval-every", "0"), "at least 1"),
    (("--epochs", "0"), "at least 1"),
    (("--bw", "-5"), "--bw not negative"),
    (("--lr", "0"), "--lr must be positive"),
    (("--deadline-ms", "-1"), "--deadline-ms must not be negative"),
    (("--deadline-ms", "50", "--chaos"), "--deadline-ms with --chaos"),
    (("--busy", "-1"), "--busy must not be negative"),
])
def test_settings_that_cannot_run_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        options(*argv)


@pytest.mark.parametrize("ina", [False, True])
def test_the_report_prints_every_line_it_promises(ina, capsys):
    """The report's own arithmetic and wording, on answers of the shape train.py sends."""
    answer = {"accuracy": 0.9, "step_time_ms": 4.0, "allreduce_ms": 3.0, "cpu_ms_per_step": 2.0,
              "tx_bytes": 1000, "retransmissions": 0, "tcp_retrans": 0, "parameters": 2410,
              "steps": 22, "aggregation_packets": 720, "redone": 24}
    results = {"switch": [answer, answer], "gloo": [dict(answer, step_time_ms=5.0)] * 2}
    args = options(*(["--ina"] if ina else []))
    demo.report(results, {"switch": {}}, args, "softswitch", protocol.packet_format(1024))
    out = capsys.readouterr().out
    assert "switch / gloo step time: 0.80" in out
    assert "each 1024-value block once (4152 B frames)" in out   # 4 KiB of values, headers
    assert ("switch (ina)" in out) == ina
    assert "after the first" not in out     # answers from before the warm-up was counted


def test_the_report_counts_redone_blocks_after_the_warm_up_apart(capsys):
    # 24 of 720 redone in all, 18 of the first 60 in the warm-up: 6 of 660 after it
    answer = {"accuracy": 0.9, "step_time_ms": 4.0, "allreduce_ms": 3.0, "cpu_ms_per_step": 2.0,
              "tx_bytes": 1000, "retransmissions": 0, "tcp_retrans": 0, "parameters": 2410,
              "steps": 22, "aggregation_packets": 720, "redone": 24, "warmup_steps": 2,
              "warmup_redone": 18, "warmup_packets": 60}
    results = {"switch": [answer, answer], "gloo": [dict(answer, step_time_ms=5.0)] * 2}
    demo.report(results, {"switch": {}}, options(), "softswitch", protocol.packet_format(1024))
    out = capsys.readouterr().out
    assert "48 of them (3.3%)" in out
    assert "after the first 2 steps, whose calls are new to the session, 0.91%." in out


def test_a_negative_deadline_is_refused():
    from innet_aggregation.testbed.layout import check_deadline
    with pytest.raises(ValueError, match=r"--deadline-ms must not be negative, not -5"):
        check_deadline(-5)
    check_deadline(0)
    check_deadline(50)


def test_the_deadline_line_says_what_was_released():
    answer = {"results_received": 1000, "steps": 10, "parameters": 2000, "released": 30,
              "late": 10, "carried_values": 4000}
    line = demo.deadline_line([answer, dict(answer, released=10)], 40.0)
    assert ("deadline 40 ms: 40 results released early (2.00% of the workers' results), 20 "
            "blocks late (1.00%), 8000 gradient values carried into the next step (20.00%).") in line
    assert "count no releases" in demo.deadline_line([{"results_received": 5}], 40.0)


def test_busy_processes_spin_beside_the_block_and_are_gone_after_it():
    import os
    import time

    from innet_aggregation.testbed.busy import busy
    with busy(2) as pids:
        assert len(pids) == 2
        time.sleep(0.5)
        for pid in pids:      # each has used CPU: state R, and utime advancing
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            assert int(fields[11]) > 0, fields        # utime, in clock ticks
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), pid


@pytest.mark.parametrize("argv, name", [
    ((), "demo-small"), (("--busy", "1"), "demo-small-busy1"),
    (("--bw", "0"), "demo-small-unshaped"), (("--bw", "20"), "demo-small"),
    (("--model", "large", "--bw", "0", "--busy", "2"), "demo-large-unshaped-busy2"),
    (("--model", "large", "--bw", "200"), "demo-large-200mbit"),
])
def test_a_run_in_other_settings_keeps_its_own_record(argv, name):
    assert demo.record_name(options(*argv)) == name


@pytest.mark.parametrize("argv, message", [
    (("--runs", "0"), "--runs must be at least 1"),
    (("--runs", "2", "--chaos"), "--runs with --chaos"),
])
def test_runs_that_cannot_be_made_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        options(*argv)


def test_cpu_per_mb_is_per_byte_of_float32_gradient():
    # 2 ms a step for 250,000 parameters (1 MB of float32): 2 ms per MB; mean of workers
    answers = [{"cpu_ms_per_step": 2.0, "parameters": 250_000},
               {"cpu_ms_per_step": 4.0, "parameters": 250_000}]
    assert demo.cpu_ms_per_mb(answers) == pytest.approx(3.0)
