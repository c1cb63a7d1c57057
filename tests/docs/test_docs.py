"""The documentation site: it builds with every link and anchor checked, its figures
are the ones in their records, its references match the code, and every command
shown to a new user runs in a test or says why not."""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
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


def test_every_committed_record_was_measured():
    """A record is what a benchmark wrote from a run (record.write), never figures
    transcribed from older text: those live in History only."""
    records = {p.name: json.loads(p.read_text()) for p in sorted((DOCS / "results").glob("*.json"))}
    assert records
    unmeasured = {name: r.get("source") for name, r in records.items() if r.get("source") != "measured"}
    assert not unmeasured, f"records not written by a run: {unmeasured}"
    unloaded = [name for name, r in records.items() if r["load"] is None or r["load"][1] is None]
    assert not unloaded, f"records without the machine's load: {unloaded}"


# A figure some run measured: a decimal (not a version's 2.11.0), or a number with the
# unit of a share, a factor, a rate or a time. Sizes are left alone: those in the
# prose are the design's (frames, MTUs, windows).
UNIT = (r"(?: ?(?:%|×|[kMG]?pps\b|packets/s|frames/s|[kMG]?B/s|[kMG]?bit/s|ms\b|µs\b|ns\b|s\b"
        r"|seconds?\b|minutes?\b|hours?\b)|x\b)")     # a factor is 3x, not the 2 x 1 of a mesh
TYPED = re.compile(rf"(?<![\w.])\d[\d,]*(?:\.\d+(?![\d.]){UNIT}?|{UNIT})")

# The phrases the pattern would otherwise take for measured figures. A phrase that
# quotes the code says where: its numbers must be that constant's value (Code, checked
# below); the others (the tests' settings, versions, arithmetic) say why they are none.
@dataclass(frozen=True)
class Code:
    """The value ``expr`` has in ``module``: a number, or a tuple in the phrase's order."""
    module: str
    expr: str

    def values(self) -> tuple[float, ...]:
        value = eval(self.expr, vars(importlib.import_module(self.module)))  # noqa: S307
        return tuple(float(v) for v in (value if isinstance(value, tuple) else (value,)))


BASELINE = "innet_aggregation.experiments.baseline"
STRAGGLER = "innet_aggregation.experiments.straggler"
DEMO = "innet_aggregation.experiments.demo"
TRANSPORT = "innet_aggregation.worker.transport"
FALLBACK = "innet_aggregation.worker.fallback"
SERVER = "innet_aggregation.switch_ctl.manager.server"
P4RUNTIME = "innet_aggregation.switch_ctl.client"

