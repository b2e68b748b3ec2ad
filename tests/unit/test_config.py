"""Configuration: defaults, overrides, and one clear line for every bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from qpid_flow import hookimpl
from qpid_flow.config import (
    ConfigError,
    DestinationPolicy,
    RouterConfig,
    build_config,
    load_config,
    parse_duration,
    parse_size,
    pattern_matches,
    resolve_policy,
)
from qpid_flow.core.dialect import RABBITMQ


def test_defaults_are_standalone_on_the_local_port() -> None:
    config = build_config({})
    assert config.standalone
    assert config.listen == "127.0.0.1:5673"
    assert config.producer_window == 100


def test_the_producer_window_is_larger_in_front_of_a_broker_unless_set(tmp_path: Path) -> None:
    """An extra hop needs more in flight for the same rate: 1,000 in front of a broker,
    100 standalone; a configured window applies in either mode."""
    path = tmp_path / "qpid-flow.toml"
    path.write_text("")
    assert load_config(path, {"broker": "amqp://127.0.0.1:5672"}).producer_window == 1000
    assert build_config({"broker": "amqp://127.0.0.1:5672", "producer_window": 50}).producer_window == 50
    assert build_config({"producer_window": 500}).producer_window == 500


@pytest.mark.parametrize("content", [b"listen = '127.0.0.1:5673' # caf\xe9\n", None])
def test_a_config_file_that_cannot_be_read_is_refused_in_one_line(tmp_path: Path, content: bytes | None) -> None:
    """Not UTF-8 (TOML's rule), or a folder: the --config key and why, no traceback."""
    path = tmp_path / "qpid-flow.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == "--config"
    assert ("UTF-8" if content else "cannot be read") in str(caught.value)


def test_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "qpid-flow.toml"
    path.write_text('listen = "0.0.0.0:6000"\nbroker = "amqp://guest:guest@127.0.0.1:5672"\n')
    config = load_config(path, {"listen": "127.0.0.1:7000", "broker": None})
    assert config.listen == "127.0.0.1:7000"
    assert config.broker == "amqp://guest:guest@127.0.0.1:5672"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10 MB", 10 * 1024**2), ("512 KB", 512 * 1024), ("512KB", 512 * 1024), (4096, 4096), ("1 GB", 1024**3)],
)
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), (3, 3.0), ("0", 0.0), ("1.5", 1.5)]
)
def test_durations(text: object, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("data", "key", "rule"),
    [
        ({"listne": "x"}, "listne", "unknown key"),
        ({"listen": "localhost"}, "listen", "HOST:PORT"),
        ({"broker": "http://x"}, "broker", "URL"),
        ({"broker": "amqp://a:5672,ftp://u:secret@b"}, "broker", "entry 2"),
        ({"broker_dialect": "artemis"}, "broker_dialect", "one of"),
        ({"producer_window": 0}, "producer_window", "positive integer"),
        ({"producer_window": "10"}, "producer_window", "positive integer"),
        ({"default_max_size": "ten megs"}, "default_max_size", "size"),
        ({"destinations": {"orders": {"max_count": -1}}}, 'destinations."orders".max_count', "non-negative"),
        ({"destinations": {"orders": {"max_cuont": 1}}}, 'destinations."orders".max_cuont', "unknown key"),
        ({"destinations": {"a.>.b": {}}}, 'destinations."a.>.b"', "last segment"),
        ({"log_level": "loud"}, "log_level", "one of"),
        # Values that would pass a type check and fail later, on every connection or at
        # the first attach: refused at start.
        ({"idle_timeout": float("nan")}, "idle_timeout", "at most 4294967 s"),
        ({"idle_timeout": float("inf")}, "idle_timeout", "at most 4294967 s"),
        ({"idle_timeout": "1200h"}, "idle_timeout", "at most 4294967 s"),
        ({"destinations": {"d": {"reject_after": float("nan")}}}, 'destinations."d".reject_after', "at most"),
        ({"max_message_size": 2**64}, "max_message_size", "at most 9223372036854775807 bytes"),
        ({"destinations": {"q": {"max_count": 10**30}}}, 'destinations."q".max_count', "at most 9223372036854775807"),
        ({"default_max_size": "9" * 400}, "default_max_size", "at most"),
    ],
)
def test_bad_values_name_the_key_and_the_rule(data: dict, key: str, rule: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(data)
    assert caught.value.key == key
    assert rule in str(caught.value)
    assert "\n" not in str(caught.value)
    assert "secret" not in str(caught.value)


def test_bad_toml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("listen = \n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "not valid TOML" in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "address", "matches"),
    [
        ("PRICES.>", "PRICES.STOCK.IBM", True),
        ("PRICES.>", "PRICES.X", True),
        ("PRICES.>", "PRICES", False),
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders.eu.paris", False),
        ("orders", "orders", True),
        ("*.eu", "orders.eu", True),
        # "/" separates segments too (broker address forms): security.md's /exchange/>
        # and /topic/> were single literal segments that guarded nothing.
        ("/topic/>", "/topic/a.b", True),
        ("/exchange/>", "/exchange/amq.topic/a.b", True),
        ("/exchange/>", "/topic/a.b", False),
        ("/topic/*", "/topic/k", True),
        ("/topic/*", "/topic/a.b", False),
        ("*", "/topic/k", False),
        ("orders.*", "orders.a/b", False),
        # An empty segment is a segment (a deny of orders.* let "orders." through).
        ("orders.*", "orders.", True),
        ("a.*.c", "a..c", True),
        ("a.>", "a.", True),
        ("PRICES.>", "PRICES", False),
        (">", "", True),
        ("a+b.*", "a+b.x", True),  # literal segments are literal, not regular expressions
        ("a+b.*", "aab.x", False),
    ],
)
def test_wildcards(pattern: str, address: str, matches: bool) -> None:
    assert pattern_matches(pattern, address) is matches


def test_exact_name_beats_patterns_and_specific_patterns_beat_general_ones() -> None:
    config = build_config(
        {
            "destinations": {
                ">": {"max_count": 1},
                "orders.>": {"max_count": 2},
                "orders.*": {"max_count": 3},
                "orders.eu": {"max_count": 4},
            }
        }
    )
    assert config.policy_for("orders.eu").max_count == 4
    assert config.policy_for("orders.us").max_count == 3
    assert config.policy_for("orders.us.west").max_count == 2
    assert config.policy_for("misc").max_count == 1


def test_qpid_declare_keys_are_aliases() -> None:
    config = build_config({"destinations": {"q": {"qpid.max_count": 10, "qpid.max_size": "1 KB"}}})
    policy = config.policy_for("q")
    assert (policy.max_count, policy.max_size) == (10, 1024)


def test_unset_destination_values_fall_back_to_router_defaults() -> None:
    config = build_config({"default_max_size": "1 MB", "destinations": {"q": {"max_count": 5}}})
    policy = config.policy_for("q")
    assert (policy.max_count, policy.max_size) == (5, 1024**2)


# --- security keys ---------------------------------------------------------------------------


def test_several_listeners_plain_and_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("x")
    config = build_config(
        {"listen": ["127.0.0.1:5672", "amqps://0.0.0.0:5671"], "tls_cert": str(cert), "tls_key": str(key)}
    )
    assert config.listeners == [("amqp", "127.0.0.1", 5672), ("amqps", "0.0.0.0", 5671)]
    assert build_config({"listen": "amqp://[::1]:5672"}).listeners == [("amqp", "::1", 5672)]
    with pytest.raises(ConfigError, match="entry 2: scheme must be amqp:// or amqps://"):
        build_config({"listen": "127.0.0.1:1,http://h:2"})
    with pytest.raises(ConfigError, match="the same address twice"):
        build_config({"listen": ["127.0.0.1:1", "amqp://127.0.0.1:1"]})


def test_secrets_from_the_environment_below_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "q.toml"
    path.write_text('admin_token = "from-file"\n')
    environ = {
        "QPID_FLOW_ADMIN_TOKEN": "from-env",
        "QPID_FLOW_BROKER": "amqp://broker.example:5672",
        "QPID_FLOW_BROKER_USER": "svc",
        "QPID_FLOW_BROKER_PASSWORD": "p@ss,word",
    }
    config = load_config(path, {}, environ)
    assert config.admin_token == "from-env"
    assert [(b.user, b.password, b.host) for b in config.broker_addresses] == [("svc", "p@ss,word", "broker.example")]
    assert config.broker is not None and "p@ss" not in config.broker  # the URL itself carries no password
    assert load_config(path, {"broker": "amqp://other:5672"}, environ).broker == "amqp://other:5672"
    # An entry with its own credentials keeps them.
    own = load_config(None, {"broker": "amqp://me:mine@b:5672"}, environ)
    assert [(b.user, b.password) for b in own.broker_addresses] == [("me", "mine")]


def test_security_rules_between_keys(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("")
    with pytest.raises(ConfigError, match=r"^users_file = .*applies standalone only"):
        build_config({"users_file": str(users), "broker": "amqp://b:5672"})
    with pytest.raises(ConfigError, match=r"^allow_anonymous = False: leaves no way to sign in"):
        build_config({"allow_anonymous": False})
    assert not build_config({"allow_anonymous": False, "users_file": str(users)}).anonymous_allowed
    assert not build_config({"users_file": str(users)}).anonymous_allowed
    assert build_config({"users_file": str(users), "allow_anonymous": True}).anonymous_allowed
    with pytest.raises(ConfigError, match=r"^admin = '0.0.0.0:8673': .*needs admin_token"):
        build_config({"admin": "0.0.0.0:8673"})
    assert build_config({"admin": "0.0.0.0:8673", "admin_token": "t"}).admin_token == "t"
    assert build_config({"admin": "localhost:8673"}).admin_token is None
    with pytest.raises(ConfigError, match=r"^max_links_per_connection = -1"):
        build_config({"max_links_per_connection": -1})
    with pytest.raises(ConfigError, match=r"^idle_timeout = 'soon'"):
        build_config({"idle_timeout": "soon"})


def test_a_bad_secret_is_never_echoed() -> None:
    for key in ("admin_token", "broker_password"):
        with pytest.raises(ConfigError) as caught:
            build_config({key: 123456789})
        assert "123456789" not in str(caught.value) and str(caught.value).startswith(f"{key} = '***'")


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"max_count": 10, "qpid.max_count": 20}, "qpid.max_count"),
        ({"qpid.flow_stop_count": 9, "flow_stop_count": 8}, "flow_stop_count"),
    ],
)
def test_a_setting_given_twice_under_two_names_is_refused(table: dict[str, int], key: str) -> None:
    """A name and its qpidd alias in one table: which won depended on the file's order."""
    with pytest.raises(ConfigError) as refused:
        build_config({"destinations": {"q": table}})
    assert str(refused.value).startswith(f'destinations."q".{key} = ')
    assert "give one of them" in str(refused.value)


