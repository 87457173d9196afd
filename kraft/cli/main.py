"""Entry point of the `kraft` command: registers every command group and enforces the error contract.

Each group lives in its own module and exposes a ``typer.Typer`` named ``app``; add one ``LazyEntry``
line per group (or single command) to :data:`ENTRIES`.  Commands are thin: parse, call, print.

Start-up cost: a command's module (and its grpc, rich, cryptography, pydantic… imports) is imported only
when that command runs or shows its own help — ``kraft topic list`` imports kraft.cli.topic and no other
group, ``kraft --help`` lists every command from :data:`ENTRIES` without importing any
(docs/internals/cli.md).

:func:`run` turns every failure into the contract of ``kraft.cli.common``: one ``error: …`` line on
stderr and exit 1 — usage errors included (click would print a multi-line box and exit 2).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import typer
import typer.main

# typer vendors click (typer._click) and exports no usage-error classes; typer is pinned in pyproject.
from typer._click import Command, Context, HelpFormatter
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperCommand, TyperGroup


@dataclass(frozen=True)
class LazyEntry:
    """One top-level command of ``kraft``, imported only when it runs (or its own help is asked for).

    ``attr`` is ``"app"`` for a command group (a ``typer.Typer``) or the function of a single command;
    ``help`` is what ``kraft --help`` lists without importing ``module`` (for a group the group's help,
    for a single command the first paragraph of its docstring — a test keeps them equal);
    ``extra_modules`` are imported with it (modules that add commands to the group).
    """

    name: str
    module: str
    attr: str
    help: str
    extra_modules: tuple[str, ...] = ()

    def load(self) -> Command:
        module = importlib.import_module(f"kraft.cli.{self.module}")
        for extra in self.extra_modules:
            importlib.import_module(f"kraft.cli.{extra}")
        # Built exactly as an eager registration on the root app would build it.
        holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        target = getattr(module, self.attr)
        if isinstance(target, typer.Typer):
            holder.add_typer(target, name=self.name, help=self.help)
        else:
            holder.command(self.name)(target)
        return typer.main.get_group(holder).commands[self.name]

    def placeholder(self) -> Command:
        """What the root's help lists: the name and help text, nothing imported."""
        return TyperCommand(name=self.name, help=self.help)


# --- commands (one line each): single commands first, then the groups — typer's own order ---
ENTRIES: tuple[LazyEntry, ...] = (
    LazyEntry(
        "produce",
        "produce",
        "produce_command",
        "Append records to a topic partition through its leader; prints their offsets.",
    ),
    LazyEntry(
        "consume",
        "consume",
        "consume_command",
        "Read records of a topic partition from its leader; one value per line.",
    ),
    LazyEntry(
        "health",
        "health",
        "health_command",
        "grpc.health.v1 Check of nodes; exit 1 unless every check is SERVING.",
    ),
    LazyEntry(
        "api-versions",
        "api_versions",
        "api_versions_command",
        "Per node: kraft version, the gRPC services and methods it serves, and metadata.version (supported\n"
        "range, finalized level) — what kafka-broker-api-versions.sh tells a Kafka operator.",
    ),
    LazyEntry(
        "demo",
        "demo",
        "demo_command",
        "Start a local demo cluster and walk through topics, produce/consume and the quorum tools.",
    ),
    LazyEntry("storage", "storage", "app", "Format and inspect storage directories (kafka-storage.sh)."),
    LazyEntry("cluster", "cluster", "app", "Run a local cluster: up, status, down, restart, stop, start."),
    LazyEntry(
        "metadata",
        "metadata",
        "app",
        "Inspect the metadata log offline: dump segments and snapshots.",
        extra_modules=("metadata_shell",),  # adds `kraft metadata shell` to the metadata group
    ),
    LazyEntry(
        "broker", "broker", "app", "Brokers: run one, list, describe, unregister, controlled shutdown."
    ),
    LazyEntry("topic", "topic", "app", "Topics: create, list, describe, alter, delete, elect-leaders."),
    LazyEntry(
        "config", "configs", "app", "Topic and dynamic broker configs: describe, alter (kafka-configs.sh)."
    ),
    LazyEntry("offsets", "offsets", "app", "Partition offsets: get (kafka-get-offsets.sh)."),
    LazyEntry(
        "features", "features", "app", "Feature levels: describe, upgrade, downgrade (kafka-features.sh)."
    ),
    LazyEntry(
        "log-dirs",
        "log_dirs",
        "app",
        "Brokers' log dirs: describe sizes and offline dirs (kafka-log-dirs.sh).",
    ),
    LazyEntry("controller", "controller", "app", "Run a controller node (Raft quorum member)."),
    LazyEntry(
        "quorum",
        "quorum",
        "app",
        "Describe the controller quorum; add and remove controllers (kafka-metadata-quorum.sh).",
    ),
    LazyEntry("acl", "acl", "app", "ACLs in the metadata log: add, list, remove (kafka-acls.sh)."),
    LazyEntry("chaos", "chaos", "app", "Chaos testing: Toxiproxy-compatible proxy, nemeses, checked runs."),
    LazyEntry(
        "pipeline", "pipeline", "app", "PySpark jobs over kraft logs: metadata report, exact compaction."
    ),
)


