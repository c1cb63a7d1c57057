"""The loader's refusals that matter most, and the bounds behind them (issue #20).

- The exploit: an error code that is C code ("errors": [["NoError", "0; INJECTED_C_CODE();
  //"], ...]) is refused with one line naming its JSON path, on both backends, and
  nothing is generated or compiled from it.
- Register and counter sizes are ints in [1, 2^24]: -1 (which made calloc(size + 1)
  wrap and the index guard always pass), 0, 2^32 and friends are refused; the C
  runtime refuses them too, whatever source it is given.
- Action data enters a table masked to the widths the JSON declares (both emitters
  drop the masks that would otherwise be needed); a const entry has exactly one key
  per table key and one datum per parameter.
- A negative register index is skipped on both backends, as BMv2 does (Python would
  otherwise take the cell from the end of the list).
"""

from __future__ import annotations

import json
import re

import pytest

from innet_aggregation.p4src import protocol
from innet_aggregation.softswitch import frontend
from innet_aggregation.softswitch.backends.native import loader as native, printer as emit_c
from innet_aggregation.softswitch.backends import load_pipeline
from innet_aggregation.softswitch.backends.native.loader import RUNTIME, NativePipeline, NativeUnavailable
from innet_aggregation.softswitch.backends.python.pipeline import Pipeline
from innet_aggregation.softswitch.backends.tables import Entry, TableError
from tests.softswitch.conftest import pipeline, program_files
from tests.softswitch.test_primitives import fields, frame

PAYLOAD = "0; INJECTED_C_CODE(); //"


def doc_of(name: str) -> dict:
    path = protocol.PROGRAM_JSON if name == "aggregation" else program_files(name)[0]
    return json.loads(path.read_bytes())


def refused(doc: dict, backend: str, match: str, error=ValueError) -> str:
    with pytest.raises(error) as exc:
        load_pipeline(json.dumps(doc), backend=backend)
    message = str(exc.value)
    assert re.fullmatch(match, message), message
    return message


def test_the_exploit_is_refused_naming_its_path_and_nothing_is_built(tmp_path, monkeypatch,
                                                                     backend):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    doc = doc_of("aggregation")
    assert doc["errors"][0] == ["NoError", 0]
    doc["errors"][0][1] = PAYLOAD
    refused(doc, backend, re.escape(f"errors[0][1]: expected an int in [0, 2^31), "
                                    f"got '{PAYLOAD}'"))
    for cls in (NativePipeline, Pipeline):
        with pytest.raises(ValueError, match=re.escape("errors[0][1]:")):
            cls(json.dumps(doc))
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not written and not native.cache_dir().exists()
    doc = doc_of("aggregation")               # where the payload was a table id
    doc["pipelines"][0]["tables"][0]["id"] = PAYLOAD
    refused(doc, backend, re.escape("pipelines[0].tables[0].id: expected an int in [0, 2^31), "
                                    f"got '{PAYLOAD}'"))
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("size", [-1, 0, 2**24 + 1, 2**32 - 1, 2**32, True, "16", 16.0, None])
def test_register_and_counter_sizes_outside_1_to_2_24_are_refused(size, backend):
    for kind in ("register_arrays", "counter_arrays"):
        doc = doc_of("forwarding")
        i = next(i for i, item in enumerate(doc[kind]) if "size" in item)
        doc[kind][i]["size"] = size
        refused(doc, backend, re.escape(f"{kind}[{i}].size: expected an int in [1, 2^24], "
                                        "got ") + ".*")


def test_a_register_of_one_cell_is_bounds_checked(backend):
    doc = doc_of("primitives")
    doc["register_arrays"][0]["size"] = 1
    pipe = pipeline(json.dumps(doc).encode(), backend)
    for index in (0, 1, 3, 15, 2**31, 2**32 - 1):
        pipe.process(frame(6, a=5, b=index), 5)       # reg[b] += a, read back into r1
    assert list(pipe.registers["Ing.reg"].cells) == [5] and len(pipe.registers["Ing.reg"].cells) == 1


