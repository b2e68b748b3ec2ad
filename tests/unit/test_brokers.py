"""The broker list: what ``broker`` accepts, every refusal as one line, and URLs Proton reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Url

from qpid_flow.brokers import BrokerAddress, parse_broker_list
from qpid_flow.config import ConfigError, build_config, load_config


def test_one_url() -> None:
    assert parse_broker_list("amqp://guest:guest@127.0.0.1:5672") == [
        BrokerAddress("amqp", "127.0.0.1", 5672, "guest", "guest", None)
    ]


def test_a_list_in_order_with_spaces_around_the_commas() -> None:
    addresses = parse_broker_list(" amqp://guest:guest@10.0.0.1:5672 ,  amqp://10.0.0.2:5672,amqps://broker.example ")
    assert addresses == [
        BrokerAddress("amqp", "10.0.0.1", 5672, "guest", "guest", None),
        BrokerAddress("amqp", "10.0.0.2", 5672, None, None, None),
        BrokerAddress("amqps", "broker.example", 5671, None, None, None),
    ]


def test_a_toml_style_list() -> None:
    assert [a.host for a in parse_broker_list(["amqp://a", " amqp://b:5673 "])] == ["a", "b"]


@pytest.mark.parametrize(
    ("url", "scheme", "port"),
    [
        ("amqp://h", "amqp", 5672),
        ("amqps://h", "amqps", 5671),
        ("AMQP://h:1", "amqp", 1),
        ("amqp://h:65535", "amqp", 65535),
    ],
)
def test_scheme_and_default_port(url: str, scheme: str, port: int) -> None:
    (address,) = parse_broker_list(url)
    assert (address.scheme, address.port) == (scheme, port)


@pytest.mark.parametrize(
    ("url", "vhost"),
    [
        ("amqp://h", None),
        ("amqp://h/", None),
        ("amqp://h/prod", "prod"),
        ("amqp://h/%2F", "/"),
        ("amqp://h/a%20b", "a b"),
    ],
)
def test_vhost_is_the_decoded_path(url: str, vhost: str | None) -> None:
    assert parse_broker_list(url)[0].vhost == vhost


def test_percent_encoded_credentials_are_decoded() -> None:
    (address,) = parse_broker_list("amqp://us%40er:p%3Ass%2Cw%2F%25rd@h")
    assert (address.user, address.password) == ("us@er", "p:ss,w/%rd")


def test_user_without_password() -> None:
    (address,) = parse_broker_list("amqp://alice@h")
    assert (address.user, address.password) == ("alice", None)
    assert address.url == "amqp://alice@h:5672"


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("amqp://[::1]", "::1", 5672),
        ("amqp://[FE80:0::1]:5673", "fe80::1", 5673),
        ("amqp://u:p@[2001:db8::7]:1", "2001:db8::7", 1),
    ],
)
def test_ipv6_hosts_lose_their_brackets(url: str, host: str, port: int) -> None:
    (address,) = parse_broker_list(url)
    assert (address.host, address.port) == (host, port)
    assert f"[{host}]:{port}" in address.url


def test_host_names_are_lower_case() -> None:
    assert parse_broker_list("amqp://Broker.EXAMPLE")[0].host == "broker.example"


ROUND_TRIP = [
    "amqp://guest:guest@127.0.0.1:5672",
    "amqps://us%40er:p%3Ass%2Cw%2F%25rd%20x@[2001:db8::7]:5671/%2F",
    "amqp://alice@h/prod",
    "amqp://h",
]


@pytest.mark.parametrize("url", ROUND_TRIP)
def test_url_parses_back_to_the_same_address(url: str) -> None:
    (address,) = parse_broker_list(url)
    assert parse_broker_list(address.url) == [address]


@pytest.mark.parametrize("url", ROUND_TRIP)
def test_proton_reads_the_url_as_meant(url: str) -> None:
    (address,) = parse_broker_list(url)
    proton_url = Url(address.url)
    assert proton_url.scheme == address.scheme
    assert proton_url.host == address.host
    assert int(proton_url.port) == address.port
    assert proton_url.username == address.user
    assert proton_url.password == address.password


def test_redacted_hides_only_the_password() -> None:
    (address,) = parse_broker_list("amqp://guest:s%40cret@h:5672/prod")
    assert address.redacted == "amqp://guest:***@h:5672/prod"
    assert "s%40cret" in address.url
    assert "cret" not in address.redacted


def test_redacted_without_a_password_is_the_url() -> None:
    (address,) = parse_broker_list("amqp://alice@h")
    assert address.redacted == address.url == "amqp://alice@h:5672"


EXAMPLE = "amqp://user:password@host:5672"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("amqp://a,amqp//x", f"entry 2 'amqp//x' must be a URL such as {EXAMPLE}"),
        ("", f"must name at least one broker URL, such as {EXAMPLE}"),
        ("  ", f"must name at least one broker URL, such as {EXAMPLE}"),
        (",", f"must name at least one broker URL, such as {EXAMPLE}"),
        ([], f"must name at least one broker URL, such as {EXAMPLE}"),
        ("amqp://a,,amqp://b", "entry 2 '' is empty"),
        ("amqp://a,", "entry 2 '' is empty"),
        (["amqp://a", " "], "entry 2 '' is empty"),
        ("amqp://a,amqp://b,amqp://A:5672", "entry 3 'amqp://A:5672' names the same broker as entry 1"),
        ("amqp://a,amqps://a:5672", "entry 2 'amqps://a:5672' names the same broker as entry 1"),
        ("http://x", "entry 1 'http://x' has an unknown scheme 'http': a broker URL starts with amqp:// or amqps://"),
        ("amqp://h:0", "entry 1 'amqp://h:0' has port '0': a port must be a number from 1 to 65535"),
        ("amqp://h:65536", "entry 1 'amqp://h:65536' has port '65536': a port must be a number from 1 to 65535"),
        ("amqp://h:", "entry 1 'amqp://h:' has port '': a port must be a number from 1 to 65535"),
        ("amqp://h:amqp", "entry 1 'amqp://h:amqp' has port 'amqp': a port must be a number from 1 to 65535"),
        ("amqp://h x:5672", "entry 1 'amqp://h x:5672' must not contain spaces (write a space in a password as %20)"),
        ("amqp://a, amqp://b c", "entry 2 'amqp://b c' must not contain spaces"),
        ("amqp://", f"entry 1 'amqp://' must name a host, as in {EXAMPLE}"),
        ("amqp://u:p@:5672", "entry 1 'amqp://u:***@:5672' must name a host"),
        ("amqp://h%41", "entry 1 'amqp://h%41' has 'h%41' where a host name or address belongs"),
        ("amqp://::1", "entry 1 'amqp://::1' must put an IPv6 address in brackets, as in amqp://[::1]:5672"),
        ("amqp://[::1", "entry 1 'amqp://[::1' must have an IPv6 address between its brackets"),
        ("amqp://[h]:1", "entry 1 'amqp://[h]:1' must have an IPv6 address between its brackets"),
        ("amqp://[::1]x", f"entry 1 'amqp://[::1]x' must be a URL such as {EXAMPLE}"),
        ("amqp://h/a/b", "entry 1 'amqp://h/a/b' has a vhost with '/' in it"),
        ("amqp://h?x=1", "entry 1 'amqp://h?x=1' must not have a query (?) or fragment (#)"),
        ("amqp://:secret@h", "entry 1 'amqp://:***@h' has a password but no user name"),
        # A raw '/' in a password: the rest read as host and port, and the refusal showed
        # "port 'Pa55w0rd'" (part of the password).
        (
            "amqp://svc:Pa55w0rd/2024@broker.example:5672",
            "entry 1 'amqp://svc:***@broker.example:5672' has '@' after a '/': write a '/' in a user name or password",
        ),
        ("amqp://u:p@h/%FF", "entry 1 'amqp://u:***@h/%FF' has percent-encoding that is not UTF-8"),
        (["amqp://a", 5672], "entry 2 5672 must be a string"),
        (["amqp://a,amqp://b"], "entry 1 'amqp://a,amqp://b' must not contain a comma: one URL per list item"),
        (5672, f"must be a URL such as {EXAMPLE}, or a list of them"),
        (None, f"must be a URL such as {EXAMPLE}, or a list of them"),
    ],
)
def test_refusals_are_one_line_naming_the_entry_and_the_rule(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_broker_list(value, key="broker")
    error = caught.value
    assert error.key == "broker"
    assert str(error).startswith("broker = ")
    assert message in error.rule
    assert "\n" not in str(error)


def test_a_refusal_never_shows_a_password() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_broker_list("amqp://guest:s3cr%40t@10.0.0.1:5672,amqp://admin:p@ss@h:0")
    assert "s3cr" not in str(caught.value)
    assert "ss@" not in str(caught.value)
    assert str(caught.value) == (
        "broker = 'amqp://guest:***@10.0.0.1:5672,amqp://admin:***@h:0': "
        "entry 2 'amqp://admin:***@h:0' has port '0': a port must be a number from 1 to 65535"
    )


@pytest.mark.parametrize(
    "value", ["guest:s3cret@host:5672", "amqp//guest:s3cret@h", "amqp://u:s3/cret@h", "amqp://u:s3cret@h:0"]
)
def test_a_malformed_entry_still_hides_its_password(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_broker_list(value)
    assert "cret" not in str(caught.value)
    assert "***" in str(caught.value)


# A raw comma, space or other character in a password: the refusal showed the URL cut at
# the comma ("entry 1 'amqp://svc:S3cr' has port 'S3cr'"), or as given.
LEAKY = [
    "amqp://svc:S3cr,etPass@broker.example:5672",
    "amqp://svc:S3cr etPass@broker.example:5672",
    "amqp://svc:S3cr,et Pass,x@broker.example:5672",
    "amqp://svc:S3cr~etPa\x7fss@broker.example:5672/a/b",
    "amqp://svc:S3cr\tetPass@broker.example:5672",
    "amqp://svc:1234,etPass@broker.example:5672",  # "amqp://svc:1234" alone is a valid URL
    "amqp://a:5672,amqp://svc:S3cr,etPass@broker.example:5672",
    "amqp://svc:S3cr,et@Pass@broker.example:5672,amqp://b",
]


@pytest.mark.parametrize("value", LEAKY)
def test_no_fragment_of_a_password_with_a_raw_comma_or_space_is_shown(value: str) -> None:
    for given in (value, [value]):
        with pytest.raises(ConfigError) as caught:
            parse_broker_list(given)
        shown = str(caught.value)
        assert "S3cr" not in shown
        assert "etPass" not in shown
        assert "1234" not in shown
        assert "amqp://svc:***@broker.example:5672" in shown


def test_a_comma_in_a_password_is_refused_naming_its_entry() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_broker_list("amqp://a:5672, amqp://svc:S3cr,etPass@broker.example:5672")
    assert str(caught.value) == (
        "broker = 'amqp://a:5672, amqp://svc:***@broker.example:5672': entry 2 'amqp://svc:***@broker.example:5672'"
        " has a comma in its password, and a comma separates two URLs: write a comma in a password as %2C"
    )


def test_a_comma_after_the_password_still_separates_urls() -> None:
    addresses = parse_broker_list("amqp://u:p@a,amqp://b,amqp://v:q@c")
    assert [(a.host, a.password) for a in addresses] == [("a", "p"), ("b", None), ("c", "q")]


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("amqp://u:p,w d@h:1", "amqp://u:***@h:1"),
        ("amqp://u:p@h,amqp://v:q@k", "amqp://u:***@h,amqp://v:***@k"),
        ("amqp://h:5672,amqp://v:q,r@k", "amqp://h:5672,amqp://v:***@k"),
        ("u:p@h", "u:***@h"),
        ("amqp://u@h", "amqp://u@h"),
        ("amqp://h:5672", "amqp://h:5672"),
    ],
)
def test_mask_passwords(text: str, masked: str) -> None:
    from qpid_flow.brokers import mask_passwords  # here: the other tests run without it

    assert mask_passwords(text) == masked


def test_the_key_is_the_one_given() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_broker_list("nope", key="--broker")
    assert caught.value.key == "--broker"


# --- through the configuration ------------------------------------------------------------


def test_config_keeps_a_normalised_comma_joined_string() -> None:
    config = build_config({"broker": " amqp://guest:guest@10.0.0.1:5672 , amqp://10.0.0.2"})
    assert config.broker == "amqp://guest:guest@10.0.0.1:5672,amqp://10.0.0.2:5672"
    assert [a.host for a in config.broker_addresses] == ["10.0.0.1", "10.0.0.2"]
    assert not config.standalone


def test_config_file_takes_a_toml_array(tmp_path: Path) -> None:
    path = tmp_path / "qpid-flow.toml"
    path.write_text('broker = ["amqp://guest:p%2Cw@10.0.0.1:5672", "amqp://[::1]:5673/%2F"]\n')
    config = load_config(path)
    assert config.broker == "amqp://guest:p%2Cw@10.0.0.1:5672,amqp://[::1]:5673/%2F"
    assert config.broker_addresses == [
        BrokerAddress("amqp", "10.0.0.1", 5672, "guest", "p,w", None),
        BrokerAddress("amqp", "::1", 5673, None, None, "/"),
    ]


def test_command_line_list_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "qpid-flow.toml"
    path.write_text('broker = ["amqp://a"]\n')
    config = load_config(path, {"broker": "amqp://b,amqp://c"})
    assert [a.host for a in config.broker_addresses] == ["b", "c"]


def test_config_refuses_a_bad_entry_with_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"broker": "amqp://guest:guest@10.0.0.1:5672,amqp//x"})
    assert str(caught.value) == (
        "broker = 'amqp://guest:***@10.0.0.1:5672,amqp//x': "
        "entry 2 'amqp//x' must be a URL such as amqp://user:password@host:5672"
    )


def test_standalone_has_no_broker_addresses() -> None:
    assert build_config({}).broker_addresses == []
