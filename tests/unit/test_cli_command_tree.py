"""Scripting contract over the whole ``kraft`` command tree: every command that prints takes ``--json``,
every command that dials a node takes ``--command-config`` and ``--timeout``.

Every command must be classified below, so a new command fails this test until someone decides which
contract it owes (and the exemptions stay a short, documented list)."""

from __future__ import annotations

from collections.abc import Iterator

import typer.main
from typer._click import Command

from kraft.cli.main import app

SERVERS = {"demo", "controller start", "broker start", "chaos proxy"}
"""Long-running foreground processes: they print a listening line and logs, no result to script."""

DIALS_NODES = {
    "produce",
    "consume",
    "health",
    "api-versions",
    "broker list",
    "broker describe",
    "broker unregister",
    "broker shutdown",
    "topic create",
    "topic list",
    "topic describe",
    "topic alter",
    "topic delete",
    "topic elect-leaders",
    "config describe",
    "config alter",
    "features describe",
    "features upgrade",
    "features downgrade",
    "offsets get",
    "log-dirs describe",
    "quorum describe",
    "quorum add-controller",
    "quorum remove-controller",
    "acl add",
    "acl list",
    "acl remove",
}
"""Client commands: TLS settings from ``--command-config`` (add-controller: the joining controller's
config, whose keystore it dials with), a bounded wait from ``--timeout``."""

LOCAL_CLUSTER = {
    "cluster up",
    "cluster status",
    "cluster down",
    "cluster restart",
    "cluster stop",
    "cluster start",
}
"""They dial the nodes of a cluster directory with its own ``client.properties`` (no ``--command-config``)
and wait at most ``--timeout``."""

OFFLINE = {
    "storage random-uuid",
    "storage format",
    "storage info",
    "metadata dump",
    "metadata shell",
    "pipeline metadata-report",
    "pipeline compact",
    "chaos run",  # starts, faults and stops its own cluster; bounded by --duration and --recovery
}
"""Files and local processes only."""


def _walk(command: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Command]]:
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield " ".join(path), command
        return
    for name in list(subcommands):
        yield from _walk(subcommands[name], (*path, name))


def _options(command: Command) -> set[str]:
    return {option for param in command.params for option in getattr(param, "opts", ())}


COMMANDS = dict(_walk(typer.main.get_group(app)))


def test_every_command_is_classified_once() -> None:
    groups = [SERVERS, DIALS_NODES, LOCAL_CLUSTER, OFFLINE]
    classified = [name for group in groups for name in group]
    assert len(classified) == len(set(classified)), "a command is in two groups"
    assert set(COMMANDS) == set(classified)


def test_every_command_that_prints_a_result_takes_json() -> None:
    missing = sorted(
        name
        for name, command in COMMANDS.items()
        if name not in SERVERS and "--json" not in _options(command)
    )
    assert missing == []


def test_every_command_that_dials_a_node_takes_command_config_and_timeout() -> None:
    for name in sorted(DIALS_NODES):
        assert {"--command-config", "--timeout"} <= _options(COMMANDS[name]), name
    for name in sorted(LOCAL_CLUSTER):
        assert "--timeout" in _options(COMMANDS[name]), name


def test_voter_changes_show_their_retries_and_health_takes_cluster_dir() -> None:
    for name in ("quorum add-controller", "quorum remove-controller"):
        assert "--verbose" in _options(COMMANDS[name]), name
    assert {"--cluster-dir", "--dir"} <= _options(COMMANDS["health"])
