"""Fuzzing the AMQP listener: bad bytes close that connection, never the process.

A recorded Proton client session (tests/integration/data/proton-session.txt: SASL
ANONYMOUS, open, a sender, a message, a receiver, the message back, detach, close) is
mutated (harness/fuzzing.py) and each mutation sent on a fresh TCP connection, to
standalone qpid-flow and to qpid-flow in front of RabbitMQ. Every batch, a well-behaved
client still round-trips a message; a client connected before the fuzzing is never
dropped; at the end no fuzzed connection is left open by qpid-flow, and nothing leaks: once
the connections are closed, qpid-flow's open descriptors are back to where they were after
the first batch (the warm-up), and its resident memory grew by less than a bound per fuzzed
connection (harness/fuzzing.py, LeakCheck). When the process dies,
the failure names the input that kills a fresh process (hex) and the router's log tail:
enough for a regression test, as the ones here that the fuzzer found. `bench/fuzz.py` is the same
fuzzer for longer runs (BENCHMARKS.md, "Listener fuzzing").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from .harness.blocking_clients import ClientError
from .harness.fuzzing import (
    AMQP_HEADER,
    NULL_MECHANISM_INIT,
    SASL_HEADER,
    Batch,
    Bystander,
    Input,
    LeakCheck,
    Tally,
    alive,
    answers,
    describe,
    from_units,
    left_open,
    load_session,
    mutate,
    reproduce,
    round_trip,
    send_batch,
    send_one,
    split_units,
)
from .harness.router import RouterProcess, StartRouter

pytestmark = pytest.mark.integration

SEED = 15
MUTATIONS = 2000
BATCH = 200  # a health check after each
CONCURRENCY = 32
READ_TIMEOUT = 0.5  # after the last step, for the listener to close the connection

Start = Callable[[], RouterProcess]

# sasl-init: mechanism ANONYMOUS, initial response "anonymous" (as Proton sends it)
ANONYMOUS_INIT = bytes.fromhex("0000002402010000005341c01702a309414e4f4e594d4f5553a009616e6f6e796d6f7573")
# The recorded sender attach, its properties (field 13) an array8 that says it holds 2
# symbols and holds one: e0 03 02 a3 00.
ATTACH_WITH_LYING_PROPERTIES = bytes.fromhex(
    "0000006502000000005312c0580ea12933653033353865632d373737652d343366652d626530352d3238383331376631306636"
    "612d66757a7a434250025000005328c006054043404342005329c00b05a10466757a7a43404342404043444040e00302a300"
)


@pytest.fixture(params=["standalone", "broker"])
def start(request: pytest.FixtureRequest, qpid_flow_process: StartRouter) -> Start:
    """Starts a qpid-flow, standalone or in front of the session's RabbitMQ."""
    broker_url = request.getfixturevalue("rabbitmq").url if request.param == "broker" else None
    return lambda: qpid_flow_process(broker_url=broker_url)


def log_tail(router: RouterProcess, lines: int = 40) -> str:
    return f"--- {router.log_path} (rc={router.returncode}, last {lines} lines) ---\n{router.log_tail(lines)}"


def died_report(router: RouterProcess, suspects: Sequence[Input], start: Start, tmp_path: Path) -> str:
    """What killed the process: the suspect that kills a fresh one, hex, and the log tails."""
    saved = tmp_path / "fuzz-suspects.txt"
    saved.write_text("".join(f"{item}\n\n" for item in suspects))
    killer, killed = reproduce(suspects, start)
    if killer is not None and killed is not None:
        (tmp_path / f"fuzz-killer-{killer.index}.bin").write_bytes(killer.data)
        found = f"This input alone kills a fresh qpid-flow too:\n{killer.show()}\n{log_tail(killed)}"
    else:
        found = f"None of the {len(suspects)} suspects kills a fresh qpid-flow alone. First of them:\n" + "\n".join(
            item.show() for item in suspects[:3]
        )
    return (
        f"qpid-flow died (rc={router.returncode}) while fuzzed (seed {SEED}); the inputs in flight "
        f"then are in {saved}.\n{found}\n{log_tail(router)}"
    )


