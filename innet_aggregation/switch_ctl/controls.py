"""One class per P4 control the controller configures, named as in p4src/v1model/control/.

Table paths are the v1model P4Info names, <pipeline control>.<instance>.<table>;
the base class resolves them against the program the switch runs (control_base.py).
"""

from __future__ import annotations

import ipaddress
import time

from innet_aggregation.p4src import protocol

from .client import P4CounterEntry, P4RuntimeError, P4TableEntry
from .config import Config
from .control_base import Changes, Control, action_values, match_values
from .overlaps import InstalledJob


def mac_int(mac: str) -> int:
    """A MAC as P4Runtime's match value, to compare with what a read returns."""
    return int(mac.replace(":", ""), 16)


def mac_str(value: int) -> str:
    """A MAC read back from a match, spelled as config.py spells it."""
    return ":".join(f"{b:02x}" for b in value.to_bytes(6, "big"))


def ip_int(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


class L2Forwarding(Control):
    """Workers' MACs to their ports (in a tree, also the other switches' workers, by
    the port towards them), but for workers without an L2 route, whose MACs another
    job or host may own; the flood group over every switch port."""
    TABLE = "AggIngress.l2_forwarding.mac_table"
    ACTIONS = ("AggIngress.l2_forwarding.forward",)

    @staticmethod
    def _routes(config: Config) -> list[tuple[str, int]]:
        return ([(w.mac, w.switch_port) for w in config.job.workers if w.l2_route]
                + list(config.l2_routes))

    def install(self, config: Config) -> Changes:
        routes = self._routes(config)
        desired = [self.entry(self.TABLE, self.ACTIONS[0], {"dst_mac": mac}, {"port": port})
                   for mac, port in routes]
        macs = {mac_int(mac) for mac, _ in routes}
        changes = self.sync(self.TABLE, desired, lambda m: m["dst_mac"] in macs)
        flood = {(port, 0) for port in config.switch.ports}
        return changes + self.sync_multicast_group(protocol.FLOOD_MCAST_GROUP, flood)

    def clear(self, config: Config) -> Changes:
        macs = {mac_int(mac) for mac, _ in self._routes(config)}
        return self.sync(self.TABLE, [], lambda m: m["dst_mac"] in macs)


class ArpResponder(Control):
    """The job's service address, answered by the switch itself."""
    TABLE = "AggIngress.arp_responder.arp_table"
    ACTIONS = ("AggIngress.arp_responder.reply",)

    def _owned(self, config: Config):
        ip = ip_int(config.job.service_ip)
        return lambda m: m["target_ip"] == ip

    def install(self, config: Config) -> Changes:
        desired = [self.entry(self.TABLE, self.ACTIONS[0], {"target_ip": config.job.service_ip},
                              {"mac": config.job.service_mac})]
        return self.sync(self.TABLE, desired, self._owned(config))

    def clear(self, config: Config) -> Changes:
        return self.sync(self.TABLE, [], self._owned(config))


class SourceGuard(Control):
    """Port security: frames claiming the job's service MAC or IPv4 as their source
    (Ethernet, IPv4 or ARP sender) are dropped, since only the switch sources them.

    Every entry does the same (drop), so their order is free, and each entry's
    priority records the job that claimed the address: job id + 1 (P4Runtime's
    priorities start at 1). It is the one place the switch keeps a job's service
    address, which lets apply name the job an address belongs to (overlaps.py)."""
    TABLE = "AggIngress.source_guard.service_sources"
    ACTIONS = ("NoAction",)
    OPTIONAL = True

    def _owned(self, config: Config):
        ip, mac = ip_int(config.job.service_ip), mac_int(config.job.service_mac)
        claims = {("src_mac", mac), ("arp_sender_mac", mac), ("src_ip", ip)}
        return lambda m: bool(claims & set(m.items()))

    def install(self, config: Config) -> Changes:
        # One ternary entry per claimed field, the others left out (wildcards).
        job = config.job
        desired = [self.entry(self.TABLE, self.ACTIONS[0], {field: address}, {},
                              priority=job.id + 1)
                   for field, address in (("src_mac", job.service_mac),
                                          ("arp_sender_mac", job.service_mac),
                                          ("src_ip", job.service_ip))]
        return self.sync(self.TABLE, desired, self._owned(config))

    def clear(self, config: Config) -> Changes:
        return self.sync(self.TABLE, [], self._owned(config))

    def service_addresses(self) -> dict[int, dict[str, str]]:
        """Job id -> {"service_ip": ..., "service_mac": ...}, from the entries' priorities."""
        found: dict[int, dict[str, str]] = {}
        for match, _, _, priority in self.entries(self.TABLE):
            addresses = found.setdefault(priority - 1, {})
            if "src_ip" in match:
                addresses["service_ip"] = str(ipaddress.IPv4Address(match["src_ip"]))
            if "src_mac" in match:
                addresses["service_mac"] = mac_str(match["src_mac"])
        return found


class JobLookup(Control):
    """The job: contributor count, multicast group, slot range, UDP port, and on a
    leaf of a tree its parent. Its entry carries ``mark`` as P4Runtime metadata, so
    whoever installed a job (the job manager, or a person) can be told apart."""
    TABLE = "AggIngress.job_lookup.jobs"
    # The TNA program's slot range check, a range match beside jobs (p4src/tna/control/
    # job_lookup.p4: a Tofino gateway cannot compare two fields); v1model has none.
    SLOT_RANGE = "AggIngress.job_lookup.slot_range"
    IN_RANGE = "AggIngress.job_lookup.slot_in_range"

    @staticmethod
    def _action(config: Config) -> str:
        return "AggIngress.job_lookup." + ("set_job" if config.job.parent is None
                                           else "set_leaf_job")

    def __init__(self, conn, mark: bytes = b""):
        super().__init__(conn)
        self.mark = mark

    def needs(self, config: Config) -> list[tuple[str, str]]:
        return [("tables", self.TABLE), ("actions", self._action(config))]

    def install(self, config: Config) -> Changes:
        job = config.job
        params = {"num_workers": len(job.workers), "total_workers": job.num_workers,
                  "group": job.multicast_group, "first_slot": job.first_slot,
                  "num_slots": job.num_slots}
        if job.parent is not None:
            params.update(parent_port=job.parent.port, parent_mac=job.parent.mac,
                          parent_ip=job.parent.ip)
        desired = [self.entry(self.TABLE, self._action(config),
                              {"job_id": job.id, "udp_port": job.udp_port}, params,
                              metadata=self.mark)]
        changes = self.sync(self.TABLE, desired, lambda m: m["job_id"] == job.id)
        if self.has(self.SLOT_RANGE):
            last = job.first_slot + job.num_slots - 1
            ranged = [self.entry(self.SLOT_RANGE, self.IN_RANGE,
                                 {"job_id": job.id, "udp_port": job.udp_port,
                                  "slot": (job.first_slot, last)}, {}, priority=1)]
            changes += self.sync(self.SLOT_RANGE, ranged, lambda m: m["job_id"] == job.id)
        return changes

    def clear(self, config: Config) -> Changes:
        changes = self.sync(self.TABLE, [], lambda m: m["job_id"] == config.job.id)
        if self.has(self.SLOT_RANGE):
            changes += self.sync(self.SLOT_RANGE, [], lambda m: m["job_id"] == config.job.id)
        return changes

    def installed(self) -> list[InstalledJob]:
        """Every job the table holds: its id, UDP port, slot range, PRE group and mark."""
        table = self.name("tables", self.TABLE)
        jobs = []
        for entity in self.conn.read_raw(P4TableEntry(table)):
            match = match_values(self.conn, table, entity.table_entry)
            _, params = action_values(self.conn, entity.table_entry)
            jobs.append(InstalledJob(match["job_id"], udp_port=match["udp_port"],
                                     first_slot=params["first_slot"],
                                     num_slots=params["num_slots"], group=params["group"],
                                     mark=entity.table_entry.metadata))
        return jobs


class SenderIdentification(Control):
    """Who may contribute: (port, source IP, source UDP port) -> worker id; on a leaf,
    also who may send results: the parent, from its service address and the job's port."""
    TABLE = "AggIngress.sender_identification.senders"
    SENDER = "AggIngress.sender_identification.set_sender"
    PARENT = "AggIngress.sender_identification.set_parent"

    def needs(self, config: Config) -> list[tuple[str, str]]:
        actions = [self.SENDER] + ([self.PARENT] if config.job.parent is not None else [])
        return [("tables", self.TABLE)] + [("actions", a) for a in actions]

    def install(self, config: Config) -> Changes:
        job = config.job
        desired = [self.entry(self.TABLE, self.SENDER,
                              {"ingress_port": w.switch_port, "src_ip": w.ip,
                               "src_udp_port": w.udp_port, "job_id": job.id},
                              {"worker_id": w.id, "worker_bit": 1 << w.id})
                   for w in job.workers]
        if job.parent is not None:
            desired.append(self.entry(self.TABLE, self.PARENT,
                                      {"ingress_port": job.parent.port, "src_ip": job.parent.ip,
                                       "src_udp_port": job.udp_port, "job_id": job.id}, {}))
        return self.sync(self.TABLE, desired, lambda m: m["job_id"] == job.id)

    def clear(self, config: Config) -> Changes:
        return self.sync(self.TABLE, [], lambda m: m["job_id"] == config.job.id)


class ResultRewrite(Control):
    """Where each worker's copy of a result goes; the job's PRE group (rid = worker id)."""
    TABLE = "AggEgress.result_rewrite.workers"
    ACTIONS = ("AggEgress.result_rewrite.set_worker_address",)

    def install(self, config: Config) -> Changes:
        job = config.job
        desired = [self.entry(self.TABLE, self.ACTIONS[0],
                              {"job_id": job.id, "worker_id": w.id},
                              {"mac": w.mac, "ip": w.ip, "udp_port": w.udp_port})
                   for w in job.workers]
        changes = self.sync(self.TABLE, desired, lambda m: m["job_id"] == job.id)
        replicas = {(w.switch_port, w.id) for w in job.workers}
        return changes + self.sync_multicast_group(job.multicast_group, replicas)

    def clear(self, config: Config) -> Changes:
        changes = self.sync(self.TABLE, [], lambda m: m["job_id"] == config.job.id)
        return changes + self.sync_multicast_group(config.job.multicast_group, None)


class DropSimulator(Control):
    """Loss simulator probabilities, per port, for the ingress and egress instances."""
    INSTANCES = {"ingress": "AggIngress.ingress_loss", "egress": "AggEgress.egress_loss"}

    def needs(self, config: Config) -> list[tuple[str, str]]:
        return [(kind, f"{control}.{name}") for control in self.INSTANCES.values()
                for kind, name in (("tables", "drop_probability"),
                                   ("actions", "set_drop_probability"))]

    @staticmethod
    def encode(probability: float) -> int:
        """P(drop) = value / 2^32, as the program compares a 32-bit random draw."""
        return min(round(probability * 2**32), 2**32 - 1)

    def install(self, config: Config) -> Changes:
        return self.set(config.switch.ports,
                        {"ingress": config.loss.ingress, "egress": config.loss.egress})

    def set(self, ports, probabilities: dict[str, float]) -> Changes:
        changes = Changes()
        ports = set(ports)
        for direction, probability in probabilities.items():
            control = self.INSTANCES[direction]
            table = f"{control}.drop_probability"
            desired = [] if probability == 0 else [
                self.entry(table, f"{control}.set_drop_probability", {"port": port},
                           {"p": self.encode(probability)}) for port in sorted(ports)]
            changes += self.sync(table, desired, lambda m: m["port"] in ports)
        return changes

    def clear(self, config: Config) -> Changes:
        return self.set(config.switch.ports, {"ingress": 0.0, "egress": 0.0})


class RoundTracker(Control):
    """The jobs with a deadline (job.deadline_ms), whose rounds a worker may have
    released early (p4src/shared/deadline.p4), and what the deadline did, per job.
    Installing a deadline job on a program without the table is refused."""
    TABLE = "AggIngress.round_tracker.deadline_jobs"
    ACTIONS = ("AggIngress.round_tracker.set_deadline",)
    COUNTER = "AggIngress.deadline_outcomes"
    # deadline.p4's DEADLINE_* indexes, per job: job_id * stride + index
    OUTCOMES = ("released", "late", "stale", "release_refused", "quorum")
    JOB_IDS = 256       # the counter holds every job id's cells

    def needs(self, config: Config) -> list[tuple[str, str]]:
        return super().needs(config) if config.job.deadline_ms else []

    def present(self, config: Config) -> bool:
        return self.has(self.TABLE)

    def install(self, config: Config) -> Changes:
        if not self.has(self.TABLE):
            return Changes()
        job = config.job
        desired = ([self.entry(self.TABLE, self.ACTIONS[0], {"job_id": job.id}, {})]
                   if job.deadline_ms else [])
        return self.sync(self.TABLE, desired, lambda m: m["job_id"] == job.id)

    def clear(self, config: Config) -> Changes:
        return self.sync(self.TABLE, [], lambda m: m["job_id"] == config.job.id)

    def stride(self) -> int:
        """Cells a job has in the counter (its size over 256 job ids): v1model packs
        them (5 a job); the TNA program, whose cell index can be a hash of fields but
        not a sum, gives each job 8."""
        counter = self.name("counters", self.COUNTER)
        stride = self.conn.schema.counters[counter].size // self.JOB_IDS
        if stride < len(self.OUTCOMES):
            raise P4RuntimeError(f"{counter} holds {stride} cells a job, fewer than the "
                                 f"{len(self.OUTCOMES)} deadline outcomes")
        return stride

    def read_counters(self, job_id: int) -> dict[str, int]:
        """Packets per outcome of ``job_id``'s deadline: rounds released, contributions
        that came after a release, stale packets dropped, releases refused, rounds
        released at their quorum."""
        counter = self.name("counters", self.COUNTER)
        base = job_id * self.stride()
        cells = {cell.index: cell.data.packet_count
                 for cell in self.conn.read(P4CounterEntry(counter))}
        return {name: cells.get(base + i, 0) for i, name in enumerate(self.OUTCOMES)}


class OutcomeCounters(Control):
    """The pipeline-level counters: one cell per outcome enum member."""
    COUNTERS = {"AggIngress.ingress_outcomes": protocol.IngressOutcome,
                "AggEgress.egress_outcomes": protocol.EgressOutcome}

    def read_counters(self) -> dict[str, dict[str, int]]:
        out = {}
        for counter, outcomes in self.COUNTERS.items():
            for cell in self.conn.read(P4CounterEntry(self.name("counters", counter))):
                index = cell.index
                if index in outcomes._value2member_map_:
                    name = f"{counter.split('.')[0].removeprefix('Agg').lower()}." \
                           f"{outcomes(index).name.lower()}"
                    out[name] = {"packets": cell.data.packet_count, "bytes": cell.data.byte_count}
        return out


class BitmapChecker(Control):
    """The slots' worker bitmaps, cleared for a job's slot range: its slots are then
    as on a fresh switch. P4Runtime cannot write BMv2's registers, so each slot's
    reset is a PacketOut (op RESET_SLOT) that the program accepts only from the CPU
    port; the switch counts each one as outcome SLOT_RESET."""
    COUNTER = "AggIngress.ingress_outcomes"

    def reset(self, config: Config, timeout: float = 10.0) -> int:
        job = config.job
        packet_out = self.conn.schema.controller_packet_metadata.get("packet_out")
        if packet_out is None or packet_out.metadata.get("op") is None:
            raise P4RuntimeError(f"the program on {self.conn.grpc_addr} has no slot reset by "
                                 f"PacketOut (the TNA program has none yet): only reloading "
                                 f"the program clears its slots")
        before = self._resets()
        for slot in range(job.first_slot, job.first_slot + job.num_slots):
            self.conn.packet_out(b"", op=protocol.ControlOp.RESET_SLOT, job_id=job.id, slot=slot)
        # PacketOuts are not acknowledged: done when the switch has counted them all.
        deadline = time.monotonic() + timeout
        while (done := self._resets() - before) < job.num_slots:
            if time.monotonic() > deadline:
                raise P4RuntimeError(
                    f"{done} of {job.num_slots} slot resets reached the switch in {timeout:g} s "
                    f"(is it started with --cpu-port {protocol.CPU_PORT}?)")
            time.sleep(0.01)
        return job.num_slots

    def _resets(self) -> int:
        (cell,) = self.conn.read(P4CounterEntry(self.name("counters", self.COUNTER),
                                                index=protocol.IngressOutcome.SLOT_RESET))
        return cell.data.packet_count
