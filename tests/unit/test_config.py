"""kraft.config: java.util.Properties syntax, NodeConfig keys, defaults and every validation rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.broker.replication import ReplicationSettings
from kraft.config import (
    ConfigError,
    Listener,
    NodeConfig,
    Role,
    Voter,
    format_properties,
    load_config,
    parse_properties,
)
from kraft.errors import ErrorCode
from kraft.node.broker import BrokerSettings

VOTERS = "1@127.0.0.1:9093,2@127.0.0.1:9094,3@127.0.0.1:9095"
CONTROLLER = {
    "process.roles": "controller",
    "node.id": "1",
    "controller.quorum.voters": VOTERS,
    "listeners": "CONTROLLER://127.0.0.1:9093",
    "log.dirs": "/var/kraft/c1",
}
BROKER = {
    "process.roles": "broker",
    "node.id": "101",
    "controller.quorum.voters": VOTERS,
    "listeners": "PLAINTEXT://127.0.0.1:9092",
    "log.dirs": "/var/kraft/b1,/var/kraft/b1-extra",
}
COMBINED = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.quorum.voters": VOTERS,
    "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
    "log.dirs": "/var/kraft/n1",
}


# --- properties syntax -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=b", {"a": "b"}),
        ("a = b", {"a": "b"}),
        ("a:b", {"a": "b"}),
        ("a : b", {"a": "b"}),
        ("a b", {"a": "b"}),
        ("a\tb", {"a": "b"}),
        ("   a=b", {"a": "b"}),
        ("a=b  ", {"a": "b  "}),  # trailing whitespace is part of the value, as in Java
        ("a=", {"a": ""}),
        ("a", {"a": ""}),
        ("a==b", {"a": "=b"}),
        ("a = = b", {"a": "= b"}),
        ("a b=c", {"a": "b=c"}),
        ("# comment\na=b", {"a": "b"}),
        ("! comment\na=b", {"a": "b"}),
        ("  # indented comment\na=b", {"a": "b"}),
        ("a=b # not a comment", {"a": "b # not a comment"}),
        ("\n\n   \na=b\n\n", {"a": "b"}),
        ("a=1\na=2", {"a": "2"}),
        ("a=b\r\nc=d\re=f", {"a": "b", "c": "d", "e": "f"}),
    ],
)
def test_separators_comments_and_blank_lines_follow_java(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=one,\\\n   two", {"a": "one,two"}),
        ("a=one\\\n\\\n  two", {"a": "onetwo"}),
        ("a\\\n  b=c", {"ab": "c"}),
        ("a=ends with two\\\\\nb=c", {"a": "ends with two\\", "b": "c"}),
        ("a=three\\\\\\\n  x", {"a": "three\\x"}),
        ("# comment \\\na=b", {"a": "b"}),  # comment lines never continue
        ("a=b\\\n# not a comment", {"a": "b# not a comment"}),
        ("a=dangling\\", {"a": "dangling"}),
    ],
)
def test_backslash_continuation_joins_lines_and_drops_leading_whitespace(
    text: str, expected: dict[str, str]
) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=x\\ty", {"a": "x\ty"}),
        ("a=x\\ny", {"a": "x\ny"}),
        ("a=x\\ry", {"a": "x\ry"}),
        ("a=x\\fy", {"a": "x\fy"}),
        ("a=\\u0041\\u00e9\\u20AC", {"a": "Aé€"}),
        ("a=back\\\\slash", {"a": "back\\slash"}),
        ("a=x\\=y", {"a": "x=y"}),
        ("a=x\\:y", {"a": "x:y"}),
        ("a\\=b=c", {"a=b": "c"}),
        ("a\\:b:c", {"a:b": "c"}),
        ("a\\ b=c", {"a b": "c"}),
        ("a=\\ leading", {"a": " leading"}),
        ("a=\\q", {"a": "q"}),  # an unknown escape is the character itself
        ("\\#notcomment=1", {"#notcomment": "1"}),
    ],
)
def test_escapes_in_keys_and_values(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


@pytest.mark.parametrize("text", ["a=\\u12", "a=\\uZZZZ", "a=\\u"])
def test_malformed_unicode_escape_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="malformed"):
        parse_properties(text)


def test_format_properties_round_trips_awkward_keys_and_values() -> None:
    values = {"k=1": " lead", "k:2": "a=b:c#!", "k 3": "tab\tnew\nline\\", "uni": "é€", "#k": "!v"}
    assert parse_properties(format_properties(values, header="generated\nby test")) == values


# --- NodeConfig: keys, defaults, typed views ---------------------------------------------------------


def test_controller_config_defaults_and_typed_views() -> None:
    cfg = NodeConfig.from_properties(CONTROLLER)
    assert cfg.roles == frozenset({Role.CONTROLLER})
    assert cfg.is_controller and not cfg.is_broker
    assert cfg.node_id == 1
    assert cfg.voters == (
        Voter(1, "127.0.0.1", 9093),
        Voter(2, "127.0.0.1", 9094),
        Voter(3, "127.0.0.1", 9095),
    )
    assert cfg.voter_ids == frozenset({1, 2, 3})
    assert cfg.voter(2) == Voter(2, "127.0.0.1", 9094)
    assert cfg.voter(9) is None
    assert cfg.voters[0].target == "127.0.0.1:9093"
    assert cfg.controller_listener == Listener("CONTROLLER", "127.0.0.1", 9093)
    assert cfg.broker_listener is None
    assert cfg.metadata_log_dir == Path("/var/kraft/c1")
    assert cfg.controller_quorum_election_timeout_ms == 1000
    assert cfg.controller_quorum_fetch_timeout_ms == 2000
    assert cfg.controller_quorum_election_backoff_max_ms == 1000
    assert cfg.controller_quorum_append_linger_ms == 25
    assert cfg.controller_quorum_request_timeout_ms == 2000
    assert cfg.controller_quorum_retry_backoff_ms == 20
    assert cfg.controller_quorum_fetch_max_wait_ms == 500
    assert cfg.broker_heartbeat_interval_ms == 2000
    assert cfg.broker_session_timeout_ms == 9000
    assert cfg.initial_broker_registration_timeout_ms == 60000
    assert cfg.metadata_log_segment_bytes == 1073741824
    assert cfg.metadata_log_segment_ms == 604800000
    assert cfg.metadata_max_retention_bytes == 104857600
    assert cfg.metadata_max_retention_ms == 604800000
    assert cfg.metadata_log_max_record_bytes_between_snapshots == 20971520
    assert cfg.metadata_log_max_snapshot_interval_ms == 3600000
    assert cfg.metadata_max_idle_interval_ms == 500
    assert cfg.log_segment_bytes == 1073741824
    assert cfg.num_partitions == 1
    assert cfg.default_replication_factor == 1
    assert cfg.metrics_port == 0
    assert cfg.log_level == "INFO"
    assert cfg.grpc_max_message_bytes == 16777216
    assert cfg.kraft_test_append_enable is False
    assert cfg.broker_rack is None
    assert cfg.controller_listener_names == ("CONTROLLER",)


def test_broker_config_views_and_metadata_dir_defaults_to_first_log_dir() -> None:
    cfg = NodeConfig.from_properties({**BROKER, "broker.rack": "rack-a"})
    assert cfg.is_broker and not cfg.is_controller
    assert cfg.broker_listener == Listener("PLAINTEXT", "127.0.0.1", 9092)
    assert cfg.controller_listener is None
    assert cfg.log_dirs == (Path("/var/kraft/b1"), Path("/var/kraft/b1-extra"))
    assert cfg.metadata_log_dir == Path("/var/kraft/b1")
    assert cfg.all_log_dirs == cfg.log_dirs
    assert cfg.broker_rack == "rack-a"


def test_explicit_metadata_dir_is_kept_and_listed_with_log_dirs() -> None:
    cfg = NodeConfig.from_properties({**BROKER, "metadata.log.dir": "/var/kraft/meta"})
    assert cfg.metadata_log_dir == Path("/var/kraft/meta")
    assert cfg.all_log_dirs == (Path("/var/kraft/b1"), Path("/var/kraft/b1-extra"), Path("/var/kraft/meta"))


def test_controller_may_use_metadata_log_dir_without_log_dirs() -> None:
    props = {k: v for k, v in CONTROLLER.items() if k != "log.dirs"}
    cfg = NodeConfig.from_properties({**props, "metadata.log.dir": "/m"})
    assert cfg.metadata_log_dir == Path("/m")
    assert cfg.log_dirs == ()


def test_combined_mode_may_use_a_voter_id_and_has_both_listeners() -> None:
    cfg = NodeConfig.from_properties(COMBINED)
    assert cfg.roles == frozenset({Role.BROKER, Role.CONTROLLER})
    assert cfg.controller_listener == Listener("CONTROLLER", "127.0.0.1", 9093)
    assert cfg.broker_listener == Listener("PLAINTEXT", "127.0.0.1", 9092)


@pytest.mark.parametrize(
    ("key", "value", "attribute", "expected"),
    [
        ("kraft.test.append.enable", "TRUE", "kraft_test_append_enable", True),
        ("kraft.test.append.enable", "false", "kraft_test_append_enable", False),
        ("log.level", "debug", "log_level", "DEBUG"),
        ("log.level", "warn", "log_level", "WARNING"),
        ("controller.quorum.append.linger.ms", "0", "controller_quorum_append_linger_ms", 0),
        ("controller.quorum.election.timeout.ms", " 300 ", "controller_quorum_election_timeout_ms", 300),
        ("metadata.max.retention.bytes", "-1", "metadata_max_retention_bytes", -1),
        ("controller.listener.names", "ctl,other", "controller_listener_names", ("CTL", "OTHER")),
    ],
)
def test_values_are_parsed_into_types(key: str, value: str, attribute: str, expected: object) -> None:
    props = dict(CONTROLLER)
    if key == "controller.listener.names":
        props["listeners"] = "CTL://127.0.0.1:9093"
    assert getattr(NodeConfig.from_properties({**props, key: value}), attribute) == expected


def test_ipv6_and_wildcard_listeners() -> None:
    cfg = NodeConfig.from_properties({**BROKER, "listeners": "PLAINTEXT://[::1]:9092"})
    assert cfg.broker_listener == Listener("PLAINTEXT", "::1", 9092)
    assert cfg.broker_listener.target == "[::1]:9092"
    wildcard = NodeConfig.from_properties({**BROKER, "listeners": "plaintext://:9092"})
    assert wildcard.broker_listener == Listener("PLAINTEXT", "", 9092)
    assert wildcard.broker_listener.bind_address == "0.0.0.0:9092"
    assert wildcard.broker_listener.target == "127.0.0.1:9092"


def test_metrics_bind_on_the_listeners_host_unless_told() -> None:
    """Issue #15: metrics listened on 0.0.0.0 whatever the listener host."""
    assert NodeConfig.from_properties(CONTROLLER).metrics_bind_host == "127.0.0.1"
    ipv6 = NodeConfig.from_properties({**BROKER, "listeners": "PLAINTEXT://[::1]:9092"})
    assert ipv6.metrics_bind_host == "::1"
    wildcard = NodeConfig.from_properties({**BROKER, "listeners": "PLAINTEXT://:9092"})
    assert wildcard.metrics_bind_host == "0.0.0.0"  # the listener itself is on every interface
    told = NodeConfig.from_properties(
        {**BROKER, "listeners": "PLAINTEXT://:9092", "metrics.host": "10.1.2.3"}
    )
    assert told.metrics_bind_host == "10.1.2.3"