def test_sasl_init_with_a_null_mechanism_closes_that_connection_only(start: Start) -> None:
    router = start()
    result = send_one(router.host, router.port, from_units(0, "null mechanism", [NULL_MECHANISM_INIT]), 5.0)
    time.sleep(0.2)  # fixed: time for qpid-flow to die of it, if it would
    assert router.returncode is None, f"qpid-flow died on the 23-byte sasl-init:\n{log_tail(router)}"
    said = answers(result.response)
    refused = [a for a in said if a.startswith("sasl-outcome") and a != "sasl-outcome 00"]
    assert "sasl-outcome 00" not in said, f"a null mechanism signed in: {said}"
    assert result.closed_by_router or refused, (
        f"the connection neither closed nor got an auth failure in 5 s: {result.response.hex()}\n{log_tail(router)}"
    )
    round_trip(router.url)


def test_more_than_8_kib_sent_with_the_sasl_init_closes_that_connection_only(start: Start) -> None:
    """A client may send its AMQP header and first frames without waiting for the SASL
    outcome. Here: 8,200 bytes after the sasl-init in the same write (found by the fuzzer:
    qpid-flow in front of a broker exited with OverflowError from Transport.push)."""
    router = start()
    data = SASL_HEADER + ANONYMOUS_INIT + AMQP_HEADER + bytes(8192)
    result = send_one(router.host, router.port, from_units(0, "8 KiB pipelined", [data]), 5.0)
    time.sleep(0.5)  # fixed: time for qpid-flow to die of it, if it would
    assert router.returncode is None, (
        f"qpid-flow died on {len(data)} bytes sent at once: {data[:60].hex()}... + zeros\n{log_tail(router)}"
    )
    assert result.closed_by_router, f"the connection is still open: {answers(result.response)}"
    round_trip(router.url)


def test_a_client_gone_right_after_its_first_bytes_is_forgotten(start: Start) -> None:
    """Clients that send a protocol header (and a sasl-init) and close at once, before any
    answer (found by the fuzzer: in front of a broker, the first one ended qpid-flow with an
    AssertionError in the gate once the upstream socket connected)."""
    router = start()
    for first in (AMQP_HEADER, SASL_HEADER + ANONYMOUS_INIT, SASL_HEADER):
        send_one(router.host, router.port, from_units(0, "gone at once", [first], hang_up=True), 0)
        time.sleep(0.5)  # fixed: time for qpid-flow to die of it, if it would
        assert router.returncode is None, (
            f"qpid-flow died after a client sent {first.hex()} and left\n{log_tail(router)}"
        )
    round_trip(router.url)


def test_an_attach_with_a_malformed_properties_array_closes_that_connection_only(start: Start) -> None:
    """The recorded session up to the sender's attach, whose properties are an array that
    lies about its count (found by the fuzzer: in front of a broker, qpid-flow died of a
    segmentation fault writing the upstream attach)."""
    router = start()
    units = [*load_session()[:8], ATTACH_WITH_LYING_PROPERTIES]
    assert [describe(u) for u in units if isinstance(u, bytes)][-2:] == ["begin", "attach"]
    send_one(router.host, router.port, from_units(0, "lying properties", units), 2.0)
    time.sleep(0.5)  # fixed: time for qpid-flow to die of it, if it would
    assert router.returncode is None, (
        f"qpid-flow died on an attach {ATTACH_WITH_LYING_PROPERTIES.hex()}\n{log_tail(router)}"
    )
    round_trip(router.url)


