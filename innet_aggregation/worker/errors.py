"""The errors a call of the worker raises, and the recovery their messages name: every
worker raises the same one on the same call, so each says what broke and what to do."""

from __future__ import annotations

START = "session start"       # the two rounds of ``Transport.start``, in messages
RECOVER = ("reset the job's slots (python -m innet_aggregation.switch_ctl reset <job.toml>) and open new "
           "sessions on every worker")


class AggregationTimeout(RuntimeError):
    """No result for some slots within ``peer_timeout``: a worker or the switch is gone.
    ``switch_answered``: the switch said whom it waits for (it is alive; a worker is
    slow or its results are lost), or not (it is gone, restarted or unreachable)."""

    def __init__(self, message: str, switch_answered: bool = False):
        super().__init__(message)
        self.switch_answered = switch_answered


class CallAborted(RuntimeError):
    """The call was given up on the caller's word (``Transport.abort``): the job's
    lease is lost, so the switch no longer serves it."""


class CallMismatch(RuntimeError):
    """The workers did not all issue the same call, or the slots held another
    session's sums: every worker raises it, on the first call where it happens."""


class TransportBroken(RuntimeError):
    """A previous call failed, so the switch's slot state for this job is unknown."""


class SendRefused(RuntimeError):
    """The kernel refuses the worker's packets to the switch, again at once after the
    socket's queued error was cleared: no retransmission can cure it."""




def stale(t, label: str, window_slot: int, why: str) -> str:
    """The message for a slot that holds another session's state (``t``: the Transport)."""
    return (f"job {t.job_id}, worker {t.worker_id}, {label}: slot {t.first_slot + window_slot} "
            f"holds another session's state ({why}): a session on this job ended without "
            f"closing (killed, or after a failed call). {RECOVER[0].upper()}{RECOVER[1:]}")
