"""The documentation site: it builds with every link and anchor checked, its figures
are the ones in their records, its references match the code, and every command
shown to a new user runs in a test or says why not."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import gen_cli_docs  # tools/, on pytest's pythonpath (pyproject.toml)
import pytest
import render_results

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def mkdocs(config: Path, out: Path, offline: bool = False) -> subprocess.CompletedProcess:
    """``offline``: in a network namespace of its own, with no interface up."""
    prefix = ["unshare", "--net"] if offline else []
    return subprocess.run([*prefix, sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(out)], capture_output=True, text=True, timeout=120,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_site_builds_strict_with_no_network(tmp_path):
    offline = os.geteuid() == 0 and shutil.which("unshare") is not None
    started = time.monotonic()
    done = mkdocs(REPO / "mkdocs.yml", tmp_path / "site", offline=offline)
    took = time.monotonic() - started
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-3000:]}"
    assert took < 60, f"the site took {took:.0f} s to build (the limit is a minute)"
    assert (tmp_path / "site" / "experiments" / "index.html").exists()
    html = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "AggregationSession" in html and "allreduce" in html, "mkdocstrings rendered no API"


def test_a_broken_anchor_fails_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for name in ("innet_aggregation", "tests"):      # what snippets and mkdocstrings read
        (tmp_path / name).symlink_to(REPO / name)
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](train.md#no-such-heading)\n")
    done = mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "no-such-heading" in done.stderr


# -- figures --------------------------------------------------------------------

def test_rendered_figures_are_the_records():
    assert render_results.main(["--check"]) == 0, "python tools/render_results.py, and commit"


def test_every_record_says_where_its_figures_come_from():
    records = sorted((DOCS / "results").glob("*.json"))
    assert records
    for path in records:
        r = json.loads(path.read_text())
        for key in ("experiment", "commit", "date", "machine", "load", "source", "figures"):
            assert key in r, f"{path.name} has no {key}"
        assert r["experiment"] == path.stem
        assert re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]), f"{path.name}: commit {r['commit']!r}"


def _prose(text: str) -> str:
    """The text outside code blocks, snippet lines and the README's rendered block."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(re.escape(render_results.BEGIN) + ".*?" + re.escape(render_results.END), "",
                  text, flags=re.S)
    return "\n".join(l for l in text.splitlines() if not l.startswith("--8<--"))


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/experiments.md"])
def test_no_measured_figure_is_typed_by_hand(page):
    """Pages of current results show figures only from their records: no decimal
    figure in their own prose."""
    typed = re.findall(r"[^\s]*\d\.\d+[^\s]*", _prose((REPO / page).read_text()))
    assert not typed, f"{page}: figures typed by hand: {typed} (render them from a record)"


def test_a_changed_record_shows_in_the_check(tmp_path, monkeypatch):
    copy = tmp_path / "results"
    shutil.copytree(DOCS / "results", copy)
    record = copy / "bench-allreduce.json"
    record.write_text(record.read_text().replace('"ratio": 0.62', '"ratio": 0.61', 1))
    monkeypatch.setattr(render_results, "RECORDS", copy)
    assert render_results.main(["--check"]) == 1


# -- references -----------------------------------------------------------------

def test_the_command_line_reference_is_current():
    assert gen_cli_docs.main(["--check"]) == 0, "python tools/gen_cli_docs.py, and commit"


ENV_READ = re.compile(r"""(?:environ|env|getenv)(?:\.get\(|\[|\()\s*["']([A-Z][A-Z0-9_]+)["']""")
PASSED_THROUGH = {"PATH", "PYTHONPATH"}      # handed on to child processes, not settings


def _env_read(*roots: str) -> set[str]:
    names = set()
    for root in roots:
        for path in (REPO / root).rglob("*.py"):
            names |= set(ENV_READ.findall(path.read_text()))
    return names - PASSED_THROUGH


def test_the_environment_reference_matches_the_code():
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`(?:, `([A-Z][A-Z0-9_]+)`)?",
                                (DOCS / "reference" / "environment.md").read_text(), re.M))
    documented = {n for pair in documented for n in pair if n}
    missing = _env_read("innet_aggregation", "benchmarks", "tools") - documented
    assert not missing, f"read by the code, not in reference/environment.md: {sorted(missing)}"
    stale = documented - _env_read("innet_aggregation", "benchmarks", "tools", "tests")
    assert not stale, f"in reference/environment.md, read nowhere: {sorted(stale)}"


def _toml_blocks(page: Path) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"```toml\n# ([^\n]+)\n(.*?)```", page.read_text(), re.S)}


