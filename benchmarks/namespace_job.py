"""The benchmarks' one job: every host of a namespace topology a worker, on slots
from 0, installed by a controller on the switch process the benchmark started."""

from __future__ import annotations

from pathlib import Path

import tomli_w

from innet_aggregation.p4src import protocol


def install_job(switch, topo, slots: int, workdir: Path, program: Path = protocol.PROGRAM_JSON,
                p4info: Path = protocol.P4INFO, pool_size: int | None = None) -> Path:
    """Push the program (the default build unless given), install the job, and
    return its TOML file, which the workers read."""
    from innet_aggregation.switch_ctl import jobfile
    from innet_aggregation.switch_ctl.client import SwitchConnection
    from innet_aggregation.switch_ctl.controller import Controller

    raw = {"switch": {"grpc_addr": switch.grpc_addr, "device_id": 0,
                      "ports": [h.switch_port for h in topo.hosts]},
           "job": {"id": 1, "udp_port": protocol.AGG_UDP_PORT_BASE,
                   "service_ip": "10.0.0.254", "service_mac": "02:00:00:00:00:fe",
                   "first_slot": 0, "num_slots": slots,
                   "workers": [{"id": i, "mac": h.mac, "ip": h.ip, "udp_port": 41000,
                                "switch_port": h.switch_port}
                               for i, h in enumerate(topo.hosts)]}}
    path = workdir / "job.toml"
    path.write_text(tomli_w.dumps(raw))
    with SwitchConnection(switch.grpc_addr, 0, (0, 1)) as conn:
        controller = Controller(conn)
        controller.push(program, p4info)
        controller.apply(jobfile.load(path, pool_size=pool_size))
    return path
