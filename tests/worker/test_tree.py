"""Two-level aggregation: a spine and two leaves of 2 or 4 workers each, every switch a
process of the target, with loss on every link. Results must be bit-identical on
every worker and within the bound of the exact sum (tests/worker/test_end_to_end);
the sums are exact integers and the exponent the maximum over every worker, as on
one switch."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from innet_aggregation.p4src import protocol

from .harness import TreeFabric, skip_unless_runnable
from .test_end_to_end import check_run


@pytest.fixture(scope="module", params=[
    pytest.param((target, per_leaf), id=f"{target}-2x{per_leaf}",
                 marks=[pytest.mark.bmv2] if target == "bmv2" else [])
    for target in ("softswitch", "softswitch-python", "bmv2") for per_leaf in (2, 4)])
def tree(request, tmp_path_factory):
    target, per_leaf = request.param
    skip_unless_runnable(target)
    fabric = TreeFabric(target, 2 * per_leaf, tmp_path_factory.mktemp("tree-fabric"),
                        leaves=2, per_leaf=per_leaf).start()
    yield fabric
    fabric.stop()


@pytest.mark.parametrize("loss", [0.0, 0.01, 0.10])
def test_tree_sums_are_exact_under_loss_on_every_link(tree, tmp_path, loss):
    job = tree.job(num_slots=16)
    size = {"bmv2": 4000}.get(tree.target, 12000)
    reps = 2
    tree.set_loss(job, loss)
    before = tree.counters(job)
    runs = tree.run(job, ["--size", str(size), "--reps", str(reps), "--seed", str(int(loss * 100)),
                          "--save", str(tmp_path)], timeout=300)
    after = tree.counters(job)
    tree.set_loss(job, 0.0)
    check_run(runs, job, tmp_path, size=size, seed=int(loss * 100), reps=reps)
    digests = {tuple(r["digest"] for r in run.reports) for run in runs}
    assert len(digests) == 1, "workers disagree"

    delta = {name: {k: after[name][k] - before[name][k] for k in after[name]}
             for name in after}
    # Every switch took part: the leaves sent sums up, the spine completed them, and
    # the leaves handed the spine's results down; no worker result left the spine.
    blocks = -(-size // protocol.packet_format().values_per_packet) * reps
    for leaf in ("leaf0", "leaf1"):
        assert delta[leaf]["ingress.sent_up"] >= blocks
        assert delta[leaf]["ingress.parent_result"] >= blocks
        assert delta[leaf]["ingress.completed"] == 0
    assert delta["spine"]["ingress.completed"] >= blocks
    assert delta["spine"]["ingress.sent_up"] == 0
    if loss:
        repaired = sum(delta[leaf]["ingress.resent_up"] + delta[leaf]["ingress.resent"]
                       for leaf in ("leaf0", "leaf1"))
        assert repaired > 0, "loss on every link but no leaf ever resent"
        dropped = sum(d["ingress.simulated_drop"] + d["egress.simulated_drop"]
                      for d in delta.values())
        assert dropped > 0
    tree.remove(job)


def test_two_tree_jobs_at_once_through_the_same_switches(tree, tmp_path):
    """Disjoint hosts (half of each leaf's), slots and service addresses: both exact
    while the other runs; one removed, the other still exact."""
    half = tree.per_leaf // 2
    a = tree.job(num_slots=16, per_leaf=half)
    b = tree.job(num_slots=16, per_leaf=half, first=half, addresses=1)
    size = {"bmv2": 4000}.get(tree.target, 12000)
    with ThreadPoolExecutor(2) as pool:
        runs = {job.id: pool.submit(tree.run, job, ["--size", str(size), "--reps", "2",
                                                    "--seed", str(job.id),
                                                    "--save", str(tmp_path / str(job.id))])
                for job in (a, b)}
        for job in (a, b):
            check_run(runs[job.id].result(), job, tmp_path / str(job.id), size=size,
                      seed=job.id, reps=2)
    tree.remove(a)
    runs = tree.run(b, ["--size", str(size), "--seed", "5", "--save", str(tmp_path / "b")])
    check_run(runs, b, tmp_path / "b", size=size, seed=5, reps=1)
    tree.remove(b)
