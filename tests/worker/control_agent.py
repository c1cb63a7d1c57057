"""The controller of the worker tests' switch, in its own process.

p4runtime-shell allows one switch connection per process, and another module's
switch fixture may hold it in the pytest process; so this process pushes the program
and then applies, removes and sets loss on command, one JSON line in, one out.
"""

from __future__ import annotations

import json
import sys

from switch_ctl import config as config_mod
from switch_ctl.client import SwitchConnection
from switch_ctl.controller import Controller


def main(grpc_addr: str) -> None:
    with SwitchConnection(grpc_addr, 0, (0, 1)) as conn:
        controller = Controller(conn)
        controller.push()
        print(json.dumps({"ok": True}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            try:
                config = config_mod.load(cmd["config"])
                result = None
                if cmd["op"] == "apply":
                    controller.apply(config)
                elif cmd["op"] == "remove":
                    controller.remove(config)
                elif cmd["op"] == "loss":
                    controller.set_loss(config.switch.ports, ingress=cmd["ingress"],
                                        egress=cmd["egress"])
                elif cmd["op"] == "counters":
                    result = controller.counters()
                else:
                    raise ValueError(f"unknown op {cmd['op']!r}")
                print(json.dumps({"ok": True, "result": result}), flush=True)
            except Exception as exc:
                print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
