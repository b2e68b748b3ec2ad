"""The field reader agrees with Proton's full decode, and refuses broken encodings."""

from __future__ import annotations

import uuid

import pytest
from proton import Message, char, decimal32, decimal64, decimal128, symbol, ulong

from qpid_flow import codec
from qpid_flow.core.model import DEFAULT_GROUP, group_key


def encode(**kwargs: object) -> bytes:
    message = Message(**kwargs)
    return message.encode()


@pytest.mark.parametrize(
    "message_id",
    [None, "id-1", 42, uuid.uuid4(), b"binary-id", ulong(7)],
)
def test_to_is_found_whatever_the_message_id_type(message_id: object) -> None:
    data = encode(id=message_id, user_id=b"someone", address="orders.eu", body="x")
    assert codec.to_address(data) == "orders.eu"


def test_group_id_from_properties_and_from_an_application_property() -> None:
    data = encode(
        address="q",
        group_id="cart-17",
        properties={"JMSXGroupID": "A", "GROUP_KEY": 5, "flag": True},
        body="x" * 300,
    )
    assert codec.group_id(data) == "cart-17"
    assert codec.group_id(data, "JMSXGroupID") == "A"
    assert codec.group_id(data, "GROUP_KEY") == 5
    assert codec.application_property(data, "flag") is True
    assert codec.application_property(data, "absent") is None


def test_char_and_decimal_group_keys_are_distinct_groups() -> None:
    """A char or decimal application property (simple AMQP types a group header may name)
    read as None, so each of them fell into the default group, merged with every other
    and with every keyless message. Each value is now a group of its own."""
    values = [char("x"), char("y"), decimal32(1), decimal32(2), decimal64(1), decimal128(b"\x01" * 16)]
    keys = [group_key(codec.group_id(encode(address="q", properties={"GK": v}, body="x"), "GK")) for v in values]
    assert DEFAULT_GROUP not in keys
    assert len(set(keys)) == len(values), keys
    assert keys[:2] == ["x", "y"]


def test_a_char_outside_unicode_is_no_key() -> None:
    data = bytearray(encode(address="q", properties={"GK": char("x")}, body="x"))
    at = data.index(b"\x73\x00\x00\x00x")
    data[at + 1 : at + 5] = (0x110000).to_bytes(4, "big")
    assert codec.group_id(bytes(data), "GK") is None


def test_sections_before_properties_are_skipped() -> None:
    message = Message(address="after-annotations", durable=True, priority=7, ttl=5, body={"k": [1, 2]})
    message.annotations = {symbol("x-opt-a"): "v", symbol("x-opt-b"): [1, 2, 3]}
    message.instructions = {symbol("x-opt-di"): 1}
    assert codec.to_address(message.encode()) == "after-annotations"


def test_message_without_properties_has_no_address() -> None:
    assert codec.to_address(encode(body="only a body")) is None
    assert codec.group_id(encode(body="only a body")) is None


def test_long_strings_use_the_32_bit_forms() -> None:
    long_address = "a" * 300
    data = encode(address=long_address, properties={"k" * 300: "v" * 300}, body="x")
    assert codec.to_address(data) == long_address
    assert codec.application_property(data, "k" * 300) == "v" * 300


@pytest.mark.parametrize("cut", [1, 3, 10, 20])
def test_truncated_encoding_is_refused(cut: int) -> None:
    data = encode(id="x", address="somewhere-far", body="x")
    with pytest.raises(codec.MalformedMessage):
        codec.properties_field(data[: 3 + cut] + b"\xff", "to")


def test_garbage_is_refused() -> None:
    with pytest.raises(codec.MalformedMessage):
        codec.to_address(b"\x01\x02\x03garbage")


# --- expiry and redelivery (issue 16) ---------------------------------------------------------


def test_expiry_from_ttl_counts_from_arrival_and_absolute_time_wins_if_sooner() -> None:
    assert codec.expiry_time(Message(body="x", ttl=1.5).encode(), 1000.0) == 1001.5
    assert codec.expiry_time(Message(body="x").encode(), 1000.0) is None
    both = Message(body="x", ttl=60, expiry_time=1010.0).encode()
    assert codec.expiry_time(both, 1000.0) == 1010.0