# --- validation: every rule fails with one line naming key, value and rule ---------------------------


def _error_for(props: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_properties(props)
    return info.value


def _without(props: dict[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in props.items() if k != key}


@pytest.mark.parametrize(
    ("props", "key", "fragment"),
    [
        ({**CONTROLLER, "node.id": "-1"}, "node.id", "integer >= 0"),
        ({**CONTROLLER, "node.id": "one"}, "node.id", "integer >= 0"),
        ({**CONTROLLER, "process.roles": "brokr"}, "process.roles", "'broker', 'controller'"),
        ({**CONTROLLER, "process.roles": ""}, "process.roles", "'broker', 'controller'"),
        ({**CONTROLLER, "controller.quorum.voters": "1@localhost"}, "controller.quorum.voters", "host:port"),
        ({**CONTROLLER, "controller.quorum.voters": "x@h:1"}, "controller.quorum.voters", "id@host:port"),
        ({**CONTROLLER, "controller.quorum.voters": "1@h:1,1@h:2"}, "controller.quorum.voters", "unique"),
        ({**CONTROLLER, "controller.quorum.voters": "1@h:99999"}, "controller.quorum.voters", "range"),
        ({**CONTROLLER, "controller.quorum.voters": "1@h:0"}, "controller.quorum.voters", "1..65535"),
        ({**CONTROLLER, "controller.quorum.voters": " , "}, "controller.quorum.voters", "at least one"),
        ({**CONTROLLER, "listeners": "127.0.0.1:9093"}, "listeners", "NAME://host:port"),
        (
            {**CONTROLLER, "listeners": "CONTROLLER://h:1,CONTROLLER://h:2"},
            "listeners",
            "unique",
        ),
        ({**CONTROLLER, "controller.quorum.election.timeout.ms": "0"}, "controller.quorum.election", ">= 1"),
        ({**CONTROLLER, "controller.quorum.fetch.timeout.ms": "1.5"}, "controller.quorum.fetch", "integer"),
        ({**CONTROLLER, "controller.quorum.append.linger.ms": "-1"}, "controller.quorum.append", ">= 0"),
        ({**CONTROLLER, "metrics.port": "70000"}, "metrics.port", "<= 65535"),
        ({**CONTROLLER, "log.level": "TRACE"}, "log.level", "DEBUG, INFO"),
        ({**CONTROLLER, "kraft.test.append.enable": "yes"}, "kraft.test.append.enable", "true or false"),
        ({**CONTROLLER, "grpc.max.message.bytes": "10"}, "grpc.max.message.bytes", ">= 1024"),
        ({**CONTROLLER, "num.partitions": "0"}, "num.partitions", ">= 1"),
        ({**CONTROLLER, "no.such.key": "1"}, "no.such.key", "unknown configuration key"),
        ({**CONTROLLER, "node.id": "4"}, "node.id", "must be one of the voter ids"),
        ({**CONTROLLER, "listeners": "OTHER://h:1"}, "listeners", "needs a listener named CONTROLLER"),
        (
            {**CONTROLLER, "listeners": "CONTROLLER://h:1,PLAINTEXT://h:2"},
            "listeners",
            "may only have controller listeners",
        ),
        (_without(CONTROLLER, "log.dirs"), "metadata.log.dir", "needs metadata.log.dir or log.dirs"),
        (_without(BROKER, "log.dirs"), "log.dirs", "a broker needs at least one log directory"),
        ({**BROKER, "log.dirs": " "}, "log.dirs", "a broker needs at least one log directory"),
        ({**BROKER, "node.id": "2"}, "node.id", "broker-only node must not use a voter id"),
        ({**BROKER, "listeners": "CONTROLLER://h:1"}, "listeners", "needs a listener that is not"),
        (
            {**BROKER, "listeners": "PLAINTEXT://h:1,CONTROLLER://h:2"},
            "listeners",
            "must not listen on controller listener",
        ),
        (
            {**BROKER, "broker.heartbeat.interval.ms": "9000"},
            "broker.heartbeat.interval.ms",
            "less than broker.session.timeout.ms",
        ),
        ({**BROKER, "min.insync.replicas": "0"}, "min.insync.replicas", ">= 1"),
        ({**BROKER, "replica.fetch.max.bytes": "0"}, "replica.fetch.max.bytes", ">= 1"),
        ({**BROKER, "replica.fetch.wait.max.ms": "10001"}, "replica.fetch.wait.max.ms", "<= 10000"),
        (
            {**BROKER, "replica.fetch.wait.max.ms": "1000", "replica.lag.time.max.ms": "1000"},
            "replica.fetch.wait.max.ms",
            "less than replica.lag.time.max.ms (1000)",
        ),
        (
            {**BROKER, "replica.fetch.wait.max.ms": "800", "replica.socket.timeout.ms": "500"},
            "replica.fetch.wait.max.ms",
            "less than replica.socket.timeout.ms (500)",
        ),
    ],
)
def test_each_rule_fails_with_one_line_naming_key_value_and_rule(
    props: dict[str, str], key: str, fragment: str
) -> None:
    error = _error_for(props)
    message = str(error)
    assert "\n" not in message
    assert key in message
    assert fragment in message
    assert error.code is ErrorCode.INVALID_CONFIG
    if props.get(key, "").strip():  # a blank value is shown as parsed ('')
        assert repr(props[key]) in message


@pytest.mark.parametrize("missing", ["process.roles", "node.id", "controller.quorum.voters", "listeners"])
def test_missing_required_key_is_named(missing: str) -> None:
    expected = f"missing required config key {missing}"
    if missing == "controller.quorum.voters":  # or the bootstrap servers of a dynamic quorum (KIP-853)
        expected += " (or controller.quorum.bootstrap.servers for a dynamic quorum)"
    assert str(_error_for(_without(CONTROLLER, missing))) == expected


def test_a_dynamic_quorum_takes_bootstrap_servers_instead_of_voters() -> None:
    dynamic = {
        **_without(CONTROLLER, "controller.quorum.voters"),
        "controller.quorum.bootstrap.servers": "h:1,[::1]:2",
    }
    cfg = NodeConfig.from_properties(dynamic)
    assert cfg.dynamic_quorum and cfg.controller_quorum_bootstrap_servers == ("h:1", "[::1]:2")
    assert cfg.controller_addresses == ((-2, "h:1"), (-3, "[::1]:2"))
    both = {**CONTROLLER, "controller.quorum.bootstrap.servers": "h:1"}
    assert "not both" in str(_error_for(both))
    for bad, rule in (
        ("h", "host:port"),
        ("h:0", "1..65535"),
        ("h:1,h:1", "unique"),
        (" , ", "at least one"),
    ):
        message = str(_error_for({**dynamic, "controller.quorum.bootstrap.servers": bad}))
        assert "controller.quorum.bootstrap.servers" in message and rule in message, message


def test_unknown_key_suggests_the_closest_known_key() -> None:
    message = str(_error_for({**CONTROLLER, "controller.quorum.election.timeout": "5"}))
    assert "did you mean controller.quorum.election.timeout.ms?" in message


def test_several_problems_report_the_first_and_count_the_rest() -> None:
    message = str(_error_for({**CONTROLLER, "node.id": "x", "metrics.port": "x", "num.partitions": "x"}))
    assert message.endswith("(and 2 more problems)")


# --- files and round trips --------------------------------------------------------------------------


def test_load_config_reads_a_kafka_style_file(tmp_path: Path) -> None:
    path = tmp_path / "controller.properties"
    path.write_text(
        "# a controller\n"
        "process.roles=controller\n"
        "node.id=2\n"
        "controller.quorum.voters=1@127.0.0.1:9093,\\\n"
        "    2@127.0.0.1:9094,3@127.0.0.1:9095\n"
        "listeners: CONTROLLER://127.0.0.1:9094\n"
        f"metadata.log.dir {tmp_path / 'meta'}\n",
        encoding="utf-8",
    )
    cfg = load_config(path)
    assert cfg.node_id == 2
    assert len(cfg.voters) == 3
    assert cfg.metadata_log_dir == tmp_path / "meta"


def test_load_config_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.properties"):
        load_config(tmp_path / "nope.properties")


@pytest.mark.parametrize("props", [CONTROLLER, BROKER, COMBINED])
def test_to_properties_round_trips(tmp_path: Path, props: dict[str, str]) -> None:
    cfg = NodeConfig.from_properties({**props, "controller.quorum.election.timeout.ms": "300"})
    path = tmp_path / "n.properties"
    path.write_text(cfg.to_properties(header="generated"), encoding="utf-8")
    assert load_config(path) == cfg
    full = cfg.to_properties(include_defaults=True)
    assert "broker.session.timeout.ms=9000" in full
    assert NodeConfig.from_properties(parse_properties(full)) == cfg


def test_build_from_python_values_uses_the_same_rules() -> None:
    cfg = NodeConfig.build(
        process_roles=[Role.BROKER],
        node_id=101,
        controller_quorum_voters=(Voter(1, "127.0.0.1", 9093),),
        listeners=[Listener("PLAINTEXT", "127.0.0.1", 9092)],
        log_dirs=[Path("/d")],
    )
    assert cfg.to_properties_dict() == {
        "process.roles": "broker",
        "node.id": "101",
        "controller.quorum.voters": "1@127.0.0.1:9093",
        "listeners": "PLAINTEXT://127.0.0.1:9092",
        "log.dirs": "/d",
        "metadata.log.dir": "/d",
    }
    with pytest.raises(ConfigError, match=r"node\.id"):
        NodeConfig.build(process_roles="broker", node_id=-5, controller_quorum_voters=VOTERS, listeners="")


DEPLOY_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "config").glob("*.properties"))