def test_a_negative_register_index_is_skipped(backend):
    """primitives.p4's reg[b] with b made signed: b = -1 must touch nothing."""
    doc = doc_of("primitives")
    header_type = next(h for h in doc["header_types"] if [f[0] for f in h["fields"]][:3]
                       == ["op", "a", "b"])
    header_type["fields"][2][2] = True
    pipe = pipeline(json.dumps(doc).encode(), backend)
    out = fields(pipe.process(frame(6, a=5, b=0xFFFFFFFF), 5)[0][1])
    assert list(pipe.registers["Ing.reg"].cells) == [0] * 16
    assert out["r1"] == 5                            # v stayed 0: the read was skipped
    pipe.process(frame(6, a=5, b=15), 5)
    assert list(pipe.registers["Ing.reg"].cells) == [0] * 15 + [5]


def no_pipeline(text: bytes, source: str) -> None:
    """The C unit ``source`` (keyed as ``text``) builds but makes no pipeline."""
    so = native.build(text, 511, lambda: source)
    with pytest.raises(NativeUnavailable, match="cannot allocate"):
        native._Context(native._load(so), 511)


def test_the_c_runtime_refuses_sizes_outside_1_to_2_24_whatever_the_source(tmp_path,
                                                                              monkeypatch):
    """Sizes outside 1 to 2^24 cells, and side-by-side layouts of 0 registers or of
    more than the program has (its one register here)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    text = program_files("primitives")[0].read_bytes()
    source = emit_c.emit(frontend.load(text), str(RUNTIME))
    assert "ss_reg_init(c, 0, 16U, 1U, 1);" in source
    for bad in ("0U, 1U", "4294967295U, 1U", f"{2**24 + 1}U, 1U", "16U, 0U", "16U, 2U"):
        no_pipeline(text + bad.encode(),
                source.replace("ss_reg_init(c, 0, 16U, 1U, 1)", f"ss_reg_init(c, 0, {bad}, 1)"))


def test_the_c_runtime_refuses_a_lane_outside_its_block_whatever_the_source(tmp_path,
                                                                               monkeypatch):
    """A register placed beside another at a lane past the block's stride, or in the
    block of a register laid out alone: no pipeline, rather than cells that overlap."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    text = protocol.SMALL_PROGRAM_JSON.read_bytes()
    source = emit_c.emit(frontend.load(text), str(RUNTIME))
    # The program's first value register, placed in its block of values at lane 1.
    placed = re.search(r"ss_reg_lane\(c, (\d+), (\d+), 1U\);", source)
    assert placed and placed[2] != "0", "no value register placed at lane 1"
    register, block = placed[1], placed[2]
    # Past the block's stride, and in block 0, which holds a register laid out alone.
    for bad in (f"ss_reg_lane(c, {register}, {block}, 64U);",
                f"ss_reg_lane(c, {register}, 0, 1U);"):
        no_pipeline(text + bad.encode(), source.replace(placed[0], bad))


def test_the_c_control_plane_calls_check_what_they_are_given():
    pipe = NativePipeline(program_files("forwarding")[0].read_bytes())
    lib, ctx = pipe.c.lib, pipe.c.ctx
    assert lib.ss_reg_get(ctx, 99, 0) == 0 and lib.ss_reg_get(ctx, 0, 512) == 0
    lib.ss_reg_set(ctx, -1, 0, 7)
    lib.ss_ctr_set(ctx, 0, 2**31, 0, 7)
    assert lib.ss_ctr_get(ctx, 7, 0, 0) == 0
    assert lib.ss_tbl_add(ctx, 99, None, None, 0, 0, None) == -1
    lib.ss_tbl_del(ctx, 0, 12345)
    lib.ss_tbl_del(ctx, -3, 0)
    lib.ss_tbl_set_action(ctx, 0, 7, 1, None)
    counters = native._u64s([1, 2])
    lib.ss_tbl_counter(ctx, 0, 99, counters, 0)
    assert list(counters) == [1, 2]
    assert [list(r.cells) for r in pipe.registers.values()] == [[0] * 512]


def forward_id(pipe) -> int:
    return next(a.id for a in pipe.actions.values() if a.name == "Ing.forward")


