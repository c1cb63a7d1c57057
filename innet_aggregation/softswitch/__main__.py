"""``python -m innet_aggregation.softswitch``: simple_switch_grpc's command line, run in Python.

    python -m innet_aggregation.softswitch -i 1@veth1 -i 2@veth2 --device-id 0 --no-p4 \\
        -- --grpc-server-addr 127.0.0.1:9559

P4Runtime listens on 127.0.0.1:9559 unless told otherwise (simple_switch_grpc:
0.0.0.0:9559), because whoever reaches it programs the switch. TLS takes
simple_switch_grpc's options: --grpc-server-ssl --grpc-server-cert PEM
--grpc-server-key PEM, and for mutual TLS --grpc-server-cacert PEM
--grpc-server-with-client-auth.

The data plane's counters (frames received, sent, and every frame lost, by where:
``DataPlane.counters``) are logged at exit, a warning says when losses grow, and
``--counters-file PATH`` keeps them in PATH as JSON (rewritten once a second when
they changed, and at exit), where the testbed reads them beside the P4 counters.
``--metrics-addr HOST:PORT`` serves them, every P4 counter and each port's frames and
bytes to Prometheus (metrics.py; loopback only unless --metrics-cert and --metrics-key).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time

from innet_aggregation.addresses import is_loopback
from innet_aggregation.softswitch.frontend import DROP_PORT
from innet_aggregation.softswitch.dataplane import MAX_IO_THREADS, io_threads_argument

LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
          "warn": logging.WARNING, "error": logging.ERROR, "off": logging.CRITICAL + 1}
DEFAULT_GRPC = "127.0.0.1:9559"
TLS_FILES = ("grpc_server_cacert", "grpc_server_cert", "grpc_server_key")


class ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgumentError(message)


log = logging.getLogger("softswitch")


def _interface(text: str) -> tuple[int, str]:
    number, sep, ifname = text.partition("@")
    if not sep or not ifname or not number.isdigit():
        raise argparse.ArgumentTypeError(f"expected PORT@IFACE, got {text!r}")
    port = int(number)
    if port >= 512:
        raise argparse.ArgumentTypeError(f"port {port} is not a 9-bit port number")
    return port, ifname


def _grpc_addr(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def _grpc_server_arguments(parser) -> None:
    """simple_switch_grpc's P4Runtime server options, accepted before and after '--'."""
    parser.add_argument("--grpc-server-addr", type=_grpc_addr)
    parser.add_argument("--grpc-server-ssl", action="store_true")
    parser.add_argument("--grpc-server-cacert", metavar="PEM")
    parser.add_argument("--grpc-server-cert", metavar="PEM")
    parser.add_argument("--grpc-server-key", metavar="PEM")
    parser.add_argument("--grpc-server-with-client-auth", action="store_true")


def _check_tls(args) -> None:
    """simple_switch_grpc's rules, except that what it only warns about (certificates
    or client auth without --grpc-server-ssl) is refused: TLS is never silently off."""
    given = [f"--{n.replace('_', '-')}" for n in TLS_FILES if getattr(args, n)]
    if args.grpc_server_with_client_auth:
        given.append("--grpc-server-with-client-auth")
    if not args.grpc_server_ssl:
        if given:
            raise ArgumentError(f"{', '.join(given)} given without --grpc-server-ssl "
                                "(TLS is off unless --grpc-server-ssl is given)")
        return
    for name in ("grpc_server_cert", "grpc_server_key"):
        if not getattr(args, name):
            raise ArgumentError(f"--grpc-server-ssl needs --{name.replace('_', '-')}")
    if args.grpc_server_with_client_auth and not args.grpc_server_cacert:
        raise ArgumentError("--grpc-server-with-client-auth needs --grpc-server-cacert "
                            "(the CA that client certificates must be signed by)")


