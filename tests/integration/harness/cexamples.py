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
    """Compile send and receive into cache_dir/<hash>/ unless a matching build exists there.

    The hash covers the sources and the pkg-config flags, so a proton upgrade rebuilds.
    """
    missing = [p for p in ("send.c", "receive.c") if not (EXAMPLES_DIR / p).exists()]
    if missing:
        raise FileNotFoundError(f"{EXAMPLES_DIR}/{missing[0]} missing; {INSTALL_HINT}")
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
            break
        errors.append(flags.stderr.strip())
    else:
        raise FileNotFoundError(f"pkg-config found no Proton C library: {errors}; {INSTALL_HINT}")
    h = hashlib.sha256(flags.stdout.encode())
    for name in ("send.c", "receive.c"):
        h.update((EXAMPLES_DIR / name).read_bytes())
    out = cache_dir / h.hexdigest()[:16]
    out.mkdir(parents=True, exist_ok=True)
    for name in ("send", "receive"):
        exe = out / name
        if exe.exists():
            continue
        tmp = out / f".{name}.tmp"  # rename at the end: a half-written binary is never cached
        cmd = ["gcc", "-O2", "-o", str(tmp), str(EXAMPLES_DIR / f"{name}.c"), *flags.stdout.split(), "-lpthread"]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"building {name} failed: {' '.join(cmd)}\n{r.stderr}")
        tmp.replace(exe)
    return ProtonCExamples(send=out / "send", receive=out / "receive")
