"""Every option of ``kraft`` that takes a wait (seconds or ms) refuses ``inf``, ``nan`` and values beyond
Kafka's INT bound with one usage-error line and exit 1 — before any IO: ``--timeout inf`` once passed
``min=0.1`` and reached asyncio and gRPC deadlines (issue #17)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import typer
from typer._click.core import Command, Context

from kraft.cli.common import MAX_WAIT_MS, MAX_WAIT_S
from kraft.cli.main import app, run

_WAIT_WORDS = ("timeout", "duration", "recovery", "interval", "wait", "delay", "linger", "backoff")


def _commands(group: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Command]]:
    ctx = Context(group)
    names = group.list_commands(ctx) if hasattr(group, "list_commands") else []
    if not names:
        yield path, group
    for name in names:
        sub = group.get_command(ctx, name)  # type: ignore[attr-defined]
        assert sub is not None
        yield from _commands(sub, (*path, name))


def _wait_options() -> list[tuple[str, str, object, object]]:
    """(command path, option, its annotation, its max) for every option that takes a wait."""
    found = []
    for path, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            opts = getattr(param, "opts", [])
            name = opts[0] if opts else ""
            annotation = param.type_descriptor.annotation  # type: ignore[attr-defined]
            is_float = annotation in (float, float | None)
            is_ms = name.endswith("-ms") and any(word in name for word in _WAIT_WORDS)
            if is_float or is_ms:
                found.append((" ".join(path), name, annotation, getattr(param, "max", None)))
    return found


def test_every_wait_option_has_a_finite_bound() -> None:
    options = _wait_options()
    assert len(options) >= 15, options  # the walk found the commands' options
    for command, name, annotation, bound in options:
        limit = MAX_WAIT_MS if name.endswith("-ms") else MAX_WAIT_S
        assert isinstance(bound, int | float) and math.isfinite(bound), (command, name, annotation)
        assert bound <= limit, (command, name, bound)


_DEAD = "127.0.0.1:1"  # never reached: the option is refused first
_CONTROLLER = "--bootstrap-controller"
_HUGE_MS = str(10**12)  # an int, so no inf: above Kafka's INT bound


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["produce", "-t", "t", "-v", "x", "--bootstrap-server", _DEAD, "--timeout", "inf"], "--timeout"),
        (["consume", "-t", "t", "--bootstrap-server", _DEAD, "--timeout", "nan"], "--timeout"),
        (["consume", "-t", "t", "--bootstrap-server", _DEAD, "--idle-timeout", "1e300"], "--idle-timeout"),
        (["topic", "list", "--bootstrap-controller", _DEAD, "--timeout", "inf"], "--timeout"),
        (["topic", "list", "--bootstrap-controller", _DEAD, "--timeout", "-1"], "--timeout"),
        (["quorum", "describe", "--status", _CONTROLLER, _DEAD, "--timeout-ms", _HUGE_MS], "--timeout-ms"),
        (["health", "--bootstrap-controller", _DEAD, "--timeout", "inf"], "--timeout"),
    ],
)  # fmt: skip
def test_an_endless_wait_is_one_usage_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], option: str
) -> None:
    assert run(argv) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: kraft ") and f"Invalid value for '{option}'" in err, err