@pytest.mark.parametrize(
    "body",
    [
        "qpid.max_count = 10\nqpid.max_size = '1 KB'\nqpid.flow_stop_count = 9\nqpid.shared_msg_group = 1",
        '"qpid.max_count" = 10\n"qpid.max_size" = "1 KB"\n"qpid.flow_stop_count" = 9\n"qpid.shared_msg_group" = 1',
        "\"qpid.max_size\" = '1 KB'\n[destinations.q.qpid]\nmax_count = 10\nflow_stop_count = 9\nshared_msg_group = 1",
    ],
)
def test_qpid_aliases_work_as_the_docs_write_them_unquoted(tmp_path: Path, body: str) -> None:
    """docs/configuration.md lists ``qpid.max_count`` etc.: unquoted in TOML that is a
    ``qpid`` table holding ``max_count``, which was refused as an unknown key ``qpid``."""
    path = tmp_path / "qpid-flow.toml"
    path.write_text(f"[destinations.q]\n{body}\n")
    policy = load_config(path).policy_for("q")
    assert (policy.max_count, policy.max_size) == (10, 1024)
    assert (policy.setting("flow_stop_count"), policy.setting("shared_groups")) == (9, True)


@pytest.mark.parametrize(
    ("table", "key", "rule"),
    [
        ({"qpid": {"max_cuont": 1}}, "qpid.max_cuont", "unknown key; known: max_count"),
        ({"qpid": {"max_count": -1}}, "qpid.max_count", "non-negative"),
        ({"qpid": 3}, "qpid", "unknown key"),
        ({"max_count": 1, "qpid": {"max_count": 2}}, "qpid.max_count", "give one of them"),
        ({"qpid.max_count": 1, "qpid": {"max_count": 2}}, "qpid.max_count", "given twice"),
    ],
)
def test_a_bad_key_in_the_qpid_table_is_refused_by_its_dotted_name(table: dict, key: str, rule: str) -> None:
    with pytest.raises(ConfigError) as refused:
        build_config({"destinations": {"q": table}})
    assert refused.value.key == f'destinations."q".{key}'
    assert rule in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("key", ["sasl_timeout", "reconnect_max_delay"])
