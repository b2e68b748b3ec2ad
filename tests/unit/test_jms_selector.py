"""JMS message selectors (qpid_flow.core.jms_selector): JMS 2.0 section 3.8.1's examples, SQL's
three-valued logic, the type rules, errors that name their column, and random input that
may only ever raise SelectorError."""

from __future__ import annotations

import random
import re
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from qpid_flow.core.jms_selector import (
    JMS_HEADER_IDENTIFIERS,
    MAX_DEPTH,
    MAX_SELECTOR_LENGTH,
    SELECTOR_FILTER_CODE,
    SELECTOR_FILTER_NAME,
    Selector,
    SelectorError,
    parse_selector,
)


def truth(selector: str, fields: Mapping[str, Any] | None = None) -> bool | None:
    """The selector's three-valued result: True, False, or None for unknown. A message
    matches ``s`` when ``s`` is TRUE and matches ``NOT (s)`` when ``s`` is FALSE."""
    fields = fields or {}
    if parse_selector(selector).matches(fields):
        assert not parse_selector(f"NOT ({selector})").matches(fields)
        return True
    if parse_selector(f"NOT ({selector})").matches(fields):
        return False
    return None


def error(selector: str) -> SelectorError:
    with pytest.raises(SelectorError) as caught:
        parse_selector(selector)
    return caught.value


# --- the specification's examples ---------------------------------------------------------


def test_filter_identity() -> None:
    assert SELECTOR_FILTER_NAME == "apache.org:selector-filter:string"
    assert SELECTOR_FILTER_CODE == 0x0000468C00000004
    assert {"JMSMessageID", "JMSCorrelationID", "JMSPriority", "JMSDeliveryMode", "JMSTimestamp", "JMSType"} <= (
        JMS_HEADER_IDENTIFIERS
    )


def test_car_example() -> None:
    s = parse_selector("JMSType = 'car' AND color = 'blue' AND weight > 2500")
    assert s.text == "JMSType = 'car' AND color = 'blue' AND weight > 2500"
    assert s.identifiers == {"JMSType", "color", "weight"}
    assert s.matches({"JMSType": "car", "color": "blue", "weight": 3000})
    assert s.matches({"JMSType": "car", "color": "blue", "weight": 2500.5})
    assert not s.matches({"JMSType": "car", "color": "blue", "weight": 2500})
    assert not s.matches({"JMSType": "car", "color": "red", "weight": 3000})
    assert not s.matches({"JMSType": "truck", "color": "blue", "weight": 3000})
    assert not s.matches({"color": "blue", "weight": 3000})  # JMSType NULL
    assert not s.matches({})


@pytest.mark.parametrize(
    ("age", "between", "not_between"),
    [
        (14, False, True),
        (15, True, False),
        (17, True, False),
        (19, True, False),
        (20, False, True),
        (19.5, False, True),
    ],
)
def test_between(age: Any, between: bool, not_between: bool) -> None:
    assert truth("age BETWEEN 15 AND 19", {"age": age}) is between
    assert truth("age NOT BETWEEN 15 AND 19", {"age": age}) is not_between


def test_between_with_null() -> None:
    assert truth("age BETWEEN 15 AND 19", {}) is None
    assert truth("age NOT BETWEEN 15 AND 19", {}) is None
    # x BETWEEN a AND b is x >= a AND x <= b; NOT BETWEEN is x < a OR x > b.
    assert truth("age BETWEEN lo AND hi", {"age": 16, "hi": 19}) is None
    assert truth("age BETWEEN lo AND hi", {"age": 25, "lo": 15}) is None
    assert truth("age BETWEEN lo AND hi", {"age": 10, "hi": 19}) is None
    assert truth("age BETWEEN lo AND hi", {"age": 25, "hi": 19}) is False  # NULL AND FALSE
    assert truth("age BETWEEN lo AND hi", {"age": 10, "lo": 15}) is False
    assert truth("age NOT BETWEEN lo AND hi", {"age": 25, "lo": 15}) is None
    assert truth("age NOT BETWEEN lo AND hi", {"age": 10, "hi": 19}) is None
    assert truth("age NOT BETWEEN lo AND hi", {"age": 25, "hi": 19}) is True
    assert truth("age BETWEEN lo AND hi", {"age": 16, "lo": 15, "hi": 19}) is True
    assert truth("age BETWEEN 10 + 5 AND 20 - 1", {"age": 19}) is True


def test_between_types() -> None:
    assert truth("age BETWEEN 15 AND 19", {"age": "16"}) is False
    assert truth("age NOT BETWEEN 15 AND 19", {"age": "16"}) is False
    assert truth("age BETWEEN 15 AND 19", {"age": True}) is False
    assert truth("age BETWEEN 15 AND 19", {"age": b"16"}) is None


