"""Run p4c's v1model STF samples on BMv2 and on the embedded switch, driven the same way.

    python tools/stf_samples.py --samples P4C/testdata/p4_16_samples \
        [--targets bmv2,softswitch,softswitch-python] [--jobs 2] [--only PATTERN] \
        [--out results/stf.csv]

Each sample (a .p4 including v1model.p4, with a .stf beside it) is compiled with
p4c-bm2-ss (cached by the hash of its source), and each target is started as a
process (testbed.targets.SwitchProcess) on veth pairs whose host ends sit in
namespaces. The program is pushed and the STF's table entries, defaults, multicast
groups and clone sessions are written over P4Runtime; packets go in and come out of
the host ends on raw sockets. What came out is compared with the STF's expectations
per port, in order, as p4c's own runner (backends/bmv2/bmv2stf.py) does: a port
the STF names nothing for must stay silent, `*` is a don't-care nibble, a trailing
`$` asks for the exact length, otherwise a longer frame matches its prefix.

Outcomes: pass, fail (a wrong, missing or extra packet, each listed), refused (the
switch refused the program; the construct it named), compile-fail,
driver-unsupported (an STF command this driver does not run), error (the run
itself broke). Nothing from p4c is copied: the samples are read where they lie.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import fnmatch
import hashlib
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGETS = ("bmv2", "softswitch", "softswitch-python")
OUTCOMES = ("pass", "fail", "refused", "compile-fail", "driver-unsupported", "error")
COMPILER = "p4c-bm2-ss"
ETH_HLEN = 14

# Commands p4c's runner passes on and this driver runs; the rest are reported, by name.
RUNS = {"add", "setdefault", "packet", "expect", "wait", "mirroring_add", "mc_mgrp_create",
        "mc_node_create", "mc_node_associate", "no_packet"}


class StfError(ValueError):
    """An STF line or value this driver cannot read or map onto the program."""


# ---------------------------------------------------------------------- STF text
@dataclass
class Command:
    kind: str
    line: int
    args: dict = field(default_factory=dict)


_ADD = re.compile(r"^(?P<table>\S+)\s+(?:(?P<prio>\d+)\s+)?(?P<keys>.*?)\s*"
                  r"(?P<action>[A-Za-z_$][\w$.\[\]]*)\s*\((?P<args>[^)]*)\)\s*(?:=\s*\S+)?$")
_ACTION = re.compile(r"^(?P<action>[A-Za-z_$][\w$.\[\]]*)\s*\((?P<args>[^)]*)\)$")


def _pairs(text: str, sep: str) -> list[tuple[str, str]]:
    out = []
    for item in filter(None, (part.strip() for part in text.split(sep))):
        name, colon, value = item.rpartition(":")
        if not colon or not name.strip() or not value.strip():
            raise StfError(f"expected NAME:VALUE, got {item!r}")
        out.append((name.strip(), value.strip()))
    return out


def parse_stf(text: str) -> list[Command]:
    """The STF's commands in order; a command this driver does not run comes back
    as kind ``unsupported:NAME``. A malformed line raises StfError."""
    commands = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        word, _, rest = line.partition(" ")
        word, rest = word.lower(), rest.strip()
        try:
            commands.append(_parse_command(word, rest, number))
        except StfError as exc:
            raise StfError(f"line {number}: {exc}: {raw.strip()!r}") from None
    return commands


def _parse_command(word: str, rest: str, number: int) -> Command:
    if word not in RUNS:
        return Command(f"unsupported:{word}", number, {"text": rest})
    if word in ("packet", "expect"):
        port, _, data = rest.partition(" ")
        if not port.isdigit():
            raise StfError(f"{word} needs a port number")
        data = "".join(data.split())
        exact = data.endswith("$")
        data = data.rstrip("$")
        if not re.fullmatch(r"[0-9a-fA-F*]*", data) or (word == "packet" and "*" in data):
            raise StfError("packet data must be hex digits (expect: and '*')")
        if len(data) % 2:
            raise StfError("packet data has an odd number of hex digits")
        return Command(word, number, {"port": int(port), "data": data.upper(), "exact": exact})
    if word == "add":
        m = _ADD.match(rest)
        if m is None:
            raise StfError("expected add TABLE [PRIORITY] KEY:VALUE... ACTION(ARG:VALUE,...)")
        keys = _pairs(m["keys"].replace(",", " "), " ") if m["keys"].strip() else []
        priority = int(m["prio"]) if m["prio"] else None
        return Command(word, number, {"table": m["table"], "priority": priority,
                                      "keys": keys, "action": m["action"],
                                      "params": _pairs(m["args"], ",")})
    if word == "setdefault":
        table, _, call = rest.partition(" ")
        m = _ACTION.match(call.strip())
        if m is None:
            raise StfError("expected setdefault TABLE ACTION(ARG:VALUE,...)")
        return Command(word, number, {"table": table, "action": m["action"],
                                      "params": _pairs(m["args"], ",")})
    numbers = rest.split()
    if not all(n.isdigit() for n in numbers):
        raise StfError(f"{word} takes numbers")
    numbers = [int(n) for n in numbers]
    wanted = {"mirroring_add": 2, "mc_mgrp_create": 1, "mc_node_associate": 2}.get(word)
    if wanted is not None and len(numbers) != wanted:
        raise StfError(f"{word} takes {wanted} numbers")
    if word == "mc_node_create" and len(numbers) < 2:
        raise StfError("mc_node_create takes a replication id and ports")
    return Command(word, number, {"numbers": numbers})


def parse_int(text: str) -> int:
    """An STF number: decimal, 0x hex or 0b binary."""
    try:
        return int(text, 0) if text.lower().startswith(("0x", "0b", "0o")) else int(text, 10)
    except ValueError:
        raise StfError(f"{text!r} is not a number") from None


def ternary(text: str, width: int) -> tuple[int, int]:
    """(value, mask) as p4c's runner makes them (bmv2stf.makeMask): ``V&&&M``, or a
    hex/binary number whose written digits are cared about and whose `*` digits are
    not (so 0x1 on a 16-bit key cares about the low nibble only), or a decimal
    number, all bits cared about."""
    if "&&&" in text:
        value, mask = (parse_int(part) for part in text.split("&&&", 1))
    elif text[:2].lower() in ("0x", "0b"):
        bits = 4 if text[1] in "xX" else 1
        digits = text[2:]
        value = int(digits.replace("*", "0"), 16 if bits == 4 else 2)
        mask = int("".join("0" if d == "*" else ("F" if bits == 4 else "1") for d in digits),
                   16 if bits == 4 else 2)
    else:
        value, mask = parse_int(text), (1 << width) - 1
    return value & mask, mask


def lpm(text: str) -> tuple[int, int]:
    """(value, prefix length) as bmv2stf.makeLpm: ``V/LEN``, or a number whose
    written non-`*` hex digits make the prefix."""
    if "/" in text:
        value, length = text.split("/", 1)
        return parse_int(value), parse_int(length)
    if text[:2].lower() == "0x":
        digits = text[2:]
        return int(digits.replace("*", "0"), 16), 4 * (len(digits) - digits.count("*"))
    if text[:2].lower() == "0b":
        digits = text[2:]
        return int(digits.replace("*", "0"), 2), len(digits) - digits.count("*")
    value = parse_int(text)
    return value, 4 * len(f"{value:x}")


def match_packet(expected: str, exact: bool, got: bytes, slack: int = 0) -> str | None:
    """None if ``got`` matches the STF expectation (hex with `*` don't-care nibbles;
    ``exact``: the trailing `$`, no longer than expected), else why not
    (testutils.compare_pkt). ``slack``: zero bytes padded onto a short input frame,
    which an exact-length output may carry at its end."""
    received = got.hex().upper()
    tail = received[len(expected):]
    if exact and (len(tail) > 2 * slack or tail.strip("0")):
        return f"too long: {len(received) // 2} bytes, expected {len(expected) // 2}"
    if len(received) < len(expected):
        return f"too short: {len(received) // 2} bytes, expected {len(expected) // 2}"
    for i, nibble in enumerate(expected):
        if nibble != "*" and nibble != received[i]:
            return f"differs at byte {i // 2}"
    return None


def compare(expected: dict[int, list], got: dict[int, list[bytes]],
            slack: int = 0) -> list[str]:
    """Each difference between what the STF expects per port (a list of (data,
    exact), or None: anything goes on that port) and what came out, in order per
    port, as bmv2stf.checkOutputs: a count that differs fails the port."""
    problems = []
    for port in sorted(set(expected) | set(got)):
        want, frames = expected.get(port, []), got.get(port, [])
        if want is None:
            continue
        for i in range(max(len(want), len(frames))):
            if i >= len(frames):
                problems.append(f"port {port} #{i}: missing, expected {want[i][0]}")
            elif i >= len(want):
                problems.append(f"port {port} #{i}: extra packet {frames[i].hex().upper()}")
            else:
                why = match_packet(*want[i], frames[i], slack)
                if why is not None:
                    problems.append(f"port {port} #{i}: wrong packet ({why}): expected "
                                    f"{want[i][0]}{'$' if want[i][1] else ''} got "
                                    f"{frames[i].hex().upper()}")
    return problems


def expectations(commands: list[Command]) -> dict[int, list | None]:
    out: dict[int, list | None] = {}
    for cmd in commands:
        if cmd.kind != "expect":
            continue
        port, data = cmd.args["port"], cmd.args["data"]
        if not data:
            out[cmd.args["port"]] = None          # "expect PORT": anything on it
        elif out.get(port, []) is not None:
            out.setdefault(port, []).append((data, cmd.args["exact"]))
    return out


# ---------------------------------------------------------------------- samples, compiling
def is_v1model(p4: Path) -> bool:
    return bool(re.search(r'#include\s*[<"]v1model\.p4[>"]', p4.read_text(errors="replace")))


def find_samples(directory: Path, only: str | None = None) -> list[Path]:
    """The v1model programs with an .stf beside them, by path under ``directory``;
    ``only``: comma-separated globs on the name or path."""
    globs = only.split(",") if only else ["*"]
    found = []
    for stf in sorted(directory.rglob("*.stf")):
        p4 = stf.with_suffix(".p4")
        names = (str(p4.relative_to(directory)), p4.stem)
        if p4.exists() and any(fnmatch.fnmatch(n, g) for n in names for g in globs) \
                and is_v1model(p4):
            found.append(p4)
    return found


def compile_sample(p4: Path, cache: Path) -> tuple[Path, Path] | str:
    """(JSON, P4Info) from p4c-bm2-ss, cached by the hash of the source (and the
    local files it includes); or the compiler's error, in a line."""
    digest = hashlib.sha256(p4.read_bytes())
    for inc in re.findall(r'#include\s*"([^"]+)"', p4.read_text(errors="replace")):
        if (p4.parent / inc).exists():
            digest.update((p4.parent / inc).read_bytes())
    out = cache / f"{p4.stem}-{digest.hexdigest()[:16]}"
    json_path, info_path, failed = out / "prog.json", out / "prog.p4info.txtpb", out / "failed"
    if failed.exists():
        return failed.read_text()
    if json_path.exists() and info_path.exists():
        return json_path, info_path
    scratch = Path(tempfile.mkdtemp(dir=cache))
    result = subprocess.run([COMPILER, "--arch", "v1model", "--std", "p4-16", "-I", str(p4.parent),
                             "-o", str(scratch / "prog.json"),
                             "--p4runtime-files", str(scratch / "prog.p4info.txtpb"), str(p4)],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0 or not (scratch / "prog.json").exists():
        lines = [ln for ln in result.stderr.splitlines() if "rror" in ln] or \
            result.stderr.splitlines()[-1:] or [f"exit {result.returncode}"]
        (scratch / "failed").write_text(lines[0][:300])
    try:
        scratch.rename(out)
    except OSError:                                 # another job compiled it meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    return compile_sample(p4, cache)


# ---------------------------------------------------------------------- P4Runtime entities
class Program:
    """The P4Info, and STF names resolved against it the way bmv2stf resolves them
    against the JSON: the full name, else the one name ending in ``.NAME``."""

    def __init__(self, info):
        self.info = info
        self.tables = {t.preamble.name: t for t in info.tables}
        self.actions = {a.preamble.id: a for a in info.actions}

    @staticmethod
    def _pick(names: list[str], name: str, what: str) -> str:
        if name in names:
            return name
        for suffix in ("." + name, name):
            found = [n for n in names if n.endswith(suffix)]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise StfError(f"{what} {name} is ambiguous: {', '.join(found)}")
        raise StfError(f"no {what} {name}")

    def table(self, name: str):
        return self.tables[self._pick(list(self.tables), name, "table")]

    def action(self, table, name: str):
        ids = [ref.id for ref in table.action_refs]
        by_name = {self.actions[i].preamble.name: self.actions[i] for i in ids}
        return by_name[self._pick(list(by_name), name, f"action of {table.preamble.name}")]

    @staticmethod
    def key(table, name: str):
        """A match field by the STF's name (bmv2stf.TableKeyInstance.set)."""
        name = re.sub(r"\$([0-9]+)", r"[\1]", name)
        fields = {f.name: f for f in table.match_fields}
        for candidate in (name, name + "$", name + ".$valid$",
                          name[:-5] + "$valid$" if name.endswith(".valid") else None):
            if candidate in fields:
                return fields[candidate]
        found = [f for n, f in fields.items()
                 if n.endswith("." + name) or n.endswith("." + name + "$")
                 or (name == "valid" and n.endswith("$valid$"))]
        if len(found) == 1:
            return found[0]
        raise StfError(f"no key {name} in table {table.preamble.name} "
                       f"(keys: {', '.join(fields)})")


def encode(value: int, width: int, what: str) -> bytes:
    """P4Runtime's canonical bytes for ``value`` in ``width`` bits."""
    if not 0 <= value < (1 << width):
        raise StfError(f"{what}: {value:#x} does not fit in {width} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def table_entry(program: Program, cmd: Command):
    """The p4.v1.TableEntry for an STF ``add`` or ``setdefault``."""
    from finsy.proto import p4i, p4r

    table = program.table(cmd.args["table"])
    action = program.action(table, cmd.args["action"])
    entry = p4r.TableEntry(table_id=table.preamble.id)
    params = {p.name: p for p in action.params}
    act = entry.action.action
    act.action_id = action.preamble.id
    given = dict(cmd.args["params"])
    if set(given) != set(params):
        raise StfError(f"{action.preamble.name} takes ({', '.join(params)}), given "
                       f"({', '.join(given)})")
    for name, param in params.items():
        act.params.add(param_id=param.id, value=encode(parse_int(given[name]), param.bitwidth,
                                                       f"{action.preamble.name}({name})"))
    if cmd.kind == "setdefault":
        entry.is_default_action = True
        return entry
    MF = p4i.MatchField
    kinds = {f.id: f.match_type for f in table.match_fields}
    values = {}
    for name, text in cmd.args["keys"]:
        values[program.key(table, name).id] = text
    for f in table.match_fields:
        text = values.get(f.id)
        what = f"{table.preamble.name} key {f.name}"
        if f.match_type == MF.EXACT:
            entry.match.add(field_id=f.id).exact.value = encode(
                parse_int(text) if text is not None else 0, f.bitwidth, what)
        elif text is None:
            continue                                 # ternary, LPM, range, optional: don't care
        elif f.match_type == MF.TERNARY:
            value, mask = ternary(text, f.bitwidth)
            if mask:
                m = entry.match.add(field_id=f.id).ternary
                m.value, m.mask = encode(value, f.bitwidth, what), encode(mask, f.bitwidth, what)
        elif f.match_type == MF.LPM:
            value, length = lpm(text)
            if length:
                keep = ((1 << f.bitwidth) - 1) ^ ((1 << (f.bitwidth - length)) - 1)
                m = entry.match.add(field_id=f.id).lpm
                m.value, m.prefix_len = encode(value & keep, f.bitwidth, what), length
        elif f.match_type == MF.RANGE:
            lo, _, hi = text.partition("->")
            m = entry.match.add(field_id=f.id).range
            m.low = encode(parse_int(lo), f.bitwidth, what)
            m.high = encode(parse_int(hi or lo), f.bitwidth, what)
        elif f.match_type == MF.OPTIONAL:
            if "*" not in text:
                entry.match.add(field_id=f.id).optional.value = encode(parse_int(text),
                                                                       f.bitwidth, what)
        else:
            raise StfError(f"{what}: match kind {f.match_type} not run by this driver")
    if any(k in (MF.TERNARY, MF.RANGE, MF.OPTIONAL) for k in kinds.values()):
        # STF: the higher wins (bmv2stf writes 10000 - p for BMv2's lower-wins); P4Runtime
        # also says the higher wins, and wants it above 0.
        entry.priority = (cmd.args["priority"] or 0) + 1
    return entry


# ---------------------------------------------------------------------- frames
SOL_PACKET, PACKET_AUXDATA = 263, 8
TP_STATUS_VLAN_VALID, TP_STATUS_VLAN_TPID_VALID = 0x10, 0x40


def receive(sock: socket.socket) -> bytes | None:
    """A frame the host end received (None for one it sent), with the VLAN tag the
    kernel took off put back from PACKET_AUXDATA, as libpcap does for BMv2."""
    data, ancillary, _, addr = sock.recvmsg(65536, socket.CMSG_SPACE(20))
    if addr[2] == socket.PACKET_OUTGOING:
        return None
    for level, kind, payload in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(payload) >= 20:
            status, _, _, _, _, tci, tpid = struct.unpack("IIIHHHH", payload[:20])
            if status & TP_STATUS_VLAN_VALID:
                tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID else 0x8100
                data = data[:12] + struct.pack("!HH", tpid, tci) + data[12:]
    return data


class Wires:
    """The host ends of the switch's ports, and what came out of each."""

    def __init__(self, topo, port_of_host: dict[int, int]):
        self.socks = {}
        for host in topo.hosts:
            sock = host.raw_socket()
            sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
            self.socks[port_of_host[host.index]] = sock
        self.got: dict[int, list[bytes]] = defaultdict(list)

    def drain(self) -> None:
        for sock in self.socks.values():
            while select.select([sock], [], [], 0)[0]:
                sock.recv(65536)

    def send(self, port: int, data: bytes) -> None:
        self.socks[port].send(data)

    def settle(self, want: int, patience: float, quiet: float) -> None:
        """Collect until ``want`` frames have come in all (or ``patience`` s passed),
        then until ``quiet`` s pass without one."""
        port_of = {sock: port for port, sock in self.socks.items()}
        deadline = time.monotonic() + patience
        while True:
            count = sum(map(len, self.got.values()))
            wait = quiet if count >= want else max(deadline - time.monotonic(), quiet)
            ready, _, _ = select.select(list(port_of), [], [], wait)
            if not ready:
                return
            for sock in ready:
                frame = receive(sock)
                if frame is not None:
                    self.got[port_of[sock]].append(frame)

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()


# ---------------------------------------------------------------------- one run
@dataclass
class Result:
    sample: str
    target: str
    outcome: str
    detail: str = ""
    construct: str = ""
    native_fallback: str = ""
    padded: bool = False
    seconds: float = 0.0


REFUSALS = [   # (construct, pattern in the switch's refusal), first match wins
    ("wider than 64 bits", r"up to 64|more than 64 bits|fit in 64 bits"),
    ("varbit fields", r"variable-length|varbit|\[name, bitwidth, signed\], got 2 items"),
    ("header stack element by a computed index",
     r"parameters\[0\]\.type: expected 'field', got 'expression'"),
    ("header unions", r"\bunion"),
    ("header stacks", r"header stack|stack"),
    ("clone", r"\bclone"),
    ("resubmit", r"\bresubmit"),
    ("recirculate", r"\brecirculate"),
    ("range match", r"'range'|\brange (match|entry)"),
    ("meters", r"\bmeters?\b|execute_meter"),
    ("action profiles/selectors", r"action.profile|selector|indirect"),
    ("digests", r"\bdigest|generate_digest|\blearn"),
    ("parser value sets", r"value.set"),
    ("hash-based offset primitive", r"hash_based_offset"),
    ("hash algorithm", r"hash algorithm"),
    ("checksum", r"checksum"),
    ("extern instances", r"\bextern"),
    ("loops in actions", r"_jump"),
]


def construct_of(message: str) -> str:
    """The construct a refusal names: a known family, else the message less its JSON path."""
    for name, pattern in REFUSALS:
        if re.search(pattern, message, re.I):
            return name
    message = re.sub(r"^unsupported P4 program: ", "", message)
    return re.sub(r"^[\w\[\].$]+: ", "", message)[:80]


def run_sample(name: str, files: tuple[Path, Path], commands: list[Command], target: str,
               logs: Path, pad: bool = True, io_threads: int | None = None) -> Result:
    from finsy import P4CloneSessionEntry
    from finsy.proto import p4i, p4r
    from google.protobuf import text_format

    from innet_aggregation.switch_ctl.client import (P4MulticastGroupEntry, P4RuntimeError,
                                                     SwitchConnection)
    from innet_aggregation.testbed.netns import Namespaces, _run
    from innet_aggregation.testbed.targets import SwitchProcess

    started = time.monotonic()
    result = Result(name, target, "error")
    ports = sorted({c.args["port"] for c in commands if c.kind in ("packet", "expect")})
    if not ports:
        ports = [0]
    program = Program(text_format.Parse(files[1].read_text(), p4i.P4Info()))
    log_path = logs / f"{name.replace('/', '_')}.{target}.log"
    topo = Namespaces(len(ports))
    try:
        topo.create()
        for host in topo.hosts:       # no address: the hosts' kernels answer nothing
            _run("ip", "netns", "exec", host.netns, "ip", "addr", "flush", "dev", host.ifname)
        port_of_host = {host.index: port for host, port in zip(topo.hosts, ports)}
        switch_ports = {port_of_host[h.index]: h.switch_ifname for h in topo.hosts}
        with SwitchProcess(target, switch_ports, log_path=log_path,
                           io_threads=io_threads) as switch:
            conn = SwitchConnection(switch.grpc_addr).connect()
            wires = Wires(topo, port_of_host)
            try:
                try:
                    conn.push_pipeline(files[0], files[1])
                except ValueError:
                    pass    # finsy's schema refuses the P4Info (a name twice); the switch has it
                except P4RuntimeError as exc:
                    message = str(exc).partition(": ")[2] or str(exc)
                    result.outcome, result.detail = "refused", message[:300]
                    result.construct = construct_of(message)
                    return result
                result.native_fallback = _fallback(log_path) if target == "softswitch" else ""
                time.sleep(0.3)
                wires.drain()
                patience, quiet = (3.0, 0.6) if target == "bmv2" else (2.0, 0.3)
                sent_since_write, expected_so_far, slack = False, 0, 0
                groups: dict[int, list[int]] = {}
                nodes: dict[int, tuple[int, list[int]]] = {}
                for cmd in commands:
                    if cmd.kind in ("add", "setdefault", "mirroring_add", "mc_node_associate") \
                            and sent_since_write:
                        wires.settle(expected_so_far, patience, quiet / 2)
                        sent_since_write = False
                    if cmd.kind == "packet":
                        data = bytes.fromhex(cmd.args["data"])
                        if len(data) < ETH_HLEN:
                            # p4c's runner writes pcap files; no Ethernet link carries a
                            # frame this short, so it goes padded with zeros (the CSV says so).
                            if not pad:
                                raise StfError(f"line {cmd.line}: packet shorter than "
                                               f"{ETH_HLEN} bytes (--pad-short sends it padded)")
                            slack = max(slack, ETH_HLEN - len(data))
                            data, result.padded = data.ljust(ETH_HLEN, b"\0"), True
                        wires.send(cmd.args["port"], data)
                        sent_since_write = True
                    elif cmd.kind == "expect":
                        expected_so_far += bool(cmd.args["data"])
                    elif cmd.kind == "wait":
                        wires.settle(expected_so_far, patience, quiet)
                    elif cmd.kind in ("add", "setdefault"):
                        entity = p4r.Entity(table_entry=table_entry(program, cmd))
                        conn.write(p4r.Update.INSERT if cmd.kind == "add" else p4r.Update.MODIFY,
                                   [entity])
                    elif cmd.kind == "mirroring_add":
                        session, port = cmd.args["numbers"]
                        conn.insert(P4CloneSessionEntry(session, replicas=[(port, 0)]))
                    elif cmd.kind == "mc_mgrp_create":
                        groups[cmd.args["numbers"][0]] = []
                    elif cmd.kind == "mc_node_create":
                        rid, *node_ports = cmd.args["numbers"]
                        nodes[len(nodes)] = (rid, node_ports)   # handles count from 0, as BMv2's
                    elif cmd.kind == "mc_node_associate":
                        group, handle = cmd.args["numbers"]
                        if group not in groups or handle not in nodes:
                            raise StfError(f"line {cmd.line}: no group {group} or node {handle}")
                        update = conn.modify if groups[group] else conn.insert
                        groups[group].append(handle)
                        rid_ports = [(p, nodes[h][0]) for h in groups[group] for p in nodes[h][1]]
                        update(P4MulticastGroupEntry(group, replicas=rid_ports))
                wires.settle(expected_so_far, patience, quiet)
                problems = compare(expectations(commands), dict(wires.got), slack)
                result.outcome = "fail" if problems else "pass"
                result.detail = "; ".join(problems)
            finally:
                wires.close()
                conn.close()
    except StfError as exc:
        result.outcome, result.detail = "driver-unsupported", str(exc)[:300]
    except Exception as exc:        # the run broke: say so in the table, go on with the rest
        result.outcome, result.detail = "error", f"{type(exc).__name__}: {exc}"[:300]
    finally:
        topo.destroy()
        result.seconds = round(time.monotonic() - started, 2)
    return result


def _fallback(log_path: Path) -> str:
    """Why the native target runs this program on Python ("" if it does not)."""
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    m = re.search(r"native backend: (.*); running this program on the Python backend", text)
    return m.group(1)[:200] if m else ""


def run_one(p4: Path, samples: Path, targets: list[str], cache: Path, logs: Path,
            pad: bool, io_threads: int | None = None) -> list[Result]:
    name = str(p4.relative_to(samples).with_suffix(""))
    files = compile_sample(p4, cache)
    if isinstance(files, str):
        return [Result(name, t, "compile-fail", files) for t in targets]
    try:
        commands = parse_stf(p4.with_suffix(".stf").read_text(errors="replace"))
    except StfError as exc:
        return [Result(name, t, "driver-unsupported", str(exc)) for t in targets]
    unsupported = sorted({c.kind.partition(":")[2] for c in commands
                          if c.kind.startswith("unsupported:")})
    if unsupported:
        return [Result(name, t, "driver-unsupported", "STF command " + ", ".join(unsupported),
                       construct=",".join(unsupported)) for t in targets]
    return [run_sample(name, files, commands, t, logs, pad, io_threads) for t in targets]


# ---------------------------------------------------------------------- summary
def summary(results: list[Result], targets: list[str]) -> str:
    by = {(r.sample, r.target): r for r in results}
    samples = sorted({r.sample for r in results})
    lines = [f"{len(samples)} v1model samples with an STF"]
    for target in targets:
        counts = Counter(by[s, target].outcome for s in samples)
        lines.append(f"  {target:18} "
                     + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES if counts[o]))
    if "bmv2" not in targets:
        return "\n".join(lines)
    passing = [s for s in samples if by[s, "bmv2"].outcome == "pass"]
    padded = {r.sample for r in results if r.padded}
    unpadded = [s for s in passing if s not in padded]
    lines.append(f"BMv2 passes {len(passing)} ({len(passing) - len(unpadded)} of them with "
                 f"frames shorter than 14 bytes sent padded); of those:")
    for target in targets:
        if target == "bmv2":
            continue
        counts = Counter(by[s, target].outcome for s in passing)
        ok = counts["pass"]
        share = f"{100 * ok / len(passing):.1f} %" if passing else "-"
        ok_unpadded = sum(by[s, target].outcome == "pass" for s in unpadded)
        line = f"  {target:18} pass {ok} ({share}; {ok_unpadded} of the {len(unpadded)} unpadded)"
        if target == "softswitch":
            fell = [s for s in passing if by[s, target].native_fallback and
                    by[s, target].outcome == "pass"]
            line += f", of which {ok - len(fell)} in C and {len(fell)} on the Python fallback"
        lines.append(line + "; "
                     + ", ".join(f"{o} {counts[o]}" for o in OUTCOMES[1:] if counts[o]))
        refusals = defaultdict(list)
        for s in passing:
            if by[s, target].outcome == "refused":
                refusals[by[s, target].construct].append(s)
        for construct, names in sorted(refusals.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"      refused {len(names):3}  {construct}: {', '.join(names)}")
        fallbacks = defaultdict(list)
        for s in passing:
            if by[s, target].native_fallback and by[s, target].outcome == "pass":
                fallbacks[construct_of(by[s, target].native_fallback)].append(s)
        for construct, names in sorted(fallbacks.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"      C refused, passed on Python {len(names):3}  {construct}: "
                         f"{', '.join(names)}")
    wrong = [(s, t) for s in passing for t in targets
             if t != "bmv2" and by[s, t].outcome == "fail"]
    lines.append(f"WRONG/MISSING/EXTRA packets where BMv2 passes: {len(wrong)}")
    for s, t in wrong:
        lines.append(f"  {s} on {t}: {by[s, t].detail}")
    other = [(s, t) for s in passing for t in targets
             if t != "bmv2" and by[s, t].outcome == "error"]
    for s, t in other:
        lines.append(f"  error: {s} on {t}: {by[s, t].detail}")
    return "\n".join(lines)


def figures(results: list[Result], targets: list[str]) -> dict:
    """The record's figures: each switch's outcomes over every sample, and over those
    BMv2 passes (the ones a second target is measured against)."""
    by = {(r.sample, r.target): r for r in results}
    samples = sorted({r.sample for r in results})
    passing = [s for s in samples if ("bmv2" not in targets or by[s, "bmv2"].outcome == "pass")]
    out = {"samples": len(samples), "bmv2_passes": len(passing) if "bmv2" in targets else None,
           "targets": {}}
    for target in targets:
        mine = [by[s, target] for s in passing]
        out["targets"][target] = {
            "outcomes": {o: n for o, n in Counter(by[s, target].outcome for s in samples).items()},
            "pass_where_bmv2_passes": sum(r.outcome == "pass" for r in mine),
            "python_fallback": sum(bool(r.native_fallback) and r.outcome == "pass" for r in mine),
            "wrong_where_bmv2_passes": sum(r.outcome == "fail" for r in mine)}
    return out


def read_csv(path: Path) -> list[Result]:
    with open(path, newline="") as f:
        return [Result(row["sample"], row["target"], row["outcome"], row["detail"],
                       construct_of(row["detail"]) if row["outcome"] == "refused"
                       else row["construct"], row["native_fallback"], row["padded"] == "yes",
                       float(row["seconds"])) for row in csv.DictReader(f)]


def compiler_version() -> str:
    """The compiler's own version line, for the record: the outcomes depend on it."""
    out = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((out.stdout or out.stderr).split())


def main(argv: list[str] | None = None) -> int:
    from innet_aggregation.softswitch.dataplane import io_threads_argument

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=Path,
                        help="p4c's testdata/p4_16_samples (read in place, nothing copied)")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated, from {', '.join(TARGETS)} (default all)")
    parser.add_argument("--jobs", type=int, default=2, help="samples run at once (default 2)")
    parser.add_argument("--only",
                        help="comma-separated globs on the sample's name or path (e.g. 'issue*')")
    parser.add_argument("--io-threads", type=io_threads_argument, default=None, metavar="N",
                        help="the embedded switch's lanes (default: its own choice)")
    parser.add_argument("--out", type=Path, default=Path("results/stf.csv"), help="CSV written")
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "stf-samples-cache",
                        help="compiled samples, by hash of their source")
    parser.add_argument("--pad-short", action=argparse.BooleanOptionalAction, default=True,
                        help="send frames shorter than 14 bytes padded with zeros (default), "
                             "else count their samples as driver-unsupported")
    parser.add_argument("--report", type=Path, metavar="CSV",
                        help="only print the summary of an earlier run's CSV")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    if args.report is not None:
        results = read_csv(args.report)
        print(summary(results, [t for t in TARGETS if any(r.target == t for r in results)]))
        return 0
    if bad := [t for t in targets if t not in TARGETS]:
        parser.error(f"unknown target(s) {', '.join(bad)}; choose from {', '.join(TARGETS)}")
    if args.samples is None or not args.samples.is_dir():
        parser.error(f"--samples: {args.samples} is not a directory (p4c's "
                     f"testdata/p4_16_samples)")
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces)")
    if shutil.which(COMPILER) is None:
        parser.error(f"{COMPILER} is not on PATH")
    samples = find_samples(args.samples.resolve(), args.only)
    if not samples:
        parser.error("no v1model sample with an .stf matches")
    args.cache.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    logs = Path(tempfile.mkdtemp(prefix="stf-logs-"))
    results: list[Result] = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(run_one, p4, args.samples.resolve(), targets, args.cache, logs,
                               args.pad_short, args.io_threads): p4
                   for p4 in samples}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            for r in future.result():
                results.append(r)
                print(f"[{done}/{len(samples)}] {r.sample} {r.target}: {r.outcome}"
                      f"{' (' + r.detail[:150] + ')' if r.detail else ''}", flush=True)
    results.sort(key=lambda r: (r.sample, targets.index(r.target)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sample", "target", "outcome", "construct", "native_fallback",
                         "padded", "seconds", "detail"])
        for r in results:
            writer.writerow([r.sample, r.target, r.outcome, r.construct, r.native_fallback,
                             "yes" if r.padded else "", r.seconds, r.detail])
    print(summary(results, targets))
    print(f"CSV: {args.out}; switch logs: {logs}")
    from innet_aggregation.experiments import record
    record.write("p4c-samples", figures(results, targets),
                 params={"samples": str(args.samples), "targets": targets, "pad_short": args.pad_short,
                         "jobs": args.jobs, "only": args.only, "compiler": compiler_version()},
                 load_before=load, out=args.out.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
