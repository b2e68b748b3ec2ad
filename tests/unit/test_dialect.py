"""Destination identity per broker dialect: RabbitMQ's address forms, the plain one, the choice."""

from __future__ import annotations

import pytest

from qpid_flow.config import ConfigError, build_config
from qpid_flow.core.dialect import PLAIN, RABBITMQ, Dialect, Node, PlainDialect, RabbitMQDialect, dialect_for


@pytest.mark.parametrize("address", ["orders", "/queue/orders", "/amq/queue/orders"])
def test_rabbitmq_reads_three_spellings_as_one_queue(address: str) -> None:
    assert RABBITMQ.node(address) == Node("orders", True)


@pytest.mark.parametrize(
    ("address", "name"),
    [
        ("/queue/a%2Fb", "a/b"),
        ("/amq/queue/a%2Fb", "a/b"),
        ("a%2Fb", "a/b"),
        ("/queue/%2F%2F", "//"),
        # RabbitMQ decodes this one escape only, and only in upper case: the rest is the name.
        ("/queue/a%2fb", "a%2fb"),
        ("/queue/a%20b", "a%20b"),
        ("a%3Ab", "a%3Ab"),
        ("/queue/orders.eu", "orders.eu"),
        ("/queue/queue", "queue"),
    ],
)
def test_rabbitmq_unescapes_as_rabbitmq_does(address: str, name: str) -> None:
    assert RABBITMQ.node(address) == Node(name, True)


def test_rabbitmq_escaped_and_plain_names_are_the_same_queue() -> None:
    assert RABBITMQ.node("/queue/a%2Fb") == RABBITMQ.node("a%2Fb") == RABBITMQ.node("/amq/queue/a%2Fb")


def test_rabbitmq_reply_queue_is_the_rest_verbatim() -> None:
    assert RABBITMQ.node("/reply-queue/amq.gen-Xy") == Node("amq.gen-Xy", True)
    assert RABBITMQ.node("/reply-queue/a%2Fb/c") == Node("a%2Fb/c", True)


@pytest.mark.parametrize(
    "address",
    [
        "/exchange/amq.fanout",
        "/exchange/amq.direct/orders",
        "/exchange/amq.topic/a%2Fb",
        "/topic/prices.eu",
        "/topic/orders",
    ],
)
def test_rabbitmq_exchanges_and_topics_are_not_queues(address: str) -> None:
    assert RABBITMQ.node(address) == Node(address, False)


def test_rabbitmq_bare_queue_address_routes_each_message_by_its_subject() -> None:
    # A sender's target: each message goes to the queue its subject names.
    assert RABBITMQ.node("/queue") == Node("/queue", False, by_subject=True)
    assert not PLAIN.node("/queue").by_subject


@pytest.mark.parametrize(
    "address",
    [
        "/queue/",
        "/amq/queue/",
        "/queue/a/b",
        "/amq/queue/a/b",
        "foo/bar",
        "/foo/bar",
        "/reply-queue/",
        "/temp-queue/t",
        "",
    ],
)
def test_rabbitmq_addresses_it_refuses_are_returned_unchanged_as_non_queues(address: str) -> None:
    assert RABBITMQ.node(address) == Node(address, False)


def test_an_exchange_and_a_queue_of_the_same_word_stay_apart() -> None:
    assert RABBITMQ.node("/topic/orders").name != RABBITMQ.node("/queue/orders").name


@pytest.mark.parametrize("address", ["orders", "/queue/orders", "/exchange/x/y", "a%2Fb", "", "topic://prices"])
def test_plain_takes_every_address_as_a_queue_of_that_name(address: str) -> None:
    assert PLAIN.node(address) == Node(address, True)


@pytest.mark.parametrize(
    ("setting", "product", "expected"),
    [
        ("auto", "RabbitMQ", "rabbitmq"),
        ("auto", "rabbitmq", "rabbitmq"),
        ("auto", " RABBITMQ ", "rabbitmq"),
        ("auto", "apache-activemq-artemis", "plain"),
        ("auto", "qpid-cpp", "plain"),
        ("auto", "qpid-flow", "plain"),
        ("auto", None, "plain"),
        ("auto", "", "plain"),
        ("rabbitmq", None, "rabbitmq"),
        ("rabbitmq", "apache-activemq-artemis", "rabbitmq"),
        ("plain", "RabbitMQ", "plain"),
    ],
)
def test_dialect_for(setting: str, product: str | None, expected: str) -> None:
    dialect = dialect_for(setting, product)
    assert dialect.name == expected
    assert isinstance(dialect, RabbitMQDialect if expected == "rabbitmq" else PlainDialect)


