"""Fuzz campaign: hostile frames from member and non-member hosts, alone and while
every worker runs exact allreduce calls, with every frame accounted for.

    python -m tests.worker.fuzz --frames 100000        # `make fuzz`: native softswitch

Frames (built in numpy from a few scapy templates, one row each):

* ``agg``: contributions, mutated: foreign source ports, another worker's address
  and port sent from the wrong switch port, random job ids, slots, message types,
  sets and values, truncated or padded frames, wrong UDP lengths, wrong IPv4 and UDP
  checksums. The switch must refuse each (MALFORMED, UNKNOWN_JOB, BAD_SLOT or
  UNKNOWN_SENDER): none is a registered worker flow.
* ``spoof``: frames claiming a service address (forged results from the service
  MAC and IP, the service IP or MAC alone, gratuitous ARP for the service IP, ARP
  binding the service MAC): SPOOFED_SOURCE, each.
* ``l2``: random bytes, forged ICMP destination-unreachable quoting the workers'
  flows, results forged from the attacker's own address: switched at L2
  (FORWARDED_L2); the hosts' kernels may answer some (ICMP), which the switch
  counts too.

Accounting, per phase: the ingress outcome counters grow by exactly the frames the
switch ports received (the veths' rx counters), SPOOFED_SOURCE by exactly the spoofs
sent, the four refusals by exactly the ``agg`` frames sent, FORWARDED_L2 by at least
the ``l2`` frames; no frame is lost to the loss simulator. The workers' results
must be bit-identical on every worker and within the bound of the exact sum
(tests/worker/test_end_to_end.py's check).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether

from innet_aggregation.p4src import protocol

from innet_aggregation.experiments import record
from innet_aggregation.testbed.netns import in_netns

from .harness import SERVICE_IP, SERVICE_MAC, WORKER_UDP_PORT, Fabric, Job

KINDS = ("agg", "spoof", "l2")
AGG, SPOOF, L2 = range(3)
REFUSED = ("malformed", "unknown_job", "unknown_sender", "bad_slot")
AGGREGATED = ("consumed", "completed", "resent", "duplicate_dropped")
# Ethernet 14 + IPv4 20 + UDP 8: where the aggregation header starts.
AGG_OFFSET = 42
# The program's aggregation frame, and room for frames longer than it.
MAX_FRAME = AGG_OFFSET + protocol.packet_format().payload_bytes + 64
UNREACHABLE_CODES = (1, 2, 3, 10, 13)


@dataclass
class Frames:
    """``count`` frames: bytes (rows of ``data``, ``length`` used), sending host, kind."""
    data: np.ndarray
    length: np.ndarray
    sender: np.ndarray
    kind: np.ndarray

    def __len__(self) -> int:
        return len(self.length)


def _mac(text: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(text.replace(":", "")), dtype=np.uint8)


def _ip(text: str) -> np.ndarray:
    return np.frombuffer(socket.inet_aton(text), dtype=np.uint8)


def _put16(data: np.ndarray, rows: np.ndarray, offset: int, values) -> None:
    values = np.asarray(values, dtype=np.int64)
    data[rows, offset] = (values >> 8) & 0xFF
    data[rows, offset + 1] = values & 0xFF


def _ipv4_checksum(data: np.ndarray, rows: np.ndarray) -> None:
    """The IPv4 header checksum of rows with a 20-byte header at offset 14."""
    data[rows, 24:26] = 0
    words = data[rows, 14:34].astype(np.uint32)
    total = (words[:, 0::2] << 8 | words[:, 1::2]).sum(axis=1)
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    _put16(data, rows, 24, ~total & 0xFFFF)


class Generator:
    """Builds hostile frames for a job on a fabric whose hosts beyond the job's
    workers are non-members."""

    def __init__(self, fabric: Fabric, job: Job, seed: int):
        self.rng = np.random.default_rng(seed)
        self.hosts = fabric.topology.hosts
        self.job = job
        self.fmt = protocol.packet_format()
        self.workers = list(range(job.num_workers))

    def _pick(self, templates: list[list[bytes]], rows: np.ndarray, data, length) -> None:
        """Each row: a template of its sender (templates[sender] is that host's list)."""
        for sender in np.unique(self._sender[rows]):
            mine = rows[self._sender[rows] == sender]
            options = templates[sender]
            table = np.zeros((len(options), MAX_FRAME), dtype=np.uint8)
            sizes = np.array([len(t) for t in options])
            for i, t in enumerate(options):
                table[i, :len(t)] = np.frombuffer(t, dtype=np.uint8)
            choice = self.rng.integers(0, len(options), len(mine))
            data[mine] = table[choice]
            length[mine] = sizes[choice]

    def frames(self, count: int) -> Frames:
        rng = self.rng
        data = np.zeros((count, MAX_FRAME), dtype=np.uint8)
        length = np.zeros(count, dtype=np.int64)
        kind = rng.choice(3, size=count, p=[0.5, 0.2, 0.3])
        self._sender = sender = rng.integers(0, len(self.hosts), count)
        self._agg(np.flatnonzero(kind == AGG), data, length)
        self._pick([self._spoofs(h) for h in self.hosts], np.flatnonzero(kind == SPOOF),
                   data, length)
        self._l2(np.flatnonzero(kind == L2), data, length)
        return Frames(data, length, sender, kind)

    # -- aggregation frames, mutated ---------------------------------------------
    def _agg(self, rows: np.ndarray, data, length) -> None:
        rng, job, n = self.rng, self.job, len(rows)
        fmt = self.fmt
        full = AGG_OFFSET + fmt.payload_bytes
        templates = [[bytes(Ether(src=h.mac, dst=SERVICE_MAC) / IP(src=h.ip, dst=SERVICE_IP)
                            / UDP(sport=1, dport=protocol.AGG_UDP_PORT_BASE)
                            / bytes(fmt.payload_bytes))] for h in self.hosts]
        self._pick(templates, rows, data, length)
        # Payload: random values, then a header with each field right or wrong.
        data[rows, AGG_OFFSET:full] = rng.integers(0, 256, (n, fmt.payload_bytes), dtype=np.uint8)
        slots = np.where(rng.random(n) < 0.6, job.first_slot + rng.integers(0, job.num_slots, n),
                         rng.integers(0, 2**15, n))
        header = fmt.pack(count=n, msg_type=np.where(rng.random(n) < 0.7,
                                                     int(protocol.MsgType.CONTRIBUTION),
                                                     rng.integers(0, 256, n)),
                          job_id=np.where(rng.random(n) < 0.6, job.id, rng.integers(0, 256, n)),
                          set=rng.integers(0, 2, n), slot=slots,
                          pkt_id=rng.integers(0, 2**32, n), exponent=rng.integers(-128, 128, n))
        raw = header.view(np.uint8).reshape(n, -1)
        data[rows, AGG_OFFSET:AGG_OFFSET + fmt.header_bytes] = raw[:, :fmt.header_bytes]
        _put16(data, rows, 36, protocol.AGG_UDP_PORT_BASE + rng.integers(0, 16, n))
        # Source: a foreign UDP port from the host's own address, or a worker's
        # address and port sent from another host's switch port.
        sport = rng.integers(1024, 65536, n)
        sport[sport == WORKER_UDP_PORT] += 1
        _put16(data, rows, 34, sport)
        stolen = rows[rng.random(n) < 0.3]
        victim = rng.integers(0, len(self.workers), len(stolen))
        victim = np.where(victim == self._sender[stolen], (victim + 1) % len(self.workers), victim)
        data[stolen, 26:30] = np.stack([_ip(self.hosts[w].ip) for w in self.workers])[victim]
        _put16(data, stolen, 34, WORKER_UDP_PORT)
        # Lengths: most whole; some cut short (never before the UDP header, so the
        # parser still calls it aggregation), some padded; some UDP lengths wrong.
        cut = rng.random(n)
        length[rows] = np.where(cut < 0.15, rng.integers(AGG_OFFSET, full, n),
                                np.where(cut < 0.25, full + rng.integers(1, 64, n), full))
        udp_len = np.where(rng.random(n) < 0.15, rng.integers(0, 2**16, n), length[rows] - 34)
        _put16(data, rows, 38, udp_len)
        _put16(data, rows, 16, length[rows] - 14)
        _ipv4_checksum(data, rows)
        # Checksums: a third of the IPv4 ones wrong, UDP's absent or random.
        wrong = rows[rng.random(n) < 0.33]
        _put16(data, wrong, 24, rng.integers(0, 2**16, len(wrong)))
        _put16(data, rows, 40, np.where(rng.random(n) < 0.5, 0, rng.integers(0, 2**16, n)))

    # -- service-address spoofs --------------------------------------------------
    def _result(self) -> bytes:
        fmt = self.fmt
        return fmt.pack(self.rng.integers(-2**31, 2**31, (1, fmt.values_per_packet)
                                          ).astype(np.int32),
                        msg_type=int(protocol.MsgType.RESULT), job_id=self.job.id,
                        slot=self.job.first_slot, set=0,
                        contributions=self.job.num_workers).tobytes()

    def _spoofs(self, me) -> list[bytes]:
        out = []
        for w in (self.hosts[i] for i in self.workers):
            out += [
                bytes(Ether(src=SERVICE_MAC, dst=w.mac) / IP(src=SERVICE_IP, dst=w.ip)
                      / UDP(sport=protocol.AGG_UDP_PORT_BASE, dport=WORKER_UDP_PORT)
                      / self._result()),
                bytes(Ether(src=me.mac, dst=w.mac) / IP(src=SERVICE_IP, dst=w.ip)
                      / UDP(sport=protocol.AGG_UDP_PORT_BASE, dport=WORKER_UDP_PORT)
                      / self._result()),
                bytes(Ether(src=SERVICE_MAC, dst=w.mac, type=0x88B5) / bytes(46)),
                bytes(Ether(src=me.mac, dst=w.mac)
                      / ARP(op=2, hwsrc=SERVICE_MAC, psrc=me.ip, hwdst=w.mac, pdst=w.ip)),
            ]
        for op in (1, 2):
            out.append(bytes(Ether(src=me.mac, dst="ff:ff:ff:ff:ff:ff")
                             / ARP(op=op, hwsrc=me.mac, psrc=SERVICE_IP, pdst=SERVICE_IP)))
        return out

    # -- frames switched at L2 -----------------------------------------------------
    def _l2(self, rows: np.ndarray, data, length) -> None:
        rng = self.rng
        forged = rows[rng.random(len(rows)) < 0.5]
        self._pick([self._l2_templates(h) for h in self.hosts], forged, data, length)
        noise = np.setdiff1d(rows, forged)
        n = len(noise)
        data[noise] = rng.integers(0, 256, (n, MAX_FRAME), dtype=np.uint8)
        length[noise] = rng.integers(14, MAX_FRAME + 1, n)
        # Mostly to a host's MAC (a flood of random unicast would only load the
        # switch); never from the service MAC (that would be a spoof).
        macs = np.stack([_mac(h.mac) for h in self.hosts])
        to_host = noise[rng.random(n) < 0.9]
        data[to_host, 0:6] = macs[rng.integers(0, len(self.hosts), len(to_host))]
        data[noise, 11] ^= (data[noise, 6:12] == _mac(SERVICE_MAC)).all(axis=1).astype(np.uint8)

    def _l2_templates(self, me) -> list[bytes]:
        out = []
        for w in (self.hosts[i] for i in self.workers):
            if w is me:
                continue
            quoted = bytes(IP(src=w.ip, dst=SERVICE_IP)
                           / UDP(sport=WORKER_UDP_PORT, dport=protocol.AGG_UDP_PORT_BASE))[:28]
            out += [bytes(Ether(src=me.mac, dst=w.mac) / IP(src=me.ip, dst=w.ip)
                          / ICMP(type=3, code=code) / quoted) for code in UNREACHABLE_CODES]
            out.append(bytes(Ether(src=me.mac, dst=w.mac) / IP(src=me.ip, dst=w.ip)
                             / UDP(sport=protocol.AGG_UDP_PORT_BASE, dport=WORKER_UDP_PORT)
                             / self._result()))
        return out


class Sender:
    """Sends frames from their hosts' ports at ``rate`` per second (in bursts), once
    through or round and round until stopped; counts what went out, per kind."""

    BURST = 64

    def __init__(self, fabric: Fabric, frames: Frames, rate: float):
        self.socks = [_send_socket(h) for h in fabric.topology.hosts]
        self.frames, self.rate = frames, rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, limit: int) -> None:
        f = self.frames
        views = [memoryview(row) for row in f.data]
        socks = [self.socks[s] for s in f.sender]
        start = time.monotonic()
        while self.sent < limit and not self._stop.is_set():
            end = min(self.sent + self.BURST, limit)
            for i in range(self.sent, end):
                j = i % len(f)
                socks[j].send(views[j][:f.length[j]])
            self.sent = end
            wait = start + self.sent / self.rate - time.monotonic()
            if wait > 0:
                self._stop.wait(wait)

    def counts(self) -> dict[str, int]:
        """Frames sent per kind."""
        cycles, rest = divmod(self.sent, len(self.frames))
        per = (cycles * np.bincount(self.frames.kind, minlength=3)
               + np.bincount(self.frames.kind[:rest], minlength=3))
        return dict(zip(KINDS, map(int, per)))

    def start(self) -> "Sender":
        self._thread = threading.Thread(target=self.run, args=(sys.maxsize,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def _send_socket(host) -> socket.socket:
    """A packet socket on the host's interface that receives nothing (protocol 0),
    so the frames flooded back to it queue nowhere."""
    with in_netns(host.netns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        sock.bind((host.ifname, 0))
    return sock


def _rx_frames(fabric: Fabric) -> int:
    """Frames the switch's ports received from the hosts (the veths' counters)."""
    return sum(int(Path(f"/sys/class/net/{h.switch_ifname}/statistics/rx_packets").read_text())
               for h in fabric.topology.hosts)


class Ledger:
    """Counters and received frames at the start of a phase; ``settle`` waits until
    the switch has an outcome for every frame its ports received. The start waits
    for a quiet switch: a slow target (BMv2) may still be working through frames
    an earlier test queued, which its ports counted before the start and its
    counters would count after it."""

    def __init__(self, fabric: Fabric, job: Job, timeout: float = 30.0):
        self.fabric, self.job = fabric, job
        deadline = time.monotonic() + timeout
        self.counters, self.rx = fabric.counters(job), _rx_frames(fabric)
        while time.monotonic() < deadline:
            time.sleep(0.3)
            counters, rx = fabric.counters(job), _rx_frames(fabric)
            if counters == self.counters and rx == self.rx:
                break
            self.counters, self.rx = counters, rx

    def settle(self, timeout: float = 30.0) -> tuple[dict[str, int], int]:
        deadline = time.monotonic() + timeout
        last = None
        while True:
            rx = _rx_frames(self.fabric) - self.rx
            counters = self.fabric.counters(self.job)
            delta = {k.removeprefix("ingress."): v - self.counters[k]
                     for k, v in counters.items() if k.startswith("ingress.")}
            total = sum(delta.values())
            if (total == rx and last == total) or time.monotonic() > deadline:
                return delta, rx
            last = total
            time.sleep(0.2)


def account(delta: dict[str, int], rx: int, sent: dict[str, int]) -> list[str]:
    """What the counters fail to account for (empty: every frame accounted)."""
    problems = []
    if sum(delta.values()) != rx:
        problems.append(f"outcomes {sum(delta.values())} != frames received {rx}")
    if delta["spoofed_source"] != sent["spoof"]:
        problems.append(f"spoofed_source {delta['spoofed_source']} != spoofs sent {sent['spoof']}")
    refused = sum(delta[r] for r in REFUSED)
    if refused != sent["agg"]:
        problems.append(f"refused {refused} != hostile aggregation frames sent {sent['agg']}")
    if delta["forwarded_l2"] < sent["l2"]:
        problems.append(f"forwarded_l2 {delta['forwarded_l2']} < L2 frames sent {sent['l2']}")
    if delta["simulated_drop"]:
        problems.append(f"simulated_drop {delta['simulated_drop']} with no loss configured")
    return problems


def campaign(fabric: Fabric, outdir: Path, *, frames: int, rate: float, workers: int = 4,
             size: int = 20_000, reps: int = 4, seed: int = 1) -> dict:
    """Phase 1, hostile frames alone; phase 2, the rest while every worker runs
    ``reps`` allreduce calls; phase 3, one call on a quiet fabric. Returns a report;
    the caller asserts on it (``problems``)."""
    from .test_end_to_end import check_run
    job = fabric.job(workers, num_slots=16)
    gen = Generator(fabric, job, seed)
    report = {"target": fabric.target, "workers": workers, "hosts": len(fabric.topology.hosts),
              "phases": {}, "problems": []}
    args = ["--size", str(size), "--seed", str(seed)]

    def phase(name, body):
        ledger = Ledger(fabric, job)
        start = time.monotonic()
        sent, extra = body()
        seconds = time.monotonic() - start
        delta, rx = ledger.settle()
        problems = account(delta, rx, sent)
        report["phases"][name] = {"seconds": round(seconds, 2), "sent": sent, "received": rx,
                                  "outcomes": delta, **extra}
        report["problems"] += [f"{name}: {p}" for p in problems]

    def workers_run(name, n_reps):
        out = outdir / name
        runs = fabric.run(job, [*args, "--reps", str(n_reps), "--save", str(out)])
        exact = True
        try:
            check_run(runs, job, out, size=size, seed=seed, reps=n_reps)
        except AssertionError as exc:
            exact = False
            report["problems"].append(f"{name}: allreduce not exact: {exc}")
        counters = [r["counters"] for run in runs for r in run.reports if "counters" in r]
        seconds = [r["seconds"] for run in runs for r in run.reports if "seconds" in r]
        return {"calls": len(counters), "exact": exact,
                "median_call_s": round(float(np.median(seconds)), 3) if seconds else None,
                "socket_errors": sum(c["socket_errors"] for c in counters),
                "retransmissions": sum(c["retransmissions"] for c in counters),
                "worker_packets": sum(c["packets_sent"] for c in counters)}

    alone = gen.frames(frames // 2)
    concurrent = gen.frames(frames - frames // 2)

    def hostile_alone():
        sender = Sender(fabric, alone, rate)
        try:
            sender.run(len(alone))
        finally:
            sender.close()
        return sender.counts(), {}

    def hostile_with_workers():
        sender = Sender(fabric, concurrent, rate).start()
        try:
            extra = workers_run("concurrent", reps)
            # At least the planned frames, all of them sent while workers ran or after.
            while sender.sent < len(concurrent) and sender._thread.is_alive():
                time.sleep(0.05)
        finally:
            sender.stop()
            sender.close()
        return sender.counts(), extra

    t0 = time.monotonic()
    phase("hostile", hostile_alone)
    phase("concurrent", hostile_with_workers)
    phase("after", lambda: (dict.fromkeys(KINDS, 0), workers_run("after", 1)))
    agg = report["phases"]["concurrent"]["outcomes"]
    if sum(agg[a] for a in AGGREGATED) < report["phases"]["concurrent"]["worker_packets"]:
        report["problems"].append("concurrent: fewer aggregation outcomes than worker packets")
    fabric.remove(job)
    report["frames"] = sum(sum(p["sent"].values()) for p in report["phases"].values())
    report["seconds"] = round(time.monotonic() - t0, 1)
    return report


def print_report(report: dict) -> None:
    print(f"fuzz on {report['target']}: {report['frames']:,} hostile frames from "
          f"{report['hosts']} hosts ({report['workers']} workers), {report['seconds']} s")
    for name, p in report["phases"].items():
        sent = ", ".join(f"{k} {v:,}" for k, v in p["sent"].items())
        outcomes = ", ".join(f"{k} {v:,}" for k, v in p["outcomes"].items() if v)
        total = sum(p["sent"].values())
        rate = f" ({total / p['seconds']:,.0f}/s)" if total else ""
        print(f"  {name:<10} {p['seconds']:6.2f} s  sent: {sent}{rate}; switch "
              f"received {p['received']:,}")
        print(f"  {'':<10} outcomes: {outcomes}")
        if "calls" in p:
            print(f"  {'':<10} {p['calls']} allreduce calls (median {p['median_call_s']} s), "
                  f"exact and identical: {p['exact']}; worker socket errors "
                  f"{p['socket_errors']}, retransmissions {p['retransmissions']}")
    print("every frame accounted for" if not report["problems"]
          else "PROBLEMS:\n  " + "\n  ".join(report["problems"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.worker.fuzz",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=20_000, help="hostile frames per second")
    parser.add_argument("--target", default="softswitch")
    parser.add_argument("--reps", type=int, default=5, help="allreduce calls while under attack")
    parser.add_argument("--size", type=int, default=65_536)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        fabric = Fabric(args.target, 8, Path(tmp)).start()
        try:
            report = campaign(fabric, Path(tmp), frames=args.frames, rate=args.rate,
                              size=args.size, reps=args.reps)
        finally:
            fabric.stop()
    print(json.dumps(report) if args.json else "", end="\n" if args.json else "")
    print_report(report)
    record.write("fuzz", report, params=vars(args), load_before=load)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