CONSTANTS = {
    # the sweep's definitions
    "within 10 % of the limit": Code(BASELINE, "100 * (GOAL - 1)"),
    "0.85 for 4 workers, 0.70 for 8": Code(BASELINE,
                                           "(UNSHAPED_GOALS[4], 4, UNSHAPED_GOALS[8], 8)"),
    "95 % bootstrap interval": Code("innet_aggregation.experiments.stats", "100 * LEVEL"),
    "95 % intervals": Code("innet_aggregation.experiments.stats", "100 * LEVEL"),
    "to 95 % test accuracy": Code(DEMO, "100 * MODELS['large'].accuracy"),
    # the straggler experiment's defaults and the goals
    "(default 1 %)": Code(STRAGGLER, "_parser().get_default('loss_pct')"),
    "*s to 95 % held*": Code(STRAGGLER, "100 * _parser().get_default('accuracy')"),
    "goal of at most 60 % was judged": "issue 38's goal for time to accuracy with a deadline",
    "under 1 % of the blocks": "the share test_quantize asserts on the recorded gradients",
    "(default: large 0.95, small none)": Code(DEMO, "MODELS['large'].accuracy"),
    "(default 0.95)": Code(STRAGGLER, "_parser().get_default('accuracy')"),
    "(default 0.2)": Code(STRAGGLER, "_parser().get_default('p')"),
    "--p 0.25": "an example of the straggler experiment's command line",
    "(at most 120 %)": "issue 38's goal for p99 step time under loss",
    "at 80-100 %, **burst** above 100 %": Code("innet_aggregation.experiments.link_model",
                                              "(100 * LINK_BOUND, 100, 100)"),
    "at 80-100 %, \"burst\" above 100 %": Code("innet_aggregation.experiments.link_model",
                                               "(100 * LINK_BOUND, 100, 100)"),
    "at most 5 % slower than the session": "bench-backend's goal (its docstring)",
    "within 3 % of CODE": "bench-observe's goal, benchmarks/bench_observe.GOAL",
    "20, 50, 100, 200 and 500 Mbit/s": Code(BASELINE, "tuple(_parser().get_default('bw')[:-1])"),
    "100 Mbit/s links": Code(DEMO, "MODELS['large'].bw"),
    "0-1000 Mbit/s": "the rates the testbed can shape",
    "20 Mbit/s to unshaped": Code(BASELINE, "_parser().get_default('bw')[0]"),
    "at 50 Mbit/s": Code("innet_aggregation.experiments.scaling",
                         "_parser().get_default('bw')"),
    "0.67 for n = 4, 0.57 for n = 8": "n/(2(n-1)), arithmetic",
    "(1 at n = 2, 1.875 at n = 16)": "2(n-1)/n, arithmetic",
    "the 1.1x and 2x marks": "lines drawn on the loss plot",
    "1.13 M parameters": "the large demo model's size, arithmetic",
    "e.g. 1ms": "an example of --delay's argument",
    "(default: small 0.01, large 0.001)": Code(DEMO, "(MODELS['small'].lr, MODELS['large'].lr)"),
    "(default 0,0.01,0.1,1,5,10)": Code("innet_aggregation.experiments.loss",
                                        "tuple(_parser().get_default('loss'))"),
    # timeouts and defaults
    "(default 10 s)": Code(FALLBACK, "DEFAULT_SWITCH_TIMEOUT"),
    "the retransmission timer's 2 s ceiling": Code(TRANSPORT, "RetransmitPolicy.max_rto"),
    "default 10 s lease": Code("innet_aggregation.switch_ctl.manager.config",
                               "DEFAULT_LEASE_SECONDS"),
    "(at most 0.5 s apart)": Code("innet_aggregation.worker.call", "ABORT_POLL"),
    "look there every 0.5 s": Code(FALLBACK, "STORE_POLL"),
    "logging every 10 s which rank": Code(TRANSPORT, "RetransmitPolicy.progress_interval"),
    "The default is 30 minutes": Code(TRANSPORT, "RetransmitPolicy.peer_timeout / 60"),
    "30 minutes by default": Code(TRANSPORT, "RetransmitPolicy.peer_timeout / 60"),
    "10 s for a write or read, 5 s for arbitration, 120 s for": Code(
        P4RUNTIME, "(CALL_TIMEOUT, ARBITRATION_TIMEOUT, PUSH_TIMEOUT)"),
    "0.1 s at a time": Code(SERVER, "ACCEPT_BACKOFF"),
    "token), for 30 s": Code("innet_aggregation.switch_ctl.manager.proof", "PROOF_SECONDS"),
    "in the last 10 minutes": Code(SERVER, "TRUSTED_SECONDS / 60"),
    "every test (600 s, generous for BMv2)": "pytest-timeout's bound, pyproject.toml",
    # the tests' settings
    "pauses 40 s": "test_slow_and_dead.py's pause",
    "a rank paused 12 s with": "test_slow_and_dead.py's pause past the switch timeout",
    "three 3 s leases": "test_manager_listener.py's leases",
    "0, 1 and 10 % loss": "the tree tests' loss rates",
    "1 % and 10 % loss": "test_end_to_end.py's loss rates",
    "a 5 ms RTO cap": "test_end_to_end.py's setting",
    "restarted 5 s later": "test_torchrun_fallback.py's outage",
    "within 0.5 point": "test_ddp.py's accuracy tolerance",
    # versions
    "Python 3.11, 3.12 and 3.13": "the interpreters the install test covers",
    "protoc < 3.19": "a version bound",
    "before 4.20": "a Linux version",
    "in torch 2.13": "a torch version",
}


def quoted_wrongly(constants: dict) -> list[str]:
    """The phrases whose numbers are not the code's constant they quote."""
    wrong = []
    for phrase, source in constants.items():
        if isinstance(source, Code):
            quoted = tuple(float(n) for n in re.findall(r"\d+(?:\.\d+)?", phrase))
            code = source.values()
            if len(quoted) != len(code) or not all(map(math.isclose, quoted, code)):
                wrong.append(f"{phrase!r} quotes {quoted}, {source.module}.{source.expr} "
                             f"is {code}")
    return wrong


def _prose(text: str) -> str:
    """The text outside code, rendered figures, snippet lines, link targets and the
    README's rendered block, on one line."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(re.escape(render_results.BEGIN) + ".*?" + re.escape(render_results.END), "",
                  text, flags=re.S)
    text = render_results.FIGURE.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = "\n".join(l for l in text.splitlines() if not l.startswith("--8<--"))
    text = re.sub(r"`[^`]*`", " CODE ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return " ".join(text.split())


def typed_figures(text: str) -> list[str]:
    """The figures in a page's prose that look measured and are no known constant."""
    prose = _prose(text)
    for phrase in CONSTANTS:
        prose = prose.replace(phrase, " ")
    return TYPED.findall(prose)