def test_a_frame_that_does_not_decode_gets_its_connection_closed(start: Start) -> None:
    """The AMQP header, then a 9-byte frame whose body is a lone 0x00 (a descriptor with
    nothing after it): 17 bytes. qpid-flow must end that connection, not hold it (found by
    the fuzzer: standalone, the socket stayed in CLOSE_WAIT after the client left, for good;
    in front of RabbitMQ, until the broker dropped the upstream connection 10 s later)."""
    router = start()
    data = AMQP_HEADER + bytes.fromhex("000000090200000000")
    result = send_one(router.host, router.port, from_units(0, "undecodable frame", [data]), 2.0)
    deadline = time.monotonic() + 3  # after the client closed
    while result.client_port in left_open(router.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert router.returncode is None, f"qpid-flow died on {data.hex()}\n{log_tail(router)}"
    assert result.closed_by_router or result.client_port not in left_open(router.port), (
        f"qpid-flow neither closed the connection that sent {data.hex()} in 2 s nor its own end in the 3 s "
        f"after the client closed (CLOSE_WAIT): it answered {result.response.hex()}\n{log_tail(router)}"
    )


def test_the_recorded_session_replays_to_the_end(start: Start) -> None:
    """The unmutated session, sent step by step, is a whole clean session: the fuzzing
    starts from bytes that get everywhere."""
    router = start()
    result = send_one(router.host, router.port, from_units(0, "as recorded", load_session()), 5.0)
    said = [describe(unit) for unit in split_units(result.response)]
    assert "sasl-outcome 00" in answers(result.response), said
    assert said.count("attach") == 2 and "transfer" in said and said[-1] == "close", said
    assert not [a for a in answers(result.response) if a.startswith("amqp:")], answers(result.response)
    assert router.returncode is None


def test_fuzzed_sessions_close_only_their_own_connection(start: Start, tmp_path: Path) -> None:
    router = start()
    bystander = Bystander(router.url)
    bystander.start()
    session = load_session()
    tally = Tally()
    by_port: dict[int, Input] = {}  # the client port of each input's connection
    leak = LeakCheck(router.pid)  # the first batch is the warm-up
    t0 = time.monotonic()
    try:
        for first in range(0, MUTATIONS, BATCH):
            inputs = [mutate(session, SEED, i) for i in range(first, first + BATCH)]
            batch: Batch = send_batch(router.host, router.port, inputs, alive(router), CONCURRENCY, READ_TIMEOUT)
            tally.add(batch.results)
            by_port.update((r.client_port, r.input) for r in batch.results)
            if batch.died:
                pytest.fail(died_report(router, batch.suspects, start, tmp_path), pytrace=False)
            refused = [r for r in batch.results if r.connect_error]
            assert not refused, (
                f"qpid-flow alive but refusing connections: {refused[0].connect_error} at {refused[0].input.show()}\n"
                f"{log_tail(router)}"
            )
            try:
                round_trip(router.url, timeout=30)
            except ClientError as exc:
                if router.returncode is not None:  # died after the batch's grace time
                    pytest.fail(died_report(router, inputs, start, tmp_path), pytrace=False)
                saved = tmp_path / "fuzz-batch.txt"
                saved.write_text("".join(f"{item}\n\n" for item in inputs))
                pytest.fail(
                    f"qpid-flow alive but a well-behaved client no longer round-trips after inputs {first}-"
                    f"{first + BATCH - 1} of seed {SEED} (saved in {saved}): {exc}\n{log_tail(router)}",
                    pytrace=False,
                )
            if first == 0:
                leak.warmed_up(BATCH)
            else:
                leak.after_batch(first + BATCH)
        assert bystander.probe(30), (
            f"the client connected before the fuzzing no longer round-trips: {bystander.errors}\n{log_tail(router)}"
        )
        assert not bystander.errors, f"the client connected before the fuzzing: {bystander.errors}\n{log_tail(router)}"
        deadline = time.monotonic() + 5  # every fuzzed connection ended on our side long ago
        while (left := [by_port[p] for p in left_open(router.port) if p in by_port]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            saved = tmp_path / "fuzz-left-open.txt"
            saved.write_text("".join(f"{item}\n\n" for item in left))
            pytest.fail(
                f"qpid-flow never closed {len(left)} connections the fuzzer had closed (CLOSE_WAIT; each holds a "
                f"descriptor), all in {saved}; the first:\n" + "\n".join(i.show() for i in left[:3]),
                pytrace=False,
            )
        # Once the fuzzed connections are closed (descriptors back to the warm-up level,
        # waited for), with the bystander still connected as it was at the warm-up.
        leak.finish(MUTATIONS)
    finally:
        bystander.stop()
    seconds = time.monotonic() - t0
    print(
        f"{tally.inputs} inputs in {seconds:.1f}s ({tally.inputs / seconds:.0f}/s): closed by qpid-flow "
        f"{tally.closed_by_router}, by timeout {tally.timed_out}, hung up {tally.hung_up}; "
        f"answers {dict(tally.answers.most_common())}; {leak.summary()}"
    )
    assert router.returncode is None
    assert not leak.problems(), (
        f"qpid-flow leaks (seed {SEED}): {'; '.join(leak.problems())}.\n{leak.summary()}\nSamples after each "
        f"batch:\n{leak.table()}\nbench/fuzz.py --mutations 10000 runs longer (BENCHMARKS.md, 'Listener "
        f"fuzzing').\n{log_tail(router, 20)}"
    )
