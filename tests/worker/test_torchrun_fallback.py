"""torchrun, three ranks, DDP with no hook on the ``ina`` backend through the job
manager, while the switch's side goes away (``fallback.py``): training completes
every step, the ranks' parameters are identical after every step, the final ones
match the exact-mean reference within test_torchrun's bound, and the calls go
through the switch again once it is back. Gloo runs on the management network, as
in a cluster, so it survives the switch. Each test takes 40-70 s (marked slow).
"""

from __future__ import annotations

import json
import random
import statistics
import time

import pytest
import torch

from innet_aggregation.switch_ctl.client import SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller
from tests.switch_ctl.manager_harness import LEASE, POOL_SLOTS, SWEEP, ManagerBed, until
from tests.worker import torchrun_chaos as script
from tests.worker import torchrun_train
from tests.worker.harness import skip_unless_runnable
from tests.worker.test_torchrun import BOUND, stop, torchrun

pytestmark = pytest.mark.slow
SWITCH_TIMEOUT = "2"


@pytest.fixture
def bed(tmp_path):
    skip_unless_runnable("softswitch")
    bed = ManagerBed(tmp_path).start()
    yield bed
    bed.stop()


def reference(world: int, steps: int = script.STEPS) -> list[torch.Tensor]:
    net = torchrun_train.model()
    optimizer = torch.optim.SGD(net.parameters(), lr=torchrun_train.LR)
    for step in range(steps):
        for rank in range(world):
            x, y = torchrun_train.batch(step, rank)
            (torch.nn.functional.mse_loss(net(x), y) / world).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() for p in net.parameters()]


def steps_done(out, world: int) -> int:
    """The fewest steps any rank has logged."""
    counts = []
    for rank in range(world):
        path = out.parent / f"{out.name}.{rank}.jsonl"
        counts.append(len(path.read_text().splitlines()) if path.exists() else 0)
    return min(counts)


def switch_packets(bed: ManagerBed) -> int:
    """Aggregation packets the (current) switch has counted, read as a backup controller."""
    with SwitchConnection(bed.switch.grpc_addr, 0, (0, 1)) as conn:
        conn.load_p4info()
        return sum(c["packets"] for c in Controller(conn).counters().values())


def train_through(bed: ManagerBed, tmp_path, fault, world: int = 3):
    """torchrun on hosts 0..world-1, ``fault(bed)`` at a random step from 3 to 8;
    returns the ranks' step logs, each step's path ("switch", "gloo") on each rank."""
    out = tmp_path / "chaos"
    processes = torchrun(bed, "chaos", list(range(world)), 29900, out,
                         script="tests/worker/torchrun_chaos.py",
                         extra_env={"INA_SWITCH_TIMEOUT": SWITCH_TIMEOUT})
    try:
        at = random.randint(3, 8)
        until(lambda: steps_done(out, world) >= at or any(p.poll() is not None
                                                          for p, _ in processes),
              60, "the ranks' first steps")
        faulted = time.time()
        fault(bed)
        for node_rank, (process, _) in enumerate(processes):
            code = process.wait(timeout=80)
            text = (tmp_path / f"chaos-{node_rank}.log").read_text()
            assert code == 0, f"node {node_rank}:\n{text[-4000:]}"
    finally:
        stop(processes)
    logs = [[json.loads(line) for line in (tmp_path / f"chaos.{r}.jsonl").read_text().splitlines()]
            for r in range(world)]
    assert all(len(log) == script.STEPS for log in logs), [len(log) for log in logs]
    for step in zip(*logs):
        assert len({s["hash"] for s in step}) == 1, f"the ranks' parameters differ: {step}"
    ranks = [torch.load(tmp_path / f"chaos.{rank}.pt") for rank in range(world)]
    for got, want in zip(ranks[0], reference(world)):
        torch.testing.assert_close(got, want, rtol=0, atol=BOUND)
    paths = [["gloo" if s["gloo"] else "switch" for s in log] for log in logs]
    report(logs[0], paths[0])
    return logs, paths, faulted


def report(log, paths) -> None:
    """The fault's cost, as rank 0 saw it (pytest -s shows it): the first gloo step's
    time against the median step, and how long until a step was through the switch again."""
    if "gloo" not in paths:
        return
    first = paths.index("gloo")
    back = next((i for i in range(first, len(paths)) if paths[i] == "switch"), None)
    median = statistics.median(s["seconds"] for s in log)
    print(f"fault at step {first}: {log[first]['seconds']:.3f} s (median step {median:.4f} s); "
          + (f"through the switch again from step {back}, "
             f"{log[back]['at'] - log[first]['at']:.1f} s later" if back else "gloo to the end"))