def test_action_data_enters_a_table_masked_to_its_width(backend):
    """forwarding.p4's forward(bit<9> port): 0x203 is port 3, as BMv2 would have it."""
    pipe = pipeline(program_files("forwarding")[0].read_bytes(), backend)
    mac = 0x020000000009
    data = mac.to_bytes(6, "big") + bytes(6) + b"\x88\xb5" + bytes(40)
    table = pipe.tables["Ing.mac_table"]
    table.insert(Entry((mac,), ((1 << 48) - 1,), 0, (forward_id(pipe), (0x203,))))
    assert pipe.process(data, 1) == [(3, data)]
    table.modify(Entry((mac,), ((1 << 48) - 1,), 0, (forward_id(pipe), ((1 << 64) | 4,))))
    assert pipe.process(data, 1) == [(4, data)]
    table.delete(((mac,), ((1 << 48) - 1,), 0))
    table.set_default((forward_id(pipe), (0x1FE05,)))
    assert pipe.process(data, 1) == [(5, data)]


def test_a_table_entry_of_the_wrong_shape_is_refused(backend):
    pipe = pipeline(program_files("forwarding")[0].read_bytes(), backend)
    table = pipe.tables["Ing.mac_table"]
    full = ((1 << 48) - 1,)
    for entry, what in ((Entry((1,), full, 0, (forward_id(pipe), ())), "takes 1 parameters"),
                        (Entry((1,), full, 0, (forward_id(pipe), (1, 2))), "takes 1 parameters"),
                        (Entry((1, 2), full * 2, 0, (forward_id(pipe), (1,))), "1 keys"),
                        (Entry((1,), full, 0, (9999, (1,))), "not one of the table's")):
        with pytest.raises(TableError, match=what):
            table.insert(entry)
    assert not table.entries


def test_a_const_entry_with_too_few_or_too_many_keys_or_data_is_refused(backend):
    doc = doc_of("forwarding")
    pipe_index, table_index = next((i, j) for i, p in enumerate(doc["pipelines"])
                                   for j, t in enumerate(p["tables"]) if t.get("entries"))
    path = f"pipelines[{pipe_index}].tables[{table_index}].entries[0]"
    entry = doc["pipelines"][pipe_index]["tables"][table_index]["entries"][0]
    keys, data = entry["match_key"], entry["action_entry"]["action_data"]
    for wrong in ([], keys + keys):
        entry["match_key"] = wrong
        refused(doc, backend, re.escape(f"{path}.match_key: expected {len(keys)} items (one per "
                                        f"key of the table), got {len(wrong)} items"))
    entry["match_key"] = keys
    for wrong in ([], data + data):
        entry["action_entry"]["action_data"] = wrong
        refused(doc, backend, re.escape(f"{path}.action_entry.action_data: expected "
                                        f"{len(data)} items (one per parameter of action ")
                + r"\d+\), got \d+ items")


def test_what_p4c_writes_at_times_loads_and_runs_as_written(backend):
    """A signed flag written 1 or 0 and a table key without a name are p4c's own output
    (p4c's samples gauntlet_various_ops, invalid-hdr-warnings3), which BMv2 takes: they
    load, and run as the JSON with true and the named key; a flag of 2 is still refused."""
    doc = doc_of("primitives")
    i, header_type = next((i, h) for i, h in enumerate(doc["header_types"])
                          if [f[0] for f in h["fields"]][:3] == ["op", "a", "b"])
    signed = json.loads(json.dumps(doc))
    signed["header_types"][i]["fields"][2][2] = True
    header_type["fields"][2][2] = 1
    loose, strict = (pipeline(json.dumps(d).encode(), backend) for d in (doc, signed))
    for b in (0, 15, 0xFFFFFFFF):
        assert loose.process(frame(6, a=5, b=b), 5) == strict.process(frame(6, a=5, b=b), 5)
    header_type["fields"][2][2] = 2
    refused(doc, backend, re.escape(f"header_types[{i}].fields[2][2]: expected true or "
                                    "false, got 2"))

    doc = doc_of("forwarding")
    table = next(t for t in doc["pipelines"][0]["tables"] if t["key"])
    named = json.dumps(doc)
    del table["key"][0]["name"]       # a label only: P4Info's fields join by position
    assert (pipeline(json.dumps(doc).encode(), backend).process(bytes(64), 1)
            == pipeline(named.encode(), backend).process(bytes(64), 1))
