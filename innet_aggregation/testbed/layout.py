"""Addresses and job descriptions of the testbed's topologies, shared by the Mininet
testbed and the namespace fabrics of the tests (no Mininet needed here)."""

from __future__ import annotations

from innet_aggregation.p4src import protocol

SERVICE_IP = "10.0.0.254"
SERVICE_MAC = "02:00:00:00:00:fe"
WORKER_UDP_PORT = 40000
WINDOW_BYTES = 128 << 10     # values in flight per worker at most (default_window)
JUMBO_VALUES = 1024          # the embedded switch's build in a testbed (default_values_per_packet)


def host_mac(i: int) -> str:
    return f"02:00:00:00:{i >> 8:02x}:{i & 0xff:02x}"


def job_config_dict(ports: dict[int, str], grpc_addr: str, device_id: int, job_id: int = 1,
                    num_slots: int | None = None, loss: tuple[float, float] = (0.0, 0.0),
                    values_per_packet: int | None = None, deadline_ms: float = 0.0) -> dict:
    """The job's configuration (switch_ctl.config format) for worker i on port i+1,
    for the program of ``values_per_packet`` (None: the default one); a bounded-time
    aggregation ``deadline_ms`` (0: none, and no key)."""
    fmt = protocol.packet_format(values_per_packet)
    pool = fmt.pool_size
    workers = [{"id": port - 1, "mac": host_mac(port), "ip": f"10.0.0.{port}",
                "udp_port": WORKER_UDP_PORT, "switch_port": port} for port in sorted(ports)]
    return {
        "switch": {"grpc_addr": grpc_addr, "device_id": device_id, "ports": sorted(ports)},
        "job": {"id": job_id, "udp_port": protocol.AGG_UDP_PORTS.start, "service_ip": SERVICE_IP,
                "service_mac": SERVICE_MAC, "first_slot": 0,
                "num_slots": min(num_slots or pool, pool), "workers": workers,
                "values_per_packet": fmt.values_per_packet, **_deadline(deadline_ms)},
        "loss": {"ingress": loss[0], "egress": loss[1]},
    }


def _deadline(deadline_ms: float) -> dict:
    """The job's ``deadline_ms`` key, only where there is one: a job without stays as it was."""
    return {"deadline_ms": deadline_ms} if deadline_ms else {}


def check_deadline(deadline_ms: float) -> None:
    """Refuse a deadline that cannot be (negative)."""
    if deadline_ms < 0:
        raise ValueError(f"--deadline-ms must not be negative, not {deadline_ms:g}")


def tree_config_dict(switches: dict[str, tuple[str, int]], leaves: int, per_leaf: int,
                     job_id: int = 1, num_slots: int | None = None,
                     udp_port: int = WORKER_UDP_PORT, loss: dict | None = None,
                     values_per_packet: int | None = None, deadline_ms: float = 0.0) -> dict:
    """A tree job (switch_ctl.tree format) in the testbed's layout: the root "spine"
    has leaf j on port j+1; "leafJ" has its workers on ports 1..per_leaf and its
    uplink on port per_leaf+1; worker g (= j * per_leaf + i) is host g+1, 10.0.0.(g+1).
    ``switches`` maps each name to its (gRPC address, device id); ``loss`` maps a
    switch name to its {"ingress": p, "egress": p}."""
    fmt = protocol.packet_format(values_per_packet)
    pool = fmt.pool_size
    loss = loss or {}

    def switch(name: str, ports: list[int], ip: str, mac: str) -> dict:
        addr, device = switches[name]
        entry = {"grpc_addr": addr, "device_id": device, "ports": ports,
                 "service_ip": ip, "service_mac": mac}
        if name in loss:
            entry["loss"] = loss[name]
        return entry

    tree = {"spine": switch("spine", list(range(1, leaves + 1)), SERVICE_IP, SERVICE_MAC)}
    for j in range(leaves):
        leaf = switch(f"leaf{j}", list(range(1, per_leaf + 2)), f"10.0.0.{240 + j}",
                      f"02:00:00:00:01:{j:02x}")
        leaf.update(parent="spine", uplink_port=per_leaf + 1, parent_port=j + 1)
        leaf["workers"] = [{"id": g, "mac": host_mac(g + 1), "ip": f"10.0.0.{g + 1}",
                            "udp_port": udp_port, "switch_port": g - j * per_leaf + 1}
                           for g in range(j * per_leaf, (j + 1) * per_leaf)]
        tree[f"leaf{j}"] = leaf
    return {"job": {"id": job_id, "udp_port": protocol.AGG_UDP_PORTS.start, "first_slot": 0,
                    "num_slots": min(num_slots or pool, pool),
                    "values_per_packet": fmt.values_per_packet, **_deadline(deadline_ms)},
            "tree": {"root": "spine"}, "switches": tree}


