"""Transport-security configuration: Kafka's keys on a node, ``--command-config`` for clients, and the
one-line errors for every way they can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.cli.common import error_message
from kraft.client.channel import (
    PLAINTEXT_SECURITY,
    SSL,
    KeyStore,
    PemSource,
    TlsMaterialError,
    set_default_security,
)
from kraft.client.properties import load_client_config
from kraft.config import ConfigError, NodeConfig, format_properties, load_config, parse_properties
from kraft.node.metadata_layer import options_from_config
from kraft.security.ca import create_ca, write_cluster_tls, write_private
from kraft.security.tls import (
    TlsError,
    check_node_tls,
    client_security,
    listener_settings,
    outbound_security,
)

VOTERS = "1@127.0.0.1:9093,2@127.0.0.1:9094,3@127.0.0.1:9095"


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tls"
    write_cluster_tls(directory, ["controller-1", "broker-101", "admin"])
    return directory


def controller(tls_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "process.roles": "controller",
        "node.id": "1",
        "controller.quorum.voters": VOTERS,
        "listeners": "CONTROLLER://127.0.0.1:9093",
        "log.dirs": "/var/kraft/c1",
        "listener.security.protocol.map": "CONTROLLER:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls_dir / "controller-1.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls_dir / "ca.pem"),
        "ssl.client.auth": "required",
        **extra,
    }


def broker(tls_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "process.roles": "broker",
        "node.id": "101",
        "controller.quorum.voters": VOTERS,
        "listeners": "BROKER://127.0.0.1:9092",
        "log.dirs": "/var/kraft/b1",
        "listener.security.protocol.map": "CONTROLLER:SSL,BROKER:SSL",
        "ssl.keystore.location": str(tls_dir / "broker-101.pem"),
        "ssl.truststore.location": str(tls_dir / "ca.pem"),
        **extra,
    }


def error_of(props: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        NodeConfig.from_properties(props)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_protocol_map_defaults_to_plaintext_and_names_ssl(tls_dir: Path) -> None:
    plain = NodeConfig.from_properties(
        {k: v for k, v in controller(tls_dir).items() if not k.startswith(("ssl", "listener.s"))}
    )
    assert plain.security_protocol("CONTROLLER") == "PLAINTEXT" and not plain.uses_ssl
    assert plain.security_protocol("SSL") == "SSL"  # Kafka's default map
    assert listener_settings(plain, "CONTROLLER") is None
    assert outbound_security(plain, "CONTROLLER") is PLAINTEXT_SECURITY
    cfg = NodeConfig.from_properties(controller(tls_dir))
    assert cfg.security_protocol("controller") == "SSL" and cfg.uses_ssl
    settings = listener_settings(cfg, "CONTROLLER")
    assert settings is not None and settings.require_client_auth
    assert outbound_security(cfg, "CONTROLLER").protocol == SSL
    assert check_node_tls(cfg) is not None
    # The rendered config reads back the same (the map and the paths survive format_properties).
    assert NodeConfig.from_properties(parse_properties(cfg.to_properties())) == cfg


def test_a_broker_dials_an_ssl_controller_listener_it_does_not_serve(tls_dir: Path) -> None:
    cfg = NodeConfig.from_properties(broker(tls_dir, **{"listener.security.protocol.map": "CONTROLLER:SSL"}))
    assert listener_settings(cfg, "BROKER") is None  # its own listener stays PLAINTEXT
    assert outbound_security(cfg, "CONTROLLER").protocol == SSL


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"listener.security.protocol.map": "CONTROLLER:SASL_SSL"}, "protocol must be PLAINTEXT or SSL"),
        ({"listener.security.protocol.map": "CONTROLLER"}, "is not LISTENER_NAME:PROTOCOL"),
        ({"listener.security.protocol.map": "CONTROLLER:SSL,controller:SSL"}, "must be unique"),
        ({"ssl.keystore.type": "JKS"}, "invalid config ssl.keystore.type='JKS': only PEM is supported"),
        ({"ssl.client.auth": "requested"}, "'requested' is not supported"),
        ({"ssl.client.auth": "none"}, "needs ssl.client.auth=required"),
        (
            {"ssl.principal.mapping.rules": "RULE:^CN=(.*?)$/$1/LU"},
            "invalid config ssl.principal.mapping.rules",
        ),
        ({"ssl.keystore.key": "/etc/key.pem"}, "holds the PEM text itself"),
        ({"ssl.keystore.key": "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----"}, "not both"),
        ({"ssl.truststore.certificates": "-----BEGIN CERTIFICATE-----\n"}, "not both"),
        ({"ssl.keystore.location": ""}, "missing required config key ssl.keystore.location"),
        ({"ssl.truststore.location": ""}, "missing required config key ssl.truststore.location"),
    ],
)
def test_bad_tls_settings_are_one_line_errors_naming_the_key(
    tls_dir: Path, change: dict[str, str], expected: str
) -> None:
    assert expected in error_of(controller(tls_dir, **change))


def test_an_inline_keystore_needs_both_the_key_and_the_chain(tls_dir: Path) -> None:
    key, chain = KeyStore.from_file(tls_dir / "controller-1.pem").read()
    props = controller(tls_dir)
    del props["ssl.keystore.location"]
    assert "missing required config key ssl.keystore.certificate.chain" in error_of(
        {**props, "ssl.keystore.key": key.decode()}
    )
    cfg = NodeConfig.from_properties(
        {**props, "ssl.keystore.key": key.decode(), "ssl.keystore.certificate.chain": chain.decode()}
    )
    settings = check_node_tls(cfg)
    assert settings is not None and settings.load().subject == "CN=controller-1,O=kraft"


def test_missing_unreadable_or_mismatched_files_fail_at_startup_with_one_line(
    tls_dir: Path, tmp_path: Path
) -> None:
    missing = NodeConfig.from_properties(
        controller(tls_dir, **{"ssl.keystore.location": str(tmp_path / "nope.pem")})
    )
    with pytest.raises(TlsError, match=r"cannot read .*nope.pem: No such file or directory"):
        check_node_tls(missing)
    empty = tmp_path / "empty.pem"
    empty.write_text("not a pem\n")
    with pytest.raises(TlsError, match=r"no PEM certificate in .*empty\.pem"):
        check_node_tls(
            NodeConfig.from_properties(controller(tls_dir, **{"ssl.truststore.location": str(empty)}))
        )
    mismatched = tmp_path / "mismatched.pem"
    ca = create_ca()
    write_private(mismatched, ca.issue("a").key_pem + ca.issue("controller-1").chain_pem)
    with pytest.raises(
        TlsError, match="the private key does not belong to the certificate CN=controller-1,O=kraft"
    ):
        check_node_tls(
            NodeConfig.from_properties(controller(tls_dir, **{"ssl.keystore.location": str(mismatched)}))
        )


def test_config_files_with_tls_keys_load(tls_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "c1.properties"
    path.write_text(format_properties(controller(tls_dir)))
    assert load_config(path).ssl_keystore_location == tls_dir / "controller-1.pem"


def test_pem_sources_reread_a_file_only_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "x.pem"
    path.write_bytes(b"one")
    source = PemSource(path=path)
    assert source.read() == b"one"
    path.write_bytes(b"two!")  # another size: another stat
    assert source.read() == b"two!"
    path.unlink()
    with pytest.raises(TlsMaterialError, match="cannot read"):
        source.read()
    with pytest.raises(ValueError):
        PemSource()


def test_command_config_follows_the_kafka_admin_client_keys(tls_dir: Path, tmp_path: Path) -> None:
    assert client_security({}) is PLAINTEXT_SECURITY
    assert client_security({"security.protocol": "plaintext"}) is PLAINTEXT_SECURITY
    props = {
        "security.protocol": "SSL",
        "ssl.truststore.location": str(tls_dir / "ca.pem"),
        "ssl.keystore.location": str(tls_dir / "admin.pem"),
    }
    path = tmp_path / "client.properties"
    path.write_text(format_properties(props))
    security = load_client_config(path).security
    assert security.is_ssl and security.keystore is not None and security.truststore is not None
    # Inline PEM text works too (what Kafka's ssl.truststore.certificates means).
    inline = client_security(
        {"security.protocol": "SSL", "ssl.truststore.certificates": (tls_dir / "ca.pem").read_text()}
    )
    assert inline.is_ssl and inline.keystore is None


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({"security.protocol": "SASL_SSL"}, "must be PLAINTEXT or SSL"),
        ({"bootstrap.servers": "x:1"}, "unknown key in client config"),
        (
            {"security.protocol": "SSL", "ssl.truststore.location": "/no/such/ca.pem"},
            "cannot read /no/such/ca.pem",
        ),
        ({"security.protocol": "SSL", "ssl.truststore.certificates": "x"}, "holds the PEM text itself"),
        ({"security.protocol": "SSL", "ssl.keystore.key": "k"}, "needs both the key and the chain"),
    ],
)
def test_bad_command_configs_are_one_line_errors(props: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        client_security(props)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_an_unreadable_command_config_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read command config"):
        load_client_config(tmp_path / "missing.properties")


def test_the_cli_hints_at_tls_when_a_plaintext_client_meets_an_ssl_listener(tls_dir: Path) -> None:
    closed = OSError("UNAVAILABLE: ipv4:127.0.0.1:9093: Socket closed")
    assert "pass --command-config with security.protocol=SSL" in error_message(closed)
    set_default_security(
        client_security({"security.protocol": "SSL", "ssl.truststore.location": str(tls_dir / "ca.pem")})
    )
    try:
        assert "--command-config" not in error_message(closed)
    finally:
        set_default_security(PLAINTEXT_SECURITY)


def test_the_controller_options_name_the_controller_listeners_protocol(tls_dir: Path) -> None:
    cfg = NodeConfig.from_properties(controller(tls_dir))
    options = options_from_config(cfg)
    assert (options.controller_listener_name, options.controller_security_protocol) == ("CONTROLLER", "SSL")
    plain = NodeConfig.from_properties(
        {k: v for k, v in controller(tls_dir).items() if not k.startswith(("ssl", "listener.s"))}
    )
    assert options_from_config(plain).controller_security_protocol == "PLAINTEXT"
