"""The native backend's C unit under AddressSanitizer and UndefinedBehaviorSanitizer.

The aggregation program (with a job installed) and four test programs are compiled
with ``-fsanitize=address,undefined`` and run in a process of their own (libasan
preloaded into Python) over valid frames, every truncation of them, corrupted and
random frames, frames of 0 bytes to 64 KiB, and control-plane calls naming tables,
entries, registers and counters that do not exist. The run must end cleanly, without
a sanitizer report, and forward exactly what the normal build forwards. A second run
with one bounds check taken out of the generated code must be caught, so the harness
is known to see an out-of-bounds write.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch.backends.native import loader as native
from innet_aggregation.softswitch.backends.native.loader import NativePipeline
from tests.softswitch.conftest import program_files
from tests.softswitch.test_loader_fuzz import PROGRAMS, aggregation_frames, primitives_frames
from tests.softswitch.test_primitives import frame
from tests.softswitch.test_robustness import frames as robustness_frames

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import hashlib, pickle, subprocess, sys
from pathlib import Path
from innet_aggregation.softswitch.backends.native import loader as native
from innet_aggregation.softswitch.backends.tables import Entry

jobs_file, work, cut = sys.argv[1], Path(sys.argv[2]), pickle.loads(bytes.fromhex(sys.argv[3]))

def build(json_text, drop_port, print_unit):
    source = print_unit()
    if cut:
        assert cut[0] in source
        source = source.replace(cut[0], cut[1])
    name = hashlib.sha256(source.encode()).hexdigest()[:16]
    c_file, so = work / f"{name}.c", work / f"{name}.so"
    c_file.write_text(source)
    subprocess.run([native.compiler(), "-O1", "-g", "-fno-omit-frame-pointer",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    "-shared", "-fPIC", "-o", str(so), str(c_file), "-lpthread"], check=True)
    return so

native.build = build
results = []
for job in pickle.loads(Path(jobs_file).read_bytes()):
    pipe = native.NativePipeline(job["json"])
    for name, entries in job["entries"].items():
        for values, masks, priority, action in entries:
            pipe.tables[name].insert(Entry(values, masks, priority, action))
    for name, action in job["defaults"].items():
        pipe.tables[name].set_default(action)
    for gid, replicas in job["groups"].items():
        pipe.groups[gid] = replicas
    for sid, replicas in job["sessions"].items():
        pipe.sessions[sid] = replicas
    out = [sorted(pipe.process(data, port)) for data, port in job["frames"]]
    registers = {n: list(r.cells) for n, r in pipe.registers.items()}
    lib, ctx = pipe.c.lib, pipe.c.ctx
    for r in (-1, 0, 99):
        for i in (0, 2**31, 2**32 - 1):
            lib.ss_reg_set(ctx, r, i, 7)
            lib.ss_reg_get(ctx, r, i)
            lib.ss_ctr_set(ctx, r, i, 1, 7)
            lib.ss_ctr_get(ctx, r, i, 0)
    data = native._u64s([0] * 64)
    for t in (-1, 0, 99):
        for e in (-1, 0, 5, 2**31 - 1):
            lib.ss_tbl_set_action(ctx, t, e, 0, data)
            lib.ss_tbl_counter(ctx, t, e, data, 1)
            lib.ss_tbl_del(ctx, t, e)
        lib.ss_tbl_default(ctx, t, 0, data)
    results.append((out, registers))
Path(jobs_file + ".out").write_bytes(pickle.dumps(results))
"""


def libasan() -> str | None:
    cc = native.compiler()
    if cc is None:
        return None
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def job(name: str, text: bytes, frames: list) -> dict:
    """A program, the control-plane state its test installs, and the frames to send."""
    pipe = NativePipeline(text)
    PROGRAMS[name][0](pipe)
    return {"name": name, "json": text, "frames": frames, "groups": dict(pipe.groups),
            "sessions": dict(pipe.sessions),
            "entries": {n: [(e.values, e.masks, e.priority, e.action)
                            for e in t.entries.values() if not e.const]
                        for n, t in pipe.tables.items()},
            "defaults": {n: t.default[0] for n, t in pipe.tables.items()}}


def hostile(valid: list) -> list:
    rng = random.Random(20)
    out = [(data, rng.choice([0, 1, 5, 511, 2**32 - 1]))
           for data in robustness_frames(20, [d for d, _ in valid[:2]])]
    return out + [(bytes(n), 1) for n in (0, 1, 16383, 16384, 16385, 65535)]


def run_child(tmp_path, jobs: list, cut=None) -> subprocess.CompletedProcess:
    jobs_file = tmp_path / "jobs.pickle"
    jobs_file.write_bytes(pickle.dumps(jobs))
    env = dict(os.environ, PYTHONPATH=str(REPO), LD_PRELOAD=libasan(),
               XDG_CACHE_HOME=str(tmp_path / "cache"),
               ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return subprocess.run([sys.executable, "-c", CHILD, str(jobs_file), str(tmp_path),
                           pickle.dumps(cut).hex()], capture_output=True, text=True, env=env,
                          timeout=500)


@pytest.mark.skipif(libasan() is None, reason="no C compiler with AddressSanitizer")
def test_the_c_unit_runs_clean_under_address_and_undefined_behavior_sanitizers(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    forwarding = PROGRAMS["forwarding"][1]()
    ranges = PROGRAMS["range_optional"][1]()
    special = PROGRAMS["special_ops"][1]()
    jobs = [job("aggregation", protocol.PROGRAM_JSON.read_bytes(),
                aggregation_frames() + hostile(aggregation_frames())),
            job("primitives", program_files("primitives")[0].read_bytes(),
                primitives_frames() + hostile(primitives_frames())),
            job("forwarding", program_files("forwarding")[0].read_bytes(),
                forwarding + hostile(forwarding)),
            job("range_optional", program_files("range_optional")[0].read_bytes(),
                ranges + hostile(ranges)),
            job("special_ops", program_files("special_ops")[0].read_bytes(),
                special + hostile(special))]
    proc = run_child(tmp_path, jobs)
    report = proc.stderr[-6000:]
    assert proc.returncode == 0, report
    assert "AddressSanitizer" not in proc.stderr and "runtime error" not in proc.stderr, report
    results = pickle.loads((tmp_path / "jobs.pickle.out").read_bytes())
    for each, (out, registers) in zip(jobs, results):
        pipe = NativePipeline(each["json"])           # the normal build, the same state
        PROGRAMS[each["name"]][0](pipe)
        assert out == [sorted(pipe.process(d, p)) for d, p in each["frames"]]
        assert registers == {n: list(r.cells) for n, r in pipe.registers.items()}
    assert sum(len(j["frames"]) for j in jobs) > 2000


@pytest.mark.skipif(libasan() is None, reason="no C compiler with AddressSanitizer")
def test_the_sanitizers_catch_a_bounds_check_taken_out(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    primitives = job("primitives", program_files("primitives")[0].read_bytes(),
                     [(frame(6, a=5, b=1000), 5)])
    proc = run_child(tmp_path, [primitives], cut=("if (_ix < 16ULL)", "if (1)"))
    assert proc.returncode != 0 and "AddressSanitizer: heap-buffer-overflow" in proc.stderr