@pytest.mark.parametrize(
    ("country", "in_", "not_in"),
    [(" UK", True, False), ("US", True, False), ("France", True, False), ("UK", False, True), ("Peru", False, True)],
)
def test_in(country: str, in_: bool, not_in: bool) -> None:
    assert truth("Country IN (' UK', 'US', 'France')", {"Country": country}) is in_
    assert truth("Country NOT IN (' UK', 'US', 'France')", {"Country": country}) is not_in


def test_in_with_null_and_other_types() -> None:
    assert truth("Country IN ('UK')", {}) is None
    assert truth("Country NOT IN ('UK')", {}) is None
    assert truth("Country IN ('1')", {"Country": 1}) is False
    assert truth("Country NOT IN ('1')", {"Country": 1}) is False
    assert truth("Country IN ('1')", {"Country": b"1"}) is None


@pytest.mark.parametrize(
    ("selector", "value", "expected"),
    [
        ("phone LIKE '12%3'", "123", True),
        ("phone LIKE '12%3'", "12993", True),
        ("phone LIKE '12%3'", "1234", False),
        ("phone NOT LIKE '12%3'", "1234", True),
        ("phone NOT LIKE '12%3'", "123", False),
        ("word LIKE 'l_se'", "lose", True),
        ("word LIKE 'l_se'", "loose", False),
        ("word NOT LIKE 'l_se'", "loose", True),
        ("underscored LIKE '\\_%' ESCAPE '\\'", "_foo", True),
        ("underscored LIKE '\\_%' ESCAPE '\\'", "bar", False),
        ("underscored NOT LIKE '\\_%' ESCAPE '\\'", "bar", True),
    ],
)
def test_like_examples(selector: str, value: str, expected: bool) -> None:
    field = selector.split()[0]
    assert truth(selector, {field: value}) is expected


def test_like_null_and_other_types() -> None:
    assert truth("phone LIKE '12%3'", {}) is None
    assert truth("phone NOT LIKE '12%3'", {}) is None
    assert truth("phone LIKE '12%3'", {"phone": 123}) is False
    assert truth("phone NOT LIKE '12%3'", {"phone": 123}) is False
    assert truth("phone LIKE '12%3'", {"phone": b"123"}) is None


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("%", ["", "x", "anything\n"], []),
        ("%%", ["", "abc"], []),
        ("", [""], ["a"]),
        ("abc", ["abc"], ["abcd", "ab", "ABC"]),
        ("abc%", ["abc", "abcdef"], ["xabc"]),
        ("%abc", ["abc", "xxabc"], ["abcx"]),
        ("%abc%", ["abc", "xabcx"], ["ab c"]),
        ("a%b%c", ["abc", "a-b-c", "abbbc", "acbc"], ["ab", "acb", "a-c"]),
        ("_", ["a", "%", "\n"], ["", "ab"]),
        ("a_c%", ["abc", "abcd"], ["ac", "bbc"]),
        ("%_b_%", ["xbx", "abc", "aaxbxaa"], ["bx", "xb", "b"]),
        ("a.c", ["a.c"], ["abc"]),
        ("[a]*(", ["[a]*("], ["a"]),
        ("line%", ["line\nnext"], []),
        ("%é_", ["café!", "é€"], ["cafe!"]),
        ("a''b", ["a'b"], ["ab"]),
    ],
)
def test_like_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    s = parse_selector(f"v LIKE '{pattern}'")
    for value in yes:
        assert s.matches({"v": value}), (pattern, value)
    for value in no:
        assert not s.matches({"v": value}), (pattern, value)


def test_like_escape() -> None:
    assert truth("v LIKE '100!%' ESCAPE '!'", {"v": "100%"}) is True
    assert truth("v LIKE '100!%' ESCAPE '!'", {"v": "1000"}) is False
    assert truth("v LIKE '!!%' ESCAPE '!'", {"v": "!x"}) is True
    assert truth("v LIKE 'a!b' ESCAPE '!'", {"v": "ab"}) is True  # an escaped ordinary character is itself
    assert truth("v LIKE '%%' ESCAPE '%'", {"v": "%"}) is True
    assert truth("v LIKE '%%' ESCAPE '%'", {"v": "x"}) is False
    assert truth("v LIKE '\\%%' ESCAPE '\\'", {"v": "%abc"}) is True
    assert truth("v LIKE '\\%%' ESCAPE '\\'", {"v": "abc"}) is False
    assert truth("v LIKE '\\%'", {"v": "\\anything"}) is True  # without ESCAPE, a backslash is plain


def reference_like(pattern: str, escape: str | None) -> re.Pattern[str]:
    out = []
    chars = iter(pattern)
    for ch in chars:
        if ch == escape:
            out.append(re.escape(next(chars)))
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def test_like_agrees_with_a_regex_on_random_patterns() -> None:
    rng = random.Random(1729)
    for _ in range(3000):
        pattern = "".join(rng.choice("ab%_!") for _ in range(rng.randint(0, 7)))
        escaped = pattern.count("!") and rng.random() < 0.7
        selector = f"v LIKE '{pattern}'" + (" ESCAPE '!'" if escaped else "")
        if escaped and re.search(r"(^|[^!])(!!)*!$", pattern):
            with pytest.raises(SelectorError, match="escape"):
                parse_selector(selector)
            continue
        s = parse_selector(selector)
        reference = reference_like(pattern, "!" if escaped else None)
        for _ in range(10):
            value = "".join(rng.choice("ab!%_") for _ in range(rng.randint(0, 8)))
            assert s.matches({"v": value}) == (reference.fullmatch(value) is not None), (selector, value)


