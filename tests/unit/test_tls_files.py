"""Bad TLS files at start: one refusal naming the key whose file is at fault, never a
pass-phrase prompt (qpid_flow.security.tls._load_chain)."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import select
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qpid_flow.config import ConfigError, RouterConfig, build_config
from qpid_flow.security.tls import broker_context, listener_context
from tests.integration.harness.certs import Certificates, make_certificates

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def files(certificates: Certificates, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("files")
    encrypted = folder / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(certificates.server.key), "-aes256", "-passout", "pass:secret",
         "-out", str(encrypted)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert b"ENCRYPTED" in encrypted.read_bytes()
    not_pem = folder / "not.pem"
    not_pem.write_text("hello\n")
    return {
        "cert": certificates.server.cert,
        "key": certificates.server.key,
        "encrypted": encrypted,
        "not_pem": not_pem,
        "other_key": certificates.client("carol").key,
        "folder": folder,
    }


# The two places a certificate and its key are loaded: (cert key, key key, build).
SIDES: list[tuple[str, str, Callable[[RouterConfig], object]]] = [
    ("tls_cert", "tls_key", listener_context),
    ("broker_tls_cert", "broker_tls_key", broker_context),
]


def _refusal(side: tuple[str, str, Callable[[RouterConfig], object]], cert: Path, key: Path) -> ConfigError:
    cert_key, key_key, build = side
    config = build_config({cert_key: str(cert), key_key: str(key)})
    with pytest.raises(ConfigError) as raised:
        build(config)
    return raised.value


@pytest.mark.parametrize("side", SIDES, ids=["listener", "broker"])
def test_an_encrypted_key_is_refused_naming_the_key(side: tuple[str, str, Callable[[RouterConfig], object]],
                                                    files: dict[str, Path]) -> None:  # fmt: skip
    """No pass phrase is asked for: without a terminal, OpenSSL's prompt failed and the
    refusal blamed the certificate ('cannot be read: Invalid argument')."""
    error = _refusal(side, files["cert"], files["encrypted"])
    assert error.key == side[1]
    says = "is encrypted (a pass phrase is needed): give it unencrypted"
    assert str(error) == f"{side[1]} = {str(files['encrypted'])!r}: {says}"


@pytest.mark.parametrize("side", SIDES, ids=["listener", "broker"])
@pytest.mark.parametrize(
    ("cert", "key", "blamed", "says"),
    [
        ("not_pem", "key", 0, "is not a PEM certificate"),
        ("key", "key", 0, "is not a PEM certificate"),  # a key given as the certificate
        ("cert", "not_pem", 1, "is not a PEM private key"),
        ("cert", "other_key", 1, "does not match {cert_key} = {cert!r}"),
        ("folder", "key", 0, "cannot be read: Is a directory"),
        ("cert", "folder", 1, "cannot be read: Is a directory"),
    ],
)
def test_each_refusal_names_the_file_at_fault(
    side: tuple[str, str, Callable[[RouterConfig], object]],
    files: dict[str, Path],
    cert: str,
    key: str,
    blamed: int,
    says: str,
) -> None:
    """A certificate that is not PEM was reported against the key ('does not load with
    tls_cert')."""
    cert_key, key_key, build = side
    # build_config refuses a directory itself ("no such file"): past it, the file may still
    # be unreadable (permissions, a race), which is what a directory stands in for here.
    paths: dict[str, Any] = {cert_key: str(files[cert]), key_key: str(files[key])}
    config = dataclasses.replace(build_config({cert_key: str(files["cert"]), key_key: str(files["key"])}), **paths)
    with pytest.raises(ConfigError) as raised:
        build(config)
    name = side[blamed]
    assert raised.value.key == name
    expected = says.format(cert_key=cert_key, cert=str(files[cert]))
    assert str(raised.value) == f"{name} = {str(files[cert if blamed == 0 else key])!r}: {expected}"


@pytest.mark.parametrize("side", SIDES, ids=["listener", "broker"])
def test_good_files_still_load(side: tuple[str, str, Callable[[RouterConfig], object]], files: dict[str, Path]) -> None:
    cert_key, key_key, build = side
    assert build(build_config({cert_key: str(files["cert"]), key_key: str(files["key"])})) is not None


def test_an_encrypted_key_on_a_terminal_refuses_at_once(files: dict[str, Path], tmp_path: Path) -> None:
    """`qpid-flow serve` on a terminal with an encrypted tls_key waited at OpenSSL's
    'Enter PEM pass phrase:' for good; now it exits 2 with one line."""
    leader, follower = os.openpty()

    def take_the_terminal() -> None:  # after setsid: the pty becomes the controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    command = [sys.executable, "-m", "qpid_flow", "serve", "--listen", "amqps://127.0.0.1:0",
               "--tls-cert", str(files["cert"]), "--tls-key", str(files["encrypted"])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        command, stdin=follower, stdout=follower, stderr=follower, cwd=tmp_path, env=env,
        start_new_session=True, preexec_fn=take_the_terminal,
    )  # fmt: skip
    os.close(follower)
    output = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # EIO: every writer of the terminal has gone
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
    lines = [line for line in output.decode(errors="replace").replace("\r", "").splitlines() if line.strip()]
    assert code == 2, f"still waiting after 30 s (or exit {code}); it printed {lines}"
    assert lines == [
        f"qpid-flow: configuration error: tls_key = {str(files['encrypted'])!r}: "
        "is encrypted (a pass phrase is needed): give it unencrypted"
    ]
