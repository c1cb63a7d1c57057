"""The controller over mutual TLS, with certificates made in the test (openssl), against
each switch target serving simple_switch_grpc's TLS options.

The right CA and client certificate work (program, write, read back, the CLI with a
job file); no client certificate, one from another CA, plaintext, or a switch
certificate from another CA are refused, with a clear message from the controller
and the reason in the switch's log.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from innet_aggregation.switch_ctl import config as config_mod

from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.switch_ctl.client import P4RuntimeError, P4TableEntry, SwitchConnection
from innet_aggregation.switch_ctl.config import TLSConfig
from innet_aggregation.testbed.layout import job_config_dict, tree_config_dict
from innet_aggregation.testbed.targets import SwitchProcess, unavailable
from innet_aggregation.testbed.tls import make_bundle
from tests.softswitch.conftest import program_files

REPO = Path(__file__).resolve().parents[2]
JOBS = "AggIngress.job_lookup.jobs"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Our CA's certificates, and another CA's."""
    base = tmp_path_factory.mktemp("tls")
    return make_bundle(base / "ours"), make_bundle(base / "other")


@pytest.fixture(scope="module", params=["softswitch", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def switch(request, bundles, tmp_path_factory):
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("switch") / "switch.log"
    with SwitchProcess(request.param, {}, log_path=log, tls=bundles[0]) as process:
        yield process


def log_during(switch, action) -> str:
    """What the switch logged while ``action`` ran."""
    before = switch.log_path.stat().st_size
    action()
    with open(switch.log_path, "rb") as f:
        f.seek(before)
        return f.read().decode(errors="replace")


def mac_entry(port: int) -> P4TableEntry:
    return SwitchConnection.table_entry("Ing.mac_table", "Ing.forward",
                                        {"dst": "02:00:00:00:00:02"}, {"port": port})


def test_the_right_ca_and_client_certificate_work(switch, bundles):
    with SwitchConnection(switch.grpc_addr, 0, (0, 1), tls=bundles[0].controller()) as conn:
        assert conn.is_primary
        conn.push_pipeline(*program_files("forwarding"))
        conn.insert(mac_entry(3))
        (entry,) = conn.read(P4TableEntry("Ing.mac_table"))
        assert entry.match["dst"] == 0x020000000002
        assert entry.action.args == {"port": 3}


@pytest.mark.parametrize("case", ["no client certificate", "client certificate of another CA",
                                  "plaintext", "switch certificate of another CA"])
def test_the_wrong_credentials_are_refused(switch, bundles, case):
    ours, other = bundles
    tls, said, logged = {
        "no client certificate": (TLSConfig(ours.ca_cert),
                                  "it may require a client certificate",
                                  "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
        "client certificate of another CA": (
            TLSConfig(ours.ca_cert, other.client_cert, other.client_key),
            f"it did not accept the client certificate {other.client_cert}",
            "CERTIFICATE_VERIFY_FAILED"),
        "plaintext": (None, "it may require TLS", "WRONG_VERSION_NUMBER"),
        "switch certificate of another CA": (
            TLSConfig(other.ca_cert, other.client_cert, other.client_key),
            f"the switch's certificate is not signed by the CA in {other.ca_cert}", None),
    }[case]
    conn = SwitchConnection(switch.grpc_addr, 0, (0, 9), connect_timeout=10, tls=tls)
    raised = []

    def attempt():
        with pytest.raises(P4RuntimeError) as err:
            conn.connect()
        raised.append(str(err.value))

    log = log_during(switch, attempt)
    assert raised[0].startswith(f"cannot reach a P4Runtime server at {switch.grpc_addr}: ")
    assert said in raised[0] and "\n" not in raised[0]
    if logged:        # BoringSSL (grpcio) in capitals, OpenSSL (BMv2's gRPC) in words
        assert "Handshake failed" in log, log
        assert logged.replace("_", " ").lower() in log.replace("_", " ").lower(), log
    # The switch still serves its controller, and nothing was written.
    with SwitchConnection(switch.grpc_addr, 0, (0, 1), tls=ours.controller()) as conn:
        conn.push_pipeline(*program_files("forwarding"))
        assert conn.read(P4TableEntry("Ing.mac_table")) == []


def test_tls_against_a_plaintext_switch_is_refused(bundles, tmp_path):
    with SwitchProcess("softswitch", {}, log_path=tmp_path / "plain.log") as plain:
        conn = SwitchConnection(plain.grpc_addr, 0, (0, 1), tls=bundles[0].controller())
        with pytest.raises(P4RuntimeError, match="the switch does not answer TLS: does it "
                                                 "serve plaintext"):
            conn.connect()


def switch_ctl(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_the_cli_and_a_job_file_carry_the_tls_settings(switch, bundles, tmp_path):
    ours, other = bundles
    tls_dir = tmp_path / "tls"            # named relative to the job file
    tls_dir.mkdir()
    for path in (ours.ca_cert, ours.client_cert, ours.client_key):
        shutil.copy(path, tls_dir)
    flags = ["--ca-cert", str(ours.ca_cert), "--client-cert", str(ours.client_cert),
             "--client-key", str(ours.client_key)]
    pushed = switch_ctl("push", "--grpc-addr", switch.grpc_addr, *flags)
    assert pushed.returncode == 0, pushed.stderr
    raw = job_config_dict({1: "a", 2: "b"}, switch.grpc_addr, 0, job_id=1, num_slots=4)
    raw["switch"].update(ca_cert="tls/ca.pem", client_cert="tls/controller.pem",
                         client_key="tls/controller.key")
    job = tmp_path / "job.toml"
    job.write_text(tomli_w.dumps(raw))
    applied = switch_ctl("apply", str(job))
    assert applied.returncode == 0 and "job 1: " in applied.stdout, applied.stderr
    assert switch_ctl("counters", str(job), "--json").returncode == 0
    # The command line overrides the file's settings, one by one.
    refused = switch_ctl("counters", str(job), "--client-cert", str(other.client_cert),
                         "--client-key", str(other.client_key))
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "did not accept the client certificate" in refused.stderr
    half = switch_ctl("counters", str(job), "--client-cert", str(other.client_cert),
                      "--client-key", str(tmp_path / "missing.key"))
    assert half.returncode == 1 and "switch.client_key" in half.stderr
    assert f"{tmp_path / 'missing.key'}: No such file or directory" in half.stderr
    # A tree is checked whole: a missing file on one switch, nothing written to any.
    tree = tree_config_dict({"spine": (switch.grpc_addr, 0), "leaf0": ("127.0.0.1:1", 0)},
                            leaves=1, per_leaf=1, job_id=2, num_slots=4)
    tree["switches"]["spine"].update(ours.job_settings())
    tree["switches"]["leaf0"].update(ours.job_settings(), ca_cert="nowhere/ca.pem")
    tree_file = tmp_path / "tree.toml"
    tree_file.write_text(tomli_w.dumps(tree))
    refused = switch_ctl("apply", str(tree_file))
    assert refused.returncode == 1, refused.stdout
    assert f"switches.leaf0.ca_cert {tmp_path / 'nowhere/ca.pem'}: No such file" in refused.stderr
    with SwitchConnection(switch.grpc_addr, 0, (0, 1), tls=ours.controller()) as conn:
        conn.load_p4info()
        assert len(conn.read(P4TableEntry(JOBS))) == 1          # job 1's alone


@pytest.mark.parametrize("settings,problem", [
    ({"client_cert": "c.pem"}, "switch.client_cert needs switch.client_key"),
    ({"client_key": "c.key", "ca_cert": "ca.pem"}, "switch.client_key needs switch.client_cert"),
    ({"client_cert": "c.pem", "client_key": "c.key"}, "switch.client_cert needs switch.ca_cert"),
    ({"ca_cert": 7}, "switch.ca_cert must be a file path, not 7"),
])
def test_incomplete_tls_settings_are_refused(settings, problem):
    raw = job_config_dict({1: "a"}, "127.0.0.1:9559", 0)
    raw["switch"].update(settings)
    with pytest.raises(config_mod.ConfigError, match=problem):
        config_mod.parse(raw)


def test_tls_paths_are_relative_to_the_job_file(tmp_path):
    raw = job_config_dict({1: "a"}, "127.0.0.1:9559", 0)
    raw["switch"].update(ca_cert="tls/ca.pem", client_cert="/abs/c.pem", client_key="c.key")
    (tmp_path / "job.toml").write_text(tomli_w.dumps(raw))
    tls = jobfile.load(tmp_path / "job.toml").switch.tls
    assert tls == TLSConfig(tmp_path / "tls/ca.pem", Path("/abs/c.pem"), tmp_path / "c.key")
    # Only the controller reads the files: a worker's copy of the job file need not have them.
    with pytest.raises(config_mod.ConfigError, match="switch.ca_cert .*: No such file"):
        tls.check()