def test_like_is_linear_on_a_pathological_pattern() -> None:
    s = parse_selector("v LIKE '%a%a%a%a%a%a%a%a%a%a%a%a%b'")
    value = "a" * 20_000
    # A backtracking matcher would take hours here; the segment matcher answers at once.
    assert not s.matches({"v": value})
    assert s.matches({"v": value + "b"})
    s = parse_selector("v LIKE '%a_a%a_a%a_a%b'")
    assert not s.matches({"v": value})


def test_is_null() -> None:
    assert truth("prop_name IS NULL", {}) is True
    assert truth("prop_name IS NULL", {"prop_name": None}) is True
    assert truth("prop_name IS NULL", {"prop_name": 0}) is False
    assert truth("prop_name IS NULL", {"prop_name": ""}) is False
    assert truth("prop_name IS NOT NULL", {}) is False
    assert truth("prop_name IS NOT NULL", {"prop_name": False}) is True
    assert truth("(a + 1) IS NULL", {"a": "x"}) is True
    assert truth("(a + 1) IS NULL", {"a": 1}) is False
    assert truth("(a = 1) IS NULL", {}) is True
    assert truth("(a = 1) is not null", {"a": 2}) is True


# --- three-valued logic -----------------------------------------------------------------

VALUES: list[bool | None] = [True, False, None]


def fields_for(**values: bool | None) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


def sql_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def sql_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


@pytest.mark.parametrize("a", VALUES)
@pytest.mark.parametrize("b", VALUES)
def test_and_or_truth_tables(a: bool | None, b: bool | None) -> None:
    fields = fields_for(a=a, b=b)
    assert truth("a AND b", fields) is sql_and(a, b)
    assert truth("a OR b", fields) is sql_or(a, b)
    # The same through comparisons, NULL coming from a missing property.
    numbers = {name: 1 if value else 0 for name, value in (("x", a), ("y", b)) if value is not None}
    assert truth("x = 1 AND y = 1", numbers) is sql_and(a, b)
    assert truth("x = 1 OR y = 1", numbers) is sql_or(a, b)


@pytest.mark.parametrize("a", VALUES)
def test_not_truth_table(a: bool | None) -> None:
    assert truth("NOT a", fields_for(a=a)) is (None if a is None else not a)
    assert truth("NOT NOT a", fields_for(a=a)) is a
    assert truth("NOT NOT NOT a", fields_for(a=a)) is (None if a is None else not a)


@pytest.mark.parametrize("values", [(a, b, c) for a in VALUES for b in VALUES for c in VALUES])
def test_long_chains(values: tuple[bool | None, bool | None, bool | None]) -> None:
    a, b, c = values
    fields = fields_for(a=a, b=b, c=c)
    assert truth("a AND b AND c", fields) is sql_and(sql_and(a, b), c)
    assert truth("a OR b OR c", fields) is sql_or(sql_or(a, b), c)
    assert truth("a OR b AND c", fields) is sql_or(a, sql_and(b, c))  # AND binds tighter
    assert truth("(a OR b) AND c", fields) is sql_and(sql_or(a, b), c)
    assert truth("NOT a AND b", fields) is sql_and(None if a is None else not a, b)


def test_identifier_as_condition() -> None:
    assert truth("flag", {"flag": True}) is True
    assert truth("flag", {"flag": False}) is False
    assert truth("flag", {}) is None
    assert truth("flag", {"flag": "true"}) is None  # only booleans are conditions
    assert truth("flag", {"flag": 1}) is None
    assert truth("TRUE", {}) is True
    assert truth("false", {}) is False
    assert truth("flag = TRUE", {"flag": True}) is True
    assert truth("flag <> false", {"flag": True}) is True
    assert truth("(a > 1) = (b > 1)", {"a": 2, "b": 3}) is True
    assert truth("(a > 1) = (b > 1)", {"a": 2, "b": 0}) is False
    assert truth("(a > 1) = (b > 1)", {"a": 2}) is None


def test_empty_selector_matches_everything() -> None:
    for text in ("", "   ", "\t\n"):
        s = parse_selector(text)
        assert s.matches({}) and s.matches({"a": 1})
        assert s.identifiers == frozenset()


