"""The native backend: build the C unit of a program, load it, drive it from Python.

``NativePipeline`` has the interface p4runtime.py and dataplane.py use on the
Python ``Pipeline`` (tables, registers, counters, groups, lock, process), but
every table, register, counter and group lives in C and the packet loop runs on a
C thread that never holds the GIL. Shared objects are cached by a hash of the
JSON, the emitter and runtime sources and the compiler, so a program is compiled
once per machine.
"""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

from innet_aggregation import cbuild
from innet_aggregation.cbuild import cache_dir, compiler  # noqa: F401 (the tests' names)
from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends.native import printer as emit_c
from innet_aggregation.softswitch.frontend import DROP_PORT, prepared, shards
from innet_aggregation.softswitch.backends.tables import Entry, TableEntries

HERE = Path(__file__).resolve().parent
# ss_io_stats' counters, in its order: frames received (own sends skipped), sent,
# dropped by the switch (over-long, an aborted pass, the pass limit), failed sends,
# failed asserts; and frames lost outside the pipeline: by the receive rings (the
# kernel's tp_drops), for want of a send slot (a multicast of more copies than the
# send stage holds), to a port or multicast group the switch does not have.
IO_COUNTERS = ("received", "sent", "dropped", "send_errors", "asserts", "ring_drops",
               "no_room", "no_port")
MAX_IO_THREADS = 16      # runtime.c's SS_MAXLANES
RUNTIME = HERE / "runtime.c"
c_u64p = ctypes.POINTER(ctypes.c_uint64)


class NativeUnavailable(Exception):
    """The native backend cannot run this program here; the message says why."""


def _generator_sources() -> list[Path]:
    """Every file the C unit is a function of, besides the JSON and the drop port: the
    front end, this backend's printer (printer.py, packet.py, literals.py), this loader,
    and the runtime (runtime.c and the files it includes)."""
    return (sorted(Path(frontend.__file__).parent.glob("*.py")) + sorted(HERE.glob("*.py"))
            + sorted(HERE.glob("*.c")))


def build(json_text: bytes, drop_port: int, print_unit) -> Path:
    """The shared object for the program, taken from the cache or printed and compiled
    now. The key is the printer's inputs, so a program met before is not printed again."""
    key = (json_text, str(drop_port).encode(),
           *(path.read_bytes() for path in _generator_sources()))
    try:
        return cbuild.shared_object("pipeline", key, print_unit, libs=("-lpthread",))
    except cbuild.BuildUnavailable as exc:
        raise NativeUnavailable(str(exc)) from None