def test_a_switch_killed_and_restarted_during_training_costs_no_step(bed, tmp_path):
    def kill_and_restart(bed):
        bed.kill_switch()
        time.sleep(5)
        bed.start_switch()
    _, paths, _ = train_through(bed, tmp_path, kill_and_restart)
    assert all("gloo" in p for p in paths), paths
    # Back on the switch: the last steps' calls went through it, and it counted them.
    assert all(p[-1] == "switch" for p in paths), paths
    assert switch_packets(bed) > 0


def test_a_revoked_lease_goes_to_gloo_and_back(bed, tmp_path):
    """The ranks' way to the manager cut (gloo's, between the hosts, kept) for longer
    than the lease: the manager reclaims the job and takes it off the switch; the
    ranks go on through gloo and join again once they reach the manager."""
    def cut_the_manager_off(bed):
        manager = bed.topology.mgmt_address
        hosts = bed.topology.hosts[:3]
        for host in hosts:
            host.run(["ip", "route", "add", "prohibit", f"{manager}/32"], check=True)
        until(lambda: not bed.installed(), 20, "the manager reclaiming the job")
        time.sleep(1)
        for host in hosts:
            host.run(["ip", "route", "del", "prohibit", f"{manager}/32"], check=True)
    logs, paths, cut = train_through(bed, tmp_path, cut_the_manager_off)
    assert all("gloo" in p for p in paths), paths
    # Within lease + sweep + the switch timeout (and a step's pause) of the cut.
    for log, p in zip(logs, paths):
        assert log[p.index("gloo")]["at"] - cut < LEASE + SWEEP + float(SWITCH_TIMEOUT) + 2, log
    assert all(p[-1] == "switch" for p in paths), paths
    assert "reclaimed" in bed.manager_log() or "stopped renewing" in bed.manager_log()


def test_a_killed_and_restarted_manager_costs_the_data_path_nothing(bed, tmp_path):
    def kill_and_restart(bed):
        bed.kill_manager()
        time.sleep(2)
        bed.start_manager()
    _, paths, _ = train_through(bed, tmp_path, kill_and_restart)
    assert all(p == ["switch"] * script.STEPS for p in paths), paths


def test_a_job_with_no_free_slots_starts_on_gloo_and_moves_to_the_switch(bed, tmp_path):
    """Another job holds the whole pool: the ranks start on gloo at once (not after
    INA_JOIN_TIMEOUT), and move to the switch when it leaves."""
    hold = tmp_path / "hold"
    hog = bed.launch("hog", [3, 4], "--reps", "0", "--hold", str(hold),
                     extra_env={"INA_SLOTS": str(POOL_SLOTS)})
    until(lambda: all(r.event("held") for r in hog), 60, "the other job holding the pool")
    _, paths, _ = train_through(bed, tmp_path, lambda bed: hold.touch())
    assert all(p[0] == "gloo" and p[-1] == "switch" for p in paths), paths


@pytest.mark.parametrize("fault", ["switch", "lease", "slots"])
def test_with_ina_fallback_error_each_fault_raises_on_every_rank_naming_it(bed, tmp_path, fault):
    """INA_FALLBACK=error: the training fails on every rank with SwitchUnavailable,
    within the switch timeout of the fault reaching the data path, naming why."""
    hold = tmp_path / "hold"
    if fault == "slots":
        hog = bed.launch("hog", [3, 4], "--reps", "0", "--hold", str(hold),
                         extra_env={"INA_SLOTS": str(POOL_SLOTS)})
        until(lambda: all(r.event("held") for r in hog), 60, "the other job holding the pool")
    out = tmp_path / "chaos"
    processes = torchrun(bed, "chaos", [0, 1, 2], 29950, out, script="tests/worker/torchrun_chaos.py",
                         extra_env={"INA_SWITCH_TIMEOUT": SWITCH_TIMEOUT, "INA_FALLBACK": "error"})
    try:
        if fault != "slots":
            until(lambda: steps_done(out, 3) >= 3, 60, "the ranks' first steps")
            if fault == "switch":
                bed.kill_switch()
            else:
                for host in bed.topology.hosts[:3]:
                    host.run(["ip", "route", "add", "prohibit", f"{bed.topology.mgmt_address}/32"],
                             check=True)
        codes = [process.wait(timeout=60) for process, _ in processes]
    finally:
        hold.touch()
        for process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    why = {"switch": "switch restarted or unreachable",
           "lease": "the manager unreachable: the lease may be lost",
           "slots": f"not joined within {SWITCH_TIMEOUT} s"}[fault]
    for rank, code in enumerate(codes):
        text = (tmp_path / f"chaos-{rank}.log").read_text()
        assert code != 0, text[-3000:]
        assert f"SwitchUnavailable: rank {rank}" in text and why in text, text[-3000:]