class LazyCommands(MutableMapping[str, Command]):
    """The root's sub-commands: every name known up front, each module imported on first access.

    Iterating (names, ``keys()``) imports nothing; reading a value (``[name]``, ``get``, ``items()``)
    imports that command's module — so the usual click/typer code paths work unchanged.
    """

    def __init__(self, entries: Sequence[LazyEntry]) -> None:
        self._entries = {entry.name: entry for entry in entries}
        self._loaded: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        command = self._loaded.get(name)
        if command is None:
            command = self._loaded[name] = self._entries[name].load()  # KeyError: no such command
        return command

    def __setitem__(self, name: str, command: Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if self._entries.pop(name, None) is None and name not in self._loaded:
            raise KeyError(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        yield from self._entries
        yield from (name for name in self._loaded if name not in self._entries)

    def __len__(self) -> int:
        return len(self._entries.keys() | self._loaded.keys())

    def listed(self, name: str) -> Command | None:
        """The command as the help lists it: the loaded one, else a placeholder (no import)."""
        if name in self._loaded:
            return self._loaded[name]
        entry = self._entries.get(name)
        return entry.placeholder() if entry is not None else None


class LazyRootGroup(TyperGroup):
    """``kraft`` itself: a group whose commands come from :data:`ENTRIES`, imported on demand.

    ``kraft topic list`` imports kraft.cli.topic and nothing else of the CLI; ``kraft --help`` imports
    no command module at all.
    """

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        lazy = LazyCommands(ENTRIES)
        for name, command in self.commands.items():  # anything registered on `app` directly
            lazy[name] = command
        self.commands = lazy
        self._listing = False

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if self._listing and isinstance(self.commands, LazyCommands):
            return self.commands.listed(cmd_name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # the names, in registration order, without importing anything

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        # Only the listing reads the commands here: placeholders, so the help imports no module.
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="kraft",
    cls=LazyRootGroup,
    help="kraft: a KRaft-style Raft metadata quorum — controllers, brokers, and the tools to run them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    # A callback makes typer build `kraft` as a group although no command is registered on it directly.
    pass


PROG_NAME = "kraft"


def _usage_error_line(exc: UsageError) -> str:
    message = exc.format_message().strip().rstrip(".")
    if exc.ctx is None:  # raised by the option parser before a context existed
        return f"{PROG_NAME}: {message} (see '{PROG_NAME} … --help')"
    path = exc.ctx.command_path
    return f"{path}: {message} (see '{path} --help')"


def _missing_command_line(exc: NoArgsIsHelpError) -> str:
    # The help was already printed to stdout by typer's rich formatter (without rich it is the message).
    text = exc.format_message().strip()
    if text:
        print(text)
    return f"{exc.ctx.command_path}: missing command (the commands are listed above)"


def print_error(message: str) -> None:
    from kraft.cli.common import print_error as print_one_line

    print_one_line(message)


def run(argv: Sequence[str] | None = None) -> int:
    """Run ``kraft`` with ``argv`` (default: ``sys.argv[1:]``) and return the exit status.

    0 on success and for ``--help``; a command's ``typer.Exit(code)`` keeps its code; every error
    prints exactly one ``error: …`` line on stderr and gives 1.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # standalone_mode=False: click hands usage errors to us instead of printing its box and exiting 2;
        # typer.Exit (incl. --help's Exit(0) and fail()'s Exit(1)) comes back as the return value.
        result = app(args=args, prog_name=PROG_NAME, standalone_mode=False)
    except NoArgsIsHelpError as exc:
        print_error(_missing_command_line(exc))
        return 1
    except UsageError as exc:
        print_error(_usage_error_line(exc))
        return 1
    except typer.TyperException as exc:  # the rest of click's errors (e.g. a file that cannot be opened)
        print_error(exc.format_message())
        return 1
    except typer.Abort:
        print_error("aborted")
        return 1
    except Exception as exc:
        # kraft.cli.common (grpc, rich) is imported here, not at start-up: `kraft --help` needs neither.
        from kraft.cli.common import EXPECTED_ERRORS, error_message

        if not isinstance(exc, EXPECTED_ERRORS):
            raise
        # A command that forgot @handle_errors still keeps the one-line contract.
        print_error(error_message(exc))
        return 1
    # Commands return None; an int here is the code of a typer.Exit raised inside one.
    return result if isinstance(result, int) else 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
