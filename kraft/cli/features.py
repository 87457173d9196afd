"""``kraft features describe | upgrade | downgrade``: finalized feature levels (kafka-features.sh).

``describe`` asks a controller's ApiVersions (the range its software supports, the level finalized in its
committed image); ``upgrade`` / ``downgrade`` send UpdateFeatures to the active controller, which checks
the levels against its software and every registered broker, refuses a downgrade the metadata cannot
represent, and writes a FeatureLevelRecord (:mod:`kraft.metadata.feature_control`).  Levels and release
names: :mod:`kraft.features`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from kraft.cli.api_versions import ask_node
from kraft.cli.common import (
    DEFAULT_TIMEOUT_S,
    CliError,
    ClusterDirOption,
    CommandConfigOption,
    JsonOption,
    OptionalBootstrapControllerOption,
    TimeoutOption,
    VerboseOption,
    admin_client,
    bootstrap_from,
    bootstrap_targets,
    handle_errors,
    print_json,
    print_table,
    request_timeout_s,
    run_async,
)
from kraft.client.admin import AdminClient
from kraft.client.controller import MIN_ATTEMPT_S
from kraft.errors import ErrorCode, KraftError
from kraft.features import METADATA_VERSION_FEATURE, release_of, requested_levels
from kraft.metadata.feature_control import SAFE_DOWNGRADE, UPGRADE
from kraft.v1 import controller_pb2 as cpb

app = typer.Typer(
    no_args_is_help=True, help="Feature levels: describe, upgrade, downgrade (kafka-features.sh)."
)

ReleaseVersionOption = Annotated[
    str | None,
    typer.Option(
        "--release-version",
        help="metadata.version by release, e.g. 0.1 (its latest level) or 0.1-IV0.",
        show_default=False,
    ),
]
FeatureOption = Annotated[
    list[str] | None,
    typer.Option("--feature", help="name=level (repeatable), e.g. metadata.version=1.", show_default=False),
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Check only; change nothing.")]


def _client(bootstrap: str, verbose: bool, timeout_s: float) -> AdminClient:
    return admin_client(bootstrap, timeout_s, verbose)


def features_json(node: dict[str, Any]) -> dict[str, Any]:
    """The ``features describe --json`` object from a controller's ApiVersions (as
    :func:`kraft.cli.api_versions.node_json` shows it): per feature, the supported range and finalized
    level."""
    finalized: dict[str, int] = node["finalized_features"]
    supported: dict[str, list[int]] = node["supported_features"]
    names = sorted(supported.keys() | finalized.keys())
    rows = []
    for name in names:
        low, high = supported.get(name, [None, None])
        level = finalized.get(name)
        row: dict[str, Any] = {
            "feature": name,
            "supported_min": low,
            "supported_max": high,
            "finalized_level": level,
        }
        if name == METADATA_VERSION_FEATURE:
            row["release"] = None if level is None else release_of(level)
        rows.append(row)
    return {"controller_id": node["node_id"], "features": rows}


async def _describe(bootstrap: str, timeout_s: float) -> dict[str, Any]:
    """ApiVersions of the first controller that answers (any controller does, active or not), starting at
    the random address the other commands start at; ``timeout_s`` bounds them all and each attempt gets at
    most ``request.timeout.ms`` (a hung first controller used to take the whole ``--timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    problems = []
    for target in bootstrap_targets(bootstrap):
        left_s = deadline - loop.time()
        if left_s < MIN_ATTEMPT_S:
            problems.append(f"{target}: not asked, the {timeout_s:g}s --timeout passed")
            break
        node = await ask_node("controller", target, min(request_timeout_s(), left_s))
        if node["error"] is None:
            return node
        problems.append(f"{target}: {node['error']}")
    raise CliError(f"no controller answered ApiVersions ({'; '.join(problems)})")


@app.command("describe")
@handle_errors
def describe_command(
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Supported and finalized feature levels (kafka-features.sh describe).

    Per feature: the levels the controller's software supports and the
    level finalized in the cluster, as the answering controller's committed
    image holds it.

    Examples:

      kraft features describe --bootstrap-controller 127.0.0.1:9093

      kraft features describe --cluster-dir /tmp/c --json
    """
    bootstrap = bootstrap_from(bootstrap_controller, cluster_dir)
    described = features_json(run_async(_describe(bootstrap, timeout)))
    if as_json:
        print_json(described)
        return
    print_table(
        ["Feature", "SupportedMin", "SupportedMax", "FinalizedLevel", "Release"],
        [
            [
                r["feature"],
                r["supported_min"],
                r["supported_max"],
                r["finalized_level"],
                r.get("release") or "-",
            ]
            for r in described["features"]
        ],
        title=f"features (controller {described['controller_id']})",
    )


async def _update(
    bootstrap: str, updates: list[cpb.FeatureUpdate], dry_run: bool, verbose: bool, timeout_s: float
) -> cpb.UpdateFeaturesResponse:
    async with _client(bootstrap, verbose, timeout_s) as client:
        return await client.update_features(updates, dry_run)


def _run_update(
    upgrade_type: int,
    release_version: str | None,
    feature: list[str] | None,
    dry_run: bool,
    bootstrap: str,
    verbose: bool,
    timeout: float,
    as_json: bool,
) -> None:
    try:
        levels = requested_levels(release_version, list(feature or []), check=False)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not levels:
        raise CliError("nothing to change: give --release-version and/or --feature name=level")
    updates = [
        cpb.FeatureUpdate(feature=name, max_version_level=level, upgrade_type=upgrade_type)
        for name, level in levels.items()
    ]
    response = run_async(_update(bootstrap, updates, dry_run, verbose, timeout))
    refused = [r for r in response.results if r.error_code != ErrorCode.NONE]
    if refused:
        # The refused update's own reason, not the "not applied" of the others.
        first = min(refused, key=lambda r: r.error_code == ErrorCode.INVALID_REQUEST)
        raise KraftError(ErrorCode.from_wire(first.error_code), first.error_message)
    outcome = "validated" if dry_run else "finalized"
    if as_json:
        print_json({"result": outcome, "features": levels})
        return
    verb = "would be finalized" if dry_run else "finalized"
    typer.echo(", ".join(f"{name} {level} {verb}" for name, level in levels.items()))


@app.command("upgrade")
@handle_errors
def upgrade_command(
    release_version: ReleaseVersionOption = None,
    feature: FeatureOption = None,
    dry_run: DryRunOption = False,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Finalize a higher feature level (kafka-features.sh upgrade).

    The active controller refuses a level its software or any registered
    broker does not support, and a lower one (use downgrade); the level the
    cluster is at again is a no-op.

    Examples:

      kraft features upgrade --bootstrap-controller 127.0.0.1:9093 \\
          --release-version 0.1

      kraft features upgrade --cluster-dir /tmp/c \\
          --feature metadata.version=1 --dry-run
    """
    bootstrap = bootstrap_from(bootstrap_controller, cluster_dir)
    _run_update(UPGRADE, release_version, feature, dry_run, bootstrap, verbose, timeout, as_json)


@app.command("downgrade")
@handle_errors
def downgrade_command(
    release_version: ReleaseVersionOption = None,
    feature: FeatureOption = None,
    dry_run: DryRunOption = False,
    bootstrap_controller: OptionalBootstrapControllerOption = None,
    cluster_dir: ClusterDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Finalize a lower feature level where nothing is lost (kafka-features.sh
    downgrade).

    Refused when a level between the two changed what the metadata log
    holds (the lower level could not represent it), when the level is below
    what the software or a broker supports, and for a higher one.

    Examples:

      kraft features downgrade --bootstrap-controller 127.0.0.1:9093 \\
          --feature metadata.version=1
    """
    bootstrap = bootstrap_from(bootstrap_controller, cluster_dir)
    _run_update(SAFE_DOWNGRADE, release_version, feature, dry_run, bootstrap, verbose, timeout, as_json)
