"""Read single fields out of an encoded AMQP 1.0 message without decoding it.

qpid-flow forwards message bytes untouched. A policy sometimes needs one field (the
``to`` of an anonymous-relay transfer, a group id); decoding the whole message with
Proton for that costs ten times more than walking the encoding to the one value.

The walker understands every AMQP 1.0 type code (so it can skip anything) but only
turns the simple scalar types back into Python values: those are what addresses and
group ids are made of. A field holding a compound value reads as :data:`None`.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple

__all__ = [
    "Decimal",
    "MalformedMessage",
    "application_property",
    "expiry_time",
    "group_id",
    "properties_field",
    "redelivered",
    "to_address",
]


class MalformedMessage(ValueError):
    """The bytes are not a well-formed AMQP 1.0 message encoding."""


# Section descriptors (AMQP 1.0 part 3.2), numeric and symbolic forms.
_HEADER = 0x70
_DELIVERY_ANNOTATIONS = 0x71
_PROPERTIES = 0x73
_APPLICATION_PROPERTIES = 0x74
_SYMBOLIC_DESCRIPTORS = {
    b"amqp:header:list": 0x70,
    b"amqp:delivery-annotations:map": 0x71,
    b"amqp:message-annotations:map": 0x72,
    b"amqp:properties:list": 0x73,
    b"amqp:application-properties:map": 0x74,
    b"amqp:data:binary": 0x75,
    b"amqp:amqp-sequence:list": 0x76,
    b"amqp:amqp-value:*": 0x77,
    b"amqp:footer:map": 0x78,
}

# Index of each field in the properties list.
PROPERTIES_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)
_FIELD_INDEX = {name: i for i, name in enumerate(PROPERTIES_FIELDS)}

# Fixed-width type codes: code -> width in bytes.
_FIXED = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}  # fmt: skip

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


def _size_and_count(buf: bytes, pos: int, code: int) -> tuple[int, int, int]:
    """For a compound or variable-width code at buf[pos-1], return (width, count, body)."""
    if code in (0xC0, 0xC1, 0xE0):
        return buf[pos], buf[pos + 1], pos + 2
    return _U32.unpack_from(buf, pos)[0], _U32.unpack_from(buf, pos + 4)[0], pos + 8


# How to step over each type code, one lookup per value: a width >= 0 is a fixed-width
# value; _SMALL and _LARGE are variable-width and compound values with a one- and a
# four-byte size; _DESCRIBED a descriptor then a value; _UNKNOWN is no AMQP 1.0 type.
_SMALL, _LARGE, _DESCRIBED, _UNKNOWN = -1, -4, -2, -9
_STEP: tuple[int, ...] = tuple(
    _FIXED.get(code)  # type: ignore[misc]
    if code in _FIXED
    else _SMALL
    if code in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0)
    else _LARGE
    if code in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0)
    else _DESCRIBED
    if code == 0x00
    else _UNKNOWN
    for code in range(256)
)


def skip(buf: bytes, pos: int) -> int:
    """Return the position just past the encoded value starting at ``pos``."""
    try:
        step = _STEP[buf[pos]]
        if step >= 0:
            end = pos + 1 + step
        elif step == _SMALL:
            end = pos + 2 + buf[pos + 1]
        elif step == _LARGE:
            end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        elif step == _DESCRIBED:
            return skip(buf, skip(buf, pos + 1))
        else:
            raise MalformedMessage(f"unknown AMQP type code 0x{buf[pos]:02x} at offset {pos}")
    except (IndexError, struct.error) as exc:
        raise MalformedMessage("message encoding ends inside a value") from exc
    if end > len(buf):
        raise MalformedMessage("message encoding ends inside a value")
    return end


class Decimal(NamedTuple):
    """An AMQP decimal32, decimal64 or decimal128, kept as its IEEE 754 bits: read as a
    group key (its string form tells different values apart), never computed with."""

    width: int
    bits: int

    def __str__(self) -> str:
        return f"decimal{self.width}:{self.bits:#x}"


def decode_scalar(buf: bytes, pos: int) -> Any:
    """Decode the simple value at ``pos``; compound values decode as None."""
    code = buf[pos]
    p = pos + 1
    # The types message-ids and group-ids are usually made of come first: this runs for
    # every message when the event log is on.
    if code == 0x80:
        return _U64.unpack_from(buf, p)[0]
    if code in (0xA1, 0xA3):
        n = buf[p]
        return buf[p + 1 : p + 1 + n].decode("utf-8")
    if code == 0x40:
        return None
    if code == 0x53 or code == 0x50 or code == 0x52:
        return buf[p]
    if code == 0x98:
        return uuid.UUID(bytes=bytes(buf[p : p + 16]))
    if code == 0xA0:
        return bytes(buf[p + 1 : p + 1 + buf[p]])
    if code in (0x43, 0x44):
        return 0
    return _decode_rare(buf, code, p)


def _decode_rare(buf: bytes, code: int, p: int) -> Any:
    """decode_scalar for the types a message-id or group-id is seldom made of."""
    if code in (0xB1, 0xB3):
        n = _U32.unpack_from(buf, p)[0]
        return buf[p + 4 : p + 4 + n].decode("utf-8")
    if code == 0xB0:
        n = _U32.unpack_from(buf, p)[0]
        return bytes(buf[p + 4 : p + 4 + n])
    if code == 0x41:
        return True
    if code == 0x42:
        return False
    if code == 0x56:
        return buf[p] != 0
    if code in (0x51, 0x54, 0x55):
        return int.from_bytes(buf[p : p + 1], "big", signed=True)
    if code == 0x60:
        return _U16.unpack_from(buf, p)[0]
    if code == 0x61:
        return int.from_bytes(buf[p : p + 2], "big", signed=True)
    if code == 0x70:
        return _U32.unpack_from(buf, p)[0]
    if code == 0x71:
        return _I32.unpack_from(buf, p)[0]
    if code == 0x83:
        return _U64.unpack_from(buf, p)[0]
    if code == 0x81:
        return _I64.unpack_from(buf, p)[0]
    if code == 0x72:
        return struct.unpack_from(">f", buf, p)[0]
    if code == 0x82:
        return struct.unpack_from(">d", buf, p)[0]
    if code == 0x73:  # char: one UTF-32BE code point
        point = _U32.unpack_from(buf, p)[0]
        return chr(point) if point <= 0x10FFFF else None
    if (width := _DECIMAL_WIDTHS.get(code)) is not None:
        return Decimal(width, int.from_bytes(buf[p : p + width // 8], "big"))
    return None


_DECIMAL_WIDTHS = {0x74: 32, 0x84: 64, 0x94: 128}


def _section_code(buf: bytes, pos: int) -> tuple[int, int]:
    """Read a section's descriptor at ``pos``: return (section code, position of its value)."""
    if buf[pos] != 0x00:
        raise MalformedMessage(f"expected a described section at offset {pos}")
    code = buf[pos + 1]
    if code == 0x53:
        section, value_pos = buf[pos + 2], pos + 3
    elif code == 0x80:
        section, value_pos = _U64.unpack_from(buf, pos + 2)[0], pos + 10
    elif code in (0xA3, 0xB3):
        name = decode_scalar(buf, pos + 1).encode()
        section, value_pos = _SYMBOLIC_DESCRIPTORS.get(name, -1), skip(buf, pos + 1)
    else:
        raise MalformedMessage(f"unsupported section descriptor 0x{code:02x} at offset {pos}")
    if not 0x70 <= section <= 0x78:
        raise MalformedMessage(f"not a message section: descriptor {section:#x} at offset {pos}")
    return section, value_pos


