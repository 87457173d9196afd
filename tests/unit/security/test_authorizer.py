"""The standard authorizer's semantics (Kafka's StandardAuthorizer, KIP-801): deny beats allow, literal /
prefixed / wildcard patterns, implied operations, super users, default deny, and a naive oracle checked
against the indexed implementation over generated ACL sets."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.security.acl import (
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    StandardAcl,
)
from kraft.security.authorizer import (
    Action,
    Authorizer,
    AuthorizerSettings,
    cluster_action,
    parse_super_users,
)
from kraft.security.principal import Principal

ALICE = Principal("User", "alice")
BOB = Principal("User", "bob")
ON = AuthorizerSettings(enabled=True)
ALLOW = AclPermissionType.ALLOW
DENY = AclPermissionType.DENY
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED
TOPIC = ResourceType.TOPIC
OP = AclOperation


def acl(
    name: str,
    operation: AclOperation,
    permission: AclPermissionType = ALLOW,
    principal: str = "User:alice",
    pattern: PatternType = LITERAL,
    host: str = "*",
    resource_type: ResourceType = TOPIC,
) -> StandardAcl:
    return StandardAcl(resource_type, name, pattern, principal, host, operation, permission)


def authorizer(*acls: StandardAcl, settings: AuthorizerSettings = ON) -> Authorizer:
    table = {f"id-{i}": a for i, a in enumerate(acls)}
    return Authorizer(settings, lambda: table)


def allowed(
    auth: Authorizer, topic: str, operation: AclOperation, who: Principal = ALICE, host: str = "10.0.0.1"
) -> bool:
    return auth.authorize(who, host, Action(TOPIC, topic, operation)).allowed


def test_without_acls_everything_is_denied_by_default() -> None:
    auth = authorizer()
    assert not allowed(auth, "orders", OP.READ)
    assert not auth.authorize(ALICE, "", cluster_action(OP.DESCRIBE)).allowed
    assert auth.authorize(ALICE, "", cluster_action(OP.DESCRIBE)).rule == "DefaultDeny"


def test_allow_everyone_if_no_acl_found_only_where_a_resource_has_no_acl_at_all() -> None:
    settings = AuthorizerSettings(enabled=True, allow_everyone_if_no_acl_found=True)
    auth = authorizer(acl("orders", OP.READ, principal="User:bob"), settings=settings)
    assert allowed(auth, "payments", OP.WRITE)  # no ACL names payments
    assert not allowed(auth, "orders", OP.READ)  # orders has ACLs, none for alice
    assert allowed(auth, "orders", OP.READ, who=BOB)


def test_deny_beats_allow_whatever_the_pattern_that_carries_it() -> None:
    auth = authorizer(
        acl("orders", OP.READ),
        acl("ord", OP.READ, DENY, pattern=PREFIXED),
    )
    assert not allowed(auth, "orders", OP.READ)
    wildcard = authorizer(acl("orders", OP.ALL), acl("*", OP.WRITE, DENY, principal="User:*"))
    assert not allowed(wildcard, "orders", OP.WRITE)
    assert allowed(wildcard, "orders", OP.READ)


def test_literal_prefixed_and_wildcard_patterns() -> None:
    auth = authorizer(
        acl("orders", OP.READ),
        acl("etl-", OP.WRITE, pattern=PREFIXED),
        acl("*", OP.DESCRIBE, principal="User:*"),
    )
    assert allowed(auth, "orders", OP.READ)
    assert not allowed(auth, "orders-eu", OP.READ)  # a literal is not a prefix
    assert allowed(auth, "etl-daily", OP.WRITE)
    assert allowed(auth, "etl-", OP.WRITE)
    assert not allowed(auth, "etl", OP.WRITE)  # shorter than the prefix
    assert allowed(auth, "anything", OP.DESCRIBE, who=BOB)  # LITERAL * and User:*
    assert not allowed(auth, "anything", OP.READ, who=BOB)


def test_implied_operations_apply_to_allow_acls_only() -> None:
    auth = authorizer(acl("orders", OP.READ), acl("cfg", OP.ALTER_CONFIGS))
    assert allowed(auth, "orders", OP.DESCRIBE)  # READ implies DESCRIBE
    assert not allowed(auth, "orders", OP.WRITE)
    assert allowed(auth, "cfg", OP.DESCRIBE_CONFIGS)  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
    assert not allowed(auth, "cfg", OP.DESCRIBE)  # …but not DESCRIBE
    for operation in (OP.WRITE, OP.DELETE, OP.ALTER):
        assert allowed(authorizer(acl("t", operation)), "t", OP.DESCRIBE)
    denied_read = authorizer(acl("orders", OP.ALL), acl("orders", OP.READ, DENY))
    assert allowed(denied_read, "orders", OP.DESCRIBE)  # a DENY READ does not deny DESCRIBE
    assert not allowed(denied_read, "orders", OP.READ)
    assert not allowed(authorizer(acl("orders", OP.ALL), acl("orders", OP.ALL, DENY)), "orders", OP.DESCRIBE)


def test_super_users_are_allowed_everything_even_against_deny_acls() -> None:
    settings = AuthorizerSettings(
        enabled=True, super_users=parse_super_users("User:admin; User:controller-1")
    )
    auth = authorizer(acl("*", OP.ALL, DENY, principal="User:*"), settings=settings)
    admin = Principal("User", "admin")
    assert allowed(auth, "orders", OP.DELETE, who=admin)
    assert auth.authorize(admin, "", cluster_action(OP.ALTER)).rule == "SuperUser"
    assert not allowed(auth, "orders", OP.READ)


def test_hosts_match_exactly_or_by_wildcard() -> None:
    auth = authorizer(acl("orders", OP.READ, host="10.0.0.1"))
    assert allowed(auth, "orders", OP.READ, host="10.0.0.1")
    assert not allowed(auth, "orders", OP.READ, host="10.0.0.2")


def test_cluster_resource_and_resource_types_are_separate() -> None:
    auth = authorizer(
        acl(
            CLUSTER_RESOURCE_NAME,
            OP.CLUSTER_ACTION,
            principal="User:broker-1",
            resource_type=ResourceType.CLUSTER,
        )
    )
    broker = Principal("User", "broker-1")
    assert auth.authorize(broker, "", cluster_action(OP.CLUSTER_ACTION)).allowed
    assert not auth.authorize(broker, "", cluster_action(OP.ALTER)).allowed
    assert not allowed(auth, CLUSTER_RESOURCE_NAME, OP.CLUSTER_ACTION, who=broker)  # a topic of that name


def test_a_new_acl_set_is_seen_by_the_next_decision() -> None:
    table: dict[str, StandardAcl] = {}
    current: list[Mapping[str, StandardAcl]] = [table]
    auth = Authorizer(ON, lambda: current[0])
    assert not allowed(auth, "orders", OP.READ)  # cached as denied for this ACL set
    current[0] = {"a": acl("orders", OP.READ)}  # images replace the mapping, never mutate it
    assert allowed(auth, "orders", OP.READ)
    current[0] = {"a": acl("orders", OP.READ), "b": acl("orders", OP.READ, DENY)}
    assert not allowed(auth, "orders", OP.READ)


# ---- the indexed authorizer against a naive reading of the rules ----

NAMES = ["a", "ab", "abc", "b", "*"]
OPERATIONS = [OP.ALL, OP.READ, OP.WRITE, OP.DESCRIBE, OP.ALTER, OP.ALTER_CONFIGS, OP.DESCRIBE_CONFIGS]

acls_strategy = st.lists(
    st.builds(
        StandardAcl,
        st.sampled_from([TOPIC, ResourceType.GROUP]),
        st.sampled_from(NAMES),
        st.sampled_from([LITERAL, PREFIXED]),
        st.sampled_from(["User:alice", "User:bob", "User:*"]),
        st.sampled_from(["*", "h1", "h2"]),
        st.sampled_from(OPERATIONS),
        st.sampled_from([ALLOW, DENY]),
    ).filter(lambda a: not (a.pattern_type is PREFIXED and a.resource_name == "*")),
    max_size=8,
)


def oracle(
    acls: list[StandardAcl], settings: AuthorizerSettings, who: str, host: str, action: Action
) -> bool:
    if who in settings.super_users:
        return True

    def applies(a: StandardAcl) -> bool:
        if a.resource_type is not action.resource_type:
            return False
        if a.pattern_type is LITERAL:
            return a.resource_name in (action.resource_name, "*")
        return action.resource_name.startswith(a.resource_name)

    def operation_ok(a: StandardAcl) -> bool:
        implied = {
            OP.DESCRIBE: {OP.READ, OP.WRITE, OP.DELETE, OP.ALTER, OP.DESCRIBE},
            OP.DESCRIBE_CONFIGS: {OP.ALTER_CONFIGS, OP.DESCRIBE_CONFIGS},
        }
        if a.operation in (OP.ALL, action.operation):
            return True
        return a.permission is ALLOW and a.operation in implied.get(action.operation, set())

    resource_acls = [a for a in acls if applies(a)]
    matching = [
        a
        for a in resource_acls
        if a.principal in (who, "User:*") and a.host in ("*", host) and operation_ok(a)
    ]
    if any(a.permission is DENY for a in matching):
        return False
    if matching:
        return True
    return not resource_acls and settings.allow_everyone_if_no_acl_found


@settings(max_examples=400, derandomize=True)
@given(
    acls=acls_strategy,
    who=st.sampled_from(["User:alice", "User:bob", "User:carol"]),
    host=st.sampled_from(["h1", "h2", ""]),
    resource_type=st.sampled_from([TOPIC, ResourceType.GROUP]),
    name=st.sampled_from(["a", "ab", "abc", "abd", "b", "x"]),
    operation=st.sampled_from(OPERATIONS),
    allow_if_none=st.booleans(),
    bob_is_super=st.booleans(),
)
def test_the_indexed_authorizer_agrees_with_the_rules_read_naively(
    acls: list[StandardAcl],
    who: str,
    host: str,
    resource_type: ResourceType,
    name: str,
    operation: AclOperation,
    allow_if_none: bool,
    bob_is_super: bool,
) -> None:
    settings = AuthorizerSettings(
        enabled=True,
        super_users=frozenset({"User:bob"} if bob_is_super else ()),
        allow_everyone_if_no_acl_found=allow_if_none,
    )
    auth = authorizer(*acls, settings=settings)
    action = Action(resource_type, name, operation)
    expected = oracle(acls, settings, who, host, action)
    assert auth.authorize(Principal.parse(who), host, action).allowed is expected
    assert auth.authorize(Principal.parse(who), host, action).allowed is expected  # cached: the same


def test_super_users_parse_with_semicolons_and_refuse_bad_principals() -> None:
    assert parse_super_users("User:admin;User:controller-1;") == {"User:admin", "User:controller-1"}
    assert parse_super_users("") == frozenset()
    try:
        parse_super_users("admin")
    except ValueError as exc:
        assert "TYPE:NAME" in str(exc)
    else:
        raise AssertionError("a principal without a type must be refused")
