"""Mutation fuzzer over the loader (innet_aggregation/softswitch/frontend/validate.py), the softswitch's trust boundary.

Every scalar of the aggregation program's JSON and of the test programs' is made
wrong in turn: another type (a string carrying C code, a bool, a float, null), negative,
huge, a hostile or over-long string, missing; and every list whose length the
translator relies on (field specs, [header, field] references, error entries, the
format version, lookaheads, primitive and parser-op parameters, const entries' keys,
action data, select keys) one item too short and one too long. Each mutant must be
refused with ValueError or Unsupported in one line that names its JSON path (the
mutated value, what it sits in, or what in it is wrong), or load and forward exactly
like the original, on both backends: the same frames on the same ports, the same
registers and counters, after the same control-plane writes. Anything else (another
exception, a hang) fails.

A mutant the loader accepts is run through the real pipelines when its clean copy
(what the translator reads) differs from the original's, and a sample of those with
the same clean copy are run too; the native backend compiles the distinct C units.
The small programs get every mutant; primitives and aggregation a seeded
sample of a few per kind of scalar (same place in the JSON, same type, same
mutation), which covers every kind (4,836 mutants in all, about half a minute);
``SOFTSWITCH_FUZZ=all`` runs every mutant of every program (about 120,000, about
fifteen minutes).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import re
import signal

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends.native import printer as emit_c
from innet_aggregation.softswitch.frontend import validate
from innet_aggregation.softswitch.backends import load_pipeline
from innet_aggregation.softswitch.backends.native.loader import RUNTIME
from innet_aggregation.softswitch.backends.tables import Entry
from innet_aggregation.softswitch.frontend.validate import Unsupported
from tests.softswitch.conftest import BACKENDS, pipeline, program_files
from tests.softswitch.test_backends_agree import JOB, SERVICE_MAC, WORKERS, install_job
from tests.softswitch.test_header_unions import frames as union_frames
from tests.softswitch.test_p4c_constructs import MUX_CASES
from tests.softswitch.test_p4runtime import ip_frame
from tests.softswitch.test_primitives import frame
from tests.softswitch.test_varbit import frames as varbit_frames
from tests.softswitch.test_varbit_read import frames as varbit_read_frames
from tests.softswitch.test_hash_offset import frames as hash_frames
from tests.softswitch.test_range_optional import frames as range_frames
from tests.softswitch.test_stack_assign import frames as stack_assign_frames
from tests.softswitch.test_union_stacks import frames as union_stack_frames
from tests.softswitch.test_special_ops import frames as special_frames, setup as setup_special_ops

INJECTED = "0; INJECTED_C_CODE(); //"
HOSTILE = 'x"; INJECTED_C_CODE(); //\n#error'
MISSING = object()
NULLABLE = {"next_state", "true_next", "false_next", "base_default_next", "init_table", "mask",
            "if_cond"}      # and the values of next_tables
PER_KIND = {"primitives": 6, "aggregation": 4}     # sampled programs: mutants per kind
RUN_SAME = 2          # accepted mutants with the original's clean copy run per backend
NATIVE_RUNS = 4       # distinct C units compiled per program


# ---------------------------------------------------------------------- programs
def entry(pipe, table: str, action: str, data, values, masks=None, priority=0) -> None:
    widths = [w for _, w, _ in pipe.tables[table].spec.keys]
    masks = masks or tuple((1 << w) - 1 for w in widths)
    aid = next(a for a in pipe.tables[table].spec.action_ids if pipe.actions[a].name == action)
    pipe.tables[table].insert(Entry(tuple(values), tuple(masks), priority, (aid, tuple(data))))


def setup_forwarding(pipe) -> None:
    entry(pipe, "Ing.mac_table", "Ing.forward", [3], [0x020000000009])
    entry(pipe, "Ing.routes", "Ing.route", [2, 0x02AABBCCDDEE], [0x0A000000], [0xFF000000], 8)
    entry(pipe, "Ing.acl", "Ing.set_port", [4], [0x0A000005, 17], [0xFFFFFFFF, 0xFF], 10)
    pipe.groups[1] = [(1, 0), (2, 0), (3, 0)]


def setup_error_key(pipe) -> None:
    for error, port in (("NoError", 2), ("PacketTooShort", 4), ("BadTag", 5)):
        entry(pipe, "Ing.by_error", "Ing.forward", [port], [pipe.errors[error]])


def setup_range_optional(pipe) -> None:
    """A range entry holds its low bound as the value and its high one as the mask."""
    entry(pipe, "Ing.classify", "Ing.route", [1, 0x11], [100, 17, 0x10], [199, 0xff, 0xf0], 9)
    entry(pipe, "Ing.classify", "Ing.to_drop", [], [0, 6, 0], [0xffff, 0xff, 0], 5)
    entry(pipe, "Ing.by_len", "Ing.mark", [0x40], [64], [64], 3)
    entry(pipe, "Ing.by_proto", "Ing.mark", [0x51], [0, 1], [0, 0xff], 2)


def setup_primitives(pipe) -> None:
    pipe.groups[5] = [(1, 0), (2, 3), (4, 1)]


def setup_aggregation(pipe) -> None:
    install_job(pipe, 16)


def hostile(seed: int, good: bytes) -> list:
    rng = random.Random(seed)
    return ([(good[:cut], 1) for cut in (0, 1, 13, 14, 20, len(good) - 1)]
            + [(rng.randbytes(rng.randrange(0, 120)), 2) for _ in range(4)]
            + [(good + bytes(9000), 3), (good + bytes(17000), 1)])


def primitives_frames() -> list:
    rng = random.Random(3)
    out = []
    for op in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16):   # 8 draws randomly
        for _ in range(3):
            words = [rng.choice([0, 1, 5, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                                 rng.getrandbits(32)]) for _ in range(3)]
            shorts = [rng.choice([0, 1, -1, 0x7FFF, -0x8000]) for _ in range(2)]
            out.append((frame(op, words[0], words[1], shorts[0], shorts[1],
                              nib=rng.getrandbits(8), r2=words[2]), rng.choice([0, 1, 5, 511])))
    return out + hostile(3, frame(1, a=40, b=2))


def aggregation_frames() -> list:
    fmt = protocol.packet_format()
    rng = np.random.default_rng(9)
    out = []
    for n in range(6):
        for w in range(WORKERS):
            values = rng.integers(-2**31, 2**31, size=(1, fmt.values_per_packet)).astype(np.int32)
            payload = fmt.pack(values, msg_type=protocol.MsgType.CONTRIBUTION, job_id=JOB,
                               slot=n % 4, set=0, pkt_id=n, exponent=n).tobytes()
            out.append((bytes(Ether(src=f"02:00:00:00:00:{w + 1:02x}", dst=SERVICE_MAC)
                              / IP(src=f"10.0.0.{w + 1}", dst="10.0.0.254")
                              / UDP(sport=40000 + w, dport=protocol.AGG_UDP_PORT_BASE, chksum=0)
                              / payload), w + 1))
    return out + hostile(9, out[0][0])


ETH = bytes.fromhex("020000000009" "020000000001")
PROGRAMS = {
    "forwarding": (setup_forwarding, lambda: [
        (ip_frame(), 1), (ip_frame(dst="10.1.2.3", proto=6, tos=0xB8), 2),
        (ip_frame(src="10.0.0.5", dst="11.0.0.1"), 3), (ip_frame(dst="12.0.0.1", tos=0x20), 1),
        (ETH + b"\x88\xb5" + bytes(40), 1), (b"\x02" * 12 + b"\x88\xb5" + bytes(40), 2),
        *hostile(5, ip_frame())]),
    "error_key": (setup_error_key, lambda: [
        (ETH + b"\x88\xb5" + b"\x01\x02", 1), (ETH + b"\x88\xb5" + b"\xff\x02", 1),
        (ETH + b"\x88\xb5", 2), (ETH + b"\x08\x00" + bytes(30), 1), *hostile(6, ETH + b"\x88\xb5\x01\x02")]),
    "mux_headers": (lambda pipe: None, lambda: [(data, 1) for data, _ in MUX_CASES]
                    + hostile(7, MUX_CASES[3][0])),
    "removed_table": (lambda pipe: None, lambda: [(ETH + b"\x08\x00" + bytes(30), 1),
                                                  *hostile(8, ETH + b"\x08\x00" + bytes(30))]),
    "header_unions": (lambda pipe: None, lambda: [(data, 1) for data in union_frames()]
                      + hostile(10, union_frames()[2])),
    "varbit": (lambda pipe: None, lambda: [(data, 1) for data in varbit_frames()]
               + hostile(11, varbit_frames()[8])),
    "stack_assign": (lambda pipe: None, lambda: [(data, 1) for data in stack_assign_frames()]
                     + hostile(13, stack_assign_frames()[3])),
    "union_stacks": (lambda pipe: None, lambda: [(data, 1) for data in union_stack_frames()]
                     + hostile(14, union_stack_frames()[6])),
    "varbit_read": (lambda pipe: None, lambda: [(data, 1) for data in varbit_read_frames()]
                    + hostile(15, varbit_read_frames()[5])),
    "hash_offset": (lambda pipe: None, lambda: [(data, 1) for data in hash_frames()]
                    + hostile(16, hash_frames()[1])),
    "special_ops": (setup_special_ops, lambda: [(data, 1) for data in special_frames()]
                    + hostile(17, special_frames()[8])),
    "range_optional": (setup_range_optional, lambda: [(data, 1) for data in range_frames()]
                       + hostile(12, range_frames()[30])),
    "primitives": (setup_primitives, primitives_frames),
    "aggregation": (setup_aggregation, aggregation_frames),
}


def json_text(name: str) -> bytes:
    path = protocol.PROGRAM_JSON if name == "aggregation" else program_files(name)[0]
    return path.read_bytes()


def behaviour(pipe, name: str, frames: list):
    """What the program does: every frame's outputs, then every register and counter."""
    PROGRAMS[name][0](pipe)
    out = [sorted(pipe.process(data, port)) for data, port in frames]
    registers = {n: list(r.cells) for n, r in pipe.registers.items()}
    counters = {n: (list(c.packets), list(c.bytes)) for n, c in pipe.counters.items()}
    return out, registers, counters


