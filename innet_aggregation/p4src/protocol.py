"""The packet format and constants of the P4 program, for every Python component.

Nothing here is a second copy: enums and constants are parsed from
``shared/define.p4`` and ``shared/size.p4``, and the header layout, the number of
values per packet and the pool size are read from the compiled BMv2 JSON. If the
program changes, the controller, the worker and the tests follow.
"""

from __future__ import annotations

import ipaddress
import json
import re
import struct
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from pathlib import Path

import numpy as np

P4SRC_DIR = Path(__file__).resolve().parent
SOURCE_DIR_NAMES = ("shared", "v1model")
BUILD_DIR = P4SRC_DIR / "build"
PROGRAM_NAME = "aggregation"
PROGRAM_JSON = BUILD_DIR / f"{PROGRAM_NAME}.json"
P4INFO = BUILD_DIR / f"{PROGRAM_NAME}.p4info.txtpb"
# The software targets run the program above (256 values per packet) by default. The
# same program is built beside it at Tofino's 64 values per packet, for comparison,
# and at 1024 (4 KiB frames: a jumbo MTU), where links are fast enough that the hosts'
# per-packet cost binds (p4src/README.md, "Packet size").
SMALL_BUILD_DIR = BUILD_DIR / "k64"
SMALL_PROGRAM_JSON = SMALL_BUILD_DIR / f"{PROGRAM_NAME}.json"
SMALL_P4INFO = SMALL_BUILD_DIR / f"{PROGRAM_NAME}.p4info.txtpb"
JUMBO_BUILD_DIR = BUILD_DIR / "k1024"
JUMBO_PROGRAM_JSON = JUMBO_BUILD_DIR / f"{PROGRAM_NAME}.json"
# The Tofino (TNA) build: its P4Info and resource summary only (make p4-tofino).
TNA_BUILD_DIR = P4SRC_DIR / "tna" / "build"
TNA_P4INFO = TNA_BUILD_DIR / f"{PROGRAM_NAME}.p4info.txtpb"


def _read(name: str) -> str:
    return (P4SRC_DIR / "shared" / name).read_text()


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def parse_defines(text: str) -> dict[str, int]:
    """Integer ``#define``s (plain literals only; expressions are not evaluated)."""
    found = {}
    for name, value in re.findall(r"^\s*#define\s+(\w+)\s+(0x[0-9a-fA-F]+|\d+)\s*$",
                                  _strip_comments(text), flags=re.M):
        found[name] = int(value, 0)
    return found


def parse_consts(text: str) -> dict[str, int]:
    """``const <type> NAME = <int>;`` declarations."""
    found = {}
    pattern = r"\bconst\s+[\w<>]+\s+(\w+)\s*=\s*(-?(?:0x[0-9a-fA-F]+|\d+))\s*;"
    for name, value in re.findall(pattern, _strip_comments(text)):
        found[name] = int(value, 0)
    return found


def parse_enums(text: str) -> dict[str, dict[str, int]]:
    """Serializable ``enum bit<N> Name { A = 1, ... }`` blocks."""
    enums = {}
    for name, body in re.findall(r"\benum\s+bit<\d+>\s+(\w+)\s*\{([^}]*)\}",
                                 _strip_comments(text)):
        members = {}
        for member, value in re.findall(r"(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)", body):
            members[member] = int(value, 0)
        enums[name] = members
    return enums


_DEFINE_P4 = _read("define.p4")
_ENUMS = parse_enums(_DEFINE_P4)
_CONSTS = parse_consts(_DEFINE_P4)
_SIZES = parse_defines(_read("size.p4"))

MsgType = IntEnum("MsgType", _ENUMS["MsgType"])
RegisterOp = IntEnum("RegisterOp", _ENUMS["RegisterOp"])
NextStep = IntEnum("NextStep", _ENUMS["NextStep"])
ControlOp = IntEnum("ControlOp", _ENUMS["ControlOp"])
IngressOutcome = IntEnum("IngressOutcome", _ENUMS["IngressOutcome"])
EgressOutcome = IntEnum("EgressOutcome", _ENUMS["EgressOutcome"])

