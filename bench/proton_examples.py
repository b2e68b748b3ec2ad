"""Apache Qpid Proton's own Python examples, run by their own test, against qpid-flow standalone.
Not a test of the suite.

    .venv/bin/python bench/proton_examples.py --examples DIR [--config FILE] [--workdir DIR]

DIR is the `python/examples` folder of the python-qpid-proton release in use (its
test_examples.py, unmodified); from a clone of https://github.com/apache/qpid-proton:

    git -C qpid-proton archive 0.40.0 python/examples | tar -x -C /tmp/pe   # DIR=/tmp/pe/python/examples

The examples hard-code their broker as localhost:5672 (and 8888 for the brokerless "direct"
ones), so qpid-flow listens on 127.0.0.1:5672; the script stops at once if that port is taken.
test_examples.py starts each example by name with only PATH in its environment, so this
virtual environment's bin folder goes first on PATH (its python3 has Proton); tornado, which
two examples import, is installed into it if missing. What the test covers: hello world
(plain, blocking, direct, tornado), send/receive, request/response with a dynamic reply-to
(client.py, sync_client.py, server.py), the transactional ones (tx_send.py/tx_recv.py,
server_tx.py), a selector (selected_recv.py), and the database examples.

Prints each test's result and the totals; exit status 0 only if every test passed. Measured
here with the examples of 0.40.0: 17 tests, 17 passed, 10 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.harness.net import port_accepts  # noqa: E402
from tests.integration.harness.router import RouterProcess, start_router  # noqa: E402

EXAMPLES_PORT = 5672  # what every broker-based example connects to
DIRECT_PORT = 8888  # what the brokerless examples listen on
SUITE_TIMEOUT = 600.0  # the whole test file; it takes about 30 s here


def ensure_tornado() -> None:
    try:
        import tornado  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "tornado"], check=True)


def run_examples(examples: Path, report: Path, workdir: Path) -> int:
    """Run test_examples.py with pytest from a scratch folder (the database examples write
    ./src_db and ./dst_db where they run)."""
    scratch = workdir / "examples-cwd"
    scratch.mkdir(parents=True, exist_ok=True)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        str(examples / "test_examples.py"),
        "-p",
        "no:cacheprovider",
        "-q",
        f"--junitxml={report}",
        f"--rootdir={examples}",
    ]
    log = report.with_suffix(".log")
    with log.open("wb") as out:
        completed = subprocess.run(
            argv, cwd=scratch, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=SUITE_TIMEOUT
        )
    return completed.returncode


def print_report(report: Path, seconds: float) -> bool:
    if not report.exists():
        print(f"proton_examples: pytest wrote no report; see {report.with_suffix('.log')}")
        return False
    results: list[tuple[str, str, str]] = []
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = next((case.find(tag) for tag in ("failure", "error", "skipped") if case.find(tag) is not None), None)
        if problem is None:
            results.append((case.get("name", "?"), "passed", ""))
        else:
            lines = (problem.get("message") or problem.text or "").strip().splitlines()
            results.append((case.get("name", "?"), problem.tag, lines[0] if lines else ""))
    for name, result, detail in results:
        print(f"    {result:8} {name}" + (f": {detail[:200]}" if detail else ""))
    passed = sum(1 for _, result, _ in results if result == "passed")
    print(f"Proton examples against qpid-flow standalone: {len(results)} tests, {passed} passed, {seconds:.0f} s")
    return bool(results) and passed == len(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=Path, required=True, help="python/examples of the Proton release in use")
    parser.add_argument("--config", type=Path, help="a qpid-flow configuration file (default: none, the defaults)")
    parser.add_argument("--workdir", type=Path, help="where logs and reports go (default: a new temporary folder)")
    args = parser.parse_args()

    examples = args.examples.resolve()
    if not (examples / "test_examples.py").is_file():
        raise SystemExit(f"proton_examples: {examples} has no test_examples.py (want Proton's python/examples)")
    for port in (EXAMPLES_PORT, DIRECT_PORT):
        if port_accepts("127.0.0.1", port):
            raise SystemExit(f"proton_examples: port {port} is in use; the examples need it free")
    ensure_tornado()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="qpid-flow-examples-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config_text = args.config.read_text() if args.config else None
    print(f"examples {examples}; logs and reports in {workdir}", flush=True)

    router: RouterProcess = start_router(workdir, None, config_text, port=EXAMPLES_PORT)
    try:
        started = time.monotonic()
        run_examples(examples, workdir / "examples.xml", workdir)
        ok = print_report(workdir / "examples.xml", time.monotonic() - started)
    finally:
        router.stop()
    if router.returncode not in (0, None):
        print(f"qpid-flow exited with status {router.returncode}; log: {router.log_path}")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