# --- literals, identifiers, keywords ---------------------------------------------------


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("57", 57),
        ("-957", -957),
        ("+62", 62),
        ("57L", 57),
        ("9223372036854775807", 9223372036854775807),
        ("-9223372036854775808", -9223372036854775808),
        ("0", 0),
        ("0x1F", 31),
        ("0XfFL", 255),
        ("017", 15),
        ("00", 0),
        ("7E3", 7000.0),
        ("-57.9E2", -5790.0),
        ("7.", 7.0),
        ("-95.7", -95.7),
        ("+6.2", 6.2),
        (".5", 0.5),
        ("1.5e-3", 0.0015),
        ("2E+2", 200.0),
        ("09.5", 9.5),
    ],
)
def test_numeric_literals(literal: str, value: int | float) -> None:
    assert truth(f"x = {literal}", {"x": value}) is True
    assert truth(f"{literal} = x", {"x": value}) is True
    assert truth(f"x <> {literal}", {"x": value}) is False


@pytest.mark.parametrize(
    ("literal", "value"),
    [("'abc'", "abc"), ("''", ""), ("'it''s'", "it's"), ("''''", "'"), ("'a\nb'", "a\nb"), ("'ü→🙂'", "ü→🙂")],
)
def test_string_literals(literal: str, value: str) -> None:
    assert truth(f"x = {literal}", {"x": value}) is True
    assert truth(f"x = {literal}", {"x": value + "?"}) is False


def test_boolean_literals_are_case_insensitive() -> None:
    for text in ("TRUE", "true", "True", "tRuE"):
        assert truth(f"x = {text}", {"x": True}) is True
    for text in ("FALSE", "false", "False"):
        assert truth(f"x = {text}", {"x": False}) is True


def test_keywords_are_case_insensitive() -> None:
    fields = {"a": 16, "b": "xyz", "c": None}
    assert truth("a between 15 and 19 and b like 'x%' and c is null", fields) is True
    assert truth("a Not Between 15 And 19 Or b Not In ('xyz') oR NOT c iS nUlL", fields) is False
    assert truth("b like 'x\\%' escape '\\'", {"b": "x%"}) is True


def test_identifiers() -> None:
    fields = {"$x": 1, "_y": 2, "a1": 3, "JMSType": "t", "jmstype": "u", "amqp.priority": 4, "été": 5, "my-prop": 6}
    assert truth("$x = 1 AND _y = 2 AND a1 = 3", fields) is True
    assert truth("JMSType = 't' AND jmstype = 'u'", fields) is True  # identifiers are case-sensitive
    assert truth("amqp.priority = 4", fields) is True
    assert truth("été = 5", fields) is True
    assert truth('"my-prop" = 6', fields) is True
    assert truth('"AND" = 1', {"AND": 1}) is True  # a quoted identifier may be a keyword
    assert truth('"a""b" = 1', {'a"b': 1}) is True
    s = parse_selector("a = 1 OR b > c AND d IS NULL OR e LIKE 'x' OR f IN ('y') OR g BETWEEN h AND i")
    assert s.identifiers == set("abcdefghi")


@pytest.mark.parametrize(
    "keyword", ["NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"]
)
def test_keywords_are_not_identifiers(keyword: str) -> None:
    for spelling in (keyword, keyword.lower()):
        if spelling.upper() in ("TRUE", "FALSE"):
            with pytest.raises(SelectorError):
                parse_selector(f"{spelling} = 'x'")  # a boolean literal, not an identifier
        else:
            with pytest.raises(SelectorError):
                parse_selector(f"{spelling} = 1")


def test_selector_object() -> None:
    s = Selector("a = 1")
    assert s == parse_selector("a = 1") and hash(s) == hash(parse_selector("a = 1"))
    assert s != parse_selector("a = 2")
    assert repr(s) == "Selector('a = 1')"
    assert isinstance(SelectorError("x", 1), ValueError)


# --- types -------------------------------------------------------------------------------


def test_unlike_types_compare_false() -> None:
    assert truth("x = 5", {"x": "5"}) is False
    assert truth("x <> 5", {"x": "5"}) is False
    assert truth("NOT (x = 5)", {"x": "5"}) is True
    assert truth("x > 5", {"x": "6"}) is False
    assert truth("x = 'red'", {"x": 5}) is False
    assert truth("x <> 'red'", {"x": 5}) is False
    assert truth("x = TRUE", {"x": "true"}) is False
    assert truth("x = a", {"x": "5", "a": 5}) is False


def test_booleans_are_not_numbers() -> None:
    assert truth("x = 1", {"x": True}) is False
    assert truth("x <> 1", {"x": True}) is False
    assert truth("x = 0", {"x": False}) is False
    assert truth("x > 0", {"x": True}) is False
    assert truth("x + 1 = 2", {"x": True}) is None  # arithmetic on a boolean is NULL
    assert truth("x = TRUE", {"x": 1}) is False
    assert truth("x = y", {"x": True, "y": 1}) is False


def test_strings_and_booleans_only_compare_for_equality() -> None:
    assert truth("a < b", {"a": "a", "b": "b"}) is False
    assert truth("a >= b", {"a": "b", "b": "a"}) is False
    assert truth("a = b", {"a": "x", "b": "x"}) is True
    assert truth("a <> b", {"a": "x", "b": "y"}) is True
    assert truth("a > b", {"a": True, "b": False}) is False
    assert truth("a = b", {"a": True, "b": True}) is True