def _find_section(buf: bytes, wanted: int, pos: int = 0) -> int | None:
    """Position of the value of section ``wanted``, or None when the message has none;
    the search starts at the section at ``pos``."""
    end = len(buf)
    while pos < end:
        if buf[pos + 1] == 0x53 and buf[pos] == 0x00:  # the usual form: 0x00 0x53 code
            code, value_pos = buf[pos + 2], pos + 3
            if not 0x70 <= code <= 0x78:
                raise MalformedMessage(f"not a message section: descriptor {code:#x} at offset {pos}")
        else:
            code, value_pos = _section_code(buf, pos)
        if code >= wanted:  # sections appear in a fixed order
            return value_pos if code == wanted else None
        pos = skip(buf, value_pos)
    return None


def section_bounds(buf: bytes, wanted: int) -> tuple[int, int] | int:
    """Where section ``wanted`` (e.g. 0x72, message-annotations) is in the message, its
    descriptor included: (start, end); or, when it has none, the offset where it belongs
    (sections come in a fixed order)."""
    try:
        pos, end = 0, len(buf)
        while pos < end:
            code, value_pos = _section_code(buf, pos)
            if code == wanted:
                return pos, skip(buf, value_pos)
            if code > wanted:
                return pos
            pos = skip(buf, value_pos)
        return end
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"malformed message encoding: {exc}") from exc


