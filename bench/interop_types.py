"""qpid-interop-test's AMQP type tests against qpid-flow. Not a test of the suite.

    .venv/bin/python bench/interop_types.py --qit DIR [--shims python-proton,javascript-rhea] [--rabbitmq]
        [--config FILE] [--workdir DIR]

DIR is a checkout of Apache qpid-interop-test (QIT 2.0, https://github.com/apache/qpid-interop-test;
the machines CI runs on reach no GitHub, hence a folder rather than a download):

    git clone https://github.com/apache/qpid-interop-test DIR

What QIT's `qit test amqp-types` does: every sender shim sends each AMQP type's test values
(18 primitive types, array, list, map, described) to a queue named after the type and the
pair, every receiver shim receives them, and the values are compared; 22 types for each
sender-receiver pair, 88 tests for the Python (Proton) and JavaScript (rhea) shims. QIT lists
its clients' known defects (rhea's JavaScript numbers lose long and ulong values above 2^53);
those come out as "xfail" and count as passed only because QIT names them.

This script prepares DIR once (a virtual environment DIR/.venv with the python-qpid-proton of
ours and QIT's own dependencies, which the Python shim activates; `npm install` in the rhea
shim), starts a standalone qpid-flow with the default configuration (or `--config FILE`) on
a free port, runs the suite against it with a JUnit report, and prints the totals and each
failure. `--rabbitmq` runs the same suite twice more, against a private RabbitMQ directly and
through qpid-flow in front of it, and lists every test whose outcome differs from the direct
run (a drop-in must not change one). Exit status 0 when no test failed against qpid-flow
standalone and, with `--rabbitmq`, no outcome differs from the direct run (tests that fail
against RabbitMQ directly are the broker's and are listed, not counted).

Measured here (QIT b8b89ad, python-qpid-proton 0.40.0, rhea 3.0.5, RabbitMQ 3.10.8 from Debian 12): standalone
88 tests, 82 passed, 6 xfail, 0 failed; RabbitMQ directly 72 passed, 6 xfail, 10 failed (null,
array and list values); through qpid-flow in front of it the same 72/6/10, 0 differences.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.harness.broker import Broker  # noqa: E402
from tests.integration.harness.rabbitmq import make_broker  # noqa: E402
from tests.integration.harness.router import RouterProcess, start_router  # noqa: E402

QIT_DEPENDENCIES = ("click", "pydantic", "pydantic-settings", "rich")
SHIM_TIMEOUT = 900.0  # the whole suite; 88 tests take about 25 s here


@dataclass(frozen=True)
class Outcome:
    """One QIT test: sender -> receiver, type; "passed", "xfail" (a defect QIT lists) or "failed"."""

    pair: str
    amqp_type: str
    result: str
    detail: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.pair, self.amqp_type)


def prepare_qit(qit: Path) -> Path:
    """Make DIR runnable: its own venv (the Python shim sources DIR/.venv/bin/activate) holding
    the python-qpid-proton we run with, so both ends of a test use the same Proton; and rhea
    for the JavaScript shim. Returns the `qit` command."""
    import proton

    if not (qit / "src" / "qit" / "cli").is_dir():
        raise SystemExit(f"interop_types: {qit} is not a qpid-interop-test (QIT 2.0) checkout (no src/qit/cli)")
    venv = qit / ".venv"
    command = venv / "bin" / "qit"
    if not command.exists():
        proton_version = ".".join(str(part) for part in proton.VERSION)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, f"python-qpid-proton=={proton_version}", *QIT_DEPENDENCIES], check=True)
        subprocess.run([*pip, "--no-deps", "-e", str(qit)], check=True)
    rhea = qit / "shims" / "javascript-rhea"
    if rhea.is_dir() and not (rhea / "node_modules" / "rhea").is_dir():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=rhea, check=True)
    return command


def run_suite(qit_command: Path, url: str, shims: list[str], report: Path) -> list[Outcome]:
    """Run `qit test amqp-types` for every pair of `shims` against `url`; the outcomes from
    its JUnit report (the command's exit status only says whether one failed)."""
    pairs = [arg for shim in shims for arg in ("--sender", shim)]
    pairs += [arg for shim in shims for arg in ("--receiver", shim)]
    argv = [str(qit_command), "test", "amqp-types", *pairs, "--broker", url, "--junit-xml", str(report)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)  # the Python shim activates QIT's own venv
    log = report.with_suffix(".log")
    with log.open("wb") as out:
        completed = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=SHIM_TIMEOUT)
    if not report.exists():
        raise SystemExit(f"interop_types: qit wrote no report (exit {completed.returncode}); see {log}")
    return read_report(report)


