"""The `kraft` command's error contract at the entry point (`kraft.cli.main.run`/`main`).

Every failure — usage errors from the parser included — is one ``error: …`` line on stderr and exit 1;
``--help`` exits 0 and the commands' help carries examples; a command's own ``typer.Exit(code)`` keeps
its code.  Commands run in-process (``run(argv)``) with captured streams: no subprocesses.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
import typer.main
from typer._click import Command
from typer.core import TyperGroup

import kraft.cli.main as cli_main
from kraft.cli.common import CliError, WaitSpinner
from kraft.netutil import free_port


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> Outcome:
    capsys.readouterr()  # drop anything printed before this call
    code = cli_main.run(list(args))
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def assert_one_error_line(outcome: Outcome, *fragments: str) -> str:
    assert outcome.code == 1, outcome
    assert len(outcome.err_lines) == 1, outcome.err
    line = outcome.err_lines[0]
    assert line.startswith("error: "), line
    for fragment in fragments:
        assert fragment in line, line
    return line


# --- usage errors: one line, exit 1 -------------------------------------------------------------------

USAGE_ERRORS = [
    pytest.param(["storage", "format"], ["kraft storage format", "Missing option", "--config"], id="missing"),
    pytest.param(["metadata", "dump"], ["kraft metadata dump", "--log-dir"], id="missing-log-dir"),
    pytest.param(["controller", "start"], ["kraft controller start", "--config"], id="controller-missing"),
    pytest.param(
        ["quorum", "describe", "--bootstrap-controller", "h:1", "--status", "--timeout-ms", "5"],
        ["--timeout-ms", "greater than or equal to 100"],
        id="out-of-range",
    ),
    pytest.param(
        ["produce", "--bootstrap-server", "h:1", "--topic", "t", "--partition", "-1"],
        ["kraft produce", "--partition"],
        id="negative-partition",
    ),
    pytest.param(
        ["produce", "--bootstrap-server", "h:1", "--topic", "t", "--acks", "2"],
        ["kraft produce", "--acks"],
        id="produce-acks",
    ),
    pytest.param(["consume", "--topic", "t"], ["kraft consume", "--bootstrap-server"], id="consume-missing"),
    pytest.param(["topic", "list", "--no-such-flag"], ["No such option", "--no-such-flag"], id="unknown-opt"),
    pytest.param(["broker", "start", "--config"], ["requires an argument"], id="option-without-value"),
    pytest.param(["cluster", "up", "--controllers", "0"], ["--controllers"], id="cluster-range"),
    pytest.param(["storage", "info", "-c", "x", "extra"], ["unexpected extra argument", "extra"], id="extra"),
]


@pytest.mark.parametrize(("argv", "fragments"), USAGE_ERRORS)
def test_usage_error_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragments: list[str]
) -> None:
    outcome = invoke(capsys, *argv)
    line = assert_one_error_line(outcome, *fragments)
    assert "╭" not in line and "Usage:" not in line  # not click's box
    assert outcome.out == ""


def test_usage_error_names_the_help_of_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    line = assert_one_error_line(invoke(capsys, "storage", "format"))
    assert line.endswith("(see 'kraft storage format --help')")


def test_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_error_line(invoke(capsys, "no-such-command"), "kraft:", "No such command 'no-such-command'")


def test_unknown_sub_command_is_one_line_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_error_line(invoke(capsys, "storage", "fromat"), "kraft storage:", "Did you mean 'format'")


@pytest.mark.parametrize("argv", [[], ["storage"], ["quorum"]], ids=["kraft", "storage", "quorum"])
def test_group_without_command_shows_help_then_one_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    outcome = invoke(capsys, *argv)
    assert_one_error_line(outcome, "missing command")
    assert "Usage: kraft" in outcome.out


# --- --help everywhere --------------------------------------------------------------------------------


def _command_paths(command: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(command, TyperGroup):
        for name, sub in sorted(command.commands.items()):
            yield from _command_paths(sub, (*path, name))


ALL_COMMANDS = list(_command_paths(typer.main.get_command(cli_main.app)))
OWNED_COMMANDS = [
    ("metadata", "dump"),
    ("controller", "start"),
    ("quorum", "describe"),
    ("produce",),
    ("consume",),
    ("broker", "start"),
    ("broker", "list"),
    ("broker", "describe"),
    ("broker", "unregister"),
    ("broker", "shutdown"),
    ("topic", "create"),
    ("topic", "list"),
    ("topic", "describe"),
    ("topic", "delete"),
    ("topic", "elect-leaders"),
    ("topic", "alter"),
    ("config", "describe"),
    ("config", "alter"),
    ("offsets", "get"),
    ("log-dirs", "describe"),
    ("api-versions",),
    ("metadata", "shell"),
    ("chaos", "proxy"),
    ("chaos", "run"),
    ("pipeline", "compact"),
    ("pipeline", "metadata-report"),
]


def test_the_walk_finds_the_command_groups() -> None:
    # Guards the parametrization below against silently testing nothing.
    for path in [*OWNED_COMMANDS, ("storage", "format"), ("topic", "create"), ("chaos", "run")]:
        assert path in ALL_COMMANDS


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p) or "kraft")
def test_help_exits_0_on_stdout(capsys: pytest.CaptureFixture[str], path: tuple[str, ...]) -> None:
    outcome = invoke(capsys, *path, "--help")
    assert outcome.code == 0, outcome.err
    assert outcome.err == ""
    assert f"Usage: {' '.join(('kraft', *path))}" in outcome.out


@pytest.mark.parametrize("path", OWNED_COMMANDS, ids=" ".join)
def test_help_has_examples(capsys: pytest.CaptureFixture[str], path: tuple[str, ...]) -> None:
    outcome = invoke(capsys, *path, "--help")
    assert outcome.code == 0
    assert "Example" in outcome.out
    # Each example is a runnable line of this very command.
    assert f"kraft {' '.join(path)} --" in outcome.out


# --- commands' own errors stay one line, printed once -------------------------------------------------


def test_command_error_is_printed_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert_one_error_line(invoke(capsys, "metadata", "dump", "--log-dir", str(missing)), "not a directory")


def test_bad_bootstrap_list_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = invoke(capsys, "quorum", "describe", "--bootstrap-controller", "a:1,nonsense", "--status")
    assert_one_error_line(outcome, "--bootstrap-controller", "'nonsense'")


def test_unreachable_quorum_with_json_keeps_stdout_empty(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on a fresh free port: the describe gives up after --timeout-ms (100 ms).
    target = f"127.0.0.1:{free_port()}"
    argv = [
        "quorum",
        "describe",
        "--bootstrap-controller",
        target,
        "--status",
        "--json",
        "--timeout-ms",
        "100",
    ]
    outcome = invoke(capsys, *argv)
    assert_one_error_line(outcome, target)
    assert outcome.out == ""


def test_main_exits_with_the_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["kraft", "storage", "format"])
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    assert exited.value.code == 1
    assert len(capsys.readouterr().err.splitlines()) == 1


# --- exit semantics, on a throwaway app in place of the real one --------------------------------------


@pytest.fixture
def toy_app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.command("exit3")
    def exit3() -> None:
        typer.echo("partial output")
        raise typer.Exit(code=3)

    @app.command("ok")
    def ok() -> None:
        typer.echo("fine")

    @app.command("unhandled")
    def unhandled() -> None:
        raise CliError("went wrong\nacross lines")

    @app.command("abort")
    def abort() -> None:
        raise typer.Abort()

    @app.command("bad-param")
    def bad_param() -> None:
        raise typer.BadParameter("must be even")

    monkeypatch.setattr(cli_main, "app", app)
    return app


@pytest.mark.usefixtures("toy_app")
def test_typer_exit_keeps_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = invoke(capsys, "exit3")
    assert (outcome.code, outcome.out, outcome.err) == (3, "partial output\n", "")


@pytest.mark.usefixtures("toy_app")
def test_success_is_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert invoke(capsys, "ok") == Outcome(0, "fine\n", "")


@pytest.mark.usefixtures("toy_app")
def test_expected_error_outside_handle_errors_is_still_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_error_line(invoke(capsys, "unhandled"), "went wrong across lines")


@pytest.mark.usefixtures("toy_app")
def test_abort_and_bad_parameter_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_error_line(invoke(capsys, "abort"), "aborted")
    assert_one_error_line(invoke(capsys, "bad-param"), "must be even")


# --- the wait spinner ---------------------------------------------------------------------------------


def test_spinner_is_off_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with WaitSpinner("waiting for the leader") as spinner:
        assert not spinner.active
        spinner.update("still waiting")
    assert capsys.readouterr() == ("", "")


def test_spinner_draws_on_stderr_only(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich treats the captured stderr as a terminal
    with WaitSpinner("waiting for [the] leader", enabled=True) as spinner:
        assert spinner.active
        spinner.update("waiting for [the] leader: 2/3")
    assert not spinner.active
    out, err = capsys.readouterr()
    assert out == ""
    assert "waiting for [the] leader" in err  # shown verbatim, not read as rich markup


def test_spinner_hides_while_writing_to_a_terminal_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    spinner = WaitSpinner("waiting", enabled=True)
    with spinner:
        with spinner.hidden():
            assert spinner.active  # stdout is captured, not a terminal: no need to hide
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
        with spinner.hidden():
            assert not spinner.active
        assert spinner.active
    assert not spinner.active


@pytest.mark.parametrize(
    ("role", "variable", "value", "choices"),
    [
        ("controller", "KRAFT_EVENT_LOOP", "gevent", "uvloop, asyncio"),
        ("broker", "KRAFT_EVENT_LOOP", "trio", "uvloop, asyncio"),
        ("controller", "KRAFT_GRPC_IO", "epoll", "iomgr, event-engine"),
        ("broker", "KRAFT_GRPC_IO", "epoll", "iomgr, event-engine"),
        ("controller", "KRAFT_GC_THRESHOLD", "50000,10", "three non-negative integers"),
        ("broker", "KRAFT_GC_THRESHOLD", "2000,x,10", "three non-negative integers"),
    ],
)
def test_an_unknown_runtime_choice_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    role: str,
    variable: str,
    value: str,
    choices: str,
) -> None:
    port = free_port()
    config = tmp_path / f"{role}.properties"
    listener = (
        f"CONTROLLER://127.0.0.1:{port}" if role == "controller" else f"BROKER://127.0.0.1:{free_port()}"
    )
    config.write_text(
        f"process.roles={role}\nnode.id={1 if role == 'controller' else 101}\n"
        f"controller.quorum.voters=1@127.0.0.1:{port}\nlisteners={listener}\n"
        f"metadata.log.dir={tmp_path / 'meta'}\nlog.dirs={tmp_path / 'data'}\n"
    )
    monkeypatch.setenv(variable, value)
    outcome = invoke(capsys, role, "start", "--config", str(config))
    assert_one_error_line(outcome, f"{variable}={value!r}", choices)