def test_the_configuration_examples_are_valid(tmp_path):
    from innet_aggregation.switch_ctl import jobfile
    from innet_aggregation.switch_ctl.manager import config as manager_config

    blocks = _toml_blocks(DOCS / "reference" / "config.md")
    assert set(blocks) == {"a job file", "a tree job file", "a manager file", "a manager tree file"}
    jobfile.load_text(blocks["a job file"])
    jobfile.load_text(blocks["a tree job file"])
    (tmp_path / "secret").write_text("a secret of sixteen characters\n")
    (tmp_path / "tls").mkdir()
    for name in ("manager.pem", "manager.key"):
        (tmp_path / "tls" / name).write_text("-----BEGIN TEST-----\n")
    for name in ("a manager file", "a manager tree file"):
        manager_config.parse(tomllib.loads(blocks[name]), base=tmp_path)


def test_every_configuration_key_is_documented():
    page = (DOCS / "reference" / "config.md").read_text()
    documented = (set(re.findall(r"\b([a-z_]+)\s*=", page)) | set(re.findall(r"[.`]([a-z_]+)`", page))
                  | {part for table in re.findall(r"^\[\[?([a-z_.]+)", page, re.M)
                     for part in table.split(".")})
    code = set()
    for rel in ("switch_ctl/config.py", "switch_ctl/tree.py", "switch_ctl/manager/config.py"):
        text = (REPO / "innet_aggregation" / rel).read_text()
        code |= set(re.findall(r"""(?:get\(\w+, |\.get\(|\w\[|_range\(\w+, )"([a-z_]+)\"""", text))
    code |= {"ca_cert", "client_cert", "client_key", "secret", "secret_file"}
    missing = sorted(code - documented)
    assert not missing, f"configuration keys the code reads, not in reference/config.md: {missing}"


def _exceptions() -> set[str]:
    internal = {"Exit", "Return", "Dropped", "ParserError", "BadRequest"}   # control flow, never seen
    names = set()
    for path in (REPO / "innet_aggregation").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ClassDef) and not node.name.startswith("_")
                    and any(re.search(r"Error|Exception|Timeout|Mismatch|Unavailable|Unsupported",
                                      ast.unparse(b)) for b in node.bases)):
                names.add(node.name)
    return names - internal


def test_every_error_a_user_can_meet_is_in_the_reference():
    page = (DOCS / "reference" / "errors.md").read_text()
    missing = sorted(n for n in _exceptions() if f"`{n}`" not in page)
    assert not missing, f"exceptions not in reference/errors.md: {missing}"


# -- the commands a new user is shown -------------------------------------------

MARKERS = ("# test: run", "# covered by: ", "# not run by the tests: ")


def _blocks(page: str) -> list[tuple[str, str]]:
    text = (DOCS / page).read_text()
    return [(m[1], m[2]) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)
            if m[1] in ("sh", "python", "text") and not m[2].startswith("--8<--")]


@pytest.mark.parametrize("page", ["get-started.md", "train.md"])
def test_every_command_shown_runs_or_says_why_not(page):
    blocks = _blocks(page)
    assert blocks
    for _, body in blocks:
        first = body.splitlines()[0]
        assert first.startswith(MARKERS), f"{page}: a block starts {first!r}, not one of {MARKERS}"
        if first.startswith("# covered by: "):
            path = first.removeprefix("# covered by: ").split()[0]
            assert (REPO / path).exists(), f"{page}: {path} (covered by) does not exist"
        if first.startswith("# not run by the tests: "):
            assert len(first) > len("# not run by the tests: ") + 10, f"{page}: say why: {first!r}"


@pytest.mark.parametrize("command", [body.splitlines()[1] for page in ("get-started.md", "train.md")
                                     for _, body in _blocks(page) if body.startswith("# test: run")])
def test_the_commands_marked_run_run(command):
    assert command.startswith("python -m "), command
    done = subprocess.run([sys.executable, *command.split()[1:]], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
    assert "usage:" in done.stdout


def test_the_complete_script_is_the_one_the_torchrun_test_runs():
    train = (DOCS / "train.md").read_text()
    assert '--8<-- "tests/worker/torchrun_train.py"' in train
    assert "torchrun_train.py" in (REPO / "tests" / "worker" / "test_torchrun.py").read_text()


def test_the_readme_stays_short():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; the site holds the rest"
