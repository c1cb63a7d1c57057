"""Tree job descriptions: a bad tree is refused whole, before any switch is contacted."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.switch_ctl.config import ConfigError
from innet_aggregation.testbed import layout

pytestmark = pytest.mark.skipif(not protocol.PROGRAM_JSON.exists(),
                                reason="the P4 program is not built")

# Nothing listens here: reaching it would fail with a connection error, not a config one.
NOWHERE = "127.0.0.1:9"


def good_tree() -> dict:
    switches = {name: (NOWHERE, 0) for name in ("spine", "leaf0", "leaf1")}
    return layout.tree_config_dict(switches, leaves=2, per_leaf=2, num_slots=16)


def problems(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        jobfile.load_text(tomli_w.dumps(raw))
    return err.value.problems


def test_good_tree_parses():
    tree = jobfile.load_text(tomli_w.dumps(good_tree()))
    assert tree.root == "spine" and tree.parents == {"leaf0": "spine", "leaf1": "spine"}
    assert tree.homes == {0: "leaf0", 1: "leaf0", 2: "leaf1", 3: "leaf1"}


def test_worker_under_two_leaves():
    raw = good_tree()
    twin = copy.deepcopy(raw["switches"]["leaf0"]["workers"][0])
    twin["switch_port"] = 3
    raw["switches"]["leaf1"]["workers"].append(twin)
    raw["switches"]["leaf1"]["ports"].append(4)
    found = problems(raw)
    assert "worker id 0 is under two switches: leaf0 and leaf1" in found
    assert any("worker mac 02:00:00:00:00:01 is under two switches" in p for p in found)


def test_cycle():
    raw = good_tree()
    raw["switches"]["leaf0"]["parent"] = "leaf1"
    raw["switches"]["leaf1"]["parent"] = "leaf0"
    raw["switches"]["leaf1"]["parent_port"] = 3
    raw["switches"]["leaf0"]["ports"].append(0)
    found = problems(raw)
    assert found.count("switches form a cycle: leaf0 -> leaf1 -> leaf0") == 1, found


def test_leaf_without_parent_and_rooted_root():
    raw = good_tree()
    del raw["switches"]["leaf1"]["parent"]
    raw["switches"]["spine"]["parent"] = "leaf0"
    found = problems(raw)
    assert "switches.leaf1 is a leaf without a parent (only the root, spine, has none)" in found
    assert "switches.spine is the root and cannot have a parent ('leaf0')" in found


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r["tree"].update(root="nope"), "tree.root must name one of the switches"),
    (lambda r: r["switches"]["leaf0"].update(parent="core"),
     "switches.leaf0.parent 'core' is not a switch of the tree"),
    (lambda r: r["switches"]["leaf0"].update(uplink_port=1),
     "switches.leaf0: port 1 is given to both worker 0 and the uplink"),
    (lambda r: r["switches"]["leaf1"].update(parent_port=1),
     "switches.spine: port 1 is given to both child switch leaf0 and child switch leaf1"),
    (lambda r: r["switches"]["leaf0"].update(parent_port=7),
     "switches.leaf0.parent_port 7 is not one of spine's ports [1, 2]"),
    (lambda r: r["switches"]["leaf1"].update(service_ip=layout.SERVICE_IP),
     "switches.leaf1 has the same service ip 10.0.0.254 as switches.spine"),
    (lambda r: r["switches"]["leaf1"]["workers"][0].update(ip="10.0.0.241"),
     "switches.leaf1: job.workers[0].ip 10.0.0.241 is the job's service address"),
])
def test_other_bad_trees(mutate, expected):
    raw = good_tree()
    mutate(raw)
    found = problems(raw)
    assert any(p.startswith(expected) for p in found), found


def test_cli_refuses_a_bad_tree_before_contacting_any_switch(tmp_path):
    raw = good_tree()
    raw["switches"]["leaf0"]["parent"] = "leaf1"
    raw["switches"]["leaf1"]["parent"] = "leaf0"
    path = tmp_path / "tree.toml"
    path.write_text(tomli_w.dumps(raw))
    for command in ("apply", "remove", "reset"):
        done = subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", command, str(path),
                               "--connect-timeout", "1"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1
        assert "switches form a cycle: leaf0 -> leaf1 -> leaf0" in done.stderr
        assert "connect" not in done.stderr.lower() and "[leaf" not in done.stdout