def test_numbers_compare_by_value() -> None:
    assert truth("x = 1", {"x": 1.0}) is True
    assert truth("x = 1.0", {"x": 1}) is True
    assert truth("x < 2.5", {"x": 2}) is True
    assert truth("x >= 2", {"x": 2}) is True
    assert truth("x <= 1.999", {"x": 2}) is False
    assert truth("x = 9007199254740993", {"x": 9007199254740993}) is True
    assert truth("x = 9007199254740992.0", {"x": 9007199254740993}) is False  # exact, not via double
    assert truth("x = y", {"x": float("nan"), "y": float("nan")}) is False
    assert truth("x <> y", {"x": float("nan"), "y": float("nan")}) is True
    assert truth("x < 1", {"x": float("-inf")}) is True


class Symbol(str):
    """Like Proton's ``symbol``."""


class ULong(int):
    """Like Proton's ``ulong``."""


class Float32(float):
    """Like Proton's ``float32``."""


def test_subclasses_of_the_basic_types() -> None:
    assert truth("x = 'abc'", {"x": Symbol("abc")}) is True
    assert truth("x LIKE 'a%'", {"x": Symbol("abc")}) is True
    assert truth("x IN ('abc')", {"x": Symbol("abc")}) is True
    assert truth("x > 9223372036854775807", {"x": ULong(18446744073709551615)}) is True
    assert truth("x > 1", {"x": ULong(2)}) is True
    assert truth("x * 2 = 4", {"x": ULong(2)}) is True
    assert truth("x BETWEEN 0 AND 1", {"x": Float32(0.5)}) is True
    assert truth("x = 'abc'", {"x": 5}) is False


def test_other_values_are_not_comparable() -> None:
    u = uuid.UUID(int=7)
    for value in (b"abc", u, [1], {"a": 1}, object(), 1 + 2j):
        fields = {"x": value}
        assert truth("x = 'abc'", fields) is None
        assert truth("x <> 'abc'", fields) is None
        assert truth("x = 1", fields) is None
        assert truth("x > 1", fields) is None
        assert truth("x = TRUE", fields) is None
        assert truth("x LIKE 'a%'", fields) is None
        assert truth("x IN ('abc')", fields) is None
        assert truth("x BETWEEN 1 AND 2", fields) is None
        assert truth("x + 1 IS NULL", fields) is True
        assert truth("x IS NOT NULL", fields) is True
    # Equality between two values of the same type.
    assert truth("x = y", {"x": u, "y": uuid.UUID(int=7)}) is True
    assert truth("x <> y", {"x": u, "y": uuid.UUID(int=8)}) is True
    assert truth("x = y", {"x": b"a", "y": b"a"}) is True
    assert truth("x = y", {"x": b"a", "y": "a"}) is None
    assert truth("x < y", {"x": b"a", "y": b"b"}) is None


class Angry:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no")

    __hash__ = object.__hash__


def test_a_value_whose_equality_raises_is_unknown() -> None:
    assert truth("x = y", {"x": Angry(), "y": Angry()}) is None
    assert truth("x <> y", {"x": Angry(), "y": Angry()}) is None


# --- arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2", 3),
        ("7 - 10", -3),
        ("6 * 7", 42),
        ("7 / 2", 3),  # integer division
        ("-7 / 2", -3),  # truncates toward zero, as Java
        ("7 / -2", -3),
        ("7.0 / 2", 3.5),
        ("7 / 2.0", 3.5),
        ("7 % 3", 1),
        ("-7 % 3", -1),
        ("7.5 % 2", 1.5),
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("2 * 3 - 4 / 2", 4),
        ("10 - 2 - 3", 5),  # left to right
        ("100 / 10 / 5", 2),
        ("- -3", 3),
        ("-(-3)", 3),
        ("- + - 3", 3),
        ("-3 * -3", 9),
        ("9223372036854775807 + 1", -9223372036854775808),  # Java's long wraps
        ("-9223372036854775808 - 1", 9223372036854775807),
        ("-9223372036854775808 / -1", -9223372036854775808),
        ("4611686018427387904 * 4", 0),
    ],
)
def test_arithmetic(expression: str, value: int | float) -> None:
    assert truth(f"{expression} = x", {"x": value}) is True  # folded when parsed
    assert truth(f"{expression} <> x", {"x": value}) is False
    # The same with every number a property: evaluated for each message.
    fields: dict[str, Any] = {"x": value}

    def field(number: re.Match[str]) -> str:
        name = f"n{len(fields)}"
        fields[name] = float(number[0]) if "." in number[0] else int(number[0])
        return name

    per_message = re.sub(r"\d+(\.\d*)?", field, expression)
    assert len(fields) > 1
    assert truth(f"x = {per_message}", fields) is True, per_message


