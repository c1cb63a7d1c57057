"""Where the softswitch serves P4Runtime and how: loopback by default, TLS with
simple_switch_grpc's options, each refusal of a bad combination named."""

from __future__ import annotations

import time

import pytest

from innet_aggregation.softswitch.__main__ import ArgumentError, parse_args
from innet_aggregation.testbed.targets import SwitchProcess
from innet_aggregation.testbed.tls import make_bundle
from tests.softswitch.test_cli_and_veth import run_cli


def test_p4runtime_listens_on_loopback_unless_told_otherwise():
    assert parse_args(["--no-p4"]).grpc_server_addr == "127.0.0.1:9559"
    for argv in (["--no-p4", "--", "--grpc-server-addr", "0.0.0.0:9000"],
                 ["--no-p4", "--grpc-server-addr", "0.0.0.0:9000"]):
        assert parse_args(argv).grpc_server_addr == "0.0.0.0:9000"


def test_tls_options_after_or_before_the_separator():
    tls = ["--grpc-server-ssl", "--grpc-server-cert", "s.pem", "--grpc-server-key", "s.key",
           "--grpc-server-cacert", "ca.pem", "--grpc-server-with-client-auth"]
    for argv in (["--no-p4", "--", *tls], ["--no-p4", *tls]):
        args = parse_args(argv)
        assert args.grpc_server_ssl and args.grpc_server_with_client_auth
        assert (args.grpc_server_cert, args.grpc_server_key, args.grpc_server_cacert) == (
            "s.pem", "s.key", "ca.pem")


@pytest.mark.parametrize("tls,message", [
    (["--grpc-server-cert", "s.pem"], "--grpc-server-cert given without --grpc-server-ssl"),
    (["--grpc-server-with-client-auth"],
     "--grpc-server-with-client-auth given without --grpc-server-ssl"),
    (["--grpc-server-ssl", "--grpc-server-key", "s.key"], "--grpc-server-ssl needs "
                                                          "--grpc-server-cert"),
    (["--grpc-server-ssl", "--grpc-server-cert", "s.pem"], "needs --grpc-server-key"),
    (["--grpc-server-ssl", "--grpc-server-cert", "s.pem", "--grpc-server-key", "s.key",
      "--grpc-server-with-client-auth"], "--grpc-server-with-client-auth needs "
                                         "--grpc-server-cacert"),
])
def test_incomplete_tls_options_are_refused(tls, message):
    with pytest.raises(ArgumentError, match=message):
        parse_args(["--no-p4", "--", *tls])
    result = run_cli("--no-p4", "--", *tls)
    assert result.returncode == 2 and message in result.stderr


def test_unreadable_or_non_pem_files_are_named(tmp_path):
    bundle = make_bundle(tmp_path / "tls")
    not_pem = tmp_path / "key.txt"
    not_pem.write_text("not a key\n")
    base = ["--no-p4", "--", "--grpc-server-ssl", "--grpc-server-cert", str(bundle.server_cert)]
    result = run_cli(*base, "--grpc-server-key", str(tmp_path / "missing.key"))
    assert result.returncode == 1
    assert f"--grpc-server-key {tmp_path / 'missing.key'}: No such file" in result.stderr
    result = run_cli(*base, "--grpc-server-key", str(not_pem))
    assert result.returncode == 1 and f"--grpc-server-key {not_pem} is not a PEM file" in \
        result.stderr


def start_line(process: SwitchProcess) -> str:
    """The switch's line saying it is up (logged just after its port opens)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = [line for line in process.log_tail().splitlines() if "P4Runtime on" in line]
        if lines:
            return lines[0]
        time.sleep(0.1)
    raise AssertionError(f"no start line in the switch's log:\n{process.log_tail()}")


def test_the_start_line_says_where_and_how_it_listens(tmp_path):
    with SwitchProcess("softswitch", {}, log_path=tmp_path / "plain.log") as plain:
        assert f"P4Runtime on {plain.grpc_addr} (plaintext)" in start_line(plain)
    bundle = make_bundle(tmp_path / "tls")
    with SwitchProcess("softswitch", {}, log_path=tmp_path / "tls.log", tls=bundle) as tls:
        assert (f"P4Runtime on {tls.grpc_addr} (TLS, client certificates required, signed by "
                f"{bundle.ca_cert})") in start_line(tls)
        assert "WARNING" not in tls.log_tail()
