"""Entry point of the `kraft` command: registers every command group.

Each group lives in its own module and exposes a ``typer.Typer`` named ``app``; add one
``_register(...)`` line per group below.  Commands are thin: parse, call, print.
"""

from __future__ import annotations

import importlib

import typer

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
_register("topic", "topic", "Topics: create, list, describe, delete.")
_register("controller", "controller", "Run a controller node (Raft quorum member).")
_register("quorum", "quorum", "Describe the controller quorum (kafka-metadata-quorum.sh).")
_register("produce", "produce", "Append records to a topic partition through its leader.")
_register("consume", "consume", "Read records of a topic partition from its leader.")
_register("chaos", "chaos", "Chaos testing: Toxiproxy-compatible proxy, nemeses, checked runs.")
_register("pipeline", "pipeline", "PySpark jobs over kraft logs: metadata report, exact compaction.")
app.command("demo")(importlib.import_module("kraft.cli.demo").demo_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