@pytest.mark.parametrize("path", DEPLOY_CONFIGS, ids=[p.name for p in DEPLOY_CONFIGS])
def test_shipped_deploy_example_configs_are_valid(path: Path) -> None:
    cfg = load_config(path)
    assert len(cfg.voters) == 3
    assert cfg.is_controller != cfg.is_broker


def test_deploy_examples_cover_three_controllers_and_three_brokers() -> None:
    assert len(DEPLOY_CONFIGS) == 6


def test_replication_keys_have_kafkas_defaults_and_reach_the_broker_settings() -> None:
    cfg = NodeConfig.from_properties(BROKER)
    assert (cfg.min_insync_replicas, cfg.replica_lag_time_max_ms, cfg.replica_fetch_wait_max_ms) == (
        1,
        30000,
        500,
    )
    assert (cfg.replica_fetch_max_bytes, cfg.replica_fetch_response_max_bytes) == (1048576, 10485760)
    assert (cfg.replica_fetch_backoff_ms, cfg.replica_socket_timeout_ms) == (1000, 30000)
    assert cfg.replica_high_watermark_checkpoint_interval_ms == 5000
    assert cfg.unclean_leader_election_enable is False
    assert BrokerSettings.from_config(cfg, "c").replication == ReplicationSettings()
    tuned = NodeConfig.from_properties(
        {
            **BROKER,
            "min.insync.replicas": "2",
            "replica.lag.time.max.ms": "4000",
            "replica.fetch.wait.max.ms": "100",
            "replica.fetch.max.bytes": "65536",
            "replica.fetch.response.max.bytes": "67108864",  # above what one gRPC message carries
            "replica.fetch.backoff.ms": "200",
            "replica.socket.timeout.ms": "3000",
            "replica.high.watermark.checkpoint.interval.ms": "1000",
            "unclean.leader.election.enable": "false",
        }
    )
    assert BrokerSettings.from_config(tuned, "c").replication == ReplicationSettings(
        replica_lag_time_max_ms=4000,
        fetch_max_wait_ms=100,
        fetch_max_bytes=65536,
        fetch_response_max_bytes=16777216 - 65536,  # capped by grpc.max.message.bytes minus the envelope
        fetch_backoff_ms=200,
        request_timeout_ms=3000,
        min_insync_replicas=2,
        hwm_checkpoint_interval_ms=1000,
    )