AGG_UDP_PORT_BASE = _CONSTS["AGG_UDP_PORT_BASE"]
AGG_UDP_PORT_MASK = _CONSTS["AGG_UDP_PORT_MASK"]
FLOOD_MCAST_GROUP = _CONSTS["FLOOD_MCAST_GROUP"]
EXPONENT_OF_ZERO = _CONSTS["EXPONENT_OF_ZERO"]
CPU_PORT = _CONSTS["CPU_PORT"]
MAX_WORKERS = _SIZES["MAX_WORKERS"]
MAX_JOBS = _SIZES["MAX_JOBS"]
AGG_UDP_PORTS = range(AGG_UDP_PORT_BASE, AGG_UDP_PORT_BASE + ((~AGG_UDP_PORT_MASK) & 0xFFFF) + 1)


@dataclass(frozen=True)
class Field:
    name: str
    width: int
    signed: bool


@dataclass(frozen=True)
class _Word:
    """Fields that together fill whole bytes, packed as one big-endian integer."""
    fields: tuple[Field, ...]

    @cached_property
    def name(self) -> str:
        return "_".join(f.name for f in self.fields)

    @cached_property
    def width(self) -> int:
        return sum(f.width for f in self.fields)

    @cached_property
    def layout(self) -> tuple[tuple[Field, int, int], ...]:
        """(field, shift, mask) from the most significant field down."""
        out, shift = [], self.width
        for field in self.fields:
            shift -= field.width
            out.append((field, shift, (1 << field.width) - 1))
        return tuple(out)

    @cached_property
    def signed(self) -> bool:
        return len(self.fields) == 1 and self.fields[0].signed

    def dtype(self) -> str:
        return f">{'i' if self.signed else 'u'}{self.width // 8}"


def _words(fields: list[Field]) -> list[_Word]:
    words, pending = [], []
    for field in fields:
        pending.append(field)
        width = sum(f.width for f in pending)
        if width % 8 == 0:
            if width not in (8, 16, 32, 64):
                raise ValueError(f"fields {[f.name for f in pending]} span {width} bits")
            words.append(_Word(tuple(pending)))
            pending = []
    if pending:
        raise ValueError(f"header ends mid-byte after {[f.name for f in pending]}")
    return words