def _guarded(read: Any) -> Any:
    """Turn any out-of-range read or bad text in a broken encoding into MalformedMessage."""

    def guarded(buf: bytes, key: str) -> Any:
        try:
            return read(buf, key)
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise MalformedMessage(f"malformed message encoding: {exc}") from exc

    guarded.__doc__ = read.__doc__
    guarded.__name__ = read.__name__
    return guarded


@_guarded
def properties_field(buf: bytes, name: str) -> Any:
    """The value of one field of the properties section (e.g. ``"to"``), or None."""
    index = _FIELD_INDEX[name]
    pos = _find_section(buf, _PROPERTIES)
    if pos is None:
        return None
    code = buf[pos]
    if code == 0x45:
        return None
    if code not in (0xC0, 0xD0):
        raise MalformedMessage("the properties section is not a list")
    _width, count, pos = _size_and_count(buf, pos + 1, code)
    if index >= count:
        return None
    for _ in range(index):
        pos = skip(buf, pos)
    skip(buf, pos)  # the value must lie inside the buffer
    return decode_scalar(buf, pos)


@_guarded
def application_property(buf: bytes, key: str) -> Any:
    """The value of one application property, or None when absent."""
    pos = _find_section(buf, _APPLICATION_PROPERTIES)
    if pos is None:
        return None
    code = buf[pos]
    if code not in (0xC1, 0xD1):
        raise MalformedMessage("the application-properties section is not a map")
    _width, count, pos = _size_and_count(buf, pos + 1, code)
    wanted = key.encode("utf-8")
    for _ in range(count // 2):
        kcode = buf[pos]
        if kcode in (0xA1, 0xA3):
            n = buf[pos + 1]
            kstart = pos + 2
        elif kcode in (0xB1, 0xB3):
            n = _U32.unpack_from(buf, pos + 1)[0]
            kstart = pos + 5
        else:
            kstart = n = -1
        value_pos = skip(buf, pos)
        end = skip(buf, value_pos)
        if kstart >= 0 and buf[kstart : kstart + n] == wanted:
            return decode_scalar(buf, value_pos)
        pos = end
    return None


def to_address(buf: bytes) -> str | None:
    """The ``to`` address of the message (the anonymous-relay destination)."""
    value = properties_field(buf, "to")
    return value if isinstance(value, str) else None


def group_id(buf: bytes, header: str | None = None) -> Any:
    """The group id: ``properties.group-id``, or the application property ``header``."""
    if header is None:
        return properties_field(buf, "group_id")
    return application_property(buf, header)


# --- the header section: expiry and redelivery -----------------------------------------------

_HEADER_FIELD_COUNT = 5  # durable, priority, ttl, first-acquirer, delivery-count


def _header(buf: bytes) -> tuple[list[Any], int] | None:
    """The header's five fields (None where absent) and where the next section starts;
    None when the message has no header (it can only be the first section)."""
    if len(buf) < 3 or buf[0] != 0x00:
        return None
    code, value_pos = _section_code(buf, 0)
    if code != _HEADER:
        return None
    end = skip(buf, value_pos)
    fields: list[Any] = [None] * _HEADER_FIELD_COUNT
    list_code = buf[value_pos]
    if list_code == 0x45:
        return fields, end
    if list_code not in (0xC0, 0xD0):
        raise MalformedMessage("the header section is not a list")
    _width, count, pos = _size_and_count(buf, value_pos + 1, list_code)
    for index in range(min(count, _HEADER_FIELD_COUNT)):
        fields[index] = decode_scalar(buf, pos)
        pos = skip(buf, pos)
    return fields, end


def earlier_deliveries(buf: bytes) -> int:
    """How many times the broker that sent the message had delivered it before, as far as
    its header tells: its ``delivery-count`` (failed deliveries; 0 when absent), and at
    least 1 when ``first-acquirer`` is false (RabbitMQ marks a message released and
    delivered again so, its delivery-count unchanged: AMQP does not count a release)."""
    header = _read_header(buf)
    if header is None:
        return 0
    first_acquirer, count = header[0][3], header[0][4]
    failed = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return max(failed, 1) if first_acquirer is False else failed


def expiry_time(buf: bytes, received: float) -> float | None:
    """When the message expires, in seconds since the epoch: the header's ``ttl``
    (milliseconds, counted from ``received``, when it arrived here) or the properties'
    ``absolute-expiry-time``, whichever comes first; None if it never expires."""
    return expiry_and_properties(buf, received)[0]


def expiry_and_properties(buf: bytes, received: float) -> tuple[float | None, int | None]:
    """:func:`expiry_time`, and where the value of the properties section starts (None: the
    message has none), found on the way: :func:`identity` can start there."""
    # Read for every message a standalone qpid-flow takes in, so in one walk: the header
    # can only be the first section, and the properties come after it.
    try:
        ttl = None
        start = 0
        if len(buf) >= 3:
            code, value_pos = (buf[2], 3) if buf[1] == 0x53 and buf[0] == 0x00 else _section_code(buf, 0)
            if code == _HEADER:
                start = skip(buf, value_pos)
                if buf[value_pos] != 0x45:  # not the empty list
                    header = _header(buf)
                    assert header is not None
                    ttl = header[0][_TTL]
        properties = _find_section(buf, _PROPERTIES, start)
        absolute = None if properties is None else _list_field(buf, properties, _ABSOLUTE_EXPIRY)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"malformed message encoding: {exc}") from exc
    return _expiry(ttl, absolute, received), properties