@pytest.mark.parametrize("value", [0, "0", "0s", "0ms", 0.0])
def test_a_duration_that_means_nothing_at_0_is_refused(key: str, value: object) -> None:
    """sasl_timeout = 0 dropped every client as it connected; reconnect_max_delay = 0
    retried the broker with no pause at all."""
    with pytest.raises(ConfigError) as refused:
        build_config({key: value})
    assert str(refused.value) == f"{key} = {value!r}: must be a duration above 0, such as '10s' or '500ms'"


@pytest.mark.parametrize("key", ["shutdown_timeout", "idle_timeout", "destination_idle_timeout"])
def test_durations_where_0_means_something_still_take_0(key: str) -> None:
    # Do not wait; no idle time-out (nor keep-alives); keep destinations forever.
    assert getattr(build_config({key: 0}), key) == 0.0


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        # The package's name instead of the plugin's: the table was never read.
        ({"plugins": {"rabbitmq-depth": {"interval": "often"}}}, "names no loaded plugin; loaded: events, flow"),
    ],
)
def test_a_plugin_table_naming_no_loaded_plugin_is_refused(data: dict, rule: str) -> None:
    name = next(iter(data["plugins"]))
    with pytest.raises(ConfigError) as refused:
        build_config(data)
    assert refused.value.key == f"plugins.{name}"
    assert str(refused.value).startswith(f"plugins.{name} = {{{next(iter(data['plugins'][name]))} = ...}}: {rule}")
    assert "\n" not in str(refused.value)


