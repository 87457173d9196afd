"""``kraft metadata dump``: decode segments and snapshots offline (kafka-dump-log.sh).

Batch headers and control records are decoded by storage; record payloads by a decoder plugged in via
:func:`kraft.storage.dump.register_record_decoder` for the duration of one file:

- a metadata log (a file in ``__cluster_metadata-0``, any snapshot, or any file with
  ``--cluster-metadata-decoder``): ``kraft.metadata.records.describe_value``, always — the records are
  what the log is for;
- a partition log (``orders-0`` …): sizes only, as kafka-dump-log.sh prints them; with
  ``--print-data-log`` the key and value, as text when they are printable UTF-8, else as hex.  A
  partition's records are never pushed through the metadata decoder (it would call each one damaged).

``--offsets-from``/``--offsets-to`` (inclusive) select the segment records to show; segments wholly
outside the range are not read at all.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from kraft.cli.common import CliError, JsonOption, handle_errors, print_json
from kraft.metadata.records import describe_value
from kraft.storage.dump import (
    RecordDecoder,
    dump_file,
    format_file_dump,
    log_dir_files,
    register_record_decoder,
    unregister_record_decoder,
)
from kraft.storage.log import METADATA_LOG_DIR_NAME
from kraft.storage.segment import LOG_SUFFIX
from kraft.storage.snapshot import SNAPSHOT_SUFFIX

app = typer.Typer(no_args_is_help=True, help="Inspect the metadata log offline.")

MAX_FILES = 10_000  # --files entries (after splitting commas): a typo'd glob must not read a whole disk


def _describe_metadata_value(_key: bytes | None, value: bytes | None) -> dict[str, Any] | None:
    # describe_value renders undecodable bytes as an error entry itself; None values are not metadata.
    return None if value is None else describe_value(value)


def render_bytes(data: bytes | None) -> dict[str, Any] | None:
    """A key or value for --print-data-log: ``{"text": …}`` when it is printable UTF-8, else
    ``{"hex": …}``; None stays None (a null key, a tombstone's value)."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": data.hex()}
    if all(ch.isprintable() or ch in "\t\n\r" for ch in text):
        return {"text": text}
    return {"hex": data.hex()}


def _describe_data(key: bytes | None, value: bytes | None) -> dict[str, Any] | None:
    return {"key": render_bytes(key), "value": render_bytes(value)}


def is_metadata_file(path: Path) -> bool:
    """Snapshots exist only for the metadata log; segments by their directory's name."""
    return path.name.endswith(SNAPSHOT_SUFFIX) or path.parent.name == METADATA_LOG_DIR_NAME


@contextmanager
def _decoding(decoder: RecordDecoder | None) -> Iterator[None]:
    # The registry is process-wide: while this file is dumped, of this command's decoders only its own
    # is registered (decoders other code registered stay; they answer for the records they claim).
    for other in (_describe_metadata_value, _describe_data):
        if other is not decoder:
            unregister_record_decoder(other)
    if decoder is not None:
        register_record_decoder(decoder)
    try:
        yield
    finally:
        if decoder is not None:
            unregister_record_decoder(decoder)


def _base_offset(path: Path) -> int | None:
    try:
        return int(path.name.removesuffix(LOG_SUFFIX)) if path.name.endswith(LOG_SUFFIX) else None
    except ValueError:
        return None


def _segments_in_range(files: list[Path], first: int, last: int) -> list[Path]:
    """Drop the segments wholly outside [first, last], judged by base offsets in file names (a
    segment ends where the next one of the same directory begins)."""
    bases: dict[Path, list[int]] = {}
    for path in files:
        base = _base_offset(path)
        if base is not None:
            bases.setdefault(path.parent, []).append(base)
    for values in bases.values():
        values.sort()
    kept: list[Path] = []
    for path in files:
        base = _base_offset(path)
        if base is None:
            kept.append(path)
            continue
        siblings = bases[path.parent]
        after = bisect.bisect_right(siblings, base)
        next_base = siblings[after] if after < len(siblings) else None
        if base > last or (next_base is not None and next_base <= first):
            continue
        kept.append(path)
    return kept


def _filter_offsets(dump: dict[str, Any], first: int, last: int) -> dict[str, Any]:
    batches = []
    for batch in dump["batches"]:
        if batch["lastOffset"] < first or batch["baseOffset"] > last:
            continue
        if "records" in batch:
            records = [r for r in batch["records"] if first <= r["offset"] <= last]
            batches.append({**batch, "records": records})
        else:
            batches.append(batch)
    return {**dump, "batches": batches}


def _resolve_inputs(log_dir: Path | None, files: list[str] | None, ranged: bool) -> list[Path]:
    if (log_dir is None) == (not files):
        from typer._click.exceptions import UsageError
        from typer._click.globals import get_current_context

        # As a missing required option was before --files existed: a usage error of this command.
        problem = (
            "Missing option '--log-dir' (or --files)"
            if log_dir is None
            else "give --log-dir or --files, not both"
        )
        raise UsageError(problem, ctx=get_current_context(silent=True))
    if log_dir is not None:
        if not log_dir.is_dir():
            raise CliError(f"--log-dir {log_dir}: not a directory")
        if not log_dir_files(log_dir) and (log_dir / METADATA_LOG_DIR_NAME).is_dir():
            log_dir = log_dir / METADATA_LOG_DIR_NAME  # given metadata.log.dir itself: its metadata log
        found = log_dir_files(log_dir)
        if not found:
            raise CliError(f"--log-dir {log_dir}: no segment (*.log) or snapshot (*.checkpoint) files")
        # A snapshot's records carry no log offsets: with a range, only the segments are dumped.
        return [p for p in found if not (ranged and p.name.endswith(SNAPSHOT_SUFFIX))]
    assert files is not None
    paths = [Path(part) for entry in files for part in entry.split(",") if part]
    if len(paths) > MAX_FILES:
        raise CliError(f"--files: {len(paths)} files, at most {MAX_FILES}")
    for path in paths:
        if not path.is_file():
            raise CliError(f"--files {path}: not a file")
        if not path.name.endswith((LOG_SUFFIX, SNAPSHOT_SUFFIX)):
            raise CliError(f"--files {path}: not a segment (*.log) or snapshot (*.checkpoint)")
    return paths


@app.command("dump")
@handle_errors
def dump_command(
    log_dir: Annotated[
        Path | None,
        typer.Option(
            "--log-dir",
            help="A partition log directory, e.g. <metadata.log.dir>/__cluster_metadata-0 or "
            "<log.dirs>/orders-0 (given metadata.log.dir itself, its __cluster_metadata-0 is used).",
            show_default=False,
        ),
    ] = None,
    files: Annotated[
        list[str] | None,
        typer.Option(
            "--files",
            help="Segment (*.log) or snapshot (*.checkpoint) files instead of a directory "
            "(repeatable, or comma-separated as in kafka-dump-log.sh).",
            show_default=False,
        ),
    ] = None,
    print_data_log: Annotated[
        bool,
        typer.Option(
            "--print-data-log",
            help="Partition logs: print each record's key and value (text, or hex if not printable). "
            "Metadata records are always decoded.",
        ),
    ] = False,
    cluster_metadata_decoder: Annotated[
        bool,
        typer.Option(
            "--cluster-metadata-decoder",
            help="Decode the records as metadata records whatever directory the files are in.",
        ),
    ] = False,
    offsets_from: Annotated[
        int | None,
        typer.Option("--offsets-from", min=0, help="First offset to show (inclusive).", show_default=False),
    ] = None,
    offsets_to: Annotated[
        int | None,
        typer.Option("--offsets-to", min=0, help="Last offset to show (inclusive).", show_default=False),
    ] = None,
    as_json: JsonOption = False,
    headers_only: Annotated[
        bool, typer.Option("--headers-only", help="Batch headers only, no records.")
    ] = False,
) -> None:
    """Print every batch of every segment (*.log) and snapshot (*.checkpoint) — kafka-dump-log.sh.

    A damaged file is reported at its first invalid batch (exit status 0).
    Reads files only: safe on a running node's directory.
    --offsets-from/--offsets-to: only the batches and records in that range.
    A --log-dir's snapshots are then left out (no log offsets in them);
    a snapshot named in --files is shown whole.

    Examples:

      kraft metadata dump --log-dir data/controller-1/__cluster_metadata-0

      kraft metadata dump --log-dir data/controller-1 --headers-only

      kraft metadata dump --log-dir data/controller-1 --json | jq length

      kraft metadata dump --print-data-log \\
          --files data/broker-101/orders-0/00000000000000000000.log

      kraft metadata dump --log-dir data/controller-1 --offsets-from 10 \\
          --offsets-to 20
    """
    ranged = offsets_from is not None or offsets_to is not None
    first = offsets_from if offsets_from is not None else 0
    last = offsets_to if offsets_to is not None else (1 << 63) - 1
    if first > last:
        raise CliError(f"--offsets-from {first} is past --offsets-to {last}")
    paths = _resolve_inputs(log_dir, files, ranged)
    if ranged:
        paths = _segments_in_range(paths, first, last)
    dumps = []
    for path in paths:
        if cluster_metadata_decoder or is_metadata_file(path):
            decoder: RecordDecoder | None = _describe_metadata_value
        else:
            decoder = _describe_data if print_data_log else None
        with _decoding(decoder):
            dump = dump_file(path, with_records=not headers_only)
        if ranged and not path.name.endswith(SNAPSHOT_SUFFIX):
            dump = _filter_offsets(dump, first, last)
        if not as_json:
            for line in format_file_dump(dump):
                typer.echo(line)
        else:
            dumps.append(dump)
    if as_json:
        print_json(dumps)