def test_advertised_listeners_are_what_a_broker_registers_and_it_still_binds_its_listeners() -> None:
    cfg = NodeConfig.from_properties({**BROKER, "advertised.listeners": "PLAINTEXT://proxy.example:19092"})
    settings = BrokerSettings.from_config(cfg, "c")
    assert settings.bind_address == "127.0.0.1:9092"
    assert [(e.name, e.host, e.port) for e in settings.listeners] == [("PLAINTEXT", "proxy.example", 19092)]
    plain = BrokerSettings.from_config(NodeConfig.from_properties(BROKER), "c")
    assert [(e.host, e.port) for e in plain.listeners] == [("127.0.0.1", 9092)]


@pytest.mark.parametrize(
    "advertised",
    ["OTHER://h:1", "PLAINTEXT://:19092", "CONTROLLER://h:1"],
    ids=["unknown", "no-host", "controller"],
)
def test_advertised_listeners_must_name_a_broker_listener_with_a_host(advertised: str) -> None:
    with pytest.raises(ConfigError, match=r"advertised\.listeners"):
        NodeConfig.from_properties({**BROKER, "advertised.listeners": advertised})


def test_a_dynamic_quorum_controller_may_advertise_its_controller_listener() -> None:
    dynamic = {k: v for k, v in CONTROLLER.items() if k != "controller.quorum.voters"}
    dynamic["controller.quorum.bootstrap.servers"] = "127.0.0.1:9093"
    cfg = NodeConfig.from_properties({**dynamic, "advertised.listeners": "CONTROLLER://proxy.example:19093"})
    listener = cfg.controller_listener
    assert listener is not None and (listener.host, listener.port) == ("127.0.0.1", 9093)  # where it binds
    assert (cfg.advertised(listener).host, cfg.advertised(listener).port) == ("proxy.example", 19093)
    # A static quorum's voters are its config: there is nothing to advertise to.
    with pytest.raises(ConfigError, match=r"advertised\.listeners"):
        NodeConfig.from_properties({**CONTROLLER, "advertised.listeners": "CONTROLLER://proxy.example:1"})