def test_arithmetic_with_identifiers() -> None:
    fields = {"price": 10, "qty": 3, "rate": 0.5, "name": "x"}
    assert truth("price * qty > 25", fields) is True
    assert truth("price * rate = 5", fields) is True
    assert truth("price * qty * rate + 1 = 16", fields) is True
    assert truth("-price < 0", fields) is True
    assert truth("+price = 10", fields) is True
    assert truth("price + name > 1", fields) is None  # arithmetic on a string is NULL
    assert truth("-name = 1", fields) is None
    assert truth("+name IS NULL", fields) is True
    assert truth("price + missing > 1", fields) is None
    assert truth("price + missing IS NULL", fields) is True


def test_division_by_zero_is_unknown() -> None:
    assert truth("x / 0 > 1", {"x": 5}) is None
    assert truth("x / 0.0 > 1", {"x": 5}) is None
    assert truth("x / y > 1", {"x": 5.0, "y": 0}) is None
    assert truth("x % y > 1", {"x": 5, "y": 0}) is None
    assert truth("x = 1 / 0", {"x": 5}) is None
    assert truth("1 / 0 IS NULL") is True
    assert truth("x / 0 IS NULL", {"x": 1}) is True
    assert truth("x BETWEEN 1 / 0 AND 10", {"x": 5}) is None


def test_huge_values_from_fields() -> None:
    assert truth("x * 1.5 > 0", {"x": 10**400}) is None  # too big for a double: NULL, no error
    assert truth("x > 0", {"x": 10**400}) is True
    assert truth("x % 1.5 = 0", {"x": float("inf")}) is None


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "column", "reason"),
    [
        ("color = ", 9, "expected an expression, found the end"),
        ("color = 'red", 9, "unterminated string"),
        ('"color = 1', 1, "unterminated quoted identifier"),
        ("a = 1 AND", 10, "expected an expression"),
        ("a # 1", 3, "unexpected character '#'"),
        ("a > 'x'", 5, "'>' needs numbers"),
        ("'x' <= a", 1, "'<=' needs numbers"),
        ("TRUE > a", 1, "'>' needs numbers"),
        ("(a = 1", 7, "expected ')'"),
        ("a = 1)", 6, "unexpected ')'"),
        ("a LIKE 'x' ESCAPE 'ab'", 19, "exactly one character"),
        ("a LIKE 'x' ESCAPE ''", 19, "exactly one character"),
        ("a LIKE 'x!' ESCAPE '!'", 8, "ends with its escape"),
        ("a LIKE b", 8, "string literal after LIKE"),
        ("AND = 1", 1, "keyword AND"),
        ("a BETWEEN 1 OR 2", 13, "expected AND in BETWEEN"),
        ("a BETWEEN 'x' AND 2", 11, "BETWEEN needs a number"),
        ("a IS 5", 6, "expected NULL after IS"),
        ("a IS NOT 5", 10, "expected NULL after IS NOT"),
        ("a NOT = 1", 3, "unexpected 'NOT'"),
        ("1 + 2", 1, "needs a condition, not a numeric"),
        ("'abc'", 1, "needs a condition, not a string"),
        ("a = 1 b = 2", 7, "unexpected 'b'"),
        ("a = 1 = 2", 7, "unexpected '='"),
        ("0x = a", 1, "hexadecimal"),
        ("09 = a", 1, "octal"),
        ("1e999 > a", 1, "out of range"),
        ("9223372036854775809 > a", 1, "out of range"),
        ("0x8000000000000001 > a", 1, "out of range"),
        ("1" * 30 + " > a", 1, "out of range"),
        ("12abc = 1", 1, "malformed number"),
        ("1.2.3 = a", 1, "malformed number"),
        ('"" = a', 1, "empty quoted identifier"),
        ("a IN (1, 2)", 7, "string literal in the IN list"),
        ("a IN ()", 7, "string literal in the IN list"),
        ("a IN ('x'", 10, "expected ')' to close the IN list"),
        ("a IN 'x'", 6, "expected '(' after IN"),
        ("5 IN ('x')", 1, "IN needs a string"),
        ("5 LIKE 'x'", 1, "LIKE needs a string"),
        ("(a > 1) LIKE 'x'", 2, "LIKE needs a string"),
        ("'a' = 1", 5, "'=' compares a string expression with a numeric one"),
        ("TRUE = 'x'", 6, "compares a boolean"),
        ("(a = 1) = 2", 9, "compares a boolean"),
        ("NOT 5", 5, "NOT needs a condition"),
        ("a AND 5", 7, "AND needs a condition"),
        ("5 OR a", 1, "OR needs a condition"),
        ("a + 'x' > 1", 5, "'+' needs a number"),
        ("a * TRUE > 1", 5, "'*' needs a number"),
        ("-'x' = a", 2, "a sign needs a number"),
        ("x = NULL", 5, "NULL can only be tested with IS NULL"),
        ("NULL IS NULL", 1, "NULL can only be tested"),
        ("a = .", 5, "unexpected character '.'"),
        ("a == 1", 4, "expected an expression, found '='"),
        ("a != 1", 3, "unexpected character '!'"),
        ("()", 2, "expected an expression, found ')'"),
        ("a = 1 AND (b = 2 OR ) ", 21, "expected an expression, found ')'"),
    ],
)
def test_errors_name_the_column(selector: str, column: int, reason: str) -> None:
    caught = error(selector)
    assert caught.column == column, str(caught)
    assert reason in caught.reason, str(caught)
    assert str(caught).startswith(f"column {column}: ")


