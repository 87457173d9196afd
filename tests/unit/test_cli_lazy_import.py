"""`kraft` imports a command's module only when that command runs (kraft.cli.main's LazyRootGroup).

Every `kraft` process used to import every command group (grpc, cryptography, pydantic, the cluster
manager…) before parsing its arguments.  These tests pin what a fresh interpreter imports for
``kraft --help`` and ``kraft topic list --help``, and that the root's help, listed from the
placeholders in ``ENTRIES``, is exactly the help the loaded commands give.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer.main
from typer._click import Context

import kraft.cli.main as cli_main

# The modules that register command groups or single commands (kraft.cli.common & co are helpers).
COMMAND_MODULES = {f"kraft.cli.{entry.module}" for entry in cli_main.ENTRIES} | {
    "kraft.cli.metadata_shell",
    "kraft.cli.broker_start",
}


def _imported_after(argv: list[str]) -> tuple[int, set[str]]:
    """Run ``kraft argv`` in a fresh interpreter; its exit code and the modules it imported."""
    code = (
        "import json, sys, contextlib, io\n"
        "import kraft.cli.main as m\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = m.run({argv!r})\n"
        "print(json.dumps([rc, sorted(sys.modules)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    rc, modules = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, set(modules)


def test_root_help_imports_no_command_module_and_no_grpc() -> None:
    rc, modules = _imported_after(["--help"])
    assert rc == 0
    assert modules & COMMAND_MODULES == set()
    assert {"grpc", "cryptography", "pydantic", "kraft.cli.common"} & modules == set()


@pytest.mark.parametrize(
    ("argv", "own", "not_needed"),
    [
        # `kraft cluster`'s local-cluster machinery is no business of `topic list`.
        (["topic", "list", "--help"], {"kraft.cli.topic"}, "kraft.cluster.manager"),
        # consume is a client: the broker's server side stays unimported.
        (["consume", "--help"], {"kraft.cli.consume"}, "kraft.broker.service"),
        # `broker start` imports the broker node when it runs, not when `broker list` does.
        (["broker", "list", "--help"], {"kraft.cli.broker", "kraft.cli.broker_start"}, "kraft.node.broker"),
    ],
    ids=["topic", "consume", "broker"],
)
def test_a_command_imports_its_own_group_only(argv: list[str], own: set[str], not_needed: str) -> None:
    rc, modules = _imported_after(argv)
    assert rc == 0
    assert modules & COMMAND_MODULES == own
    assert not_needed not in modules


def test_metadata_group_still_carries_the_shell() -> None:
    # metadata_shell adds `shell` to the metadata group: loading the group must import it too.
    rc, modules = _imported_after(["metadata", "shell", "--help"])
    assert rc == 0
    assert {"kraft.cli.metadata", "kraft.cli.metadata_shell"} <= modules


def _root_help(group: typer.core.TyperGroup, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with Context(group, info_name="kraft") as ctx:
        returned = group.get_help(ctx)  # typer's rich formatter prints the help itself
    return returned + capsys.readouterr().out


def test_the_listing_from_placeholders_is_the_loaded_commands_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = typer.main.get_command(cli_main.app)
    assert isinstance(group, cli_main.LazyRootGroup)
    commands = group.commands
    assert isinstance(commands, cli_main.LazyCommands)
    listed = _root_help(group, capsys)
    for entry in cli_main.ENTRIES:
        assert entry.name in listed
    # Loading every command (as the real lookups do) must not change a character of the listing.
    loaded = {name: commands[name] for name in list(commands)}
    assert set(loaded) == {entry.name for entry in cli_main.ENTRIES}
    assert _root_help(group, capsys) == listed
    for entry in cli_main.ENTRIES:
        help_text = loaded[entry.name].help or ""
        assert help_text.split("\n\n")[0].strip() == entry.help, entry.name


def test_a_placeholder_is_never_invoked() -> None:
    # Resolving a command outside the help listing gives the real command, with its parameters.
    group = typer.main.get_command(cli_main.app)
    assert isinstance(group, cli_main.LazyRootGroup)
    with Context(group, info_name="kraft") as ctx:
        consume = group.get_command(ctx, "consume")
        assert consume is not None
        assert "--topic" in {opt for param in consume.params for opt in param.opts}
        assert group.get_command(ctx, "no-such-command") is None
