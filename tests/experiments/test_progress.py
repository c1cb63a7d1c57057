"""Progress on long runs: the time left from the steps so far, redrawn on a terminal,
plain lines in a log."""

from __future__ import annotations

import io

import pytest

from innet_aggregation.experiments.progress import Progress, duration


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (0, 44.6, 60, 185, 3725)] == \
        ["0 s", "45 s", "1 min 00 s", "3 min 05 s", "1 h 02 min"]


def test_a_log_gets_one_line_a_step_with_the_time_left():
    clock, log = Clock(), io.StringIO()
    progress = Progress(4, "loss", stream=log, clock=clock)
    clock.now += 30
    progress.advance("size 1024")
    clock.now += 90
    progress.advance("size 4096")
    lines = log.getvalue().splitlines()
    assert lines == ["[loss] 1/4 (25 %), 30 s elapsed, about 1 min 30 s left: size 1024",
                     "[loss] 2/4 (50 %), 2 min 00 s elapsed, about 2 min 00 s left: size 4096"]
    assert "\r" not in log.getvalue()


def test_a_terminal_gets_one_line_redrawn_under_the_runs_output(capsys):
    clock, tty = Clock(), Terminal()
    progress = Progress(2, "demo", stream=tty, clock=clock)
    clock.now += 10
    progress.advance("gloo")
    progress.say("[demo] training with gloo")
    clock.now += 10
    progress.advance("switch")
    out = tty.getvalue()
    # Drawn, cleared for the run's own line (on stdout), drawn again, and ended by a newline.
    assert out == ("\r\033[K[demo] 1/2 (50 %), 10 s elapsed, about 10 s left: gloo"
                   "\r\033[K[demo] 1/2 (50 %), 10 s elapsed, about 10 s left: gloo"
                   "\r\033[K[demo] 2/2 (100 %), 20 s elapsed: switch\n")
    assert capsys.readouterr().out == "[demo] training with gloo\n"


def test_a_run_of_no_steps_is_refused():
    with pytest.raises(ValueError, match="0 steps"):
        Progress(0, "scaling")