def test_dialect_for_an_unknown_setting() -> None:
    with pytest.raises(ValueError, match="auto, rabbitmq, plain"):
        dialect_for("artemis")


def test_both_dialects_meet_the_protocol() -> None:
    dialects: list[Dialect] = [RabbitMQDialect(), PlainDialect()]
    assert [d.node("/queue/x").is_queue for d in dialects] == [True, True]


def test_nodes_are_values() -> None:
    node = RABBITMQ.node("/queue/orders")
    assert {node, Node("orders", True)} == {Node("orders", True)}
    with pytest.raises(AttributeError):
        node.name = "other"  # type: ignore[misc]


# --- the configuration key ------------------------------------------------------------------


def test_broker_dialect_defaults_to_auto() -> None:
    assert build_config({}).broker_dialect == "auto"


@pytest.mark.parametrize("setting", ["auto", "rabbitmq", "plain"])
def test_broker_dialect_settings(setting: str) -> None:
    assert build_config({"broker_dialect": setting}).broker_dialect == setting


def test_broker_dialect_refuses_others() -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"broker_dialect": "artemis"})
    assert str(caught.value) == "broker_dialect = 'artemis': must be one of auto, rabbitmq, plain"


def test_qpid_flows_reader_reads_a_rabbitmq_queue_by_the_address_that_declares_nothing() -> None:
    assert RABBITMQ.existing_queue("orders") == "/amq/queue/orders"
    # RabbitMQ reads %2F as "/" (and refuses the plain "a/b"); "a%2Fb" itself cannot be spelt.
    assert RABBITMQ.existing_queue("a/b") == "/amq/queue/a%2Fb"
    assert RABBITMQ.existing_queue("a%2Fb") == "a%2Fb"
    assert PLAIN.existing_queue("orders") == "orders"


def test_a_rabbitmq_queue_has_three_address_forms_and_an_exchange_one() -> None:
    assert RABBITMQ.address_forms("orders") == ("orders", "/queue/orders", "/amq/queue/orders")
    assert RABBITMQ.address_forms("a/b") == ("a/b", "/queue/a%2Fb", "/amq/queue/a%2Fb")
    assert RABBITMQ.address_forms("/topic/a.b") == ("/topic/a.b",)
    assert RABBITMQ.address_forms("/exchange/amq.direct/k") == ("/exchange/amq.direct/k",)
    assert RABBITMQ.address_forms("/queue") == ("/queue",)
    # A queue's name may start with "/": /queue/%2Fsecret is queue "/secret".
    assert RABBITMQ.node("/queue/%2Fsecret").name == "/secret"
    assert RABBITMQ.address_forms("/secret") == ("/secret", "/queue/%2Fsecret", "/amq/queue/%2Fsecret")
    assert RABBITMQ.pattern_core("/queue/orders.*") == "orders.*"
    assert RABBITMQ.pattern_core("/amq/queue/a%2F*") == "a/*"
    assert RABBITMQ.pattern_core("/topic/>") == "/topic/>"
    assert PLAIN.address_forms("/queue/orders") == ("/queue/orders",)


@pytest.mark.parametrize(
    "address",
    [
        "amq.rabbitmq.reply-to",
        "amq.rabbitmq.reply-to.g1h2AA5yZXBseUAyNjMyNTE5OQAAPT4AAAAAAAAAAQ==",
        "/queue/amq.rabbitmq.reply-to.g1h2AA5yZXBseUAy",
        "/reply-queue/amq.rabbitmq.reply-to.g1h2AA5yZXBseUAy",
    ],
)
def test_rabbitmqs_direct_reply_to_keeps_no_depth_and_every_spelling(address: str) -> None:
    """An AMQP 0-9-1 requester's reply_to stores nothing: its depth counted only grew, and
    a '>' policy held an RPC server's replies every few messages. Named as a queue still,
    so that a pattern (an ACL's deny) matches it however a client spells it."""
    node = RABBITMQ.node(address)
    name = address.rsplit("/", 1)[-1]
    assert (node.name, node.is_queue, node.keeps_depth) == (name, True, False)
    assert RABBITMQ.address_forms(name) == (name, f"/queue/{name}", f"/amq/queue/{name}")
    assert RABBITMQ.node("orders").keeps_depth
