"""Test certificates made with the openssl command: a CA, a server certificate for
localhost / 127.0.0.1, and client certificates signed by the CA (or by another CA)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA that signs the server's and the clients' certificates
    server: KeyPair
    folder: Path

    def client(self, common_name: str) -> KeyPair:
        """A client certificate for ``common_name`` signed by the CA."""
        return _signed(self.folder, f"client-{common_name}", common_name, self.ca, self.folder / "ca.key")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _signed(folder: Path, name: str, common_name: str, ca: Path, ca_key: Path, server: bool = False) -> KeyPair:
    key, request, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
             "-subj", f"/CN={common_name}/O=qpid-flow tests")  # fmt: skip
    extensions = folder / f"{name}.ext"
    if server:
        extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    else:
        extensions.write_text("extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-sha256", "-extfile", str(extensions))  # fmt: skip
    return KeyPair(cert, key)


def make_ca(folder: Path, name: str = "ca") -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "2", "-subj", f"/CN=qpid-flow test {name}")  # fmt: skip
    return cert, key


def make_certificates(folder: Path) -> Certificates:
    ca, ca_key = make_ca(folder)
    server = _signed(folder, "server", "localhost", ca, ca_key, server=True)
    return Certificates(ca, server, folder)


def foreign_client(folder: Path, common_name: str) -> KeyPair:
    """A client certificate signed by a CA qpid-flow does not trust."""
    ca, ca_key = make_ca(folder / "foreign", "foreign-ca")
    return _signed(folder / "foreign", f"client-{common_name}", common_name, ca, ca_key)