# Every page of the site and the folder READMEs, but the rendered ones and History:
# History is the dated log of the runs before the records, transcribed verbatim from
# the READMEs up to 8952884 (its note says so); no record backs them.
PAGES = sorted(str(p.relative_to(REPO)) for p in [REPO / "README.md", *render_results.pages()]
               if p != DOCS / "history.md")


@pytest.mark.parametrize("page", PAGES)
def test_no_measured_figure_is_typed_by_hand(page):
    """A measured figure on a page comes from its record (render_results.py), never
    typed into the prose."""
    typed = typed_figures((REPO / page).read_text())
    assert not typed, f"{page}: figures typed by hand: {typed} (render them from a record)"


def test_every_allowed_constant_is_still_on_a_page():
    prose = " ".join(_prose((REPO / page).read_text()) for page in PAGES)
    stale = [phrase for phrase in CONSTANTS if phrase not in prose]
    assert not stale, f"CONSTANTS lists phrases no page has any more: {stale}"


def test_every_constant_the_docs_quote_is_the_codes():
    wrong = quoted_wrongly(CONSTANTS)
    assert not wrong, f"the docs quote constants the code no longer has: {wrong}"


def test_a_changed_constant_fails_the_check(monkeypatch):
    from innet_aggregation.worker import fallback
    monkeypatch.setattr(fallback, "DEFAULT_SWITCH_TIMEOUT", 20.0)
    assert quoted_wrongly(CONSTANTS) == [
        "'(default 10 s)' quotes (10.0,), innet_aggregation.worker.fallback."
        "DEFAULT_SWITCH_TIMEOUT is (20.0,)"]


def test_a_typed_figure_fails_the_check(tmp_path):
    page = tmp_path / "reliability.md"
    text = (DOCS / "how-it-works" / "reliability.md").read_text()
    assert not typed_figures(text)
    for figure in ("2.3", "41 ms", "12 %", "3x", "912 kpps", "640 MB/s", "5 s", "1.4 Gbit/s"):
        page.write_text(text + f"\nThe switch path took {figure} here.\n")
        assert typed_figures(page.read_text()) == [figure], figure
    # a constant is allowed only as its phrase: the same figure elsewhere is flagged
    page.write_text(text + "\nIt came within 10 % of the ring.\n")
    assert typed_figures(page.read_text()) == ["10 %"]
    # a rendered figure is not typed, but a marker's figure changed by hand shows
    # in the records' check (test_an_inline_figure_changed_by_hand_shows_in_the_check)
    page.write_text(text + "\nRedone: <!-- fig:demo-redone-share -->1.5%<!-- /fig -->.\n")
    assert not typed_figures(page.read_text())


def test_a_changed_record_shows_in_the_check(tmp_path, monkeypatch):
    copy = tmp_path / "results"
    shutil.copytree(DOCS / "results", copy)
    record = copy / "bench-allreduce.json"
    r = json.loads(record.read_text())
    r["figures"]["points"][0]["ratio"]["median"] -= 0.05
    record.write_text(json.dumps(r))
    monkeypatch.setattr(render_results, "RECORDS", copy)
    assert render_results.main(["--check"]) == 1


def test_an_inline_figure_follows_its_record(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "results"
    shutil.copytree(DOCS / "results", copy)
    record = copy / "demo-small.json"
    r = json.loads(record.read_text())
    switch = r["figures"]["backends"]["switch"]      # a measured demo: each worker's answer
    for answer in switch:
        answer["redone"] = answer["aggregation_packets"] / 2
    record.write_text(json.dumps(r))
    monkeypatch.setattr(render_results, "RECORDS", copy)
    assert render_results.inline_figures()["demo-redone-share"] == "50.0%"
    assert render_results.main(["--check"]) == 1
    assert "docs/how-it-works/quantization.md: differs" in capsys.readouterr().out


def test_an_unknown_or_misplaced_inline_figure_is_refused():
    with pytest.raises(SystemExit, match="fig:no-such-figure"):
        render_results.with_figures("a <!-- fig:no-such-figure -->1<!-- /fig -->", {}, "page.md")
    with pytest.raises(SystemExit, match="starts a line"):
        render_results.with_figures("were\n<!-- fig:x -->1<!-- /fig -->", {"x": "1"}, "page.md")


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
    for rel in ("switch_ctl/config.py", "switch_ctl/tree.py", "switch_ctl/manager/config.py",
                "switch_ctl/manager/tenants.py"):
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