class PacketFormat:
    """Layout of the UDP payload of an aggregation packet, from the compiled program.

    ``dtype`` describes one packet (agg_h then the values), so a whole batch of
    packets is one numpy structured array: packing and unpacking are vectorized.
    """

    def __init__(self, program: dict):
        types = {t["name"]: t for t in program["header_types"]}
        self.header_fields = [Field(n, w, bool(s)) for n, w, s in types["agg_h"]["fields"]]
        value_fields = types["values_h"]["fields"]
        if any(w != 32 for _, w, _ in value_fields):
            raise ValueError("values_h must hold 32-bit values")
        self.values_per_packet = len(value_fields)
        registers = {r["name"]: r["size"] for r in program["register_arrays"]}
        bitmaps = [size for name, size in registers.items() if name.endswith("bitmaps")]
        if len(bitmaps) != 1:
            raise ValueError("expected exactly one bitmaps register in the program")
        self.pool_size = bitmaps[0]
        self._words = _words(self.header_fields)
        self._word_of = {f.name: w for w in self._words for f in w.fields}
        self.header_bytes = sum(w.width for w in self._words) // 8
        # A WAITING reply is the header alone.
        self.header_dtype = np.dtype([(w.name, w.dtype()) for w in self._words])
        self.dtype = np.dtype(self.header_dtype.descr
                              + [("values", ">i4", (self.values_per_packet,))])
        self.payload_bytes = self.dtype.itemsize
        # IPv4 + UDP + one packet: the MTU a link or route must have to carry it whole.
        self.ip_bytes = 20 + 8 + self.payload_bytes

    @classmethod
    def load(cls, path: Path = PROGRAM_JSON) -> "PacketFormat":
        try:
            return cls(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} is missing: run 'make p4' to compile the program") from None

    def pack(self, values: np.ndarray | None = None, *, count: int | None = None,
             **fields) -> np.ndarray:
        """Build packets: ``values`` is (n, values_per_packet) int32, or None for
        ``count`` packets of zeros (for a caller that writes the values in place
        later); each header field is a scalar or an array of n."""
        if values is None:
            if count is None:
                raise ValueError("give values, or count for packets of zeros")
            n = count
        else:
            values = np.asarray(values)
            if values.ndim != 2 or values.shape[1] != self.values_per_packet:
                raise ValueError(f"values must have shape (n, {self.values_per_packet})")
            n = len(values)
        packets = np.zeros(n, dtype=self.dtype)
        if values is not None:
            packets["values"] = values
        self.write_header(packets, **({f.name: 0 for f in self.header_fields} | fields))
        return packets

    def write_header(self, packets: np.ndarray, rows=slice(None), **fields) -> None:
        """Set header fields of ``packets[rows]`` in place; each a scalar or an array
        of the rows' length. Fields that share a word (set and slot) go together."""
        words = []
        for name in fields:
            word = self._word_of.get(name)
            if word is None:
                raise ValueError(f"unknown header field: {name!r}")
            if word not in words:
                words.append(word)
        for word in words:
            acc = np.int64(0)
            for field, shift, mask in word.layout:
                if field.name not in fields:
                    raise ValueError(f"fields {[f.name for f in word.fields]} share a word: "
                                     "give them together")
                acc = acc | ((np.asarray(fields[field.name], dtype=np.int64) & mask) << shift)
            if word.signed:     # the bits as the word's two's complement
                acc = np.where(acc > word.layout[0][2] >> 1, acc - (1 << word.width), acc)
            packets[word.name][rows] = acc

    def word(self, name: str) -> str:
        """The field of ``dtype`` (one big-endian word) that holds header field ``name``."""
        return self._word_of[name].name

    def bits(self, name: str) -> tuple[int, int]:
        """Where header field ``name`` sits in its word (``word``): (shift, mask)."""
        return next((shift, mask) for field, shift, mask in self._word_of[name].layout
                    if field.name == name)

    def unpack(self, packets: np.ndarray, names=None) -> dict[str, np.ndarray]:
        """Header fields of a packet array (all, or the words holding ``names``), as
        int64 arrays (signed fields signed)."""
        out = {}
        wanted = None if names is None else {w.name for n in names if (w := self._word_of.get(n))}
        for word in self._words:
            if wanted is not None and word.name not in wanted:
                continue
            if word.signed:
                out[word.fields[0].name] = packets[word.name].astype(np.int64)
                continue
            raw = packets[word.name].astype(np.int64)
            for field, shift, mask in word.layout:
                value = (raw >> shift) & mask if shift else raw & mask
                if field.signed:
                    value = np.where(value > mask >> 1, value - mask - 1, value)
                out[field.name] = value
        return out

    def decode(self, payload: bytes) -> np.ndarray:
        """View UDP payloads (one packet, or several back to back) as packets; a
        payload of one header alone (a WAITING reply) as that header."""
        if len(payload) == self.header_bytes:
            return np.frombuffer(payload, dtype=self.header_dtype)
        if len(payload) % self.payload_bytes:
            raise ValueError(f"payload of {len(payload)} B is not a whole number of "
                             f"{self.payload_bytes} B packets")
        return np.frombuffer(payload, dtype=self.dtype)


@dataclass(frozen=True)
class Program:
    """One compiled v1model build: its BMv2 JSON and P4Info, and its packet format."""
    json: Path
    p4info: Path

    @cached_property
    def format(self) -> PacketFormat:
        return PacketFormat.load(self.json)

    @cached_property
    def values_per_packet(self) -> int:
        """From the build's manifest (its VALUES_PER_PACKET define) where it names one:
        finding a build by size then parses only that build's JSON (the 1,024-value
        one is 6.6 MB, about 0.2 s), not every build's."""
        manifest = self.json.with_name(f"{PROGRAM_NAME}.manifest.json")
        try:
            defines = json.loads(manifest.read_text()).get("defines", [])
        except (FileNotFoundError, ValueError):
            defines = []
        for define in defines:
            name, _, value = str(define).partition("=")
            if name == "VALUES_PER_PACKET" and value.isdigit():
                return int(value)
        return self.format.values_per_packet


_programs: dict[Path, Program] = {}


def _program(json_path: Path) -> Program:
    if json_path not in _programs:
        _programs[json_path] = Program(json_path, json_path.with_name(f"{PROGRAM_NAME}.p4info.txtpb"))
    return _programs[json_path]


def builds() -> list[Program]:
    """Every committed v1model build, smallest packets first."""
    found = [_program(j) for j in (SMALL_PROGRAM_JSON, PROGRAM_JSON, JUMBO_PROGRAM_JSON)
             if j.exists()]
    return sorted(found, key=lambda b: b.values_per_packet)