def test_not_a_string() -> None:
    assert "string" in error(b"a = 1").reason  # type: ignore[arg-type]
    assert "string" in error(None).reason  # type: ignore[arg-type]


# --- limits -----------------------------------------------------------------------------


def test_nesting_limit() -> None:
    ok = "(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH
    assert parse_selector(ok).matches({"a": 1})
    too_deep = "(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1)
    caught = error(too_deep)
    assert caught.column == MAX_DEPTH + 1 and "nested" in caught.reason
    caught = error("(" * 20_000)
    assert "nested" in caught.reason
    caught = error("a = " + "-(" * 10_000 + "1" + ")" * 10_000)
    assert "nested" in caught.reason
    nested_logic = "a = 1"
    for _ in range(MAX_DEPTH // 2):  # two parentheses a level
        nested_logic = f"NOT (b = 2 OR ({nested_logic}))"
    s = parse_selector(nested_logic)
    assert s.matches({"a": 1, "b": 0}) == (MAX_DEPTH // 2 % 2 == 0)
    assert not s.matches({"a": 1, "b": 2})
    assert not s.matches({"a": 1})  # b = 2 is unknown, and so is every level above the innermost


def test_parsing_from_a_deep_stack_refuses_rather_than_overflows() -> None:
    nested = "(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH
    outcomes: list[str] = []

    def descend(levels: int) -> None:
        if levels:
            descend(levels - 1)
            return
        try:
            parse_selector(nested)
            outcomes.append("parsed")
        except SelectorError as exc:
            outcomes.append(exc.reason)

    descend(sys.getrecursionlimit() - 150)
    assert outcomes == ["the selector is nested too deeply"]


def test_long_flat_chains_do_not_recurse() -> None:
    terms = 3_000
    s = parse_selector(" AND ".join(f"p{i} = {i}" for i in range(terms)))
    fields = {f"p{i}": i for i in range(terms)}
    assert s.matches(fields)
    fields[f"p{terms - 1}"] = 0
    assert not s.matches(fields)
    s = parse_selector(" OR ".join(f"p{i} = {i}" for i in range(terms)))
    assert s.matches({f"p{terms - 1}": terms - 1}) and not s.matches({})
    s = parse_selector("x + " + " + ".join(["1"] * terms) + f" = {terms}")
    assert s.matches({"x": 0})
    s = parse_selector("x * " + " * ".join(["one"] * terms) + " = 5")
    assert s.matches({"x": 5, "one": 1})
    s = parse_selector("NOT " * terms + "a")
    assert s.matches({"a": True})
    s = parse_selector("+-" * (terms // 2) + "a = 5")  # "--" would start a comment
    assert s.matches({"a": 5})
    s = parse_selector("- " * (terms + 1) + "a = -5")
    assert s.matches({"a": 5})


def test_length_limit() -> None:
    body = "a = 1 OR "
    text = body * ((MAX_SELECTOR_LENGTH - 5) // len(body)) + "a = 2"
    assert len(text) <= MAX_SELECTOR_LENGTH
    assert parse_selector(text).matches({"a": 2})
    caught = error("a = 1" + " " * MAX_SELECTOR_LENGTH)
    assert caught.column == MAX_SELECTOR_LENGTH + 1 and "longer than" in caught.reason
    assert parse_selector("v = '" + "x" * (MAX_SELECTOR_LENGTH - 7) + "'").matches(
        {"v": "x" * (MAX_SELECTOR_LENGTH - 7)}
    )
    caught = error("1" * MAX_SELECTOR_LENGTH)
    assert "out of range" in caught.reason
    assert parse_selector("1." + "1" * (MAX_SELECTOR_LENGTH - 10) + " > a").matches({"a": 1})
    assert "out of range" in error("1" * (MAX_SELECTOR_LENGTH - 10) + ".0 > a").reason
    assert parse_selector("a > 0." + "1" * 1000).matches({"a": 1})


# --- random input ------------------------------------------------------------------------

PIECES = [
    "a", "b", "x", "JMSType", "weight", "color", "$v", "p.q", '"q-r"', "1", "0", "2.5", "7E3", ".5", "0x1F", "017",
    "'red'", "''", "'it''s'", "'%_'", "TRUE", "FALSE", "NULL", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS",
    "ESCAPE", "=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "(", ")", ",", " ", " ", " ",
]  # fmt: skip
CHARS = "abxyz019.eExXlL$_'\"()=<>!+-*/%,#?\\ \t\n\x00é🙂"
VALID = [
    "JMSType = 'car' AND color = 'blue' AND weight > 2500",
    "age BETWEEN 15 AND 19 OR age NOT BETWEEN -1 AND x / 2",
    "Country IN (' UK', 'US', 'France') AND NOT (phone LIKE '12%3')",
    "underscored LIKE '\\_%' ESCAPE '\\' OR prop_name IS NOT NULL",
    "(a + b) * -c >= 0x10 AND flag = TRUE OR d <> 7.5E-1",
]
SAMPLE_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2.5,
    float("nan"),
    10**30,
    "",
    "red",
    "12%3",
    b"x",
    uuid.UUID(int=1),
]
NAMES = ["a", "b", "c", "d", "x", "JMSType", "weight", "color", "$v", "p.q", "q-r", "age", "Country", "phone", "flag"]


def check_random(text: str, rng: random.Random) -> bool:
    """Parse ``text``: only SelectorError, never an internal error; if it parses, evaluate
    it against random fields: a bool, never an exception."""
    try:
        s = parse_selector(text)
    except SelectorError as exc:
        assert "internal error" not in exc.reason, (text, exc)
        assert 1 <= exc.column <= len(text) + 1, (text, exc)
        return False
    for _ in range(3):
        fields = {name: rng.choice(SAMPLE_VALUES) for name in NAMES if rng.random() < 0.7}
        assert s.matches(fields) in (True, False)
    return True


def test_random_token_soup() -> None:
    rng = random.Random(20240601)
    parsed = 0
    for _ in range(6000):
        parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 14))]
        parsed += check_random(" ".join(parts) if rng.random() < 0.7 else "".join(parts), rng)
    assert parsed > 50  # the soup sometimes makes sense, so evaluation gets exercised too


def test_random_characters() -> None:
    rng = random.Random(7)
    for _ in range(4000):
        check_random("".join(rng.choice(CHARS) for _ in range(rng.randint(0, 30))), rng)
    for _ in range(500):
        check_random("".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 20))), rng)