def _millis(value: Any) -> int | None:
    """A ttl or an absolute-expiry-time that says something: a positive integer. A boolean
    (which Python counts as an int) or any other type is none: `true` made a message
    expire 1 ms after it arrived."""
    return value if type(value) is int and value > 0 else None


def _priority(value: Any) -> int | None:
    """A header's priority: an unsigned integer of 0-255, as RabbitMQ reads it (of any
    integer encoding: the decoder keeps no width; Proton reads only a ubyte); anything else
    (a boolean, a uint past 255) is none, the default, as both read it."""
    return value if type(value) is int and 0 <= value <= 0xFF else None


def _count(value: Any) -> int:
    """A header's delivery-count: a non-negative integer, else 0 (a boolean true counted 1)."""
    return value if type(value) is int and value >= 0 else 0


def _expiry(ttl: Any, absolute: Any, received: float) -> float | None:
    """When a message received at ``received`` expires (seconds since the epoch), by its
    header's ttl (ms, from its arrival) and its absolute-expiry-time (ms), whichever is
    sooner; None if neither says."""
    ttl, absolute = _millis(ttl), _millis(absolute)
    if ttl is not None:
        if absolute is not None:
            return min(received + ttl / 1000.0, absolute / 1000.0)
        return received + ttl / 1000.0
    if absolute is not None:
        return absolute / 1000.0
    return None


