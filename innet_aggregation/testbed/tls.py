"""Certificates for one run's P4Runtime over mutual TLS, made with the openssl command.

A run that asks for TLS gets its own CA, one server certificate that every switch
presents (for 127.0.0.1 and localhost, plus any other address it listens on) and
one client certificate for the controller, all in the run's directory. Nothing is
installed anywhere else; the CA's key stays next to it and goes with the run.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from innet_aggregation.switch_ctl.config import TLSConfig

# EC keys: a bundle takes a few tens of milliseconds, RSA would take seconds.
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
_DAYS = "7"


@dataclass(frozen=True)
class TLSBundle:
    """The PEM files of one CA's switch and controller certificates."""
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def switch_args(self) -> list[str]:
        """simple_switch_grpc's target options for mutual TLS (both targets take them)."""
        return ["--grpc-server-ssl", "--grpc-server-cacert", str(self.ca_cert),
                "--grpc-server-cert", str(self.server_cert),
                "--grpc-server-key", str(self.server_key), "--grpc-server-with-client-auth"]

    def controller(self) -> TLSConfig:
        return TLSConfig(self.ca_cert, self.client_cert, self.client_key)

    def job_settings(self) -> dict[str, str]:
        """The [switch] (or [switches.NAME]) settings that give a job file's controller TLS."""
        return {"ca_cert": str(self.ca_cert), "client_cert": str(self.client_cert),
                "client_key": str(self.client_key)}


def make_bundle(directory: Path, hosts: tuple[str, ...] = ()) -> TLSBundle:
    """A new CA in ``directory``, a server certificate for 127.0.0.1, localhost and
    ``hosts`` (addresses or names), and a client certificate; raises RuntimeError
    with openssl's words."""
    if shutil.which("openssl") is None:
        raise RuntimeError("TLS needs the openssl command (Debian package openssl)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = ["DNS:localhost", "IP:127.0.0.1"]
    for host in hosts:
        if host in ("127.0.0.1", "localhost"):
            continue
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            names.append(f"DNS:{host}")
            continue
        if not address.is_unspecified:      # 0.0.0.0 listens everywhere, names nothing
            names.append(f"IP:{address}")
    ca_cert, ca_key = directory / "ca.pem", directory / "ca.key"
    _openssl(["req", "-x509", *_KEY, "-days", _DAYS, "-subj", "/CN=innet testbed CA",
              "-keyout", ca_key, "-out", ca_cert,
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    server = _issue(directory, "switch", ca_cert, ca_key,
                    [f"subjectAltName={','.join(names)}", "extendedKeyUsage=serverAuth"])
    client = _issue(directory, "controller", ca_cert, ca_key, ["extendedKeyUsage=clientAuth"])
    return TLSBundle(ca_cert, *server, *client)


def _issue(directory: Path, name: str, ca_cert: Path, ca_key: Path,
           extensions: list[str]) -> tuple[Path, Path]:
    cert, key, csr = (directory / f"{name}{ext}" for ext in (".pem", ".key", ".csr"))
    ext_file = directory / f"{name}.ext"
    ext_file.write_text("\n".join(["basicConstraints=critical,CA:FALSE",
                                   "keyUsage=critical,digitalSignature,keyEncipherment",
                                   *extensions]) + "\n")
    _openssl(["req", "-new", *_KEY, "-subj", f"/CN=innet {name}", "-keyout", key, "-out", csr])
    _openssl(["x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
              "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", _DAYS,
              "-extfile", ext_file, "-out", cert])
    csr.unlink()
    ext_file.unlink()
    return cert, key


def _openssl(args: list) -> None:
    # Every file 0600 (umask): the keys are for root's switch and controller only.
    old = os.umask(0o077)
    try:
        result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
    finally:
        os.umask(old)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: "
                           f"{(result.stderr.strip().splitlines() or ['?'])[-1]}")
