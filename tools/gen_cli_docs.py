"""Write docs/reference/cli.md from the argparse parsers of every command line.

Each command's parser is taken from the command itself (its main() is called with
--help, and the parser is caught at parse_args), so the page lists exactly the
options the code accepts; tests/docs/test_reference.py fails when the committed
page differs from what this writes.

    python tools/gen_cli_docs.py            # rewrite docs/reference/cli.md
    python tools/gen_cli_docs.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reference" / "cli.md"

# (heading, how it is run, module, how main is called: "argv" takes a list, "sys" reads sys.argv)
COMMANDS = [
    ("switch-ctl", "python -m innet_aggregation.switch_ctl (or switch-ctl)",
     "innet_aggregation.switch_ctl.cli", "argv"),
    ("softswitch", "python -m innet_aggregation.softswitch", "innet_aggregation.softswitch.__main__", "argv"),
    ("testbed", "make testbed; python -m innet_aggregation.testbed.topology",
     "innet_aggregation.testbed.topology", "argv"),
    ("demo", "make demo; python -m innet_aggregation.testbed.demo", "innet_aggregation.testbed.demo", "argv"),
    ("loss-experiment", "make loss-experiment; python -m innet_aggregation.testbed.loss_experiment",
     "innet_aggregation.testbed.loss_experiment", "argv"),
    ("straggler-experiment", "make straggler-experiment; python -m innet_aggregation.testbed.straggler_experiment",
     "innet_aggregation.testbed.straggler_experiment", "argv"),
    ("sharing-experiment", "make sharing-experiment; python -m innet_aggregation.testbed.sharing_experiment",
     "innet_aggregation.testbed.sharing_experiment", "argv"),
    ("bench-allreduce", "make bench-allreduce; python -m innet_aggregation.testbed.baseline_experiment",
     "innet_aggregation.testbed.baseline_experiment", "argv"),
    ("bench-scaling", "make bench-scaling; python -m innet_aggregation.testbed.scaling_experiment",
     "innet_aggregation.testbed.scaling_experiment", "argv"),
    ("record-gradients", "make record-gradients; python -m innet_aggregation.testbed.gradients",
     "innet_aggregation.testbed.gradients", "argv"),
    ("bench-switch", "make bench-switch; python benchmarks/bench_switch.py", "bench_switch", "sys"),
    ("bench-worker", "make bench-worker; python benchmarks/bench_worker.py", "bench_worker", "sys"),
    ("bench-backend", "make bench-backend; python benchmarks/bench_backend.py", "bench_backend", "sys"),
    ("bench-exponents", "make bench-exponents; python -m benchmarks.bench_exponents",
     "benchmarks.bench_exponents", "sys"),
    ("worker", "python -m innet_aggregation.worker.run", "innet_aggregation.worker.run", "argv"),
    ("fuzz", "make fuzz; python -m tests.worker.fuzz", "tests.worker.fuzz", "argv"),
    ("p4build", "make p4, make p4-tofino; python tools/p4build.py", "p4build", "sys"),
    ("stf-samples", "make p4c-samples; python tools/stf_samples.py", "stf_samples", "argv"),
    ("tofino-resources", "python tools/tofino_resources.py", "tofino_resources", "sys"),
    ("render-results", "python tools/render_results.py", "render_results", "argv"),
    ("gen-cli-docs", "python tools/gen_cli_docs.py", "gen_cli_docs", "argv"),
]


class _Caught(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_of(module: str, call: str) -> argparse.ArgumentParser:
    """The first parser the command's main() parses with."""
    for path in (REPO, REPO / "benchmarks", REPO / "tools"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    main = importlib.import_module(module).main
    original = argparse.ArgumentParser.parse_args

    def catch(self, *args, **kwargs):
        raise _Caught(self)

    argparse.ArgumentParser.parse_args = catch
    argv, sys.argv = sys.argv, [module, "--help"]
    try:
        main(["--help"]) if call == "argv" else main()
    except _Caught as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv = argv
    raise RuntimeError(f"{module}.main() parsed no arguments")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _expand(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    return _cell(parser._get_formatter()._expand_help(action))


def options(parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = []
    if parser.description:
        out += [_cell(parser.description), ""]
    rows, subcommands = [], None
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            subcommands = action
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        if action.choices is not None:
            arg = "{" + ",".join(map(str, action.choices)) + "}"
        elif action.nargs == 0:
            arg = ""
        else:
            arg = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        default = ("" if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0
                   else f"`{str(action.default).replace(str(REPO) + '/', '')}`")
        rows.append(f"| {name} | {_cell(arg) if action.option_strings else ''} | {default} | "
                    f"{_expand(parser, action)} |")
    if rows:
        out += ["| option | argument | default | meaning |", "| --- | --- | --- | --- |", *rows, ""]
    if parser.epilog:
        out += [_cell(parser.epilog), ""]
    if subcommands is not None:
        helps = {a.dest: a.help for a in subcommands._choices_actions}
        for name, sub in subcommands.choices.items():
            out += [f"{'#' * (level + 1)} {parser.prog.split()[-1]} {name}", ""]
            if helps.get(name) and not sub.description:
                out += [_cell(helps[name]), ""]
            out += options(sub, level + 1)
    return out


def render() -> str:
    lines = ["# Command lines", "",
             "Every option of every command, from the command's own argparse parser "
             "(written by `python tools/gen_cli_docs.py`; a test fails when this page is stale).",
             ""]
    for heading, run, module, call in COMMANDS:
        parser = parser_of(module, call)
        lines += [f"## {heading}", "", f"Run: `{run}`", ""]
        lines += options(parser, 2)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not PAGE.exists() or PAGE.read_text() != text
        if stale:
            print(f"{PAGE.relative_to(REPO)} is stale: python tools/gen_cli_docs.py")
        return 1 if stale else 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