def test_a_refused_plugin_table_never_shows_its_values() -> None:
    """A plugin's table may hold a password (the depth plugin's amqp091_url)."""
    table = {"amqp091_url": "amqp://depth:S3cretPw@h:5672", "token": "T0ken"}
    for plugins in ({"rabbit-depth": table}, {"rabbit-depth": table, "other": "T0ken"}):
        with pytest.raises(ConfigError) as refused:
            build_config({"plugins": plugins})
        assert "S3cret" not in str(refused.value) and "T0ken" not in str(refused.value)


def test_a_disabled_plugin_s_table_is_let_be() -> None:
    """Switching a plugin off must not mean editing the file that configures it."""
    config = build_config({"disable_plugins": ["groups"], "plugins": {"groups": {"x": 1}}})
    assert config.plugin_settings("groups") == {"x": 1}


def test_a_table_of_a_loaded_plugin_is_handed_to_it() -> None:
    assert build_config({"plugins": {"flow": {}}}).plugin_settings("flow") == {}


def test_a_manager_given_by_a_test_helper_is_not_checked_against_the_tables() -> None:
    """qpid_flow.testing.make_hooks registers a plugin as "myplugin-0": the plugin's own
    table must still reach it there."""
    from qpid_flow.testing import make_hooks

    class MyPlugin:
        seen: dict | None = None

        @hookimpl
        def qpid_flow_configure(self, config: RouterConfig) -> None:
            MyPlugin.seen = config.plugin_settings("my_plugin")

    make_hooks(MyPlugin(), config={"plugins": {"my_plugin": {"limit": 3}}})
    assert MyPlugin.seen == {"limit": 3}


