"""The ACL and connection limits, alone (qpid_flow.security.access)."""

from __future__ import annotations

import pytest

from qpid_flow.config import AclEntry, ConfigError, build_config
from qpid_flow.core.dialect import RABBITMQ
from qpid_flow.security.access import AccessPolicy, ConnectionLimits


def test_no_entries_allow_everything() -> None:
    policy = AccessPolicy([])
    assert not policy.enabled
    assert policy.allows("anyone", "send", "x") and policy.allows("anyone", "receive", "y.z")


def test_first_matching_entry_decides_and_the_rest_is_denied() -> None:
    policy = AccessPolicy(
        [
            AclEntry("alice", send=("a.>",), receive=("a.>",)),
            AclEntry("alice", send=("b.>",), allow=False),
            AclEntry("*", send=("b.public",), receive=("public.*",)),
        ]
    )
    assert policy.allows("alice", "send", "a.orders")
    assert policy.allows("alice", "receive", "a.orders.eu")
    assert not policy.allows("alice", "send", "b.public")  # her deny comes before the "*" allow
    assert policy.allows("bob", "send", "b.public")
    assert not policy.allows("bob", "send", "b.other")
    assert policy.allows("bob", "receive", "public.news")
    assert not policy.allows("bob", "receive", "public.news.eu")  # "*" is one segment
    assert not policy.allows("alice", "receive", "c")  # no entry says: denied
    assert not policy.allows("alice", "send", "a")  # "a.>" needs at least one more segment


def test_a_pattern_may_name_any_address_form_of_a_name() -> None:
    """In front of RabbitMQ queue ``orders`` is also ``/queue/orders``: a deny written in
    either form guards it however a client writes it (the router asks by the queue's name)."""
    policy = AccessPolicy(
        [
            AclEntry("*", send=("/queue/orders", "/exchange/>"), receive=("/amq/queue/pay.*",), allow=False),
            AclEntry("*", send=(">",), receive=(">",)),
        ]
    )
    policy.address_forms = RABBITMQ.address_forms
    assert not policy.allows("bob", "send", "orders")
    assert not policy.allows("bob", "send", "/exchange/amq.direct/orders")
    assert not policy.allows("bob", "receive", "pay.eu")
    assert policy.allows("bob", "receive", "orders")
    assert policy.allows("bob", "send", "/topic/a.b")
    assert policy.allows("bob", "send", "orders2")


def test_a_deny_in_queue_form_guards_a_queue_whose_name_starts_with_a_slash() -> None:
    """/queue/%2Fsecret is queue "/secret", which was taken for an exchange or topic
    address (one form): neither /queue/> nor the very address the client wrote denied it."""
    for pattern in ("/queue/>", "/queue/%2Fsecret"):
        policy = AccessPolicy([AclEntry("*", send=(pattern,), allow=False), AclEntry("*", send=(">",))])
        policy.address_forms = RABBITMQ.address_forms
        assert not policy.allows("bob", "send", RABBITMQ.node("/queue/%2Fsecret").name), pattern
        assert policy.allows("bob", "send", "/topic/secret"), pattern


def test_acl_entries_are_checked_in_the_configuration() -> None:
    config = build_config({"acl": [{"user": "alice", "send": ["a.>"], "action": "deny"}]})
    assert config.acl == (AclEntry("alice", send=("a.>",), receive=(), allow=False),)
    with pytest.raises(ConfigError, match=r"acl\[1\]\.user"):
        build_config({"acl": [{"send": ["a"]}]})
    with pytest.raises(ConfigError, match=r"acl\[2\]\.sned.*unknown key"):
        build_config({"acl": [{"user": "a"}, {"user": "b", "sned": ["x"]}]})
    with pytest.raises(ConfigError, match=r"acl\[1\]\.receive.*'>' may only be the last segment"):
        build_config({"acl": [{"user": "a", "receive": ["a.>.b"]}]})
    with pytest.raises(ConfigError, match=r"acl\[1\]\.action.*allow, deny"):
        build_config({"acl": [{"user": "a", "action": "maybe"}]})


def test_an_acl_for_anonymous_in_front_of_a_broker_is_refused_unless_that_is_the_brokers_anonymous_user() -> None:
    """In front of a broker an ANONYMOUS client is broker_anonymous_user (guest): a rule
    written for "anonymous", as the docs had it, would match no one and let it through."""
    acl = [{"user": "anonymous", "send": [">"], "action": "deny"}, {"user": "*", "send": [">"]}]
    broker = "amqp://127.0.0.1:5672"
    with pytest.raises(ConfigError, match=r"^acl = 'anonymous': .*broker_anonymous_user = 'guest'"):
        build_config({"broker": broker, "acl": acl})
    assert build_config({"broker": broker, "acl": acl, "broker_anonymous_user": "anonymous"}).acl
    assert build_config({"acl": acl}).acl, "standalone, ANONYMOUS clients are anonymous"


def test_connection_limits_total_and_per_user() -> None:
    limits = ConnectionLimits(total=3, per_user=2)
    assert limits.admit("alice") is None
    assert limits.admit("alice") is None
    refusal = limits.admit("alice")
    assert refusal is not None and "max_connections_per_user = 2" in refusal
    assert limits.admit("bob") is None
    refusal = limits.admit("carol")
    assert refusal is not None and "max_connections = 3" in refusal
    limits.release("alice")
    assert limits.open_connections() == 2 and limits.open_connections("alice") == 1
    assert limits.admit("carol") is None


def test_zero_means_no_limit() -> None:
    limits = ConnectionLimits(total=0, per_user=0)
    assert all(limits.admit("alice") is None for _ in range(10_000))