# ---------------------------------------------------------------------- mutants
def render(path: tuple) -> str:
    """A path the way the loader names it: errors[0][1], pipelines[0].tables[2].name."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def fixed_size(path: tuple) -> bool:
    """Lists whose length the translator relies on (the others are the program itself:
    removing an action or a header from them makes another valid program)."""
    last = path[-1]
    if last in ("version", "value", "target", "action_data", "parameters", "match_key",
                "transition_key"):
        return True
    return isinstance(last, int) and (path[-2] in ("fields", "errors", "field_aliases")
                                      or (len(path) > 2 and path[-3] == "field_aliases"))


def scalar_mutations(value, nullable: bool) -> list:
    """Values of another type; null only where it is not a legal value (there it makes
    another program: no next table, no mask, no condition)."""
    if type(value) is bool:    # 2: an int, and no flag (a signed flag may be written 0 or 1)
        return [("wrong type", "true"), ("wrong type", 2), ("wrong type", None)]
    if type(value) is int:
        return [("wrong type", INJECTED), ("wrong type", True), ("wrong type", float(value)),
                ("negative", -1 - value), ("huge", value + 2**64)]
    if type(value) is str:
        return [("wrong type", 7), ("hostile", HOSTILE), ("huge", "a" * 5000)] + (
            [] if nullable else [("wrong type", None)])
    return [("wrong type", 7), ("wrong type", "x")]        # null


def mutations(doc):
    """(path, kind, new value or MISSING) for every mutant of ``doc``."""
    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, path + (key,))
                if not isinstance(value, (dict, list)):
                    yield path + (key,), "missing", MISSING
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, path + (i,))
            if path and fixed_size(path):
                if node:
                    yield path, "too short", node[:-1]
                yield path, "too long", node + [node[-1] if node else 0]
        if not isinstance(node, (dict, list)):
            nullable = path and (path[-1] in NULLABLE or "next_tables" in path[-2:-1])
            for kind, new in scalar_mutations(node, nullable):
                yield path, kind, new
    yield from walk(doc, ())


def kind_of(doc, path: tuple, kind: str) -> tuple:
    """Mutants of the same kind: same section, same last three keys, same type, same change."""
    value = doc
    for part in path:
        value = value[part]
    keys = tuple(p for p in path if isinstance(p, str))
    return path[0], keys[-3:], type(value).__name__, kind


def chosen(name: str, doc) -> list:
    every = list(mutations(doc))
    per_kind = PER_KIND.get(name)
    if per_kind is None or os.environ.get("SOFTSWITCH_FUZZ") == "all":
        return every
    groups = collections.defaultdict(list)
    for mutant in every:
        groups[kind_of(doc, mutant[0], mutant[1])].append(mutant)
    rng = random.Random(name)
    return [m for key in sorted(groups, key=repr)
            for m in rng.sample(groups[key], min(per_kind, len(groups[key])))]


@contextlib.contextmanager
def mutated(doc, path: tuple, new):
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    before = list(parent.items()) if isinstance(parent, dict) else None
    old = parent[key]
    if new is MISSING:
        del parent[key]
    else:
        parent[key] = new
    try:
        yield
    finally:
        if before is None:
            parent[key] = old
        else:                       # the original order of the keys, too
            parent.clear()
            parent.update(before)


@contextlib.contextmanager
def deadline(seconds: int, what: str):
    def expired(*_):
        raise AssertionError(f"{what} took over {seconds} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def names_path(message: str, path: tuple) -> bool:
    """The refusal is about the mutated value, something inside it or what holds it
    (its first words), or names the mutated value further on."""
    where, mutated_at = message.split(": ", 1)[0], render(path)
    inside = where == mutated_at or where.startswith((mutated_at + ".", mutated_at + "["))
    holder = any(where == render(path[:n]) for n in range(max(len(path) - 2, 1), len(path)))
    named = re.search(rf"(^|\s){re.escape(mutated_at)}($|[:\s.\[(])", message)
    return inside or holder or named is not None


def canon(clean: dict) -> str:
    return json.dumps(clean, sort_keys=True)


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_mutant_is_refused_naming_its_path_or_runs_like_the_original(
        name, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    text = json_text(name)
    frames = PROGRAMS[name][1]()
    doc = json.loads(text)
    original = canon(validate.document(doc))
    expected = {b: behaviour(pipeline(text, b), name, frames) for b in BACKENDS}
    counts = collections.Counter()
    accepted = []            # (label, JSON text, whether its clean copy differs)
    for path, kind, new in chosen(name, doc):
        label = f"{render(path)} {kind} ({validate._short(new) if new is not MISSING else '-'})"
        with mutated(doc, path, new), deadline(20, label):
            try:
                clean = validate.document(doc)
            except (ValueError, Unsupported) as exc:
                message = str(exc)
                assert "\n" not in message and names_path(message, path), (label, message)
                counts["refused"] += 1
                if counts["refused"] % 101 == 1:     # the same through the whole entry point
                    with pytest.raises(type(exc)) as again:
                        load_pipeline(json.dumps(doc), backend="python")
                    assert str(again.value) == message
                continue
            differs = canon(clean) != original
            counts["accepted, clean copy differs" if differs else "accepted, same clean copy"] += 1
            if differs or counts["accepted, same clean copy"] <= RUN_SAME:
                accepted.append((label, json.dumps(doc).encode(), differs))
    units = set()
    for label, mutant, differs in accepted:
        with deadline(120, label):
            assert behaviour(pipeline(mutant, "python"), name, frames) == expected["python"], label
            source = emit_c.emit(frontend.load(mutant), str(RUNTIME))
            if source in units or len(units) >= NATIVE_RUNS:
                continue
            units.add(source)
            assert behaviour(pipeline(mutant, "native"), name, frames) == expected["native"], label
    print(f"{name}: {sum(counts.values())} mutants: {dict(counts)}; ran {len(accepted)} "
          f"on Python, {len(units)} distinct C units natively")
    assert counts["refused"] > 0.5 * sum(counts.values())
