"""Slow is not dead, through the job manager (worker/fallback.py, issue 47): three
torchrun ranks of DDP on the ``ina`` backend with the default INA_SWITCH_TIMEOUT;
rank 1 sleeps 60 s before one step, as a checkpoint would. The switch's WAITING
replies say the switch is there, waiting for rank 1: the job stays on the switch (no
call through gloo on any rank, no second registration), and every step is exact.
About 90 s (marked slow).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.switch_ctl.manager_harness import ManagerBed
from tests.worker.harness import skip_unless_runnable
from tests.worker.test_torchrun import BOUND, stop, torchrun
from tests.worker.test_torchrun_fallback import reference

pytestmark = pytest.mark.slow
STEPS, SLEEPER, AT, PAUSE = 6, 1, 3, 60


@pytest.fixture
def bed(tmp_path):
    skip_unless_runnable("softswitch")
    bed = ManagerBed(tmp_path).start()
    yield bed
    bed.stop()


def test_a_rank_paused_a_minute_keeps_its_job_on_the_switch(bed, tmp_path, monkeypatch):
    monkeypatch.delenv("INA_SWITCH_TIMEOUT", raising=False)     # the default: 10 s
    out = tmp_path / "pause"
    processes = torchrun(bed, "pause", [0, 1, 2], 29960, out,
                         script="tests/worker/torchrun_chaos.py",
                         extra_env={"CHAOS_STEPS": str(STEPS),
                                    "CHAOS_SLEEP": f"{SLEEPER}:{AT}:{PAUSE}"})
    try:
        for node_rank, (process, _) in enumerate(processes):
            code = process.wait(timeout=PAUSE + 120)
            text = (tmp_path / f"pause-{node_rank}.log").read_text()
            assert code == 0, f"node {node_rank}:\n{text[-4000:]}"
            assert "through gloo" not in text, text[-4000:]
    finally:
        stop(processes)
    logs = [[json.loads(line) for line in (tmp_path / f"pause.{r}.jsonl").read_text().splitlines()]
            for r in range(3)]
    assert all(len(log) == STEPS for log in logs), [len(log) for log in logs]
    # Every step's calls went through the switch, on every rank, the paused one included.
    assert all(s["gloo"] == 0 and s["switch"] > 0 for log in logs for s in log), logs
    # The others waited the pause out inside the step's calls.
    assert all(log[AT]["seconds"] > PAUSE - 5 for r, log in enumerate(logs) if r != SLEEPER)
    for step in zip(*logs):
        assert len({s["hash"] for s in step}) == 1, f"the ranks' parameters differ: {step}"
    for got, want in zip(torch.load(tmp_path / "pause.0.pt"), reference(3, STEPS)):
        torch.testing.assert_close(got, want, rtol=0, atol=BOUND)
    # Registered once: the job never left the manager.
    assert bed.manager_log().count("rank 0 of 3 registered") == 1, bed.manager_log()[-3000:]