def program(values_per_packet: int | None = None) -> Program:
    """The committed build that carries ``values_per_packet`` values per packet (None:
    the library's default, ``PROGRAM_JSON``: 256 values, Ethernet's MTU)."""
    if values_per_packet is None:
        return _program(PROGRAM_JSON)
    for build in builds():
        if build.values_per_packet == values_per_packet:
            if build.format.values_per_packet != values_per_packet:
                raise ValueError(f"{build.json} carries {build.format.values_per_packet} "
                                 f"values per packet, its manifest says {values_per_packet}: "
                                 "run 'make p4'")
            return build
    sizes = ", ".join(str(b.values_per_packet) for b in builds())
    raise ValueError(f"no compiled program carries {values_per_packet} values per packet "
                     f"(the builds here carry {sizes or 'none'}: run 'make p4')")


def values_per_packet_in(register_names) -> int:
    """A program's packet size, from its registers' names (what a P4Info says): one
    register per value on v1model (``value_aggregator.value_I``), one per pair of
    values on TNA (``value_aggregator.pair_I.sums``); 0 if it has neither."""
    names = list(register_names)
    singles = sum(1 for n in names if re.search(r"\.value_aggregator\.value_\d+$", n))
    pairs = sum(1 for n in names if re.search(r"\.value_aggregator\.pair_\d+\.sums$", n))
    return singles + 2 * pairs


def packet_format(values_per_packet: int | None = None) -> PacketFormat:
    """The format of a committed build (loaded once), by its packet size."""
    return program(values_per_packet).format


# The job manager's port proof: a UDP datagram it sends through the switch (PacketOut,
# op SEND_FRAME) to the host a registration claims, out of the port the fabric map
# names; the rank echoes the nonce, so a registration cannot claim a host it is not.
# The tag after the nonce (an HMAC keyed by the registration's own lease token) lets
# the rank tell its own nonce from a forged one or one sent for another registration.
PROOF_MAGIC = b"INA-PORT-PROOF:"
CONTROL_OP_SEND_FRAME = parse_consts(
    (P4SRC_DIR / "v1model" / f"{PROGRAM_NAME}.p4").read_text())["CONTROL_OP_SEND_FRAME"]
PROOF_NONCE_BYTES = 16
PROOF_TAG_BYTES = 16

# Bounded-time aggregation (p4src/shared/deadline.p4): a worker's
# RELEASE of a round, and the switch's RELEASED partial sum, whose fingerprint field
# carries the bitmap of the workers in it; a QUORUM contribution, released once as many
# workers as its `contributions` are in.
_DEADLINE = parse_consts((P4SRC_DIR / "shared" / "deadline.p4").read_text())
MSG_RELEASE = _DEADLINE["MSG_RELEASE"]
MSG_RELEASED = _DEADLINE["MSG_RELEASED"]
MSG_QUORUM = _DEADLINE["MSG_QUORUM"]
# A packet id at most this many rounds behind its (slot, set)'s is stale; one this far
# behind or further counts as newer (and restarts the round).
STALE_ROUNDS = _DEADLINE["STALE_ROUNDS"]


def proof_frame(dst_mac: str, dst_ip: str, dst_port: int, src_mac: str, src_ip: str,
                nonce: bytes, tag: bytes) -> bytes:
    """Ethernet, IPv4 (checksummed) and UDP (no checksum) around the nonce and its tag."""
    payload = PROOF_MAGIC + nonce.hex().encode() + tag.hex().encode()
    udp = struct.pack("!HHHH", dst_port, dst_port, 8 + len(payload), 0) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                         ipaddress.IPv4Address(src_ip).packed,
                         ipaddress.IPv4Address(dst_ip).packed)
    words = sum(struct.unpack("!10H", header))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    header = header[:10] + struct.pack("!H", ~words & 0xFFFF) + header[12:]
    return (bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", ""))
            + b"\x08\x00" + header + udp)


def proof_payload(datagram: bytes) -> tuple[str, str] | None:
    """The nonce and its tag (hex) a proof datagram carries, or None if it is not one."""
    text = datagram[len(PROOF_MAGIC):]
    if (not datagram.startswith(PROOF_MAGIC)
            or len(text) != 2 * (PROOF_NONCE_BYTES + PROOF_TAG_BYTES)):
        return None
    try:
        both = bytes.fromhex(text.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return both[:PROOF_NONCE_BYTES].hex(), both[PROOF_NONCE_BYTES:].hex()
