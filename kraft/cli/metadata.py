"""``kraft metadata dump``: decode segments and snapshots of a log directory offline (kafka-dump-log.sh).

Batch headers and control records are decoded by storage; metadata record payloads by the decoder that
``kraft.metadata.records.describe_value`` provides, plugged in via
:func:`kraft.storage.dump.register_record_decoder`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kraft.cli.common import CliError, JsonOption, handle_errors, print_json
from kraft.metadata.records import describe_value
from kraft.storage.dump import dump_log_dir, format_file_dump, log_dir_files, register_record_decoder
from kraft.storage.log import METADATA_LOG_DIR_NAME

app = typer.Typer(no_args_is_help=True, help="Inspect the metadata log offline.")


def _describe_metadata_value(_key: bytes | None, value: bytes | None) -> dict[str, Any] | None:
    # describe_value renders undecodable bytes as an error entry itself; None values are not metadata.
    return None if value is None else describe_value(value)


@app.command("dump")
@handle_errors
def dump_command(
    log_dir: Annotated[
        Path,
        typer.Option(
            "--log-dir",
            help="A partition log directory, e.g. <metadata.log.dir>/__cluster_metadata-0 "
            "(given metadata.log.dir itself, its __cluster_metadata-0 is used).",
        ),
    ],
    as_json: JsonOption = False,
    headers_only: Annotated[
        bool, typer.Option("--headers-only", help="Batch headers only, no records.")
    ] = False,
) -> None:
    """Print every batch of every segment (*.log) and snapshot (*.checkpoint).

    A damaged file is reported at its first invalid batch (exit status 0).
    Reads files only: safe on a running node's directory.

    Examples:

      kraft metadata dump --log-dir data/controller-1/__cluster_metadata-0

      kraft metadata dump --log-dir data/controller-1 --headers-only

      kraft metadata dump --log-dir data/controller-1 --json | jq length
    """
    if not log_dir.is_dir():
        raise CliError(f"--log-dir {log_dir}: not a directory")
    if not log_dir_files(log_dir) and (log_dir / METADATA_LOG_DIR_NAME).is_dir():
        log_dir = log_dir / METADATA_LOG_DIR_NAME  # given metadata.log.dir itself: dump its metadata log
    if not log_dir_files(log_dir):
        raise CliError(f"--log-dir {log_dir}: no segment (*.log) or snapshot (*.checkpoint) files")
    register_record_decoder(_describe_metadata_value)
    dumps = dump_log_dir(log_dir, with_records=not headers_only)
    if as_json:
        print_json(list(dumps))
        return
    for dump in dumps:
        for line in format_file_dump(dump):
            typer.echo(line)