def check_sections(buf: bytes, received: float = 0.0) -> tuple[float | None, int | None, tuple[int, int] | None]:
    """Raise MalformedMessage unless ``buf`` is a message a client can decode: at least one
    section, each a described section of the message (header, annotations, properties,
    application-properties, body, footer) in the order AMQP 1.0 3.2 gives them, each
    whole, and nothing after the last. (A message without a body passes: RabbitMQ takes
    one too.) A walk of the section headers: values are skipped, not decoded, but the
    header's ttl and the properties' absolute-expiry-time. Returns what
    :func:`expiry_and_properties` does, found on the way (standalone reads both for every
    message, in this one walk), and where the delivery-annotations section lies (start,
    end), if there is one."""
    end = len(buf)
    if not end:
        raise MalformedMessage("an empty message: no section at all")
    ttl = absolute = properties = delivery_annotations = None
    try:
        pos, last = 0, 0
        while pos < end:
            if buf[pos + 1] == 0x53 and buf[pos] == 0x00:  # the usual form: 0x00 0x53 code
                code, value_pos = buf[pos + 2], pos + 3
                if not 0x70 <= code <= 0x78:
                    raise MalformedMessage(f"not a message section: descriptor {code:#x} at offset {pos}")
            else:
                code, value_pos = _section_code(buf, pos)
            # In order; only data and amqp-sequence body sections may repeat, and a body is
            # of one kind.
            if code < last or (code == last and code not in (0x75, 0x76)) or (0x75 <= last < code <= 0x77):
                raise MalformedMessage(f"section {code:#x} out of order at offset {pos}")
            last = code
            if code == _HEADER:
                ttl = _list_field(buf, value_pos, _TTL)
            elif code == _PROPERTIES:
                properties = value_pos
                absolute = _list_field(buf, value_pos, _ABSOLUTE_EXPIRY)
            start, pos = pos, skip(buf, value_pos)
            if code == _DELIVERY_ANNOTATIONS:
                delivery_annotations = (start, pos)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"malformed message encoding: {exc}") from exc
    return _expiry(ttl, absolute, received), properties, delivery_annotations


def without_section(buf: bytes, span: tuple[int, int], properties: int | None) -> tuple[bytes, int | None]:
    """``buf`` without the section at ``span`` (start, end), and where the properties'
    value (at ``properties`` in ``buf``, or None) lies in what is left."""
    start, end = span
    if properties is not None and properties > start:
        properties -= end - start
    return buf[:start] + buf[end:], properties


_TTL = 2  # in the header's list
_ABSOLUTE_EXPIRY = _FIELD_INDEX["absolute_expiry_time"]


def _list_field(buf: bytes, pos: int, index: int) -> Any:
    """Field ``index`` of the list (a header or properties section's value) at ``pos``:
    its value, or None when the list is shorter."""
    code = buf[pos]
    if code == 0xC0:
        count, pos = buf[pos + 2], pos + 3
    elif code == 0x45:
        return None
    elif code == 0xD0:
        count, pos = _U32.unpack_from(buf, pos + 5)[0], pos + 9
    else:
        raise MalformedMessage(f"a section that must be a list is not one (code 0x{code:02x})")
    if index >= count:
        return None
    for _ in range(index):
        pos = pos + 1 if buf[pos] == 0x40 else skip(buf, pos)  # nulls, the usual case, in one step
    skip(buf, pos)  # the value must lie inside the buffer
    return decode_scalar(buf, pos)


_GROUP_ID = _FIELD_INDEX["group_id"]


def identity(buf: bytes, properties: int | None = -1) -> tuple[Any, Any]:
    """The properties' ``message-id`` and ``group-id`` in one pass (the event log records
    both; each read alone walks the sections again). ``properties``: where the properties
    section's value starts, if known (:func:`expiry_and_properties`; None: it has none)."""
    try:
        pos = _find_section(buf, _PROPERTIES) if properties == -1 else properties
        if pos is None:
            return None, None
        code = buf[pos]
        if code == 0xC0:
            count, pos = buf[pos + 2], pos + 3
        elif code == 0x45:
            return None, None
        elif code == 0xD0:
            count, pos = _U32.unpack_from(buf, pos + 5)[0], pos + 9
        else:
            raise MalformedMessage("the properties section is not a list")
        if count == 0:
            return None, None
        after = skip(buf, pos)  # the value must lie inside the buffer
        message_id = decode_scalar(buf, pos)
        if count <= _GROUP_ID:
            return message_id, None
        pos = after
        for _ in range(_GROUP_ID - 1):
            pos = pos + 1 if buf[pos] == 0x40 else skip(buf, pos)  # nulls, the usual case, in one step
        skip(buf, pos)
        return message_id, decode_scalar(buf, pos)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"malformed message encoding: {exc}") from exc