def server_credentials(args):
    """grpc server credentials from the TLS options, or None for plaintext; raises
    ValueError naming a file that cannot be read or holds no PEM."""
    import grpc

    if not args.grpc_server_ssl:
        return None
    pem = {}
    for name in TLS_FILES:
        path = getattr(args, name)
        if not path:
            pem[name] = None
            continue
        option = f"--{name.replace('_', '-')}"
        try:
            with open(path, "rb") as f:
                pem[name] = f.read()
        except OSError as exc:
            raise ValueError(f"{option} {path}: {exc.strerror}") from None
        if b"-----BEGIN " not in pem[name]:
            raise ValueError(f"{option} {path} is not a PEM file")
    return grpc.ssl_server_credentials(
        [(pem["grpc_server_key"], pem["grpc_server_cert"])],
        root_certificates=pem["grpc_server_cacert"],
        require_client_auth=args.grpc_server_with_client_auth)


def describe_server(args) -> str:
    """How P4Runtime is served, for the start-up line."""
    if not args.grpc_server_ssl:
        return f"{args.grpc_server_addr} (plaintext)"
    if args.grpc_server_with_client_auth:
        return (f"{args.grpc_server_addr} (TLS, client certificates required, signed by "
                f"{args.grpc_server_cacert})")
    return f"{args.grpc_server_addr} (TLS, no client certificates)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--" in argv:
        cut = argv.index("--")
        main_argv, target_argv = argv[:cut], argv[cut + 1:]
    else:
        main_argv, target_argv = argv, []
    parser = _Parser(prog="python -m innet_aggregation.softswitch",
                     description="Embedded software switch with simple_switch_grpc's command "
                                 "line. Target options follow '--'.",
                     epilog=f"target options (after --, or before it): --grpc-server-addr "
                            f"HOST:PORT (default {DEFAULT_GRPC}, loopback only), "
                            f"--grpc-server-ssl, --grpc-server-cert PEM, --grpc-server-key PEM, "
                            f"--grpc-server-cacert PEM, --grpc-server-with-client-auth; "
                            f"--drop-port N (default {DROP_PORT})")
    parser.add_argument("json", nargs="?", help="BMv2 JSON to load at start")
    parser.add_argument("-i", "--interface", action="append", type=_interface, default=[],
                        metavar="PORT@IFACE", help="attach IFACE as switch port PORT")
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("-L", "--log-level", choices=sorted(LEVELS), default="info")
    parser.add_argument("--log-console", action="store_true", help="log to stderr (always on)")
    parser.add_argument("--log-file", help="also log to this file")
    parser.add_argument("--no-p4", action="store_true",
                        help="start with no program; wait for SetForwardingPipelineConfig")
    parser.add_argument("--counters-file", metavar="PATH",
                        help="keep the data plane's counters in PATH (JSON), updated every "
                             "second")
    parser.add_argument("--metrics-addr", metavar="HOST:PORT",
                        help="serve Prometheus metrics here (loopback unless TLS is given)")
    parser.add_argument("--metrics-cert", metavar="PEM", help="TLS certificate for --metrics-addr")
    parser.add_argument("--metrics-key", metavar="PEM", help="TLS key for --metrics-addr")
    _grpc_server_arguments(parser)
    parser.add_argument("--io-threads", type=io_threads_argument, default=None, metavar="N",
                        help=f"native backend: packet I/O threads, the ports shared out "
                             f"among them (1 to {MAX_IO_THREADS}; default: a quarter of the "
                             f"cores, at least 1 and at most one a port)")
    parser.add_argument("--backend", choices=("native", "python"), default=None,
                        help="run programs compiled to C (native, the default where a C "
                             "compiler is present) or in Python")
    # Accepted so that Mininet's and BMv2's usual command lines work; they have no effect.
    for option in ("--thrift-port", "--nanolog", "--notifications-addr", "--max-port-count"):
        parser.add_argument(option, help=argparse.SUPPRESS)
    parser.add_argument("--pcap", nargs="?", const=".", help=argparse.SUPPRESS)
    parser.add_argument("--debugger", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(main_argv)
    target = _Parser(prog="python -m innet_aggregation.softswitch ... --", add_help=False)
    _grpc_server_arguments(target)
    target.add_argument("--cpu-port", type=int)
    target.add_argument("--drop-port", type=int, default=DROP_PORT)
    # simple_switch_grpc options with no meaning here, accepted for the same command line.
    target.add_argument("--priority-queues", help=argparse.SUPPRESS)
    target.add_argument("--max-mc-groups", help=argparse.SUPPRESS)
    target.add_argument("--disable-swap", action="store_true", help=argparse.SUPPRESS)
    targs = target.parse_args(target_argv)
    if not 0 <= targs.drop_port < 512:
        raise ArgumentError(f"--drop-port {targs.drop_port} is not a 9-bit port")
    args.drop_port = targs.drop_port
    for name in ("grpc_server_addr", "grpc_server_ssl", "grpc_server_with_client_auth",
                 *TLS_FILES):
        setattr(args, name, getattr(targs, name) or getattr(args, name))
    args.grpc_server_addr = args.grpc_server_addr or DEFAULT_GRPC
    _check_tls(args)
    args.cpu_port = targs.cpu_port
    if args.json is None and not args.no_p4:
        raise ArgumentError("give a BMv2 JSON file or --no-p4")
    if args.json is not None and args.no_p4:
        raise ArgumentError("give either a BMv2 JSON file or --no-p4, not both")
    ports = {}
    for port, ifname in args.interface:
        if port in ports:
            raise ArgumentError(f"port {port} is given twice")
        if port == args.drop_port:
            raise ArgumentError(f"port {port} is the drop port (--drop-port)")
        ports[port] = ifname
    args.ports = ports
    _check_metrics(args)
    return args


def _check_metrics(args) -> None:
    from innet_aggregation.softswitch.metrics import check_listen

    if (args.metrics_cert is None) != (args.metrics_key is None):
        raise ArgumentError("--metrics-cert and --metrics-key go together")
    if args.metrics_cert and not args.metrics_addr:
        raise ArgumentError("--metrics-cert given without --metrics-addr")
    if args.metrics_addr:
        try:
            check_listen(args.metrics_addr, args.metrics_cert is not None)
        except ValueError as exc:
            raise ArgumentError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except ArgumentError as exc:
        print(f"softswitch: error: {exc}", file=sys.stderr)
        return 2
    handlers = [logging.StreamHandler()]
    if args.log_file:
        handlers.append(logging.FileHandler(args.log_file))
    logging.basicConfig(level=LEVELS[args.log_level], handlers=handlers,
                        format="%(asctime)s softswitch %(levelname)s %(message)s")

    from innet_aggregation.softswitch.frontend import Unsupported
    from innet_aggregation.softswitch.dataplane import DataPlane, check_interface, tx_method
    from innet_aggregation.softswitch.p4runtime import Device, serve
    from innet_aggregation.softswitch.backends import load_pipeline

    try:
        for ifname in args.ports.values():
            check_interface(ifname)
        credentials = server_credentials(args)
    except ValueError as exc:
        print(f"softswitch: error: {exc}", file=sys.stderr)
        return 1
    backend = args.backend or "native"
    pipeline = None
    if args.json is not None:
        try:
            with open(args.json, "rb") as f:
                pipeline = load_pipeline(f.read(), args.drop_port, backend)
        except OSError as exc:
            print(f"softswitch: error: cannot read {args.json}: {exc}", file=sys.stderr)
            return 1
        except (Unsupported, ValueError) as exc:
            print(f"softswitch: error: cannot load {args.json}: {exc}", file=sys.stderr)
            return 1
    if args.cpu_port is not None and args.cpu_port in args.ports:
        print(f"softswitch: error: --cpu-port {args.cpu_port} is also an interface's port",
              file=sys.stderr)
        return 1
    try:
        tx = tx_method()
    except ValueError as exc:
        print(f"softswitch: error: {exc}", file=sys.stderr)
        return 1
    try:
        dataplane = DataPlane(args.ports, args.io_threads, tx)
    except (OSError, ValueError) as exc:
        print(f"softswitch: error: cannot open the interfaces: {exc}", file=sys.stderr)
        return 1
    dataplane.set_pipeline(pipeline)
    cpu_port = args.cpu_port
    device = Device(args.device_id, on_pipeline=dataplane.set_pipeline,
                    drop_port=args.drop_port, backend=backend,
                    on_packet_out=None if cpu_port is None
                    else lambda frame: dataplane.inject(frame, cpu_port))
    # Before P4Runtime: a switch that answers there serves its metrics already.
    metrics = None
    if args.metrics_addr:
        from innet_aggregation.softswitch.metrics import serve_metrics
        try:
            metrics = serve_metrics(args.metrics_addr, dataplane, device, args.ports,
                                    args.metrics_cert, args.metrics_key)
        except (OSError, ValueError) as exc:
            print(f"softswitch: error: cannot serve metrics on {args.metrics_addr}: {exc}",
                  file=sys.stderr)
            dataplane.stop()
            return 1
        log.info("Prometheus metrics on %s%s", args.metrics_addr,
                 " (TLS)" if args.metrics_cert else "")
    try:
        server = serve(device, args.grpc_server_addr, credentials)
    except (OSError, RuntimeError) as exc:
        print(f"softswitch: error: cannot serve P4Runtime on {args.grpc_server_addr}: {exc}",
              file=sys.stderr)
        if metrics is not None:
            metrics.shutdown()
        dataplane.stop()
        return 1
    # Before the line that says it is up, so a SIGTERM right after it stops it in order.
    # The handler only records the signal: one that set the event itself would re-enter
    # the event's lock if a second signal came while the main thread held it (a switch
    # once hung so in server.stop, dumped by SIGUSR1 below).
    signalled: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: signalled.append(signum))
    # A switch that does not stop can be asked where it is: every thread's stack to the log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    dataplane.start()
    log.info("device %d (%s backend): ports %s, P4Runtime on %s%s", args.device_id, backend,
             ", ".join(f"{p}@{i}" for p, i in sorted(args.ports.items())) or "none",
             describe_server(args), "" if pipeline else ", waiting for a pipeline")
    if not is_loopback(args.grpc_server_addr.rpartition(":")[0].strip("[]")) and not args.grpc_server_with_client_auth:
        log.warning("P4Runtime on %s takes connections from other machines without client "
                    "certificates: whoever reaches it can program this switch (use "
                    "--grpc-server-ssl ... --grpc-server-with-client-auth)",
                    args.grpc_server_addr)
    stop = threading.Event()
    watch = threading.Thread(target=watch_counters, args=(dataplane, stop, args.counters_file),
                             daemon=True, name="counters")
    watch.start()
    # Woken twice a second: a signal the kernel gives another thread (gRPC's, the data
    # plane's) has its handler run only when the main thread next runs Python.
    while not signalled:
        time.sleep(0.5)
    stop.set()
    if metrics is not None:
        metrics.shutdown()
    server.stop(0.5)
    watch.join()
    dataplane.stop()
    counters = dataplane.counters()
    if args.counters_file:
        write_counters(args.counters_file, counters)
    log.info("stopped after %d packets in, %d out; %s", counters["received"], counters["sent"],
             ", ".join(f"{k} {v}" for k, v in counters.items() if k not in ("received", "sent")))
    return 0


LOSSES = ("dropped", "send_errors", "ring_drops", "no_room", "no_port")


def watch_counters(dataplane, stop: threading.Event, path: str | None,
                   interval: float = 1.0) -> None:
    """Once a second: a warning where frames were lost since the last look, and the
    counters into ``path`` where they changed. Reads the loop's counters only: the
    fast path pays nothing for them."""
    last = None
    while not stop.wait(interval):
        counters = dataplane.counters()
        if last is not None:
            grown = {k: counters[k] - last[k] for k in LOSSES if counters[k] > last[k]}
            if grown:
                log.warning("the data plane lost frames in the last %g s: %s", interval,
                            ", ".join(f"{k} {v}" for k, v in grown.items()))
        if path and counters != last:
            write_counters(path, counters)
        last = counters


def write_counters(path: str, counters: dict[str, int]) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(counters, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