# --- rules the review found missing ---------------------------------------------------------


@pytest.mark.parametrize("key", ["producer_window", "consumer_lookahead"])
def test_a_count_that_becomes_link_credit_is_at_most_proton_s_signed_32_bit_credit(key: str) -> None:
    """3,000,000,000 passed the start and then failed every link with OverflowError in
    Proton's link.flow()."""
    assert getattr(build_config({key: 2**31 - 1}), key) == 2**31 - 1
    with pytest.raises(ConfigError) as refused:
        build_config({key: 2**31})
    rule = "must be at most 2147483647 (link credit, a signed 32-bit integer)"
    assert str(refused.value) == f"{key} = 2147483648: {rule}"


@pytest.mark.parametrize(
    ("table", "key", "belongs"),
    [
        ({"flow": {"default_flow_stop_threshold": 50}}, "plugins.flow.default_flow_stop_threshold", "router key"),
        ({"groups": {"flow_stop_count": 5}}, "plugins.groups.flow_stop_count", 'in a [destinations."NAME"] table'),
        ({"passthrough": {"window": 5}}, "plugins.passthrough.window", ""),
        ({"events": {"broker_password": "S3cret"}}, "plugins.events.broker_password", "router key"),
    ],
)
def test_a_key_in_the_table_of_a_built_in_plugin_is_refused_saying_where_it_belongs(
    table: dict, key: str, belongs: str
) -> None:
    """qpid-flow's own plugins read no [plugins.NAME] table: [plugins.flow]
    default_flow_stop_threshold = 50 started silently with 80 in force."""
    name = next(iter(table))
    with pytest.raises(ConfigError) as refused:
        build_config({"plugins": table})
    assert refused.value.key == key
    assert str(refused.value).startswith(f"{key} = ...: unknown key: the {name} plugin has no settings")
    assert belongs in str(refused.value)
    assert "S3cret" not in str(refused.value) and "\n" not in str(refused.value)


def test_a_broker_password_without_a_user_is_refused_as_in_a_url() -> None:
    """It was accepted and dropped: qpid-flow signed in at the broker without it."""
    for config in (
        lambda: load_config(None, {"broker": "amqp://b:5672"}, {"QPID_FLOW_BROKER_PASSWORD": "S3cret"}),
        lambda: build_config({"broker": "amqp://b:5672", "broker_password": "S3cret"}),
    ):
        with pytest.raises(ConfigError) as refused:
            config()
        assert str(refused.value) == (
            "broker_password = '***': has no broker_user: set broker_user (or QPID_FLOW_BROKER_USER) too"
        )
    assert build_config({"broker_user": "u", "broker_password": "p"}).broker_password == "p"