def _read_header(buf: bytes) -> tuple[list[Any], int] | None:
    """:func:`_header`, with a broken encoding raised as MalformedMessage."""
    try:
        return _header(buf)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"malformed message encoding: {exc}") from exc


def redelivered(buf: bytes, failed_attempts: int) -> bytes:
    """The message as it goes out again: ``delivery-count`` raised by ``failed_attempts``
    and ``first-acquirer`` false (AMQP 1.0 3.2.1). Unchanged bytes when neither changes."""
    header = _read_header(buf)
    empty: list[Any] = [None] * _HEADER_FIELD_COUNT
    fields, rest = header if header is not None else (empty, 0)
    if not failed_attempts and fields[3] is not True:
        return buf
    fields[3] = False
    fields[4] = _count(fields[4]) + failed_attempts
    return _encode_header(fields) + buf[rest:]


def header_ttl(buf: bytes) -> int | None:
    """The header's ``ttl`` in milliseconds, or None when it has none."""
    header = _read_header(buf)
    ttl = header[0][_TTL] if header is not None else None
    return _millis(ttl)


def aged(buf: bytes, received: float, now: float) -> bytes | None:
    """The message as it goes on at ``now`` after waiting here since ``received``: its
    header's ``ttl`` lowered by the wait (AMQP 1.0 3.2.1: the ttl a message carries is what
    it has left), or None once it has expired (by its ttl or its absolute-expiry-time).
    Unchanged bytes when it carries no ttl."""
    expires, _properties = expiry_and_properties(buf, received)
    if expires is None:
        return buf
    if expires <= now:
        return None
    header = _read_header(buf)
    waited = int((now - received) * 1000)
    if header is None or waited <= 0:
        return buf
    fields, rest = header
    ttl = fields[_TTL]
    if _millis(ttl) is None:
        return buf  # it expires by its absolute-expiry-time, which waiting does not change
    fields[_TTL] = max(1, ttl - waited)
    fields[4] = _count(fields[4])  # its default, 0, written out
    return _encode_header(fields) + buf[rest:]


def _encode_header(fields: list[Any]) -> bytes:
    durable, priority, ttl, first_acquirer, delivery_count = fields
    parts = [
        _encode_bool(durable),
        b"\x40" if (level := _priority(priority)) is None else b"\x50" + bytes((level,)),
        # As it was read (_millis): a boolean is none, and a ulong past 2^32 - 1 ms keeps
        # the most a uint says (masked, 49.7 days came out 5 s).
        b"\x40" if (millis := _millis(ttl)) is None else b"\x70" + _U32.pack(min(millis, 0xFFFFFFFF)),
        _encode_bool(first_acquirer),
        b"\x70" + _U32.pack(min(delivery_count, 0xFFFFFFFF)),
    ]
    body = b"".join(parts)
    return b"\x00\x53\x70\xc0" + bytes((len(body) + 1, _HEADER_FIELD_COUNT)) + body


def _encode_bool(value: Any) -> bytes:
    if value is None:
        return b"\x40"
    return b"\x41" if value else b"\x42"


# --- what a JMS selector reads ------------------------------------------------------------------


