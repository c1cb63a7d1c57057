"""The native and Python backends give the same bytes for the same frames.

Random operands through every primitive, and random aggregation traffic (values
at the int32 limits, duplicates, retransmissions, stale shadow sets, corrupted
frames) through the real aggregation program with a job installed the same way
in both: every output frame and the registers afterwards must be identical.
"""

from __future__ import annotations

import json
import random
import socket

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch.backends.native.loader import NativePipeline
from innet_aggregation.softswitch.backends.python.pipeline import Pipeline
from innet_aggregation.softswitch.backends.tables import Entry
from tests.softswitch.conftest import program_files
from tests.softswitch.test_primitives import frame

WORKERS, JOB, GROUP = 4, 3, 7
SERVICE_MAC = "02:aa:00:00:00:01"


def both(json_text: bytes):
    return NativePipeline(json_text), Pipeline(json_text)


def agree(pipes, frames) -> int:
    """Frames whose outputs match on both pipelines (all must); how many produced output."""
    produced = 0
    for data, port in frames:
        native, python = (sorted(p.process(data, port)) for p in pipes)
        assert native == python, (data.hex(), port, native, python)
        produced += bool(native)
    return produced


@pytest.mark.parametrize("width", [32, 48])
def test_every_primitive_agrees_on_random_operands(width):
    """Also with its register 48 bits wide: the native backend keeps a register of up
    to 32 bits in 32-bit cells, a wider one in 64."""
    doc = json.loads(program_files("primitives")[0].read_text())
    (reg,) = doc["register_arrays"]
    reg["bitwidth"] = width
    pipes = both(json.dumps(doc).encode())
    for pipe in pipes:
        pipe.groups[5] = [(1, 0), (2, 3), (4, 1)]
    rng = random.Random(3)
    frames = []
    for _ in range(3000):
        op = rng.choice([1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16])   # 8 draws randomly
        words = [rng.choice([0, 1, 5, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, rng.getrandbits(32)])
                 for _ in range(3)]
        shorts = [rng.choice([0, 1, -1, 0x7FFF, -0x8000, rng.randrange(-0x8000, 0x8000)])
                  for _ in range(2)]
        data = frame(op, words[0], words[1], shorts[0], shorts[1], nib=rng.getrandbits(8),
                     r2=words[2], payload=rng.randbytes(rng.randrange(0, 8)))
        frames.append((data, rng.choice([0, 1, 5, 200, 511])))
    assert agree(pipes, frames) > 1000
    for name in pipes[1].registers:
        assert list(pipes[0].registers[name].cells) == list(pipes[1].registers[name].cells)
    for name, spec in pipes[1].counters.items():
        assert list(pipes[0].counters[name].packets) == list(spec.packets)
        assert list(pipes[0].counters[name].bytes) == list(spec.bytes)


def install_job(pipe, pool: int) -> None:
    """The job switch_ctl would install, written straight into the tables."""
    actions = {a.name: a.id for a in pipe.actions.values()}

    def insert(table, key, action, data):
        full = tuple((1 << w) - 1 for _, w, _ in pipe.tables[table].spec.keys)
        pipe.tables[table].insert(Entry(tuple(key), full, 0, (actions[action], tuple(data))))

    insert("AggIngress.job_lookup.jobs", (JOB, protocol.AGG_UDP_PORT_BASE),
           "AggIngress.job_lookup.set_job", (WORKERS, WORKERS, GROUP, 0, pool))
    for i in range(WORKERS):
        ip = int.from_bytes(socket.inet_aton(f"10.0.0.{i + 1}"), "big")
        insert("AggIngress.sender_identification.senders", (i + 1, ip, 40000 + i, JOB),
               "AggIngress.sender_identification.set_sender", (i, 1 << i))
        insert("AggEgress.result_rewrite.workers", (JOB, i),
               "AggEgress.result_rewrite.set_worker_address",
               (0x020000000001 + i, ip, 40000 + i))
    pipe.groups[GROUP] = [(i + 1, i) for i in range(WORKERS)]


def test_aggregation_traffic_agrees_frame_by_frame():
    fmt = protocol.packet_format()
    pipes = both(protocol.PROGRAM_JSON.read_bytes())
    for pipe in pipes:
        install_job(pipe, 16)
    rng = np.random.default_rng(5)
    prng = random.Random(5)
    extremes = np.array([0, 1, -1, 2**31 - 1, -2**31, 2**30, -2**30], dtype=np.int64)
    frames = []
    for n in range(400):
        slot, shadow = n % 16, (n // 16) & 1
        values = rng.choice(extremes, size=(WORKERS, fmt.values_per_packet))
        values = np.where(rng.random(values.shape) < 0.5, values,
                          rng.integers(-2**31, 2**31, size=values.shape)).astype(np.int32)
        order = list(range(WORKERS)) + [prng.randrange(WORKERS)]     # and one duplicate
        prng.shuffle(order)
        for w in order:
            payload = fmt.pack(values[w:w + 1], msg_type=protocol.MsgType.CONTRIBUTION,
                               job_id=JOB, slot=slot, set=shadow ^ (prng.random() < 0.05),
                               pkt_id=n, exponent=int(rng.integers(-128, 128)) & 0xFF
                               ).tobytes()
            data = bytes(Ether(src=f"02:00:00:00:00:{w + 1:02x}", dst=SERVICE_MAC)
                         / IP(src=f"10.0.0.{w + 1}", dst="10.0.0.254")
                         / UDP(sport=40000 + w, dport=protocol.AGG_UDP_PORT_BASE, chksum=0)
                         / payload)
            if prng.random() < 0.03:
                pos = prng.randrange(len(data))
                data = data[:pos] + bytes([prng.getrandbits(8)]) + data[pos + 1:]
            frames.append((data, w + 1))
    assert agree(pipes, frames) > 300
    for name in pipes[1].registers:
        assert list(pipes[0].registers[name].cells) == list(pipes[1].registers[name].cells), name