def default_window(workers: int, target: str, values_per_packet: int) -> int:
    """Slots per job (each worker's packets in flight).

    The embedded switch keeps up with the links, and the workers' timers follow the
    measured round trip, so a window of 128 covers a bandwidth-delay product of a
    few milliseconds and a whole gradient bucket of 8,192 values in one round
    (`make demo` with 16 slots needed 3 rounds per step). At most ``WINDOW_BYTES``
    of values, though: 128 KiB is 5 ms of a 200 Mbit/s link, and more only waits
    in the links' shapers, where it delays every result (8 workers at 200 Mbit/s,
    1024 values: 45 ms a MiB with 32 slots against 47-50 with 128). BMv2 forwards
    ~2 k packets/s of this program and loses packets when far more queue in front
    of it: about 64 packets in its queue."""
    if target == "bmv2":
        return max(8, 64 // workers)
    return max(1, min(128, WINDOW_BYTES // (4 * values_per_packet)))


def default_values_per_packet(target: str) -> int:
    """The program a testbed runs where none is named. A testbed sets its links' MTU, so
    the embedded switch runs the jumbo build: its cost is per packet (the kernel's send
    and delivery, most of its CPU), and with 256 values 8 workers and the switch on 2
    cores fell behind 200 Mbit/s links, and 4 behind 500, until the switch's receive
    ring; 1024 still costs them a fifth less CPU per MB (docs/history.md, `make
    bench-allreduce`). BMv2 sums as many values a second at either size, so it keeps
    the library's default, which fits Ethernet's MTU."""
    if target == "bmv2":
        return protocol.program().values_per_packet
    return JUMBO_VALUES


def add_program_argument(parser) -> None:
    parser.add_argument("--values", type=int, default=None,
                        help="values per packet: the compiled program to run (default "
                             f"{default_values_per_packet('softswitch')} on the softswitch, "
                             f"on links of a jumbo MTU; {default_values_per_packet('bmv2')} "
                             "on bmv2)")


def link_mtu(fmt: protocol.PacketFormat) -> int:
    """The MTU the testbeds give their links: Ethernet's 1500 B, or a jumbo MTU just
    large enough where the program's packets need more (1024 values: 4,138 B). gloo's
    TCP, measured on the same links, has the same MTU."""
    return max(1500, fmt.ip_bytes)


def check_mtu(mtus: dict[str, str], fmt: protocol.PacketFormat) -> None:
    """Refuse links whose MTU cannot carry the program's packets: they would be dropped
    before the switch, silently."""
    needed = fmt.ip_bytes
    small = {name: int(mtu) for name, mtu in mtus.items() if int(mtu) < needed}
    if small:
        raise ValueError(f"the program's packets ({fmt.values_per_packet} values) need an MTU "
                         f"of {needed} B; " + ", ".join(f"{n} has {m} B" for n, m in small.items()))


TOPOLOGIES = ("star", "tree")


def check_topology(topo: str, workers: int, leaves: int) -> None:
    if topo not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, not {topo!r}")
    if topo == "tree" and (leaves < 1 or workers % leaves or workers // leaves > 250):
        raise ValueError(f"a tree of {leaves} leaves needs a worker count that is a multiple "
                         f"of {leaves}, not {workers}")


def add_topology_arguments(parser) -> None:
    parser.add_argument("--topo", choices=TOPOLOGIES, default="star",
                        help="star: one switch; tree: a spine and --leaves leaf switches, "
                             "the workers spread evenly (default star)")
    parser.add_argument("--leaves", type=int, default=2, help="leaf switches of a tree (default 2)")