def selector_fields(buf: bytes, arrived: float | None = None) -> dict[str, Any]:
    """Every scalar application property by name, plus the JMS header identifiers a selector
    may use, from the AMQP fields the AMQP JMS mapping puts them in. ``arrived``: when the
    message arrived (seconds since the epoch), if its header's ttl counts (standalone)."""
    try:
        fields = _application_properties(buf)
        header = _header(buf)
        properties = {name: properties_field(buf, name) for name in _SELECTOR_PROPERTIES}
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"malformed message encoding: {exc}") from exc
    durable = header[0][0] if header is not None else None
    priority = header[0][1] if header is not None else None
    ttl = header[0][_TTL] if header is not None else None
    delivery_count = header[0][4] if header is not None else None
    fields["JMSDeliveryMode"] = "PERSISTENT" if durable else "NON_PERSISTENT"
    level = _priority(priority)
    fields["JMSPriority"] = level if level is not None else 4
    # As a JMS client reads the header it receives (qpid-jms: redelivered when the
    # delivery-count is above 0); a redelivery's raised count is added by the queue.
    count = _count(delivery_count)
    fields["JMSRedelivered"] = count > 0
    fields["JMSXDeliveryCount"] = count + 1
    jms_names = {
        "message_id": "JMSMessageID",
        "correlation_id": "JMSCorrelationID",
        "subject": "JMSType",
        "creation_time": "JMSTimestamp",
        "absolute_expiry_time": "JMSExpiration",
        "group_id": "JMSXGroupID",
        "group_sequence": "JMSXGroupSeq",
    }
    for name, jms_name in jms_names.items():
        value = properties[name]
        if value is not None:
            fields[jms_name] = value
    # Ids as a JMS client shows them (getJMSMessageID): a selector written from what the
    # client printed matches. A str() of the AMQP value gave Python's "b'...'" for binary.
    for name, jms_name, correlation in (
        ("message_id", "JMSMessageID", False),
        ("correlation_id", "JMSCorrelationID", True),
    ):
        shown = jms_id(properties[name], correlation)
        if shown is None:
            fields.pop(jms_name, None)
        else:
            fields[jms_name] = shown
    # JMS: 0 for a message without a timestamp, and for one that does not expire. A ttl
    # counts from the arrival, in whole milliseconds (through float seconds, an
    # absolute-expiry-time after 2038 came out a millisecond early).
    fields.setdefault("JMSTimestamp", 0)
    if arrived is not None and (millis := _millis(ttl)) is not None:
        by_ttl = round(arrived * 1000) + millis
        absolute = _millis(fields.get("JMSExpiration"))
        fields["JMSExpiration"] = min(by_ttl, absolute) if absolute is not None else by_ttl
    fields.setdefault("JMSExpiration", 0)
    user = properties["user_id"]
    if isinstance(user, bytes):
        fields["JMSXUserID"] = user.decode("utf-8", "replace")
    return fields


# The type prefixes qpid-jms writes after "ID:" for ids that are not plain strings.
_ID_TYPE_PREFIXES = ("AMQP_NO_PREFIX:", "AMQP_UUID:", "AMQP_ULONG:", "AMQP_BINARY:", "AMQP_STRING:")


def jms_id(value: Any, correlation: bool = False) -> str | None:
    """A message-id (or, ``correlation``, a correlation-id) as qpid-jms shows it to a JMS
    application (JMS 2.0 3.4.3: a JMSMessageID starts with "ID:"): a string that has "ID:"
    as it is (one that then looks like a type prefix escaped as AMQP_STRING), else with
    "ID:AMQP_NO_PREFIX:" (a correlation-id string as it is: applications set their own);
    a uuid, ulong or binary with its type prefix, binary in upper-case hex."""
    if isinstance(value, str):
        if value.startswith("ID:"):
            rest = value[3:]
            return "ID:AMQP_STRING:" + rest if rest.startswith(_ID_TYPE_PREFIXES) else value
        return value if correlation else "ID:AMQP_NO_PREFIX:" + value
    if isinstance(value, uuid.UUID):
        return f"ID:AMQP_UUID:{value}"
    if isinstance(value, bytes):
        return "ID:AMQP_BINARY:" + value.hex().upper()
    if isinstance(value, int) and not isinstance(value, bool):
        return f"ID:AMQP_ULONG:{value}"
    return None


_SELECTOR_PROPERTIES = (
    "message_id",
    "user_id",
    "subject",
    "correlation_id",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
)


def _application_properties(buf: bytes) -> dict[str, Any]:
    pos = _find_section(buf, _APPLICATION_PROPERTIES)
    if pos is None:
        return {}
    code = buf[pos]
    if code not in (0xC1, 0xD1):
        raise MalformedMessage("the application-properties section is not a map")
    _width, count, pos = _size_and_count(buf, pos + 1, code)
    found: dict[str, Any] = {}
    for _ in range(count // 2):
        key = decode_scalar(buf, pos)
        value_pos = skip(buf, pos)
        pos = skip(buf, value_pos)
        if isinstance(key, str):
            value = decode_scalar(buf, value_pos)
            if value is not None:
                found[key] = value
    return found
