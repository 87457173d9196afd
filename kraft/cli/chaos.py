"""``kraft chaos proxy``: the Toxiproxy-compatible proxy server; ``kraft chaos run``: checked chaos runs."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
import typer.core
from typer._click import Context, HelpFormatter

from kraft.cli.common import MAX_WAIT_S, CliError, JsonOption, handle_errors, print_json, print_table
from kraft.procutil import reap_children_on_exit

app = typer.Typer(no_args_is_help=True, help="Chaos testing: a Toxiproxy-compatible proxy and checked runs.")


async def _serve_proxy(
    host: str, port: int, seed: int | None, config: Path | None, allow_remote_listen: bool
) -> None:
    # Imported here: every kraft process (controllers, brokers) loads the CLI, and none needs the proxy.
    from chaos.proxy import ApiError, ToxiproxyServer

    server = ToxiproxyServer(host, port, seed, allow_remote_listen=allow_remote_listen)
    try:
        await server.start(config)
    except ApiError as exc:
        raise CliError(f"--config {config}: {exc.message}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sys.stderr.write(f"toxiproxy-compatible API listening on {server.url} (API version 2.12.0)\n")
    sys.stderr.flush()
    serving = asyncio.create_task(server.serve_forever())
    try:
        await stop.wait()
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await server.stop()


@app.command("proxy")
@handle_errors
def proxy_command(
    host: Annotated[str, typer.Option("--host", help="Address the HTTP API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="HTTP API port.")] = 8474,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for toxicity draws and jitter.")] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", exists=True, dir_okay=False, help="JSON array of proxies to create first."),
    ] = None,
    allow_remote_listen: Annotated[
        bool,
        typer.Option(
            "--allow-remote-listen",
            help="Let proxies listen on non-loopback addresses (default: 0.0.0.0/:port become 127.0.0.1).",
        ),
    ] = False,
) -> None:
    """Run a Toxiproxy-API-compatible proxy server in the foreground (Ctrl-C or SIGTERM stops it).

    --config takes a JSON array in the POST /populate format.  Proxies listen on loopback addresses
    only unless --allow-remote-listen is given.

    Examples:

      kraft chaos proxy --port 8474

      kraft chaos proxy --host 127.0.0.1 --port 8474 --seed 7

      kraft chaos proxy --port 8474 --config proxies.json
    """
    try:
        asyncio.run(_serve_proxy(host, port, seed, config, allow_remote_listen))
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"--config {config}: not a JSON array of proxies: {exc}") from None


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


SCENARIOS_PLACEHOLDER = "{scenarios}"


class _ScenarioHelpCommand(typer.core.TyperCommand):
    """Fills the scenario list into the help from ``chaos.scenarios.SCENARIOS`` when help is shown: the
    registry is the one list (importing it costs ~0.7 s, too much for every kraft process at start)."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        if self.help and SCENARIOS_PLACEHOLDER in self.help:
            from chaos.scenarios import SCENARIOS

            self.help = self.help.replace(SCENARIOS_PLACEHOLDER, ", ".join(SCENARIOS))
        super().format_help(ctx, formatter)


@app.command("run", cls=_ScenarioHelpCommand)
@handle_errors
def run_command(
    scenario: Annotated[str, typer.Option("--scenario", help="A scenario name, or all.")] = "mixed",
    seed: Annotated[int, typer.Option("--seed", help="Seed for the fault schedule and the workload.")] = 1,
    duration: Annotated[
        float, typer.Option("--duration", min=1.0, max=MAX_WAIT_S, help="Seconds of faults per scenario.")
    ] = 20.0,
    report: Annotated[
        Path, typer.Option("--report", help="Report directory (one subdirectory per scenario).")
    ] = Path("chaos-report"),
    controllers: Annotated[int, typer.Option("--controllers", min=1, help="Controllers.")] = 3,
    brokers: Annotated[int, typer.Option("--brokers", min=0, help="Brokers.")] = 1,
    clients: Annotated[int, typer.Option("--clients", min=1, help="Concurrent workload clients.")] = 4,
    recovery: Annotated[
        float, typer.Option("--recovery", min=1.0, max=MAX_WAIT_S, help="Seconds allowed to recover.")
    ] = 30.0,
    as_json: JsonOption = False,
) -> None:
    """Run checked chaos scenarios; print the verdicts; exit 1 if any checker found a violation.

    Scenarios: {scenarios}, or all.

    A violation prints the command that reproduces it.

    Examples:

      kraft chaos run --scenario isolate-leader --seed 7 --duration 30

      kraft chaos run --scenario all --report /tmp/chaos-report

      kraft chaos run --scenario kill --brokers 3 --clients 8 --recovery 60
    """
    # The run's controllers and brokers (and their process groups) end with it however it ends: Ctrl-C,
    # ``timeout``'s SIGTERM, a closed terminal (before, they kept running after an interrupted run).
    reap_children_on_exit()
    from chaos.runner import RunOptions, failed_verdicts, run_scenario
    from chaos.scenarios import DATA_PLANE_MIN_BROKERS, DATA_PLANE_SCENARIOS, scenario_names
    from chaos.workload import WorkloadOptions

    try:
        names = scenario_names(scenario)
    except ValueError as exc:
        raise CliError(f"--scenario: {exc}") from None
    if scenario in DATA_PLANE_SCENARIOS and brokers < DATA_PLANE_MIN_BROKERS:
        raise CliError(
            f"--brokers: {scenario} needs at least {DATA_PLANE_MIN_BROKERS} (replication factor 3)"
        )
    invalid: list[str] = []
    reproduce: dict[str, str] = {}
    rows: list[list[object]] = []
    for name in names:
        options = RunOptions(
            scenario=name,
            seed=seed,
            duration_s=duration,
            report_dir=report / name,
            controllers=controllers,
            # "all" runs the replicated data-plane scenario with the 3 brokers it needs.
            brokers=max(brokers, DATA_PLANE_MIN_BROKERS) if name in DATA_PLANE_SCENARIOS else brokers,
            recovery_bound_s=recovery,
            workload=WorkloadOptions(clients=clients),
        )
        if (options.report_dir / "history.sqlite").exists():
            raise CliError(f"{options.report_dir} already holds a run; choose another --report directory")
        result = asyncio.run(run_scenario(options, _progress))
        rows += [[name, v.checker, v.status.value.upper(), v.summary] for v in result.verdicts]
        if failed_verdicts(result):
            invalid.append(name)
            reproduce[name] = options.reproduce_command()
            _progress(f"[{name}] VIOLATION (seed {seed}); reproduce with: {reproduce[name]}")
    if as_json:
        columns = ("scenario", "checker", "status", "summary")
        print_json(
            {
                "seed": seed,
                "verdicts": [dict(zip(columns, row, strict=True)) for row in rows],
                "reports": {name: str(report / name / "report.html") for name in names},
                "violations": [{"scenario": n, "reproduce": reproduce[n]} for n in invalid],
            }
        )
    else:
        print_table(["scenario", "checker", "status", "summary"], rows, title=f"chaos verdicts (seed {seed})")
        typer.echo(f"reports: {report}/<scenario>/report.html")
    if invalid:
        raise CliError(f"violations found in {', '.join(invalid)}; see {report}/<scenario>/report.html")
