"""``kraft metadata shell``: query an image store (SQLite) read-only with SQL.

The store is the applied metadata image a controller or broker keeps in
``<metadata.log.dir>/metadata-image.sqlite``; its tables are documented in
:mod:`kraft.metadata.store` (``meta``, ``brokers``, ``topics``, ``partitions``, ``configs``, ``features``).
``-c SQL`` runs statements and exits; otherwise statements are read from stdin (``;``-terminated, plus
``.tables``, ``.schema [TABLE]``, ``.help``, ``.quit``).  The file is opened with ``mode=ro``: nothing
here can change it.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kraft.cli.common import CliError, JsonOption, handle_errors, print_json, print_table
from kraft.cli.metadata import app
from kraft.config import load_config
from kraft.metadata.store import IMAGE_STORE_FILE

HELP = """\
SQL statements end with ';'.  Tables: meta, brokers, topics, partitions, configs, features.
  .tables            list the tables
  .schema [TABLE]    show CREATE statements
  .help              this text
  .quit              leave
Example: SELECT t.name, p.partition_id, p.leader, p.isr FROM partitions p JOIN topics t USING (topic_id);"""


def resolve_store(db: Path | None, config: Path | None) -> Path:
    if db is None and config is None:
        raise CliError("give --db PATH or --config F (the store is <metadata.log.dir>/metadata-image.sqlite)")
    if db is None:
        assert config is not None
        cfg = load_config(config)
        base = cfg.metadata_log_dir or (cfg.log_dirs[0] if cfg.log_dirs else None)
        if base is None:
            raise CliError(f"{config}: neither metadata.log.dir nor log.dirs is set")
        db = Path(base) / IMAGE_STORE_FILE
    if not db.is_file():
        raise CliError(f"{db}: no image store there")
    return db


def open_read_only(path: Path) -> sqlite3.Connection:
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        connection.execute("SELECT 1 FROM meta LIMIT 1")
    except sqlite3.Error as exc:
        raise CliError(f"{path}: not a readable image store ({exc})") from None
    return connection


def run_statement(db: sqlite3.Connection, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    try:
        cursor = db.execute(sql)
    except sqlite3.Error as exc:
        raise CliError(f"SQL error: {exc}") from None
    columns = [d[0] for d in cursor.description or ()]
    return columns, cursor.fetchall()


def _print(columns: list[str], rows: list[tuple[Any, ...]], as_json: bool) -> None:
    if as_json:
        print_json([dict(zip(columns, row, strict=True)) for row in rows])
    elif columns:
        print_table(columns, rows)


def dot_command(db: sqlite3.Connection, line: str) -> tuple[list[str], list[tuple[Any, ...]]] | None:
    """Run a dot command; None means quit."""
    words = line.split()
    if words[0] in (".quit", ".exit"):
        return None
    if words[0] == ".tables":
        return run_statement(db, "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
    if words[0] == ".schema":
        if len(words) > 1:
            return ["sql"], db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (words[1],)).fetchall()
        return run_statement(db, "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")
    sys.stdout.write(HELP + "\n")
    return [], []


def interactive(db: sqlite3.Connection, as_json: bool) -> None:
    prompt = sys.stdin.isatty()
    buffer = ""
    while True:
        if prompt:
            sys.stdout.write("kraft> " if not buffer else "   ..> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            break
        stripped = line.strip()
        if not buffer and stripped.startswith("."):
            result = dot_command(db, stripped)
            if result is None:
                break
            _print(*result, as_json)
            continue
        buffer += line
        if stripped.endswith(";"):
            try:
                _print(*run_statement(db, buffer), as_json)
            except CliError as exc:
                # one bad query must not end an interactive session
                sys.stderr.write(f"error: {exc}\n")
            buffer = ""
    if buffer.strip():
        _print(*run_statement(db, buffer), as_json)


@app.command("shell")
@handle_errors
def shell_command(
    db: Annotated[
        Path | None, typer.Option("--db", help="The image store file (metadata-image.sqlite).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="A node's .properties (finds its store).")
    ] = None,
    command: Annotated[
        list[str] | None, typer.Option("--command", "-c", help="SQL to run (repeatable); no prompt.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Query a metadata image store read-only with SQL (tables: meta, brokers, topics, partitions, …).

    Without -c it reads statements from stdin (a prompt on a terminal);
    .help there lists the tables and dot commands.

    Examples:

      kraft metadata shell --config config/broker-101.properties

      kraft metadata shell --db data/metadata-image.sqlite -c .tables

      kraft metadata shell --config config/controller-1.properties \\
          -c "SELECT broker_id, fenced FROM brokers;" --json
    """
    path = resolve_store(db, config)
    connection = open_read_only(path)
    try:
        if command:
            for sql in command:
                result = (
                    dot_command(connection, sql)
                    if sql.strip().startswith(".")
                    else run_statement(connection, sql)
                )
                if result is not None:
                    _print(*result, as_json)
        else:
            interactive(connection, as_json)
    finally:
        connection.close()
