"""Fuzz qpid-flow's AMQP listener for longer than the test does. Not a test.

    .venv/bin/python bench/fuzz.py [--mutations 20000] [--seed 1] [--mode standalone|broker] [--broker URL]
    .venv/bin/python bench/fuzz.py --record tests/integration/data/proton-session.txt

The fuzzer of tests/integration/test_fuzz.py (tests/integration/harness/fuzzing.py): mutations
of a recorded Proton client session, each on a fresh TCP connection, ``--concurrency`` at a
time, against a qpid-flow it starts (in broker mode in front of ``--broker``, or of a private
RabbitMQ it starts when no URL is given). After every ``--batch`` inputs: is the process alive,
does a well-behaved client round-trip a message. At the end: is the client connected before
the fuzzing still connected and working. Prints inputs/s, connections closed by qpid-flow and
by our timeout, what qpid-flow answered, the warnings and errors of its log. When it dies, the
inputs in flight are saved under ``--out`` and replayed, in halves, to fresh qpid-flow processes
to find the one that kills it (saved as a .bin file); exit status 1. ``--keep-going``: start a
new qpid-flow after a crash and go on, counting crashes by their exception (each new one is
looked for once).

Leak check: after every batch, qpid-flow's open file descriptors and resident memory (/proc);
after the first ``--warmup`` inputs and at the end, the same once the fuzzed connections are
closed (at the end: waited for until the descriptors are back to the warm-up level, 10 s at
most). The report gives the samples, the growth per 1,000 connections after the warm-up, and
exit status 1 when the descriptors end more than ``--fd-slack`` above the warm-up level or
memory grew by more than ``--rss-bound`` KiB per fuzzed connection (tests/integration/
harness/fuzzing.py, LeakCheck; the test applies the same bounds to 2,000 inputs).

``--record FILE``: record a new session against a standalone qpid-flow (what the test's
fixture file holds) and exit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.harness.blocking_clients import ClientError  # noqa: E402
from tests.integration.harness.broker import Broker  # noqa: E402
from tests.integration.harness.fuzzing import (  # noqa: E402
    FD_SLACK,
    RSS_PER_CONNECTION,
    SESSION_FILE,
    Bystander,
    Input,
    LeakCheck,
    Tally,
    alive,
    left_open,
    load_session,
    mutate,
    record_session,
    reproduce,
    round_trip,
    save_session,
    send_batch,
)
from tests.integration.harness.rabbitmq import make_broker  # noqa: E402
from tests.integration.harness.router import RouterProcess, start_router  # noqa: E402

RECORD_COMMENT = """\
What a Python Proton client (python-qpid-proton {version}, proton.utils.BlockingConnection) sends
to qpid-flow: SASL ANONYMOUS, open, a sender on "fuzz", one message, a receiver on "fuzz", the
message back (accepted), both links detached, close. One protocol header or frame a line (hex,
then its name); "-- N" where the client waited until qpid-flow had sent it N headers and
frames in all. Only the client's bytes.
The corpus of tests/integration/test_fuzz.py and bench/fuzz.py; recorded through a TCP proxy
with: .venv/bin/python bench/fuzz.py --record tests/integration/data/proton-session.txt"""


def log_levels(router: RouterProcess) -> Counter[str]:
    """Warning and error events of qpid-flow's JSON log, by level and event (and exception type)."""
    seen: Counter[str] = Counter()
    for line in router.log_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            if "Traceback" in line or "Segmentation" in line:
                seen[f"raw: {line[:80]}"] += 1
            continue
        if entry.get("level") in ("warning", "error", "critical"):
            what = entry.get("condition") or entry.get("exception", "").strip().rsplit("\n", 1)[-1].split(":")[0]
            where = f" in {entry['handler']}.{entry['method']}" if "method" in entry else ""
            seen[f"{entry['level']} {entry.get('event')}{f' ({what}{where})' if what else where}"] += 1
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mutations", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="index of the first input (resume a run)")
    parser.add_argument("--mode", choices=("standalone", "broker"), default="standalone")
    parser.add_argument("--broker", help="broker URL for --mode broker (default: start a private RabbitMQ)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--read-timeout", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=500, help="inputs between two health checks")
    parser.add_argument("--session", type=Path, default=SESSION_FILE)
    parser.add_argument("--out", type=Path, default=Path("fuzz-crashes"), help="where crashing inputs go")
    parser.add_argument("--keep-going", action="store_true", help="after a crash, start a new qpid-flow and go on")
    parser.add_argument("--record", type=Path, metavar="FILE", help="record a new session into FILE and exit")
    parser.add_argument(
        "--warmup", type=int, help="inputs before the leak check's baseline (default: one batch)", metavar="N"
    )
    parser.add_argument(
        "--fd-slack", type=int, default=FD_SLACK, help="descriptors allowed above the warm-up level at the end"
    )
    parser.add_argument(
        "--rss-bound",
        type=float,
        default=RSS_PER_CONNECTION / 1024,
        metavar="KIB",
        help="resident memory growth allowed per fuzzed connection after the warm-up, KiB",
    )
    args = parser.parse_args()
    for signum in (signal.SIGTERM, signal.SIGHUP):  # stop what was started (finally:) on these too
        signal.signal(signum, signal.default_int_handler)

    workdir = Path(tempfile.mkdtemp(prefix="qpid-flow-fuzz-"))
    if args.record:
        import proton

        router = start_router(workdir)
        try:
            units = record_session(router.host, router.port)
        finally:
            router.stop()
        version = ".".join(str(part) for part in proton.VERSION)
        save_session(args.record, units, RECORD_COMMENT.format(version=version))
        print(f"{len(units)} units written to {args.record}")
        return 0

    broker: Broker | None = None
    broker_url = args.broker
    if args.mode == "broker" and not broker_url:
        broker = make_broker(controllable=True)
        broker.start()
        broker_url = broker.url

    def start() -> RouterProcess:
        routers.append(start_router(workdir, broker_url if args.mode == "broker" else None))
        return routers[-1]

    routers: list[RouterProcess] = []
    fuzzed = [start()]  # the processes fuzzed (not those that replay suspects)
    bystander = Bystander(fuzzed[-1].url)
    session = load_session(args.session)
    tally = Tally()
    crashes: Counter[str] = Counter()  # by signature: the exception (digits as N) or the exit code
    hung = False
    warmup = args.batch if args.warmup is None else args.warmup

    def new_leak_check() -> LeakCheck:
        return LeakCheck(fuzzed[-1].pid, args.fd_slack, args.rss_bound * 1024)

    leak = new_leak_check()  # of the live process (a new one after a crash)
    here = 0  # inputs sent to the live process
    sending = 0.0  # seconds spent sending inputs (not restarting, not replaying suspects)
    print(f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {args.mode}, logs in {workdir}", flush=True)
    t0 = time.monotonic()
    try:
        bystander.start()
        last = args.first + args.mutations
        by_port: dict[int, Input] = {}  # the client port of each input's connection (to the live process)
        pending: list[Input] = []  # inputs a dead process did not get, for the next one
        first = args.first
        while first < last or pending:
            router = fuzzed[-1]
            count = min(max(args.batch - len(pending), 0), last - first)
            inputs = pending + [mutate(session, args.seed, i) for i in range(first, first + count)]
            pending = []
            first += count
            t = time.monotonic()
            batch = send_batch(router.host, router.port, inputs, alive(router), args.concurrency, args.read_timeout)
            sending += time.monotonic() - t
            tally.add(batch.results)
            here += len(batch.results)
            by_port.update((r.client_port, r.input) for r in batch.results)
            try:
                if not batch.died:
                    round_trip(router.url, timeout=30)
            except ClientError as exc:
                if router.returncode is None:
                    hung = True
                    print(f"qpid-flow alive but a well-behaved client does not round-trip: {exc}")
                    break
            resources = ""
            if router.returncode is None:
                with contextlib.suppress(OSError):  # it may die right now
                    now = leak.after_batch(here) if leak.baseline or here < warmup else leak.warmed_up(here)
                    resources = f", fds {now.fds}, RSS {now.rss / 2**20:.1f} MiB"
            print(
                f"{tally.inputs:>7} inputs {sending:6.1f}s {tally.inputs / sending:6.1f}/s  closed by qpid-flow "
                f"{tally.closed_by_router}, by timeout {tally.timed_out}, hung up {tally.hung_up}, "
                f"connect errors {tally.connect_errors}, "
                f"crashes {crashes.total()}{resources}",
                flush=True,
            )
            if router.returncode is None:
                continue
            signature = crash_signature(router)
            crashes[signature] += 1
            print(f"qpid-flow DIED (rc={router.returncode}), inputs {inputs[0].index}-{inputs[-1].index}: {signature}")
            if crashes[signature] == 1:  # a new way to die: find the input
                print(router.log_tail(30))
                suspects = batch.suspects or inputs
                args.out.mkdir(parents=True, exist_ok=True)
                saved = args.out / f"seed{args.seed}-from{inputs[0].index}-suspects.txt"
                saved.write_text("".join(f"{item}\n\n" for item in suspects))
                killer, killed = reproduce(suspects, start)
                if killer is not None and killed is not None:
                    (args.out / f"seed{args.seed}-input{killer.index}.bin").write_bytes(killer.data)
                    print(f"kills a fresh qpid-flow alone: {killer.show(256)}\n{killed.log_tail(10)}")
                else:
                    print(f"no suspect kills a fresh qpid-flow alone; {len(suspects)} suspects in {saved}")
            if not args.keep_going:
                break
            sent = {r.input.index for r in batch.results}
            pending = [item for item in inputs if item.index not in sent]
            by_port.clear()
            bystander.stop()
            fuzzed.append(start())
            bystander = Bystander(fuzzed[-1].url)
            bystander.start()
            leak, here = new_leak_check(), 0
        if not hung and fuzzed[-1].returncode is None:
            if not bystander.probe(30) or bystander.errors:
                print(f"the client connected before the fuzzing is no longer served: {bystander.errors}")
                hung = True
            else:
                print(f"bystander: {bystander.received} messages round-tripped on one connection, no error")
        if fuzzed[-1].returncode is None:
            if leak.baseline is not None:  # waits for the last connections to close
                leak.finish(here)
            else:
                time.sleep(2)  # the last connections close
            left = sorted((by_port[p] for p in left_open(fuzzed[-1].port) if p in by_port), key=lambda i: i.index)
            print(f"connections qpid-flow {len(fuzzed)} never closed after the fuzzer did (CLOSE_WAIT): {len(left)}")
            if left:
                args.out.mkdir(parents=True, exist_ok=True)
                saved = args.out / f"seed{args.seed}-left-open.txt"
                saved.write_text("".join(f"{item}\n\n" for item in left))
                print(f"  in {saved}; the first: {left[0].show(128)}")
    finally:
        bystander.stop()
        for r in routers:
            r.stop()
        if broker is not None:
            broker.stop()
    print(f"\nmode {args.mode}, seed {args.seed}, inputs {args.first}-{args.first + tally.inputs - 1}")
    print(
        f"inputs {tally.inputs}: {tally.inputs / sending:.1f} inputs/s ({sending:.1f}s sending, "
        f"{time.monotonic() - t0:.1f}s in all), concurrency {args.concurrency}, read timeout {args.read_timeout}s"
    )
    print(
        f"connections closed by qpid-flow {tally.closed_by_router}, by the fuzzer after the read timeout "
        f"{tally.timed_out}, by the fuzzer at once (hang up) {tally.hung_up}, connect errors {tally.connect_errors}"
    )
    print(f"crashes {crashes.total()} (qpid-flow processes started for fuzzing: {len(fuzzed)}), hangs {int(hung)}")
    leaks = leak_report(leak, len(fuzzed))
    for what, n in crashes.most_common():
        print(f"  {n:>7}  {what}")
    print("qpid-flow answered:")
    for what, n in tally.answers.most_common():
        print(f"  {n:>7}  {what}")
    print("qpid-flow's logs, warnings and errors:")
    for what, n in sum((log_levels(r) for r in fuzzed), Counter[str]()).most_common():
        print(f"  {n:>7}  {what}")
    return 1 if crashes or hung or leaks else 0


def leak_report(leak: LeakCheck, process: int) -> list[str]:
    """Print the leak check of the last fuzzed process; what leaks (empty: nothing)."""
    if leak.baseline is None or leak.end is None:
        print(f"leak check of qpid-flow {process}: none (it died, or the run ended within the warm-up)")
        return []
    print(f"leak check of qpid-flow {process}, samples after each batch (fds, resident memory):")
    print("\n".join(f"  {line}" for line in leak.table().splitlines()))
    print(f"  {leak.summary()}")
    problems = leak.problems()
    bounds = f"at most {leak.fd_slack} fds more, {leak.rss_per_connection / 1024:.2f} KiB per connection"
    print(f"  LEAK: {'; '.join(problems)}" if problems else f"  no leak ({bounds})")
    return problems


def crash_signature(router: RouterProcess) -> str:
    """The last exception line of the log (digits as N), or the exit code."""
    for line in reversed(router.log_text().splitlines()):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt|Exit)\b", line):
            return re.sub(r"\d+", "N", line.strip())[:160]
    return f"exit code {router.returncode}"


if __name__ == "__main__":
    sys.exit(main())
