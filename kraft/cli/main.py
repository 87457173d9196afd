"""Entry point of the `kraft` command: registers every command group and enforces the error contract.

Each group lives in its own module and exposes a ``typer.Typer`` named ``app``; add one
``_register(...)`` line per group below.  Commands are thin: parse, call, print.

:func:`run` turns every failure into the contract of ``kraft.cli.common``: one ``error: …`` line on
stderr and exit 1 — usage errors included (click would print a multi-line box and exit 2).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import typer

# typer vendors click (typer._click) and exports no usage-error classes; typer is pinned in pyproject.
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from kraft.cli.common import EXPECTED_ERRORS, error_message, print_error

app = typer.Typer(
    name="kraft",
    help="kraft: a KRaft-style Raft metadata quorum — controllers, brokers, and the tools to run them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register(module: str, name: str, help_text: str) -> None:
    sub: typer.Typer = importlib.import_module(f"kraft.cli.{module}").app
    app.add_typer(sub, name=name, help=help_text)


# --- command groups (one line each) ---
_register("storage", "storage", "Format and inspect storage directories (kafka-storage.sh).")
_register("cluster", "cluster", "Run a local cluster: up, status, down, restart, stop, start.")
_register("metadata", "metadata", "Inspect the metadata log offline: dump segments and snapshots.")
importlib.import_module("kraft.cli.metadata_shell")  # adds `kraft metadata shell` to the metadata group
_register("broker", "broker", "Brokers: run one, list, describe, unregister, controlled shutdown.")
_register("topic", "topic", "Topics: create, list, describe, alter, delete, elect-leaders.")
_register("configs", "config", "Topic and dynamic broker configs: describe, alter (kafka-configs.sh).")
_register("offsets", "offsets", "Partition offsets: get (kafka-get-offsets.sh).")
_register("log_dirs", "log-dirs", "Brokers' log dirs: describe sizes and offline dirs (kafka-log-dirs.sh).")
_register("controller", "controller", "Run a controller node (Raft quorum member).")
_register(
    "quorum",
    "quorum",
    "Describe the controller quorum; add and remove controllers (kafka-metadata-quorum.sh).",
)
_register("acl", "acl", "ACLs in the metadata log: add, list, remove (kafka-acls.sh).")
app.command("produce")(importlib.import_module("kraft.cli.produce").produce_command)
app.command("consume")(importlib.import_module("kraft.cli.consume").consume_command)
_register("chaos", "chaos", "Chaos testing: Toxiproxy-compatible proxy, nemeses, checked runs.")
_register("pipeline", "pipeline", "PySpark jobs over kraft logs: metadata report, exact compaction.")
app.command("health")(importlib.import_module("kraft.cli.health").health_command)
app.command("api-versions")(importlib.import_module("kraft.cli.api_versions").api_versions_command)
app.command("demo")(importlib.import_module("kraft.cli.demo").demo_command)


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
    except EXPECTED_ERRORS as exc:
        # A command that forgot @handle_errors still keeps the one-line contract.
        print_error(error_message(exc))
        return 1
    # Commands return None; an int here is the code of a typer.Exit raised inside one.
    return result if isinstance(result, int) else 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
