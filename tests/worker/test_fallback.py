"""The switch's side goes away during a run of calls (``fallback.py``): every call
still completes, by one path on every rank, with the exact sum.

Three ranks on the ``ina`` backend (job file, no manager), ``INA_SWITCH_TIMEOUT=2``.
Gloo's traffic here crosses the switch too, so a killed switch takes gloo along:
that case runs on the manager's testbed, whose ranks have a management network
(test_torchrun_fallback.py); here a dead switch is tested with INA_FALLBACK=error.
Every call's result is compared on every rank with the float64 sum of all ranks'
inputs: within 2**-20 of the largest sum (the switch's quantization of a sum of
three is ~2**-28 of it, gloo's float32 adds ~2**-23; a stale call's result, a
partial one or one rank's own values are off by the values themselves, ~1), and its
bytes with the other ranks' (no rank mixes paths or takes another call's sums).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.client import SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller

from .harness import Fabric

SWITCH_TIMEOUT = 2.0
SLOTS = 8
ONE_WINDOW = SLOTS * protocol.packet_format().values_per_packet   # one round: a partial result
RELATIVE = 2.0**-20


def run_with_fault(fabric: Fabric, tmp_path, port: int, fault, *, mode: str = "gloo",
                   size: int = 20000, device: str = "cpu"):
    """The ranks' call logs (fallback_calls.py), ``fault(job)`` (which may return
    what undoes it) done between the warm-up and the rest: the job, the logs, the runs."""
    job = fabric.job(3, num_slots=SLOTS)
    master = f"{job.hosts[0].ip}:{port + job.id}"
    done = {}
    runner = threading.Thread(target=lambda: done.update(runs=fabric.run(
        job, ["--master", master, "--world", "3", "--out", str(tmp_path), "--fallback", mode,
              "--switch-timeout", str(SWITCH_TIMEOUT), "--size", str(size), "--device", device],
        module="tests.worker.fallback_calls", timeout=80)))
    runner.start()
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready.{r}").exists() for r in range(3)):
        assert runner.is_alive() and time.monotonic() < deadline, "the ranks never got ready"
        time.sleep(0.05)
    undo = fault(job)
    (tmp_path / "go").touch()
    runner.join()
    if undo is not None:
        undo()
    for run in done["runs"]:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
    logs = [[json.loads(line) for line in (tmp_path / f"{r}.jsonl").read_text().splitlines()]
            for r in range(3)]
    return job, logs, done["runs"]


def check_exact_and_agreed(logs) -> None:
    """Every call on every rank: the same bytes, the float64 sum within the bound."""
    calls = len(logs[0])
    assert all(len(log) == calls for log in logs), [len(log) for log in logs]
    for per_rank in zip(*logs):
        assert all(c["error"] is None for c in per_rank), per_rank
        assert len({c["hash"] for c in per_rank}) == 1, per_rank
        for c in per_rank:
            assert c["deviation"] <= RELATIVE * c["scale"], c


def drop_results_to(fabric: Fabric, rank: int):
    """The switch's loss simulator drops everything it sends out of rank's port."""
    def fault(job):
        port = [job.hosts[rank].switch_port]
        fabric.control.set_loss(port, egress=1.0)
        return lambda: fabric.control.set_loss(port, egress=0.0)
    return fault


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is "
    "false, so the fallback's CUDA path (gloo on CUDA tensors) is untested here"))])
def test_a_partial_result_is_agreed_on_every_rank_and_the_rest_goes_to_gloo(fabric, tmp_path,
                                                                             device):
    """Rank 2's results dropped: ranks 0 and 1 complete the call, rank 2 does not;
    all agree (rank 2 takes the call's switch result from rank 0), the next call is
    redone through gloo from its original input, and the rest go through gloo."""
    _, logs, runs = run_with_fault(fabric, tmp_path, 30700 if device == "cpu" else 30750,
                                   drop_results_to(fabric, 2), size=ONE_WINDOW, device=device)
    assert all(c["device"].startswith(device) for log in logs for c in log), logs[0][:1]
    check_exact_and_agreed(logs)
    warmup = 5
    for log in logs:
        assert all(c["via"] == "switch" for c in log[:warmup + 1]), log
        assert log[-1]["via"] == "gloo"
    # The faulted call: the switch's result on every rank, rank 2's from a peer.
    assert [log[-1]["taken"] for log in logs] == [0, 0, 1]
    assert all("through gloo: " in run.stderr for run in runs)


def kill_switch(fabric: Fabric):
    def fault(job):
        fabric.switch.process.kill()
        fabric.switch.process.wait()
    return fault


def restart_switch(fabric: Fabric) -> None:
    """A fresh switch with the program and the fabric's jobs, for the tests after."""
    fabric.restart_switch()
    fabric.control = Controller(SwitchConnection(fabric.switch.grpc_addr).connect())
    fabric.control.push()
    for job in fabric.jobs:
        fabric.control.apply(fabric._config(job))


@pytest.mark.parametrize("fault", ["partial", "killed"])
def test_with_ina_fallback_error_every_rank_raises_within_the_bound_naming_why(
        fabric, tmp_path, fault):
    """INA_FALLBACK=error: the faulted call raises SwitchUnavailable on every rank
    within the switch timeout (plus a retransmission timer's period), naming why."""
    inject = drop_results_to(fabric, 2) if fault == "partial" else kill_switch(fabric)
    try:
        _, logs, _ = run_with_fault(fabric, tmp_path, 30900 + 50 * (fault == "killed"),
                                    inject, mode="error", size=ONE_WINDOW)
    finally:
        if fault == "killed":
            restart_switch(fabric)
    for rank, log in enumerate(logs):
        last = log[-1]
        assert last["error"] is not None, log
        assert last["error"].startswith(f"SwitchUnavailable: rank {rank}, call "), last
        assert f"within INA_SWITCH_TIMEOUT={SWITCH_TIMEOUT:g} s: " in last["error"], last
        assert last["seconds"] < SWITCH_TIMEOUT + 2.5, last
        # Rank 2 hears nothing; the others hear the switch wait for rank 2 (slow is
        # not dead) until rank 2 says it left the switch path (through the group's
        # store, whose host, rank 0, may have exited on its error before rank 1 looked).
        whys = (("switch restarted or unreachable",) if fault == "killed" or rank == 2
                else ("rank 2 left the switch path", "the group's store is unreachable"))
        assert any(why in last["error"] for why in whys), last


def test_the_policy_is_checked_at_the_boundary():
    from innet_aggregation.worker.fallback import DEFAULT_SWITCH_TIMEOUT, FallbackPolicy
    assert FallbackPolicy.from_env({}) == FallbackPolicy("gloo", DEFAULT_SWITCH_TIMEOUT)
    assert FallbackPolicy.from_env({"INA_FALLBACK": "error", "INA_SWITCH_TIMEOUT": "3.5"}) \
        == FallbackPolicy("error", 3.5)
    with pytest.raises(ValueError, match="INA_FALLBACK must be one of gloo, error, not 'nccl'"):
        FallbackPolicy.from_env({"INA_FALLBACK": "nccl"})
    for bad in ("soon", "0", "-1"):
        with pytest.raises(ValueError, match="INA_SWITCH_TIMEOUT must be a"):
            FallbackPolicy.from_env({"INA_SWITCH_TIMEOUT": bad})
