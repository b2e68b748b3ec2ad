"""Build the Proton C example clients (send.c / receive.c) shipped by Debian's
libqpid-proton11-dev-examples; they load a broker or qpid-flow ~10x faster than Python clients."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

EXAMPLES_DIR = Path("/usr/share/proton/examples/c")
# Makefile.pkgconfig beside the sources names the split modules, but Debian's
# libqpid-proton11-dev ships only libqpid-proton.pc (the all-in-one library, proactor included).
PKG_MODULE_CHOICES = [["libqpid-proton-core", "libqpid-proton-proactor"], ["libqpid-proton"]]
INSTALL_HINT = "run `bash .ci/install-deps` (libqpid-proton11-dev-examples, pkg-config, gcc)"


@dataclass(frozen=True)
class ProtonCExamples:
    """Paths of the built example clients. Both take positional arguments:

        send    HOST PORT ADDRESS COUNT   sends COUNT messages (body {"sequence": N}, id N,
                                          N = 1..COUNT) at-least-once to ADDRESS; exits 0 after
                                          all are accepted and prints
                                          "COUNT messages sent and acknowledged".
        receive HOST PORT ADDRESS COUNT   grants COUNT credit up front, prints each body, accepts
                                          it, exits 0 after COUNT ("COUNT messages received");
                                          COUNT 0 = receive forever.

    Defaults: HOST "" (localhost), PORT "amqp" (5672), ADDRESS "examples", COUNT 10. They connect
    without SASL or credentials (RabbitMQ accepts that) and do not reconnect; any error (remote
    close, rejected delivery) is printed on stderr and gives exit code 1.
    """

    send: Path
    receive: Path


def build_examples(cache_dir: Path) -> ProtonCExamples:
    """Compile send and receive into cache_dir/<hash>/ unless a matching build exists there."""
    missing = [p for p in ("send.c", "receive.c") if not (EXAMPLES_DIR / p).exists()]
    if missing:
        raise FileNotFoundError(f"{EXAMPLES_DIR}/{missing[0]} missing; {INSTALL_HINT}")
    return ProtonCExamples(
        send=build_c_program(EXAMPLES_DIR / "send.c", cache_dir),
        receive=build_c_program(EXAMPLES_DIR / "receive.c", cache_dir),
    )


def proton_c_flags() -> list[str]:
    """The compiler and linker flags of Debian's Proton C library, from pkg-config."""
    for tool in ("gcc", "pkg-config"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} not found; {INSTALL_HINT}")
    errors = []
    for modules in PKG_MODULE_CHOICES:
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", *modules],
            capture_output=True,
            text=True,
            check=False,
        )
        if flags.returncode == 0:
            return flags.stdout.split()
        errors.append(flags.stderr.strip())
    raise FileNotFoundError(f"pkg-config found no Proton C library: {errors}; {INSTALL_HINT}")


def build_c_program(source: Path, cache_dir: Path) -> Path:
    """Compile one C source against Proton into cache_dir/<hash>/<name> unless that build
    exists. The hash covers the source and the pkg-config flags, so an edit or a Proton
    upgrade rebuilds."""
    flags = proton_c_flags()
    h = hashlib.sha256(" ".join(flags).encode())
    h.update(source.read_bytes())
    out = cache_dir / h.hexdigest()[:16]
    out.mkdir(parents=True, exist_ok=True)
    exe = out / source.stem
    if exe.exists():
        return exe
    tmp = out / f".{source.stem}.tmp"  # renamed at the end: a half-written binary is never cached
    cmd = ["gcc", "-O2", "-o", str(tmp), str(source), *flags, "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"building {source.name} failed: {' '.join(cmd)}\n{r.stderr}")
    tmp.replace(exe)
    return exe
