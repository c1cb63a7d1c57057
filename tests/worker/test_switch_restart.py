"""A switch that dies during training: the workers end with a clear error within
``peer_timeout`` (no hang), and after a restart and ``switch_ctl apply --push`` new
sessions aggregate exactly again."""

from __future__ import annotations

import threading

from tests.worker.test_end_to_end import check_run
from tests.worker.test_reset import switch_ctl


def test_a_killed_switch_fails_calls_clearly_and_a_restarted_one_aggregates_exactly(
        fabric, tmp_path):
    job = fabric.job(3, num_slots=8)
    consumed = fabric.counters(job)["ingress.consumed"]
    stop = threading.Event()

    def kill_in_training():
        """Once the switch has taken a thousand contributions (past the session start's
        48 and the first calls'), not after a time that a busy machine may spend
        starting the workers' interpreters."""
        while not stop.wait(0.05):
            if fabric.counters(job)["ingress.consumed"] - consumed >= 1000:
                fabric.switch.process.kill()
                return

    killer = threading.Thread(target=kill_in_training, daemon=True)
    killer.start()
    try:
        runs = fabric.run(job, ["--size", "20000", "--reps", "100000", "--peer-timeout", "3",
                                "--max-rto", "0.5"], timeout=60)
    finally:
        stop.set()
        killer.join()
    # fabric.run's 60 s limit is the hang guard; the workers gave up on their own.
    for run in runs:
        assert run.returncode == 1, run.stderr[-2000:]
        assert run.error.startswith("AggregationTimeout: job "), run.error
        assert 1 < len(run.reports) < 100000        # calls went through, then one failed
    fabric.restart_switch()
    # The documented recovery: the controller pushes the program and the job again.
    applied = switch_ctl("apply", "--push", str(job.path))
    assert applied.returncode == 0, applied.stderr
    fabric.reconnect()
    runs = fabric.run(job, ["--size", "3000", "--reps", "3", "--seed", "9",
                            "--save", str(tmp_path)])
    check_run(runs, job, tmp_path, size=3000, seed=9, reps=3)
    fabric.remove(job)
