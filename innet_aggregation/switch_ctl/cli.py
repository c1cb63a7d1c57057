"""switch-ctl: push the program, apply a job, set loss, read counters, remove a job.

    python -m innet_aggregation.switch_ctl push --grpc-addr 127.0.0.1:9559
    python -m innet_aggregation.switch_ctl apply job.toml [--push]
    python -m innet_aggregation.switch_ctl counters job.toml [--json]
    python -m innet_aggregation.switch_ctl loss job.toml --ingress 0.01 --egress 0.01
    python -m innet_aggregation.switch_ctl remove job.toml
    python -m innet_aggregation.switch_ctl check job.toml --p4info p4src/tna/build/aggregation.p4info.txtpb
    python -m innet_aggregation.switch_ctl serve --config manager.toml   # the job manager
    python -m innet_aggregation.switch_ctl jobs --config manager.toml    # what it runs

A job file may describe a tree of switches (switch_ctl/tree.py): every command then
acts on each of its switches in turn. TLS: the job file's ca_cert, client_cert and
client_key, or --ca-cert, --client-cert and --client-key in their place.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from finsy.proto import p4r

from innet_aggregation.p4src import protocol

from . import config as config_mod
from . import jobfile
from .client import DryRun, P4RuntimeError, SwitchConnection
from .config import TLSConfig
from .control_base import field_value
from .controller import Controller
from .overlaps import JobOverlap
from .tree import Tree


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switch_ctl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def target(p, config_required):
        if config_required:
            p.add_argument("config", type=Path, help="job configuration (TOML)")
        else:
            p.add_argument("config", type=Path, nargs="?", help="job configuration (TOML)")
        p.add_argument("--grpc-addr", help="overrides the config's switch.grpc_addr")
        p.add_argument("--device-id", type=int, help="overrides the config's switch.device_id")
        p.add_argument("--election-id", type=int, default=1,
                       help="P4Runtime election id; the highest connected one may write")
        p.add_argument("--connect-timeout", type=float, default=10.0,
                       help="seconds to wait for the switch's gRPC server")
        p.add_argument("--ca-cert", type=Path, help="TLS: the CA the switch's certificate is "
                                                    "signed by (overrides the config's ca_cert)")
        p.add_argument("--client-cert", type=Path,
                       help="mutual TLS: this controller's certificate (overrides client_cert)")
        p.add_argument("--client-key", type=Path,
                       help="mutual TLS: the key of --client-cert (overrides client_key)")

    push = sub.add_parser("push", help="install the compiled program")
    target(push, False)
    push.add_argument("--json", type=Path, default=protocol.PROGRAM_JSON)
    push.add_argument("--p4info", type=Path, default=protocol.P4INFO)
    apply = sub.add_parser("apply", help="install (or update) the job in CONFIG; refused, "
                                         "naming both, if it collides with another job")
    target(apply, True)
    apply.add_argument("--push", action="store_true", help="push the program first")
    counters = sub.add_parser("counters", help="print the program's counters")
    target(counters, False)
    counters.add_argument("--json", action="store_true", help="print JSON instead of a table")
    loss = sub.add_parser("loss", help="set simulated loss on the config's switch ports")
    target(loss, True)
    loss.add_argument("--ingress", type=float)
    loss.add_argument("--egress", type=float)
    loss.add_argument("--switches", help="a tree's switches to set it on, comma-separated "
                                         "(default: all)")
    remove = sub.add_parser("remove", help="remove the job in CONFIG")
    target(remove, True)
    reset = sub.add_parser("reset", help="return the slots of the job in CONFIG to a fresh "
                                         "switch's state (after a failed call)")
    target(reset, True)
    check = sub.add_parser("check", help="print what apply would write for CONFIG into a program, "
                                         "from its P4Info alone (no switch): the Tofino build's, say")
    check.add_argument("config", type=Path, help="job configuration (TOML)")
    check.add_argument("--p4info", type=Path, default=protocol.P4INFO)
    serve = sub.add_parser("serve", help="run the job manager: ranks register, it installs "
                                         "their jobs on its switch (switch_ctl/manager/)")
    serve.add_argument("--config", type=Path, required=True, help="the manager's TOML")
    jobs = sub.add_parser("jobs", help="list the jobs a running manager holds and queues")
    jobs.add_argument("--config", type=Path, required=True,
                      help="the manager's TOML (its address, and the secret of its operator "
                           "tenant, else of its first)")
    jobs.add_argument("--ca-cert", type=Path, help="the CA of the manager's certificate")
    jobs.add_argument("--json", action="store_true", help="print JSON instead of lines")
    return parser


def serve(args) -> None:
    import logging
    from .manager import config as manager_config
    from .manager.server import Manager
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    manager = Manager(manager_config.load(args.config)).start()
    try:
        manager.wait()
    except KeyboardInterrupt:
        pass
    finally:
        manager.stop()


def list_jobs(args) -> None:
    from .manager import config as manager_config
    from .manager.client import JoinError, _Manager
    config = manager_config.load(args.config)
    host, port = config.listen
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    # An operator sees every tenant's jobs; else the file's first tenant, its own.
    tenant = next((t for t in config.tenants.values() if t.operator),
                  next(iter(config.tenants.values())))
    try:
        answer = _Manager(f"{host}:{port}", tenant.secret.decode(), args.ca_cert,
                          config.insecure).request({"op": "jobs"})
    except (OSError, JoinError) as exc:
        raise P4RuntimeError(str(exc)) from None
    if answer.get("status") != "ok":
        raise P4RuntimeError(f"the manager refused: {answer.get('error')}")
    if args.json:
        print(json.dumps({k: answer.get(k, []) for k in ("running", "waiting", "removing")},
                         indent=2))
        return
    for job in answer["running"]:
        print(f"running {job['name']}{_tenant(job)}: id {job['id']}, "
              f"slots {job['slots'][0]}..{job['slots'][1]}, UDP port {job['udp_port']}, "
              f"service {job['service_ip']}, {job['ranks']} ranks"
              + (f" ({len(job['closed'])} closed)" if job["closed"] else ""))
    for job in answer["waiting"]:
        print(f"waiting {job['name']}{_tenant(job)}: {len(job['registered'])} of "
              f"{job['world']} ranks, {job['slots']} slots: {job['message']}")
    for job in answer.get("removing", []):
        print(f"removing {job['name']}{_tenant(job)}: id {job['id']}, leaving the switch")


def _tenant(job: dict) -> str:
    """A job's tenant, where the manager has more than the default one."""
    return "" if job.get("tenant") == "default" else f" (tenant {job.get('tenant')})"