def read_report(report: Path) -> list[Outcome]:
    outcomes = []
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname is "qit.<sender>.<receiver>"; name is the AMQP type.
        _, sender, receiver = case.get("classname", "qit.?.?").split(".", 2)
        pair = f"{sender} -> {receiver}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        known = case.find("skipped")
        if problem is not None:
            detail = (problem.get("message") or problem.text or "").strip()
            outcomes.append(Outcome(pair, case.get("name", "?"), "failed", detail))
        elif known is not None:
            outcomes.append(Outcome(pair, case.get("name", "?"), "xfail", known.get("message", "")))
        else:
            outcomes.append(Outcome(pair, case.get("name", "?"), "passed"))
    return outcomes


def summary(label: str, outcomes: list[Outcome], seconds: float) -> bool:
    failed = [o for o in outcomes if o.result == "failed"]
    xfail = [o for o in outcomes if o.result == "xfail"]
    passed = len(outcomes) - len(failed) - len(xfail)
    print(
        f"{label}: {len(outcomes)} tests, {passed} passed, {len(xfail)} xfail (defects QIT lists), "
        f"{len(failed)} failed, {seconds:.0f} s"
    )
    for known in sorted({o.detail for o in xfail}):
        print(f"    xfail: {known}")
    for outcome in failed:
        print(f"    FAILED {outcome.pair} ({outcome.amqp_type}): {outcome.detail[:300]}")
    return bool(outcomes) and not failed


def differences(direct: list[Outcome], through: list[Outcome]) -> list[str]:
    before = {o.key: o.result for o in direct}
    after = {o.key: o.result for o in through}
    return [
        f"{pair} ({amqp_type}): {before.get((pair, amqp_type), 'absent')} directly, "
        f"{after.get((pair, amqp_type), 'absent')} through qpid-flow"
        for pair, amqp_type in sorted(before.keys() | after.keys())
        if before.get((pair, amqp_type)) != after.get((pair, amqp_type))
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qit", type=Path, required=True, help="a qpid-interop-test (QIT 2.0) checkout")
    parser.add_argument("--shims", default="python-proton,javascript-rhea", help="comma-separated shim names")
    parser.add_argument("--config", type=Path, help="a qpid-flow configuration file (default: none, the defaults)")
    parser.add_argument(
        "--rabbitmq", action="store_true", help="also run against RabbitMQ directly and behind qpid-flow"
    )
    parser.add_argument("--workdir", type=Path, help="where logs and reports go (default: a new temporary folder)")
    args = parser.parse_args()

    qit_command = prepare_qit(args.qit.resolve())
    shims = [name.strip() for name in args.shims.split(",") if name.strip()]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="qpid-flow-interop-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config_text = args.config.read_text() if args.config else None
    print(f"shims {', '.join(shims)}; logs and reports in {workdir}", flush=True)
    ok: list[bool] = []  # what the exit status rests on: standalone passed, nothing changed

    def through_qpid_flow(label: str, broker_url: str | None) -> list[Outcome]:
        router: RouterProcess = start_router(workdir, broker_url, config_text)
        try:
            started = time.monotonic()
            outcomes = run_suite(qit_command, router.url, shims, workdir / f"{label}.xml")
            passed = summary(label, outcomes, time.monotonic() - started)
            if broker_url is None:  # in front of a broker, the direct run is the reference
                ok.append(passed)
        finally:
            router.stop()
        if router.returncode not in (0, None):
            print(f"    qpid-flow exited with status {router.returncode}; log: {router.log_path}")
            ok.append(False)
        return outcomes

    through_qpid_flow("qpid-flow standalone", None)
    if args.rabbitmq:
        broker: Broker = make_broker()
        broker.start()
        try:
            started = time.monotonic()
            # The shims take host:port only and connect as ANONYMOUS, which RabbitMQ accepts.
            direct_url = f"amqp://{broker.host}:{broker.port}"
            direct = run_suite(qit_command, direct_url, shims, workdir / "rabbitmq-direct.xml")
            summary("RabbitMQ directly", direct, time.monotonic() - started)
            through = through_qpid_flow("qpid-flow in front of RabbitMQ", broker.url)
        finally:
            broker.stop()
        changed = differences(direct, through)
        print(f"outcomes that differ between RabbitMQ directly and through qpid-flow: {len(changed)}")
        for line in changed:
            print(f"    {line}")
        ok.append(not changed)
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