def test_a_ttl_that_is_no_unsigned_integer_is_none() -> None:
    """A header whose ttl is the boolean true (Python counts it an int): the message
    expired 1 ms after it arrived, dropped unseen though its producer was told accepted."""
    value = bytes.fromhex("005377a10178")  # amqp-value "x"
    for ttl in ("41", "42", "a10135"):  # true, false, the string "5"
        header = bytes.fromhex("005370c0") + bytes((3 + len(ttl) // 2, 3)) + bytes.fromhex("4040" + ttl)
        assert codec.expiry_time(header + value, 1000.0) is None, ttl
        assert codec.header_ttl(header + value) is None, ttl
    header = bytes.fromhex("005370c0080340407000000064")  # a uint ttl of 100 ms still counts
    assert codec.expiry_time(header + value, 1000.0) == 1000.1
    # A redelivery rewrites the header as it was read: true stays no ttl (it became 1 ms),
    # a ulong past 2^32 - 1 keeps the most a uint says (masked, 49.7 days became 5 s).
    for raw_ttl, expected in (("41", 0), ("800000000100001388", 0xFFFFFFFF / 1000)):
        header = bytes.fromhex("005370c0") + bytes((3 + len(raw_ttl) // 2, 3)) + bytes.fromhex("4040" + raw_ttl)
        again = Message()
        again.decode(codec.redelivered(header + value, 1))
        assert again.ttl == pytest.approx(expected), raw_ttl


def test_a_header_priority_or_delivery_count_of_the_wrong_type_reads_as_clients_read_it() -> None:
    """A priority of true or a uint 300 (Proton reads the default, 4) came out of a
    redelivery as 1 and 44 (masked), and a selector saw True and 300; a delivery-count of
    true counted 1."""
    value = bytes.fromhex("005377a10178")
    for raw_priority in ("41", "700000012c"):  # true, uint 300
        header = bytes.fromhex("005370c0") + bytes((2 + len(raw_priority) // 2, 2)) + bytes.fromhex("40" + raw_priority)
        again = Message()
        again.decode(codec.redelivered(header + value, 1))
        assert again.priority == 4, raw_priority
        assert codec.selector_fields(header + value)["JMSPriority"] == 4, raw_priority
    header = bytes.fromhex("005370c006054040404041")  # delivery-count true
    again = Message()
    again.decode(codec.redelivered(header + value, 1))
    assert again.delivery_count == 1


def test_redelivery_raises_delivery_count_and_clears_first_acquirer() -> None:
    original = Message(body="hello", durable=True, priority=7, ttl=2.0, first_acquirer=True, delivery_count=3)
    original.address = "q"
    again = Message()
    again.decode(codec.redelivered(original.encode(), 2))
    assert (again.delivery_count, again.first_acquirer) == (5, False)
    assert (again.durable, again.priority, again.ttl, again.body, again.address) == (True, 7, 2.0, "hello", "q")
    plain = Message(body="no header").encode()
    assert codec.redelivered(plain, 0) is plain  # a released message goes out unchanged
    counted = Message()
    counted.decode(codec.redelivered(plain, 1))
    assert (counted.delivery_count, counted.body) == (1, "no header")
    with pytest.raises(codec.MalformedMessage):
        codec.redelivered(b"\x00\x53\x70\xc0\x05", 1)


def test_selector_fields_map_amqp_to_jms_identifiers() -> None:
    message = Message(
        id="m-1",
        correlation_id="c-1",
        subject="car",
        durable=True,
        priority=7,
        properties={"colour": "blue", "weight": 2501, "nested": {"no": 1}},
    )
    fields = codec.selector_fields(message.encode())
    assert fields["colour"] == "blue" and fields["weight"] == 2501
    assert "nested" not in fields  # compound values are not selectable
    assert (fields["JMSMessageID"], fields["JMSCorrelationID"], fields["JMSType"]) == (
        "ID:AMQP_NO_PREFIX:m-1",
        "c-1",
        "car",
    )
    assert (fields["JMSPriority"], fields["JMSDeliveryMode"]) == (7, "PERSISTENT")
    bare = codec.selector_fields(Message(body="x").encode())
    assert (bare["JMSPriority"], bare["JMSDeliveryMode"]) == (4, "NON_PERSISTENT")
    assert (bare["JMSTimestamp"], bare["JMSExpiration"]) == (0, 0)  # JMS: none is 0
    assert "JMSMessageID" not in bare


@pytest.mark.parametrize(
    ("message_id", "correlation_id", "shown"),
    [
        # As qpid-jms shows them (getJMSMessageID, getJMSCorrelationID): str() gave "b'...'"
        # for binary ids and no "ID:" at all.
        ("order-1", "order-1", ("ID:AMQP_NO_PREFIX:order-1", "order-1")),
        ("ID:abc", "ID:abc", ("ID:abc", "ID:abc")),
        ("ID:AMQP_UUID:x", "ID:AMQP_UUID:x", ("ID:AMQP_STRING:AMQP_UUID:x", "ID:AMQP_STRING:AMQP_UUID:x")),
        (uuid.UUID(int=1), uuid.UUID(int=1), ("ID:AMQP_UUID:00000000-0000-0000-0000-000000000001",) * 2),
        (ulong(42), ulong(42), ("ID:AMQP_ULONG:42",) * 2),
        (b"\x01\xab", b"\x01\xab", ("ID:AMQP_BINARY:01AB",) * 2),
    ],
)
def test_message_and_correlation_ids_read_as_a_jms_client_shows_them(
    message_id: object, correlation_id: object, shown: tuple[str, str]
) -> None:
    fields = codec.selector_fields(encode(id=message_id, correlation_id=correlation_id, body="x"))
    assert (fields["JMSMessageID"], fields["JMSCorrelationID"]) == shown


# --- message-id and group-id in one pass --------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"id": "msg-1"},
        {"id": 42, "group_id": "cart-17"},
        {"id": uuid.uuid4(), "ttl": 5, "expiry_time": 1010.0, "group_id": "g"},
        {"group_id": "only-group", "reply_to_group_id": "r"},
        {"id": b"binary", "subject": "s", "creation_time": 5.0, "durable": True},
    ],
)
def test_identity_agrees_with_each_field_read_alone(fields: dict[str, object]) -> None:
    message = Message(body="x", **fields)
    message.annotations = {symbol("x-opt-a"): "v"}
    data = message.encode()
    assert codec.identity(data) == (codec.properties_field(data, "message_id"), codec.group_id(data))


@pytest.mark.parametrize("cut", [1, 3, 10, 20])
def test_a_truncated_identity_is_refused(cut: int) -> None:
    data = encode(id="x", address="somewhere-far", group_id="g", body="x")
    with pytest.raises(codec.MalformedMessage):
        codec.identity(data[: 3 + cut] + b"\xff")


def test_the_walker_agrees_with_protons_decode_on_random_messages() -> None:
    """Message-id, group-id, ``to`` and expiry as Proton decodes them, over messages mixing
    every section and the id types clients use (a seeded sample: the same every run)."""
    import random

    rng = random.Random(20261125)
    id_choices: list[object] = [None, "id-1", 2**40, uuid.uuid4(), b"bin", ulong(7), "x" * 300]
    for _ in range(500):
        message = Message(
            id=rng.choice(id_choices),
            address=rng.choice([None, "q", "a" * 300]),
            group_id=rng.choice([None, "g", "é" * 200]),
            durable=rng.random() < 0.5,
            priority=rng.randrange(10),
            body=rng.choice(["x", {"k": [1, 2]}, b"\x00" * 300]),
        )
        if rng.random() < 0.5:
            message.ttl = rng.choice([0.5, 60.0])
        if rng.random() < 0.5:
            message.expiry_time = rng.choice([1000.5, 2e9])
        if rng.random() < 0.5:
            message.annotations = {symbol("x-opt-a"): "v", symbol("x-opt-b"): [1, 2, 3]}
        if rng.random() < 0.3:
            message.instructions = {symbol("x-opt-d"): 1}
        data = message.encode()
        decoded = Message()
        decoded.decode(data)
        message_id, group = codec.identity(data)
        assert message_id == decoded.id and group == decoded.group_id
        # Started where the expiry walk found the properties: the same answer.
        assert codec.identity(data, codec.expiry_and_properties(data, 0.0)[1]) == (message_id, group)
        assert codec.to_address(data) == decoded.address
        expiries = [1000.0 + decoded.ttl] if decoded.ttl else []
        expiries += [decoded.expiry_time] if decoded.expiry_time else []
        expiry = codec.expiry_time(data, 1000.0)
        assert expiry == pytest.approx(min(expiries)) if expiries else expiry is None
        # Whatever Proton encodes passes, with the expiry walk's answer found on the way.
        expiry, properties, hop_only = codec.check_sections(data, 1000.0)
        assert (expiry, properties) == codec.expiry_and_properties(data, 1000.0)
        # Standalone drops the delivery annotations: the rest decodes as before, and the
        # properties are where the offset says.
        assert (hop_only is not None) == bool(decoded.instructions)
        if hop_only is not None:
            kept_bytes, properties = codec.without_section(data, hop_only, properties)
            stripped = Message()
            stripped.decode(kept_bytes)
            assert stripped.instructions is None
            assert (stripped.body, stripped.annotations, stripped.properties) == (
                decoded.body,
                decoded.annotations,
                decoded.properties,
            )
            assert codec.identity(kept_bytes, properties) == (message_id, group)


def test_message_annotations_are_merged_keeping_every_other_byte() -> None:
    """What a modified outcome's annotations do to a kept message: only that section is
    encoded again; the header before it and everything after it stay byte for byte."""
    from proton import Message as ProtonMessage
    from proton import symbol

    from qpid_flow.amqp.messages import with_message_annotations
    from qpid_flow.codec import section_bounds

    plain = ProtonMessage(body="b", durable=True, properties={"k": 1}, subject="s").encode()
    where = section_bounds(plain, 0x72)
    assert isinstance(where, int)  # none: the offset it belongs at (after the header)
    merged = with_message_annotations(plain, {symbol("x-opt-a"): 1})
    assert merged[:where] == plain[:where] and merged.endswith(plain[where:])
    decoded = ProtonMessage()
    decoded.decode(merged)
    assert (decoded.annotations, decoded.body, decoded.subject, decoded.durable) == ({"x-opt-a": 1}, "b", "s", True)

    annotated = ProtonMessage(body="b", annotations={"x-opt-a": 1, "x-opt-b": "keep"}).encode()
    bounds = section_bounds(annotated, 0x72)
    assert isinstance(bounds, tuple)
    end = bounds[1]
    again = with_message_annotations(annotated, {symbol("x-opt-a"): 2, symbol("x-opt-c"): True})
    assert again.endswith(annotated[end:])
    decoded.decode(again)
    assert decoded.annotations == {"x-opt-a": 2, "x-opt-b": "keep", "x-opt-c": True}


def test_jms_expiration_counts_the_ttl_from_arrival() -> None:
    """A message sent with a ttl alone had no JMSExpiration (JMSExpiration > 0 matched
    nothing): it is when the message expires, in ms."""
    from qpid_flow.core.model import Message as Queued

    queued = Queued(encode(address="q", ttl=600, body="x"), "q")
    queued.arrived = 1_000_000.5
    queued.expires = queued.arrived + 600  # as the standalone backend sets it: arrival + ttl
    assert queued.selector_fields()["JMSExpiration"] == 1_000_600_500
    # An absolute-expiry-time sooner than the ttl wins, to the millisecond (after 2038 too).
    data = encode(address="q", ttl=600, expiry_time=2186113046.062, body="x")  # 2186113046061 on the wire
    on_the_wire = codec.properties_field(data, "absolute_expiry_time")
    queued = Queued(data, "q")
    queued.arrived = 2186113000.0
    queued.expires = on_the_wire / 1000
    assert queued.selector_fields()["JMSExpiration"] == on_the_wire


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "an empty message"),
        (b"\xff\xfe\xfd", "expected a described section"),
        (b"\x00Sw\xa1\x05hel", "ends inside a value"),
        (Message(body="x").encode() + b"\x00", "malformed"),
        # properties after the body: out of the order AMQP 1.0 3.2 gives
        (Message(body="x").encode() + Message(id="late").encode()[: -len(Message().encode())], "out of order"),
        (b"\x00Sw\xa1\x01a\x00Su\xa0\x01b", "out of order"),  # an amqp-value then a data section
    ],
)
def test_messages_a_client_cannot_decode_are_found(data: bytes, why: str) -> None:
    """A standalone qpid-flow queued them as sent: an empty transfer, and garbage, reached
    consumers on other connections and made Proton's MessagingHandler raise."""
    with pytest.raises(codec.MalformedMessage, match=why):
        codec.check_sections(data)


def test_a_message_without_a_body_passes_as_rabbitmq_takes_it() -> None:
    codec.check_sections(Message(id="no-body", properties={"k": 1}).encode())
    codec.check_sections(Message(body=[b"a", b"b"]).encode())  # a body of one kind


def test_a_message_that_waited_goes_on_with_the_time_to_live_it_has_left() -> None:
    original = Message(body="x", ttl=10.0, priority=7, durable=True, properties={"k": 1})
    later = codec.aged(original.encode(), received=1000.0, now=1003.5)
    assert later is not None
    decoded = Message()
    decoded.decode(later)
    assert decoded.ttl == pytest.approx(6.5)
    assert (decoded.priority, decoded.durable, decoded.body, decoded.properties) == (7, True, "x", {"k": 1})


def test_a_message_that_expired_while_it_waited_is_none() -> None:
    assert codec.aged(Message(body="x", ttl=1.0).encode(), received=1000.0, now=1001.0) is None
    by_clock = Message(body="x", expiry_time=1000.5)  # absolute-expiry-time, in seconds here
    assert codec.aged(by_clock.encode(), received=1000.0, now=1001.0) is None
    kept = by_clock.encode()
    assert codec.aged(kept, received=1000.0, now=1000.2) is kept  # its deadline does not move


def test_a_message_without_a_time_to_live_is_unchanged_by_waiting() -> None:
    encoded = Message(body="x").encode()
    assert codec.aged(encoded, received=1000.0, now=5000.0) is encoded


def test_header_ttl_is_the_headers_time_to_live_in_milliseconds() -> None:
    assert codec.header_ttl(Message(body="x", ttl=1.5).encode()) == 1500
    assert codec.header_ttl(Message(body="x").encode()) is None
    assert codec.header_ttl(Message(body="x", expiry_time=1000.0).encode()) is None
