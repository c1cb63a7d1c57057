"""The job manager, killing itself (os._exit(137), as a SIGKILL) at one step of its
switch work, for the crash tests (test_manager_state.py): "install" (the row says
installing, nothing written), "installed" (on the switches, the row still
installing), "remove" (the row says removing, nothing removed), "removed" (off the
switches, the row still there). The fault lives here, not in the product: the
manager's own Switches.install and remove are wrapped before it starts.

    python tests/switch_ctl/faulty_manager.py STEP serve --config manager.toml
"""

from __future__ import annotations

import logging
import os
import sys

from innet_aggregation.switch_ctl.cli import main
from innet_aggregation.switch_ctl.manager.installer import Switches

FAULT_STEPS = ("install", "installed", "remove", "removed")
AFTER = {"install": "installed", "remove": "removed"}     # the step after the work


def _die(step: str) -> None:
    logging.getLogger("innet_aggregation.manager").error(
        "faulty_manager: the manager kills itself at %r", step)
    logging.shutdown()
    os._exit(137)


def inject(step: str) -> None:
    """Wrap the switch work so the manager dies before or after it, at ``step``."""
    if step not in FAULT_STEPS:
        raise SystemExit(f"faulty_manager: {step!r} is not one of {', '.join(FAULT_STEPS)}")
    for work in ("install", "remove"):
        real = getattr(Switches, work)

        def wrapped(self, tree, _real=real, _work=work):
            if step == _work:
                _die(step)
            _real(self, tree)
            if step == AFTER[_work]:
                _die(step)
        setattr(Switches, work, wrapped)


if __name__ == "__main__":
    inject(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