def test_random_mutations_of_valid_selectors() -> None:
    rng = random.Random(99)
    for text in VALID:
        assert check_random(text, rng)
    for _ in range(6000):
        chars = list(rng.choice(VALID))
        for _ in range(rng.randint(1, 4)):
            where = rng.randrange(len(chars) + 1)
            action = rng.random()
            if action < 0.4 and where < len(chars):
                del chars[where]
            elif action < 0.7:
                chars.insert(where, rng.choice(CHARS))
            elif where < len(chars):
                chars[where] = rng.choice(CHARS)
        check_random("".join(chars), rng)


def test_random_well_formed_selectors_against_random_messages() -> None:
    rng = random.Random(3)

    def value() -> str:
        return rng.choice(["a", "b", "x", "1", "2.5", "-3", "'red'", "TRUE", "(a + 1)", "(x * b)", "(b / 0)"])

    def condition(depth: int) -> str:
        roll = rng.random()
        if depth > 3 or roll < 0.3:
            op = rng.choice(["=", "<>", "<", "<=", ">", ">="])
            return f"{rng.choice(['a', 'b', 'x'])} {op} {value()}"
        if roll < 0.4:
            return f"{rng.choice(['a', 'x'])} {rng.choice(['', 'NOT '])}BETWEEN {value()} AND {value()}"
        if roll < 0.5:
            return f"{rng.choice(['a', 'color'])} {rng.choice(['', 'NOT '])}LIKE '{rng.choice(['r%', '_e_', '%'])}'"
        if roll < 0.6:
            return f"color {rng.choice(['', 'NOT '])}IN ('red', 'blue')"
        if roll < 0.7:
            return f"{value()} IS {rng.choice(['', 'NOT '])}NULL"
        if roll < 0.8:
            return f"NOT ({condition(depth + 1)})"
        return f"({condition(depth + 1)}) {rng.choice(['AND', 'OR'])} ({condition(depth + 1)})"

    accepted = 0
    for _ in range(2000):
        accepted += check_random(condition(0), rng)
    assert accepted > 1000  # type errors between literals ('red' > 1) are refused; the rest parse


def test_sql_comments_are_skipped_as_activemq_and_artemis_skip_them() -> None:
    """Read as two minus signs, 'weight > 5 -- heavy' meant weight > 5 - (-heavy): accepted,
    echoed as in force, and matching nothing."""
    fields = {"weight": 10, "colour": "red"}
    for text in (
        "weight > 5 -- heavy\nAND colour = 'red'",
        "weight > 5 --heavy\r\nAND colour = 'red'",
        "weight > 5 /* heavy, -- not red */ AND colour = 'red'",
        "weight > 5 AND colour = 'red' -- the rest of the line",
    ):
        selector = parse_selector(text)
        assert selector.matches(fields), text
        assert selector.identifiers == {"weight", "colour"}, text
    with pytest.raises(SelectorError, match="unterminated comment"):
        parse_selector("weight > 5 /* heavy")
