"""``kraft storage``: random-uuid, format and info — kafka-storage.sh for kraft."""

from __future__ import annotations

from typing import Annotated

import typer

from kraft.cli.common import CliError, ConfigOption, JsonOption, handle_errors, print_json, print_table
from kraft.cluster.formatting import FormatError, format_node_storage
from kraft.config import load_config
from kraft.features import requested_levels
from kraft.storage.ids import parse_uuid, random_uuid
from kraft.storage.meta_properties import META_PROPERTIES_FILE, read_meta_properties

app = typer.Typer(no_args_is_help=True, help="Format and inspect node storage directories.")


@app.command("random-uuid")
@handle_errors
def random_uuid_command(as_json: JsonOption = False) -> None:
    """Print a new random cluster id (Kafka's 22-character base64url UUID).

    Examples:

      CLUSTER_ID=$(kraft storage random-uuid)

      kraft storage random-uuid --json      # {"cluster_id": "…"}
    """
    cluster_id = random_uuid()
    if as_json:
        print_json({"cluster_id": cluster_id})
        return
    typer.echo(cluster_id)


@app.command("format")
@handle_errors
def format_command(
    config: ConfigOption,
    cluster_id: Annotated[
        str, typer.Option("--cluster-id", "-t", help="From `kraft storage random-uuid`.", show_default=False)
    ],
    ignore_formatted: Annotated[
        bool,
        typer.Option("--ignore-formatted", "-g", help="Skip directories already formatted for this cluster."),
    ] = False,
    standalone: Annotated[
        bool,
        typer.Option(
            "--standalone", "-s", help="Dynamic quorum: format this controller as a one-voter quorum."
        ),
    ] = False,
    initial_controllers: Annotated[
        str | None,
        typer.Option(
            "--initial-controllers",
            "-I",
            help="Dynamic quorum: the first voters, id@host:port:DIRECTORY_ID,… (the same on each of them).",
            show_default=False,
        ),
    ] = None,
    no_initial_controllers: Annotated[
        bool,
        typer.Option(
            "--no-initial-controllers",
            "-N",
            help="Dynamic quorum: a controller that joins later (kraft quorum add-controller).",
        ),
    ] = False,
    release_version: Annotated[
        str | None,
        typer.Option(
            "--release-version",
            "-r",
            help="The metadata.version a new cluster starts at, by release (e.g. 0.1 or 0.1-IV0); "
            "default: the latest this software supports.",
            show_default=False,
        ),
    ] = None,
    feature: Annotated[
        list[str] | None,
        typer.Option(
            "--feature",
            "-f",
            help="A feature level a new cluster starts at, name=level (repeatable), e.g. metadata.version=1.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Write meta.properties into every log directory and the metadata directory of a node.

    Refuses a directory that is already formatted (unless --ignore-formatted) and, always, one formatted
    for another cluster id; nothing is written unless every directory passes.

    A controller without controller.quorum.voters belongs to a dynamic quorum (KIP-853) and needs
    exactly one of --standalone, --initial-controllers or --no-initial-controllers; the first two write
    the first voter set (the bootstrap checkpoint) into the metadata log directory.

    --release-version / --feature (on every controller of a new cluster
    alike) write bootstrap.checkpoint into the metadata directory: the
    feature levels the first active controller writes (kafka-storage.sh
    format --release-version).  An unknown or unsupported one is refused.

    Examples:

      kraft storage format -c controller-1.properties --cluster-id "$ID"

      kraft storage format -c broker-101.properties -t "$ID" --ignore-formatted

      kraft storage format -c controller-1.properties -t "$ID" --standalone

      kraft storage format -c controller-2.properties -t "$ID" --no-initial-controllers

      kraft storage format -c broker-101.properties -t "$ID" -g --json

      kraft storage format -c controller-1.properties -t "$ID" --release-version 0.1
    """
    cfg = load_config(config)
    try:
        parse_uuid(cluster_id)
    except ValueError as exc:
        raise CliError(f"--cluster-id: {exc}; generate one with `kraft storage random-uuid`") from None
    try:
        levels = requested_levels(release_version, list(feature or []))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        results = format_node_storage(
            cfg,
            cluster_id,
            ignore_formatted=ignore_formatted,
            standalone=standalone,
            initial_controllers=initial_controllers,
            no_initial_controllers=no_initial_controllers,
            bootstrap_features=levels,
        )
    except FormatError as exc:
        raise CliError(str(exc)) from None
    if as_json:
        print_json(
            {
                "cluster_id": cluster_id,
                "node_id": cfg.node_id,
                "bootstrap_features": levels if cfg.is_controller else {},
                "dirs": [
                    {
                        "dir": str(result.path),
                        "outcome": "skipped" if result.skipped else "formatted",
                        "directory_id": result.meta.directory_id,
                    }
                    for result in results
                ],
            }
        )
        return
    for result in results:
        if result.skipped:
            typer.echo(f"{result.path} is already formatted for cluster {cluster_id}; skipped")
        else:
            typer.echo(
                f"Formatted {result.path} with cluster.id {cluster_id} node.id {cfg.node_id} "
                f"directory.id {result.meta.directory_id}"
            )


@app.command("info")
@handle_errors
def info_command(config: ConfigOption, as_json: JsonOption = False) -> None:
    """Show each storage directory of a node and its meta.properties; exit 1 if any needs attention.

    Examples:

      kraft storage info --config controller-1.properties

      kraft storage info -c broker-101.properties --json
    """
    cfg = load_config(config)
    rows: list[dict[str, object]] = []
    problems: list[str] = []
    cluster_ids: set[str] = set()
    for directory in cfg.all_log_dirs:
        row: dict[str, object] = {
            "dir": str(directory),
            "metadata_dir": directory == cfg.metadata_log_dir,
            "state": "missing",
            "cluster_id": None,
            "node_id": None,
            "directory_id": None,
            "version": None,
        }
        if directory.is_dir():
            row["state"] = "unformatted"
            if (directory / META_PROPERTIES_FILE).exists():
                meta = read_meta_properties(directory)
                row.update(
                    state="formatted",
                    cluster_id=meta.cluster_id,
                    node_id=meta.node_id,
                    directory_id=meta.directory_id,
                    version=meta.version,
                )
                cluster_ids.add(meta.cluster_id)
                if meta.node_id != cfg.node_id:
                    problems.append(
                        f"{directory} belongs to node {meta.node_id}, the config says {cfg.node_id}"
                    )
        if row["state"] != "formatted":
            problems.append(f"{directory} is {row['state']} (run `kraft storage format`)")
        rows.append(row)
    if len(cluster_ids) > 1:
        problems.append(f"the directories disagree on cluster.id: {', '.join(sorted(cluster_ids))}")
    if as_json:
        print_json({"node_id": cfg.node_id, "dirs": rows, "problems": problems})
    else:
        columns = ["dir", "metadata_dir", "state", "cluster_id", "node_id", "directory_id", "version"]
        print_table(columns, [[row[c] for c in columns] for row in rows], title=f"node {cfg.node_id} storage")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CliError(problems[0] + more)
