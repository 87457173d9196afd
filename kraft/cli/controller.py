"""``kraft controller start --config F`` — run a controller in the foreground (SIGTERM = graceful stop)."""

from __future__ import annotations

import typer

from kraft.cli.common import CliError, ConfigOption, handle_errors
from kraft.config import load_config
from kraft.observability.logging import configure_logging
from kraft.runtime import RuntimeChoiceError, check_choices, run_server

app = typer.Typer(no_args_is_help=True, help="Run a controller node.")


@app.command("start")
@handle_errors
def start_command(config: ConfigOption) -> None:
    """Run a controller until SIGTERM/SIGINT (graceful stop).

    Refuses storage that is unformatted or formatted for another node.
    Logs go to stderr as key=value lines.

    Examples:

      kraft controller start --config controller-1.properties

      kraft controller start -c config/controller-1.properties 2>c1.log &
    """
    # Imported here so `kraft --help` stays fast (the controller pulls in grpc servers and storage).
    from kraft.node.controller import StartupError, run_controller

    try:
        check_choices()
    except RuntimeChoiceError as exc:
        raise CliError(str(exc)) from None
    cfg = load_config(config)
    configure_logging(cfg.log_level)
    try:
        run_server(run_controller(cfg))
    except StartupError as exc:
        raise CliError(str(exc)) from None
    except RuntimeChoiceError as exc:
        raise CliError(str(exc)) from None