def _connection(args, config) -> SwitchConnection:
    if args.command == "check":
        return DryRun(args.p4info)
    addr = args.grpc_addr or (config.switch.grpc_addr if config else None)
    if not addr:
        raise SystemExit("switch_ctl: give a CONFIG or --grpc-addr")
    device = args.device_id if args.device_id is not None else (
        config.switch.device_id if config else 0)
    return SwitchConnection(addr, device, (0, args.election_id), args.connect_timeout,
                            _tls(args, config))


def _tls(args, config) -> TLSConfig | None:
    """The config's TLS settings, with those the command line gives in their place."""
    tls = config.switch.tls if config else None
    given = {key: getattr(args, key, None) for key in config_mod.TLS_KEYS}
    if all(value is None for value in given.values()):
        return tls
    merged = {key: given[key] if given[key] is not None else getattr(tls, key, None)
              for key in config_mod.TLS_KEYS}
    problems: list[str] = []
    tls = config_mod.tls_config({k: v for k, v in merged.items() if v is not None}, None,
                                "switch", problems)
    if problems:
        raise config_mod.ConfigError(problems)
    return tls


def run(args) -> None:
    """One switch, or every switch of a tree: parents first when installing, children
    first when removing, so no switch forwards sums to one that lacks the job."""
    if args.command in ("serve", "jobs"):
        (serve if args.command == "serve" else list_jobs)(args)
        return
    config = jobfile.load(args.config) if args.config else None
    if not isinstance(config, Tree):
        if getattr(args, "switches", None):
            raise SystemExit("switch_ctl: --switches is for a tree's job file")
        run_on_switch(args, config)
        return
    if getattr(args, "grpc_addr", None) is not None or getattr(args, "device_id", None) is not None:
        raise SystemExit("switch_ctl: a tree names each switch's address; --grpc-addr and "
                         "--device-id apply to one-switch jobs only")
    names = list(config.switches)
    if getattr(args, "switches", None):
        wanted = args.switches.split(",")
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise SystemExit(f"switch_ctl: no switch {', '.join(unknown)} in the tree {names}")
        names = [n for n in names if n in wanted]
    if args.command == "remove":
        names.reverse()
    for name in names:       # every switch's TLS files before anything is written to any
        tls = _tls(args, config.switches[name])
        if tls is not None and args.command != "check":
            tls.check(f"switches.{name}")
    if args.command == "apply" and not args.push:   # a push clears every job anyway
        check_tree(args, config, names)
    for name in names:
        print(f"[{name}]", flush=True)
        run_on_switch(args, config.switches[name])