def test_unclean_leader_election_and_min_isr_reach_the_controller() -> None:
    """The controller's defaults for topics without their own value (KIP-966's min ISR, unclean election)."""
    from kraft.node.metadata_layer import options_from_config

    cfg = NodeConfig.from_properties(
        {**CONTROLLER, "unclean.leader.election.enable": "true", "min.insync.replicas": "2"}
    )
    options = options_from_config(cfg)
    assert options.unclean_leader_election_enable is True and options.min_insync_replicas == 2
    default = options_from_config(NodeConfig.from_properties(dict(CONTROLLER)))
    assert default.unclean_leader_election_enable is False and default.min_insync_replicas == 1


def test_the_create_topics_preparing_limit_reaches_the_controller() -> None:
    """controller.create.topics.preparing.max (session 16): 0, all at once, unless set; never negative."""
    from kraft.node.metadata_layer import options_from_config

    cfg = NodeConfig.from_properties({**CONTROLLER, "controller.create.topics.preparing.max": "2"})
    assert options_from_config(cfg).create_topics_preparing_max == 2
    assert options_from_config(NodeConfig.from_properties(dict(CONTROLLER))).create_topics_preparing_max == 0
    with pytest.raises(ConfigError, match=r"controller\.create\.topics\.preparing\.max"):
        NodeConfig.from_properties({**CONTROLLER, "controller.create.topics.preparing.max": "-1"})


def test_the_metadata_fetch_wait_cap_reaches_the_controller() -> None:
    """metadata.fetch.max.wait.ms caps a broker's MetadataFetch long-poll (test_controller asserts the cap
    on a manual clock; test_security_attacks that a real cluster answers a 24-day wait)."""
    from kraft.node.metadata_layer import options_from_config

    cfg = NodeConfig.from_properties({**CONTROLLER, "metadata.fetch.max.wait.ms": "2000"})
    assert options_from_config(cfg).metadata_fetch_max_wait_ms == 2000
    assert (
        options_from_config(NodeConfig.from_properties(dict(CONTROLLER))).metadata_fetch_max_wait_ms == 10_000
    )