@pytest.mark.parametrize("source", ["file", "environment"])
def test_a_name_to_disable_that_no_plugin_has_is_refused(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """disable_plugins = ["flw"] disabled nothing: flow control stayed on, silently."""
    monkeypatch.delenv("QPID_FLOW_PLUGINS", raising=False)
    monkeypatch.delenv("QPID_FLOW_DISABLE_PLUGINS", raising=False)
    if source == "file":
        data: dict = {"disable_plugins": ["groups", "flw"]}
        line = "disable_plugins = ['groups', 'flw']: 'flw' names no plugin; known: events, flow, groups"
    else:
        monkeypatch.setenv("QPID_FLOW_DISABLE_PLUGINS", "groups,flw")
        data = {}
        line = "QPID_FLOW_DISABLE_PLUGINS = 'groups,flw': 'flw' names no plugin; known: events, flow, groups"
    with pytest.raises(ConfigError) as refused:
        build_config(data)
    assert str(refused.value).startswith(line)


def test_a_plugin_named_in_qpid_flow_plugins_may_be_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPID_FLOW_PLUGINS", "my_policy")  # disabled: never imported
    assert build_config({"disable_plugins": ["my_policy", "flow"]}).disable_plugins == ["my_policy", "flow"]


@pytest.mark.parametrize(
    ("file_text", "overrides", "key"),
    [
        ('listen = "nohostport"\n', {"listen": "127.0.0.1:0"}, "listen"),
        ("producer_window = 0\n", {}, "producer_window"),
        ('broker = "http://b"\n', {"broker": "amqp://b:5672"}, "broker"),
        ('disable_plugins = ["flw"]\n', {"disable_plugins": ["groups"]}, "disable_plugins"),
    ],
)
def test_a_file_value_the_command_line_overrides_is_checked_all_the_same(
    tmp_path: Path, file_text: str, overrides: dict, key: str
) -> None:
    """listen = "nohostport" in the file started behind --listen, and stopped the first
    start without the flag."""
    path = tmp_path / "qpid-flow.toml"
    path.write_text(file_text)
    with pytest.raises(ConfigError) as refused:
        load_config(path, overrides)
    assert refused.value.key == key


@pytest.mark.parametrize(
    ("patterns", "address", "winner"),
    [
        (["a.*", "*.b"], "a.b", "a.*"),
        (["a.b.*", "a.*.c"], "a.b.c", "a.b.*"),
        (["*.b.>", "a.*.>"], "a.b.c", "a.*.>"),
    ],
)
def test_a_tie_between_patterns_goes_to_the_leftmost_literal_in_any_order(
    patterns: list[str], address: str, winner: str
) -> None:
    """``a.*`` and ``*.b`` both match ``a.b`` with one literal segment each: the one later
    in the file won."""
    for order in (patterns, patterns[::-1]):
        config = build_config({"destinations": {pattern: {"max_count": 1} for pattern in order}})
        assert config.policy_for(address).pattern == winner


@pytest.mark.parametrize(
    ("policies", "address", "wins"),
    [
        # A pattern in a queue's address form ranks by the part that names the queue: a
        # catch-all /queue/> counted "queue" as a literal segment and beat orders.*.
        (["/queue/>", "orders.*"], "orders.eu", "orders.*"),
        (["orders.*", "/queue/>"], "orders.eu", "orders.*"),
        (["/amq/queue/>", "/queue/orders.>"], "orders.eu", "/queue/orders.>"),
        (["/queue/orders.>", "/amq/queue/>"], "orders.eu", "/queue/orders.>"),
        (["orders.eu.>", "/queue/>"], "orders.eu.x", "orders.eu.>"),
        (["/queue/>", "orders.eu.>"], "orders.eu.x", "orders.eu.>"),
        # Two spellings of one pattern: the same either way round (by the pattern itself).
        (["/queue/orders.*", "/amq/queue/orders.*"], "orders.eu", "/queue/orders.*"),
        (["/amq/queue/orders.*", "/queue/orders.*"], "orders.eu", "/queue/orders.*"),
        (["/topic/>", ">"], "/topic/a.b", "/topic/>"),
    ],
)
def test_precedence_of_patterns_in_rabbitmq_address_forms(policies: list[str], address: str, wins: str) -> None:
    base = DestinationPolicy(pattern="")
    table = {name: DestinationPolicy(pattern=name, max_count=n + 1) for n, name in enumerate(policies)}
    forms = RABBITMQ.address_forms(address)[1:]
    chosen = resolve_policy(table, address, base, forms, RABBITMQ.pattern_core)
    assert chosen.pattern == wins
