"""``ssl.principal.mapping.rules``: Kafka's SslPrincipalMapperTest cases, and node identities."""

from __future__ import annotations

import pytest

from kraft.security.mapping import MappingRuleError, SslPrincipalMapper, parse_rules
from kraft.security.principal import NodeIdentity, NodeRole, Principal, node_identity


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules: str) -> None:
    assert parse_rules(rules)


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
    ],
)
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(MappingRuleError):
        parse_rules(rules)


def test_kafka_mapper_examples() -> None:
    mapper = SslPrincipalMapper(
        ", ".join(
            [
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
                "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
                "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
                "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
                "DEFAULT",
            ]
        )
    )
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"


def test_escaped_commas_and_whitespace() -> None:
    mapper = SslPrincipalMapper(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


def test_no_matching_rule_gives_no_name_and_missing_groups_stay_literal() -> None:
    assert SslPrincipalMapper("RULE:^CN=(.*)$/$1/").name("O=x") is None
    assert SslPrincipalMapper("RULE:^CN=(.*)$/$1-$2/").name("CN=a") == "a-$2"
    assert str(SslPrincipalMapper("RULE:^CN=(.*)$/$1/L, DEFAULT")) == "RULE:^CN=(.*)$/$1/L, DEFAULT"


@pytest.mark.parametrize(
    ("name", "identity"),
    [
        ("controller-2", NodeIdentity(NodeRole.CONTROLLER, 2)),
        ("CN=controller-3,O=kraft", NodeIdentity(NodeRole.CONTROLLER, 3)),
        ("CN=broker-101,O=kraft", NodeIdentity(NodeRole.BROKER, 101)),
        ("CN=admin,O=kraft", None),
        ("CN=controller-99999999999,O=kraft", None),
    ],
)
def test_node_identity_of_mapped_names(name: str, identity: NodeIdentity | None) -> None:
    assert node_identity(Principal("User", name)) == identity