def _load(so: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(so))
    P, I, U32, U64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    sigs = {
        "ss_new": (P, [U32, U64]),
        "ss_lock": (None, [P]), "ss_unlock": (None, [P]),
        "ss_tbl_add": (ctypes.c_int32, [P, I, c_u64p, c_u64p, ctypes.c_int32, ctypes.c_int32,
                                        c_u64p]),
        "ss_tbl_set_action": (None, [P, I, ctypes.c_int32, ctypes.c_int32, c_u64p]),
        "ss_tbl_del": (None, [P, I, ctypes.c_int32]),
        "ss_tbl_default": (None, [P, I, ctypes.c_int32, c_u64p]),
        "ss_tbl_counter": (None, [P, I, ctypes.c_int32, c_u64p, I]),
        "ss_reg_get": (U64, [P, I, U32]), "ss_reg_set": (None, [P, I, U32, U64]),
        "ss_ctr_get": (U64, [P, I, U32, I]), "ss_ctr_set": (None, [P, I, U32, I, U64]),
        "ss_group_set": (None, [P, U32, I, ctypes.POINTER(ctypes.c_uint16),
                                ctypes.POINTER(ctypes.c_uint16)]),
        "ss_session_set": (None, [P, U32, I, ctypes.POINTER(ctypes.c_uint16),
                                  ctypes.POINTER(ctypes.c_uint16)]),
        "ss_process": (I, [P, ctypes.c_char_p, U32, U32]),
        "ss_output": (ctypes.POINTER(ctypes.c_uint8), [P, I, ctypes.POINTER(U32),
                                                       ctypes.POINTER(U32)]),
        "ss_io_start": (I, [P, I, ctypes.POINTER(I), ctypes.POINTER(I), ctypes.POINTER(I), I, I]),
        "ss_io_tx": (I, [P, I]),
        "ss_io_stop": (None, [P]),
        "ss_io_stats": (None, [P, c_u64p]),
        "ss_free": (None, [P]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _u64s(values) -> ctypes.Array:
    arr = (ctypes.c_uint64 * max(len(values), 1))()
    for i, v in enumerate(values):
        arr[i] = v & 0xFFFFFFFFFFFFFFFF
    return arr


def _fits(spec, value: int) -> int:
    """A register cell's new value, refused if its width cannot hold it (C keeps a
    register of up to 32 bits in 32-bit cells)."""
    if not 0 <= value < 1 << spec.width:
        raise ValueError(f"register {spec.name}: {value} does not fit its {spec.width} bits")
    return value


class _Context:
    """The C state of one pipeline; freed when nothing refers to it any more (every
    view below holds this object, not the bare pointer)."""

    def __init__(self, lib, drop_port: int):
        self.lib = lib
        self.ctx = lib.ss_new(drop_port, random.getrandbits(64))
        if not self.ctx:
            raise NativeUnavailable("cannot allocate the program's tables, registers and "
                                    "counters")

    def __del__(self):
        if getattr(self, "ctx", None):
            self.lib.ss_free(self.ctx)


class _Lock:
    """``with pipeline.lock``: the control plane's hold (recursive): while it is held, no
    data-plane batch runs, so a multi-call read or write is seen whole."""

    def __init__(self, c: _Context):
        self.c = c

    def __enter__(self):
        self.c.lib.ss_lock(self.c.ctx)

    def __exit__(self, *exc):
        self.c.lib.ss_unlock(self.c.ctx)


class _Cells:
    """A register's or counter's cells as a sequence; each access goes to C."""

    def __init__(self, size, get, put):
        self.size, self.get, self.put = size, get, put

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if not 0 <= i < self.size:
            raise IndexError(i)
        return self.get(i)

    def __setitem__(self, i, value):
        if not 0 <= i < self.size:
            raise IndexError(i)
        self.put(i, value)

    def __iter__(self):
        return (self.get(i) for i in range(self.size))

    def __eq__(self, other):
        return list(self) == list(other)


class _DirectCounter:
    """An entry's direct counter, [packets, bytes], kept in C."""

    def __init__(self, table, handle):
        self.table, self.handle = table, handle

    def _io(self, values=None):
        buf = _u64s(values or [0, 0])
        c = self.table.c
        c.lib.ss_tbl_counter(c.ctx, self.table.index, self.handle, buf, int(values is not None))
        return [buf[0], buf[1]]

    def __iter__(self):
        return iter(self._io())

    def __getitem__(self, i):
        return self._io()[i]

    def __setitem__(self, i, value):
        current = self._io()
        current[i] = value
        self._io(current)


class _Spec:
    """A register or counter as p4runtime.py reads it: name, size, width, cells."""

    def __init__(self, spec, **cells):
        self.name, self.size = spec.name, spec.size
        self.width = getattr(spec, "width", 0)
        for key, value in cells.items():
            setattr(self, key, value)


class NativeTable(TableEntries):
    """The control-plane view of one C table; entries are mirrored for reads."""

    def __init__(self, spec, index: int, c: _Context, actions: dict):
        super().__init__(spec, actions)
        self.index, self.c = index, c
        # Action data slots per entry in C: as many as the table's widest action.
        self.nd = max([len(actions[a].params) for a in spec.applied_actions] + [0])
        self.handles: dict = {}            # ident -> C handle
        self.default = [None]
        self.initial_default = spec.default
        self.set_default(self.initial_default)
        self._add_const_entries()

    def _add(self, entry: Entry) -> None:
        keys = entry.values if self.spec.keys else (0,)
        masks = entry.masks if self.spec.keys else (0,)
        aid, data = entry.action
        handle = self.c.lib.ss_tbl_add(self.c.ctx, self.index, _u64s(keys), _u64s(masks),
                                     entry.priority, aid, self._data(data))
        if entry.ident in self.handles:      # a repeated const entry replaces the first
            self.c.lib.ss_tbl_del(self.c.ctx, self.index, self.handles[entry.ident])
        self.handles[entry.ident] = handle
        entry.counter = _DirectCounter(self, handle)
        self.entries[entry.ident] = entry

    def _changed(self, entry: Entry) -> None:
        aid, data = entry.action
        self.c.lib.ss_tbl_set_action(self.c.ctx, self.index, self.handles[entry.ident], aid,
                                   self._data(data))

    def _removed(self, entry: Entry) -> None:
        self.c.lib.ss_tbl_del(self.c.ctx, self.index, self.handles.pop(entry.ident))

    def _set_default(self, action) -> None:
        self.default[0] = action
        aid, data = action
        self.c.lib.ss_tbl_default(self.c.ctx, self.index, aid, self._data(data))

    def _data(self, data) -> ctypes.Array:
        """Action data padded to the table's slots (C copies exactly that many)."""
        return _u64s((tuple(data) + (0,) * self.nd)[:self.nd])


class _Groups(dict):
    """mgid -> [(port, rid)], every change also made in C (``setter``: multicast groups
    or clone sessions)."""

    def __init__(self, c: _Context, setter: str = "ss_group_set"):
        super().__init__()
        self.c = c
        self.setter = getattr(c.lib, setter)

    def __setitem__(self, gid, replicas):
        super().__setitem__(gid, replicas)
        ports = (ctypes.c_uint16 * max(len(replicas), 1))(*[p & 0xFFFF for p, _ in replicas])
        rids = (ctypes.c_uint16 * max(len(replicas), 1))(*[r & 0xFFFF for _, r in replicas])
        self.setter(self.c.ctx, gid, len(replicas), ports, rids)

    def __delitem__(self, gid):
        super().__delitem__(gid)
        self.setter(self.c.ctx, gid, -1, None, None)


class NativePipeline:
    """One committed forwarding pipeline, compiled to C."""

    native = True

    def __init__(self, json_text: str | bytes, drop_port: int = DROP_PORT,
                 program: frontend.Program | None = None):
        if isinstance(json_text, str):
            json_text = json_text.encode()
        self.json_text = json_text
        self.drop_port = drop_port
        program = program or frontend.load(json_text, drop_port)
        if compiler() is None:
            raise NativeUnavailable(cbuild.no_compiler())
        self.so_path = build(json_text, drop_port, lambda: emit_c.emit(program, str(RUNTIME)))
        self.c = c = _Context(_load(self.so_path), drop_port)
        lib = c.lib
        self.lock = _Lock(c)
        self.actions = program.actions
        self.errors = program.errors
        self.lanes_line = shards.describe(shards.plan(program))   # said as the lanes start
        self.multicast_line = prepared.describe(prepared.plan(program))   # said then too
        self.tables = {name: NativeTable(spec, i, c, program.actions)
                       for i, (name, spec) in enumerate(program.tables.items())}
        self.registers = {}
        for i, (name, spec) in enumerate(program.registers.items()):
            self.registers[name] = _Spec(spec, cells=_Cells(
                spec.size, lambda j, i=i: lib.ss_reg_get(c.ctx, i, j),
                lambda j, v, i=i, spec=spec: lib.ss_reg_set(c.ctx, i, j, _fits(spec, v))))
        self.counters = {}
        for i, (name, spec) in enumerate(program.counters.items()):
            self.counters[name] = _Spec(
                spec,
                packets=_Cells(spec.size, lambda j, i=i: lib.ss_ctr_get(c.ctx, i, j, 0),
                               lambda j, v, i=i: lib.ss_ctr_set(c.ctx, i, j, 0, v)),
                bytes=_Cells(spec.size, lambda j, i=i: lib.ss_ctr_get(c.ctx, i, j, 1),
                             lambda j, v, i=i: lib.ss_ctr_set(c.ctx, i, j, 1, v)))
        self.groups = _Groups(c)
        self.group_replicas: dict[int, list] = {}
        self.sessions = _Groups(c, "ss_session_set")     # clone sessions, as the Python backend's
        self.session_entries: dict[int, list] = {}

    def process(self, frame: bytes, port: int) -> list[tuple[int, bytes]]:
        """Ingress, PRE, egress, deparser: the frames to send, as (port, bytes)."""
        lib, ctx = self.c.lib, self.c.ctx
        with self.lock:
            n = lib.ss_process(ctx, frame, len(frame), port)
            out = []
            eport, length = ctypes.c_uint32(), ctypes.c_uint32()
            for i in range(n):
                ptr = lib.ss_output(ctx, i, ctypes.byref(eport), ctypes.byref(length))
                out.append((eport.value, ctypes.string_at(ptr, length.value)))
        return out

    # ------------------------------------------------------------------ data plane
    def start_io(self, ports: list[tuple[int, int, int]], threads: int = 1,
                 af_xdp: bool = False) -> list[int]:
        """Run the C packet loop on (port number, rx fd, tx fd) sockets owned by the
        caller, in ``threads`` threads (at most one a port) that share the ports out;
        with ``af_xdp``, each port sends through an AF_XDP socket where it can. How
        each port sends: 1 AF_XDP, 0 sendmmsg, -errno: sendmmsg, AF_XDP refused."""
        n = len(ports)
        arr = ctypes.c_int * max(n, 1)
        numbers, rx, tx = (arr(*[p[k] for p in ports]) for k in range(3))
        if self.c.lib.ss_io_start(self.c.ctx, n, numbers, rx, tx, threads, int(af_xdp)) != 0:
            raise OSError("cannot start the native data-plane threads")
        return [self.c.lib.ss_io_tx(self.c.ctx, k) for k in range(n)]

    def stop_io(self) -> None:
        self.c.lib.ss_io_stop(self.c.ctx)

    def stats(self) -> dict[str, int]:
        """The data plane's counters since the pipeline was loaded (IO_COUNTERS)."""
        buf = (ctypes.c_uint64 * len(IO_COUNTERS))()
        self.c.lib.ss_io_stats(self.c.ctx, buf)
        return dict(zip(IO_COUNTERS, buf))