def check_tree(args, tree: Tree, names: list[str]) -> None:
    """Every switch's installed jobs, checked before any switch is written to: a
    collision on a leaf must not leave the job installed on its parent alone."""
    problems = []
    for name in names:
        with _connection(args, tree.switches[name]) as conn:
            conn.load_p4info()
            try:
                Controller(conn).check_overlaps(tree.switches[name])
            except JobOverlap as exc:
                problems += [f"{name} ({conn.grpc_addr}): {p}" for p in exc.problems]
    if problems:
        raise JobOverlap(tree.job_id, "the switches of the tree", problems)


def run_on_switch(args, config: config_mod.Config | None) -> None:
    with _connection(args, config) as conn:
        if not conn.is_primary and args.command != "counters":
            raise P4RuntimeError(f"another controller is primary on {conn.grpc_addr} "
                                 f"(election id {args.election_id} is too low to write)")
        ctl = Controller(conn)
        if args.command == "push" or getattr(args, "push", False):
            ctl.push(*((args.json, args.p4info) if args.command == "push" else ()))
            print(f"pushed {protocol.PROGRAM_NAME} to {conn.grpc_addr}")
            if args.command == "push":
                return
        if args.command == "check":
            changes = ctl.apply(config)
            for update, entity in conn.written:
                print(f"{p4r.Update.Type.Name(update).lower()} {describe(entity, conn.schema)}")
            _print_applied(config, changes)
            return
        conn.load_p4info()
        if args.command == "apply":
            _print_applied(config, ctl.apply(config))
        elif args.command == "reset":
            slots = ctl.reset(config)
            print(f"job {config.job.id}: {slots} slots reset")
        elif args.command == "remove":
            changes = ctl.remove(config)
            print(f"job {config.job.id} removed: {changes.deleted} entries deleted")
        elif args.command == "loss":
            if args.ingress is None and args.egress is None:
                raise SystemExit("switch_ctl loss: give --ingress and/or --egress")
            changes = ctl.set_loss(config.switch.ports, args.ingress, args.egress)
            print(f"loss set: {changes.total} entries written")
        elif args.command == "counters":
            counts = ctl.counters()
            if args.json:
                print(json.dumps(counts, indent=2, sort_keys=True))
            else:
                width = max(map(len, counts), default=10)
                print(f"{'counter':<{width}}  {'packets':>12}  {'bytes':>14}")
                for name, c in counts.items():
                    print(f"{name:<{width}}  {c['packets']:>12}  {c['bytes']:>14}")


def _print_applied(config, changes) -> None:
    print(f"job {config.job.id}: {changes.inserted} inserted, {changes.modified} modified, "
          f"{changes.deleted} deleted")
    if changes.skipped:
        print(f"job {config.job.id}: the program has no {', '.join(changes.skipped)}; "
              f"left out (optional)")


def _number(value: int) -> str:
    """Counts and ports in decimal, addresses and masks in hex."""
    return str(value) if value < 1 << 16 else hex(value)


def describe(entity, schema) -> str:
    """One line per entity, by the program's full names."""
    if entity.HasField("table_entry"):
        te = entity.table_entry
        table = schema.tables[te.table_id]
        fields = {mf.id: mf.name for mf in table.match_fields}
        match = " ".join(f"{fields[fm.field_id]}=" + "&&&".join(map(_number, field_value(fm)[1:]))
                         for fm in te.match)
        action = schema.actions[te.action.action.action_id]
        args = ", ".join(f"{action.params[p.param_id].name}={_number(int.from_bytes(p.value, 'big'))}"
                         for p in te.action.action.params)
        priority = f" priority={te.priority}" if te.priority else ""
        return f"{table.name} {match}{priority} -> {action.name}({args})"
    group = entity.packet_replication_engine_entry.multicast_group_entry
    replicas = ", ".join(f"port {r.egress_port} rid {r.instance}" for r in group.replicas)
    return f"multicast group {group.multicast_group_id}: {replicas}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        run(args)
    except (P4RuntimeError, config_mod.ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"switch_ctl: {exc}", file=sys.stderr)
        return 1
    return 0
