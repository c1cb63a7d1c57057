"""The fallback at a deadline's lead (worker/lead.py): the switch fails while the
others are calls ahead of a late rank, and every value is still applied once, on
every rank alike: the late rank takes the calls the others completed through the
switch from them, carries its values of those calls, and from the first call nobody
completed every rank goes through gloo (and, with a manager, back to the switch).

Four ranks of conservation_calls.py, a 40 ms deadline. Before call 2 the switch's
packets to rank 3 are dropped, so that it cannot catch up from its socket, and rank
3 holds; the others release its rounds and run calls 2, 3 and 4, then hold before
call 5. The
switch is killed there and started again; the others' call 5 hears nothing and falls
back; rank 3 goes on once it has heard so through the group's store, three calls
behind. Before the fallback took leads, every rank raised CallMismatch there ("the
ranks did not issue the same calls").
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

from innet_aggregation.p4src import protocol

from .harness import REPO, Fabric
from .test_conservation import DEADLINE_MS, SWITCH_TIMEOUT, WORLD, check_conserved
from .test_fallback import restart_switch

CALLS, ZEROS = 8, 8
SIZE = 64 * protocol.packet_format().values_per_packet     # 4 rounds of 16 slots
LATE, HELD, AHEAD = 3, 2, 5      # rank 3 holds before call 2, the others before call 5
BACK_ZEROS = 300                 # zero calls at most, 0.1 s apart, until back on the switch
MANAGER_SWITCH_TIMEOUT = 4.0     # the four ranks' first join must fit in it (else: gloo)


def wait_for(tmp_path, call: int, ranks, runner) -> None:
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready.{call}.{r}").exists() for r in ranks):
        assert runner.is_alive() and time.monotonic() < deadline, \
            f"ranks {list(ranks)} never got to call {call}"
        time.sleep(0.05)


def check_lead(logs) -> None:
    """The lead was real and taken over: the others completed calls 2-4 through the
    switch, rank 3 took them from a peer; from call 5 on, gloo on every rank."""
    for rank, log in enumerate(logs):
        assert all(c["via"] == "switch" for c in log[:AHEAD]), (rank, log)
        assert [c["taken"] for c in log[HELD:AHEAD]] == [rank == LATE] * (AHEAD - HELD), \
            (rank, log)
        assert log[AHEAD]["via"] == "gloo", (rank, log)


def pauses(rank: int) -> list[str]:
    """Every rank pauses before call 2 (the test cuts rank 3's results then); rank 3
    holds there, the others pause again before call 5."""
    return (["--pause-before", str(HELD), "--hold"] if rank == LATE
            else ["--pause-before", f"{HELD},{AHEAD}"])


def test_a_switch_killed_while_a_rank_trails_by_calls_loses_no_value(fabric: Fabric, tmp_path):
    if fabric.target != "softswitch":
        pytest.skip("run on the native embedded switch only (the fallback is the workers')")
    job = fabric.job(WORLD, num_slots=16, deadline_ms=DEADLINE_MS)
    done = {}
    runner = threading.Thread(target=lambda: done.update(runs=fabric.run(
        job, ["--master", f"{job.hosts[0].ip}:{31400 + job.id}", "--world", str(WORLD),
              "--out", str(tmp_path), "--calls", str(CALLS), "--zeros", str(ZEROS),
              "--size", str(SIZE), "--switch-timeout", str(SWITCH_TIMEOUT)],
        extra={r: pauses(r) for r in range(WORLD)},
        module="tests.worker.conservation_calls", timeout=120)))
    runner.start()
    late_port = [job.hosts[LATE].switch_port]
    try:
        wait_for(tmp_path, HELD, range(WORLD), runner)
        fabric.control.set_loss(late_port, egress=1.0)
        (tmp_path / f"go.{HELD}").touch()
        wait_for(tmp_path, AHEAD, range(LATE), runner)
    finally:
        fabric.switch.process.kill()      # and with it its loss, and the rounds it held
        fabric.switch.process.wait()
    (tmp_path / f"go.{AHEAD}").touch()
    time.sleep(SWITCH_TIMEOUT)            # the others' call 5 hears nothing
    restart_switch(fabric)                # gloo's traffic crosses it (harness.py)
    (tmp_path / f"go.{HELD}.{LATE}").touch()
    runner.join()
    for run in done["runs"]:
        assert run.returncode == 0, f"rank {run.worker}:\n{run.stderr[-3000:]}"
    logs = check_conserved(tmp_path, CALLS + ZEROS, calls=CALLS, size=SIZE)
    check_lead(logs)


@pytest.mark.slow
def test_and_with_a_manager_the_ranks_return_to_the_switch(tmp_path):
    """The same through the job manager, whose testbed has a management network for
    gloo and the store: rank 3's data link is down while it holds (its results lost),
    the switch is killed and started again (the manager installs its program anew),
    and after the fallback the ranks join the job again and their calls go through
    the switch once more, every value still applied once on every rank. About 40 s."""
    from tests.switch_ctl.manager_harness import SECRET, ManagerBed, credential_of, env
    from .harness import skip_unless_runnable

    skip_unless_runnable("softswitch")
    bed = ManagerBed(tmp_path / "bed").start()
    out, processes = tmp_path / "calls", []
    out.mkdir()
    hosts = bed.topology.hosts[:WORLD]
    try:
        for rank, host in enumerate(hosts):
            rank_env = {**env(), "INA_MANAGER": bed.address, "INA_SECRET": SECRET,
                        "INA_CA_CERT": str(bed.tls.ca_cert), "INA_JOB": "lead",
                        "INA_JOB_CREDENTIAL": credential_of("lead"), "INA_JOIN_TIMEOUT": "60",
                        "INA_DEADLINE_MS": str(DEADLINE_MS), "OMP_NUM_THREADS": "1",
                        "GLOO_SOCKET_IFNAME": bed.topology.MGMT_IFNAME}
            with open(out / f"{rank}.err", "w") as err:
                processes.append(host.popen(
                    [sys.executable, "-m", "tests.worker.conservation_calls", "--worker-id",
                     str(rank), "--master", f"{hosts[0].mgmt_ip}:31500", "--world",
                     str(WORLD), "--out", str(out), "--calls", str(CALLS), "--zeros",
                     str(BACK_ZEROS), "--size", str(SIZE), "--switch-timeout",
                     str(MANAGER_SWITCH_TIMEOUT), "--back-on-switch", *pauses(rank)],
                    stdout=err, stderr=err, env=rank_env, cwd=REPO))
        runner = _Running(processes)
        wait_for(out, HELD, range(WORLD), runner)
        late = hosts[LATE]
        late.run(["ip", "link", "set", late.ifname, "down"], check=True)
        try:
            (out / f"go.{HELD}").touch()
            wait_for(out, AHEAD, range(LATE), runner)
        finally:
            bed.kill_switch()
            (out / f"go.{AHEAD}").touch()
            time.sleep(MANAGER_SWITCH_TIMEOUT)      # the others' call 5 hears nothing
            bed.start_switch()
            late.run(["ip", "link", "set", late.ifname, "up"], check=True)
        (out / f"go.{HELD}.{LATE}").touch()
        for rank, process in enumerate(processes):
            code = process.wait(timeout=120)
            assert code == 0, f"rank {rank}:\n{(out / f'{rank}.err').read_text()[-4000:]}"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        bed.stop()
    logs = check_conserved(out, CALLS + BACK_ZEROS, calls=CALLS, size=SIZE)
    check_lead(logs)
    for rank, log in enumerate(logs):        # back on the switch: the last calls
        assert log[-1]["via"] == "switch" and not log[-1]["taken"], (rank, log[-3:])


class _Running:
    """``wait_for``'s view of the ranks' processes: alive while all are."""

    def __init__(self, processes):
        self.processes = processes

    def is_alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)
