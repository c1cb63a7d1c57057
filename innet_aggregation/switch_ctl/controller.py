"""Puts the program on a switch and a job's configuration into it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from innet_aggregation.p4src import protocol

from .client import P4RuntimeError, SwitchConnection
from .config import Config
from .control_base import Changes
from .controls import (ArpResponder, BitmapChecker, DropSimulator, JobLookup, L2Forwarding,
                       OutcomeCounters, ResultRewrite, RoundTracker, SenderIdentification,
                       SourceGuard)
from .overlaps import InstalledJob, JobOverlap, conflicts


class Controller:
    """Every operation is idempotent: it writes only what differs from the switch."""

    def __init__(self, conn: SwitchConnection, mark: bytes = b""):
        """``mark``: the metadata of every job entry this controller writes (JobLookup)."""
        self.conn = conn
        self.l2_forwarding = L2Forwarding(conn)
        self.arp_responder = ArpResponder(conn)
        self.source_guard = SourceGuard(conn)
        self.job_lookup = JobLookup(conn, mark)
        self.sender_identification = SenderIdentification(conn)
        self.round_tracker = RoundTracker(conn)
        self.result_rewrite = ResultRewrite(conn)
        self.drop_simulator = DropSimulator(conn)
        self.outcome_counters = OutcomeCounters(conn)
        self.bitmap_checker = BitmapChecker(conn)
        # Install order: port security and addresses and groups before the tables
        # that make workers known, so no packet is admitted before its result can be
        # delivered, nor before spoofs of its result are refused; the loss simulator last.
        self._job_controls = [self.source_guard, self.l2_forwarding, self.arp_responder,
                              self.result_rewrite, self.sender_identification,
                              self.round_tracker, self.job_lookup, self.drop_simulator]

    def push(self, bmv2_json: Path = protocol.PROGRAM_JSON, p4info: Path = protocol.P4INFO) -> None:
        self.conn.push_pipeline(bmv2_json, p4info)

    def apply(self, config: Config) -> Changes:
        """Install the job; a program lacking what it needs is refused before any write
        (a tree's leaf on the TNA program, say), an optional control it lacks is named,
        and so is a job that collides with one the switch holds (JobOverlap)."""
        controls, skipped, lacking = [], [], []
        for control in self._job_controls:
            missing = control.missing(config)
            if not missing:
                controls.append(control)
            elif control.OPTIONAL:
                skipped.append(type(control).__name__)
            else:
                lacking += missing
        if lacking:
            raise P4RuntimeError(
                f"job {config.job.id} needs {', '.join(lacking)}, which the program on "
                f"{self.conn.grpc_addr} ({self.conn.schema.arch or 'no arch'}) does not have")
        self.check_packet_size(config)
        self.check_overlaps(config)
        changes = Changes(skipped=tuple(skipped))
        for control in controls:
            changes += control.install(config)
        return changes

    def check_packet_size(self, config: Config) -> None:
        """A job whose file names a packet size runs only on a program of that size: a
        worker's packets of another size would be dropped at the switch as malformed."""
        wanted = config.job.values_per_packet
        if wanted is None:
            return
        have = protocol.values_per_packet_in(r.name for r in self.conn.schema.registers)
        if have != wanted:
            raise P4RuntimeError(
                f"job {config.job.id} is for a program of {wanted} values per packet; the "
                f"program on {self.conn.grpc_addr} carries {have}: push the program of the "
                f"job's size, or fix job.values_per_packet")

    def installed_jobs(self) -> list[InstalledJob]:
        """The jobs the switch holds, from its jobs table and, where the program has
        port security, the service addresses its entries record."""
        jobs = {job.id: job for job in self.job_lookup.installed()}
        if self.source_guard.has(self.source_guard.TABLE):
            for job_id, addresses in self.source_guard.service_addresses().items():
                jobs[job_id] = dataclasses.replace(jobs.get(job_id, InstalledJob(job_id)),
                                                   **addresses)
        return list(jobs.values())

    def check_overlaps(self, config: Config) -> None:
        """Raise JobOverlap, naming both jobs, if ``config``'s job collides with another
        job on the switch in slots, UDP port, service address or PRE group, or if the
        switch holds its id with another UDP port or service address."""
        problems = conflicts(config.job, self.installed_jobs())
        if problems:
            raise JobOverlap(config.job.id, self.conn.grpc_addr, problems)

    def remove(self, config: Config) -> Changes:
        changes = Changes()
        for control in reversed(self._job_controls):
            if control.present(config):
                changes += control.clear(config)
        return changes

    def reset(self, config: Config) -> int:
        """Return the job's slots to a fresh switch's state (after AggregationTimeout),
        keeping its entries; the workers then open new sessions. Returns the slot count."""
        return self.bitmap_checker.reset(config)

    def send_frame(self, port: int, frame: bytes) -> None:
        """``frame`` out of ``port`` (PacketOut, op SEND_FRAME): how the job manager
        proves that a host sits behind the port it claims. Not acknowledged: the
        host's answer is the proof it arrived."""
        if self.conn.schema.controller_packet_metadata.get("packet_out") is None:
            raise P4RuntimeError(f"the program on {self.conn.grpc_addr} has no PacketOut "
                                 f"(the TNA program has none yet): it cannot send a frame "
                                 f"out of a port")
        if not 0 <= port < protocol.CPU_PORT:
            raise ValueError(f"port {port} is not a front-panel port (0..{protocol.CPU_PORT - 1})")
        self.conn.packet_out(frame, op=protocol.CONTROL_OP_SEND_FRAME, job_id=0, slot=port)

    def set_loss(self, ports, ingress: float | None = None, egress: float | None = None) -> Changes:
        wanted = {name: p for name, p in (("ingress", ingress), ("egress", egress)) if p is not None}
        for name, p in wanted.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} loss must be a probability in 0..1, not {p}")
        return self.drop_simulator.set(ports, wanted)

    def counters(self) -> dict[str, dict[str, int]]:
        return self.outcome_counters.read_counters()

    def deadline_counters(self, job_id: int) -> dict[str, int]:
        return self.round_tracker.read_counters(job_id)
