"""``kraft metadata shell``: browse metadata offline — SQL over an image store, or a tree of a snapshot.

SQL mode (``--db``/``--config``): the store is the applied metadata image a controller or broker keeps
in ``<metadata.log.dir>/metadata-image.sqlite``; its tables are documented in
:mod:`kraft.metadata.store` (``meta``, ``brokers``, ``topics``, ``partitions``, ``configs``,
``features``).  ``-c SQL`` runs statements and exits; otherwise statements are read from stdin
(``;``-terminated, plus ``.tables``, ``.schema [TABLE]``, ``.help``, ``.quit``).  The file is opened with
``mode=ro``: nothing here can change it.

Tree mode (``--snapshot F`` or ``--log-dir D``), as kafka-metadata-shell.sh: the image rebuilt from the
files (see :mod:`kraft.cli.metadata_tree`) is browsed with ``ls``, ``cat``, ``tree`` — given as
arguments (``kraft metadata shell --snapshot F ls /topics``) or, without them, read line by line from
stdin (plus ``cd``, ``pwd``, ``help``, ``exit``).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from kraft.cli.common import CliError, JsonOption, handle_errors, print_json, print_table
from kraft.cli.metadata import app
from kraft.cli.metadata_tree import ImageLoader, Tree, cat, lookup, ls, render, resolve, tree_lines
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


TREE_HELP = """\
Paths: /brokers /topics/<name>/<partition> /configs /features /acls /cluster
  ls [PATH]      list a directory (directories end in /)
  cat PATH       print a file
  tree [PATH]    everything under PATH
  cd [PATH]      change directory (default /)
  pwd            print the directory
  help           this text
  exit           leave"""

TREE_COMMANDS = ("ls", "cat", "tree")


def _tree_command(tree: Tree, cwd: str, words: list[str], as_json: bool) -> None:
    """Run one of ls/cat/tree and print its result."""
    command, args = words[0], words[1:]
    if command not in TREE_COMMANDS:
        raise CliError(f"unknown command {command!r} (one of {', '.join(TREE_COMMANDS)})")
    if len(args) > 1 or (command == "cat" and not args):
        raise CliError(f"usage: {command} {'PATH' if command == 'cat' else '[PATH]'}")
    path = resolve(cwd, args[0] if args else None)
    if command == "ls":
        names = ls(tree, path)
        if as_json:
            print_json(names)
        else:
            for name in names:
                typer.echo(name)
    elif command == "cat":
        value = cat(tree, path)
        if as_json:
            print_json(value)
        else:
            typer.echo(render(value))
    elif as_json:
        print_json(lookup(tree, path))
    else:
        for line in tree_lines(tree, path):
            typer.echo(line)


def tree_interactive(tree: Tree, as_json: bool) -> None:
    prompt = sys.stdin.isatty()
    cwd = "/"
    while True:
        if prompt:
            sys.stdout.write(f"kraft:{cwd}> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            break
        words = line.split()
        if not words:
            continue
        if words[0] in ("exit", "quit", ".quit"):
            break
        try:
            if words[0] == "help":
                typer.echo(TREE_HELP)
            elif words[0] == "pwd":
                typer.echo(cwd)
            elif words[0] == "cd":
                target = resolve(cwd, words[1] if len(words) > 1 else "/")
                if not isinstance(lookup(tree, target), Tree):
                    raise CliError(f"{target}: not a directory")
                cwd = target
            else:
                _tree_command(tree, cwd, words, as_json)
        except CliError as exc:
            # one bad command must not end an interactive session
            sys.stderr.write(f"error: {exc}\n")


def _load_tree(snapshot: Path | None, log_dir: Path | None) -> Tree:
    loader = ImageLoader()
    if snapshot is not None:
        loader.load_snapshot(snapshot)
    else:
        assert log_dir is not None
        loader.load_log_dir(log_dir)
    tree = loader.tree()
    if loader.problem_count:
        sys.stderr.write(
            f"warning: {loader.problem_count} records could not be read or replayed "
            "(cat /cluster/replayErrors)\n"
        )
    return tree


@app.command("shell")
@handle_errors
def shell_command(
    words: Annotated[
        list[str] | None,
        typer.Argument(
            help="Tree mode: one command (ls [PATH] | cat PATH | tree [PATH]); "
            "none: commands are read from stdin.",
            show_default=False,
        ),
    ] = None,
    snapshot: Annotated[
        Path | None,
        typer.Option("--snapshot", help="Browse this snapshot (*.checkpoint) as a tree.", show_default=False),
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            "--log-dir",
            help="Browse a metadata log directory as a tree (newest snapshot + segments after it).",
            show_default=False,
        ),
    ] = None,
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
    """Browse metadata offline: SQL over an image store, or a snapshot / metadata log as a tree.

    SQL mode (--db or --config): without -c it reads statements from stdin.
    .help there lists the tables and dot commands.

    Tree mode (--snapshot or --log-dir), like kafka-metadata-shell.sh:
    ls, cat and tree over /brokers, /topics/<name>/<partition>, /configs,
    /features, /acls and /cluster.
    Without a command it reads commands from stdin (help lists them).

    Examples:

      kraft metadata shell --snapshot 00000000000000000120-0000000002.checkpoint \\
          ls /topics

      kraft metadata shell --log-dir data/controller-1 cat /topics/orders/0/data

      kraft metadata shell --log-dir data/controller-1 tree /brokers --json

      kraft metadata shell --config config/broker-101.properties

      kraft metadata shell --db data/metadata-image.sqlite -c .tables

      kraft metadata shell --config config/controller-1.properties \\
          -c "SELECT broker_id, fenced FROM brokers;" --json
    """
    if snapshot is not None or log_dir is not None:
        if snapshot is not None and log_dir is not None:
            raise CliError("give --snapshot F or --log-dir D, not both")
        if db is not None or config is not None or command:
            raise CliError("--db/--config/-c are the SQL mode; --snapshot/--log-dir the tree mode")
        tree = _load_tree(snapshot, log_dir)
        if words:
            _tree_command(tree, "/", words, as_json)
        else:
            tree_interactive(tree, as_json)
        return
    if words:
        raise CliError(f"{' '.join(words)}: commands like ls/cat/tree need --snapshot F or --log-dir D")
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
