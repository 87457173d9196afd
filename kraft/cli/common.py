"""Helpers every CLI command group shares: one-line errors, ``--json`` output, tables, bootstrap lists.

The error contract of the ``kraft`` command: exit 0 on success; on failure exactly one line
``error: <what went wrong>`` on stderr and exit 1.  Wrap a command with :func:`handle_errors` (or a block
with :func:`cli_errors`) and raise: ``KraftError`` (incl. ``ConfigError``), ``OSError``, ``grpc.RpcError``
and :class:`CliError` are all turned into that line.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, Self, TypeVar

import grpc
import typer
from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from kraft.errors import KraftError

if TYPE_CHECKING:
    from kraft.client.admin import AdminClient
    from kraft.client.broker import BrokerClient
    from kraft.client.properties import ClientConfig

P = ParamSpec("P")
T = TypeVar("T")

# Shared option types so every command spells them the same way.
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="The node's .properties file.", show_default=False)
]
BootstrapControllerOption = Annotated[
    str,
    typer.Option(
        "--bootstrap-controller",
        help="Controller endpoint(s): host:port[,host:port…]; NOT_CONTROLLER redirects are followed.",
        show_default=False,
    ),
]

OptionalBootstrapControllerOption = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-controller",
        help="Controller endpoint(s): host:port[,host:port…] (default: the controllers of --cluster-dir).",
        show_default=False,
    ),
]
OptionalBootstrapServerOption = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-server",
        help="Broker endpoint(s): host:port[,host:port…] (default: the brokers of --cluster-dir).",
        show_default=False,
    ),
]
ClusterDirOption = Annotated[
    Path | None,
    typer.Option(
        "--cluster-dir",
        envvar="KRAFT_CLUSTER_DIR",
        help="A local cluster directory (kraft cluster up): its nodes and client.properties are used when no "
        "bootstrap list is given.",
        show_default=False,
    ),
]
DEFAULT_TIMEOUT_S = 15.0
MAX_WAIT_MS = 2**31 - 1
"""The longest wait any option or client property takes (ms): Kafka's INT timeouts' bound
(:data:`kraft.client.properties.MAX_MS`).  Every seconds option has ``max=MAX_WAIT_S`` and every ms option
``max=MAX_WAIT_MS``: ``--timeout inf`` (or 1e300) would otherwise pass ``min=`` and reach asyncio and gRPC
deadlines that cannot hold it; ``nan`` fails the range check too.  All are one-line usage errors."""
MAX_WAIT_S = MAX_WAIT_MS / 1000
TimeoutOption = Annotated[
    float,
    typer.Option(
        "--timeout", min=0.1, max=MAX_WAIT_S, help="Seconds to wait for the answer, retries included."
    ),
]

VerboseOption = Annotated[
    bool,
    typer.Option("--verbose", help="Print each retry (redirects, unknown outcomes, resends) on stderr."),
]


def verbose_printer(verbose: bool) -> Callable[[str], None] | None:
    """The ``on_retry`` callback of the admin clients for ``--verbose``: one ``retry: …`` line on stderr."""
    if not verbose:
        return None

    def show(line: str) -> None:
        print(f"retry: {_one_line(line)}", file=sys.stderr, flush=True)

    return show


DEFAULT_REQUEST_TIMEOUT_MS = 5000
"""The admin commands' ``request.timeout.ms``: one RPC's limit, under ``--timeout`` (the whole call's, Kafka's
``default.api.timeout.ms``).  A bootstrap address that accepts the connection and never answers costs this
much, and the next address is asked — before session 16 it cost the whole ``--timeout``.  Kafka's default
is 30 s beside a 60 s API timeout; ours is shorter because ``--timeout`` is 15 s and one admin request
commits one small batch (a write that takes longer is resent and reconciled, see kraft.client.admin)."""


@dataclass
class _ClientSettings:
    """The client properties file in force for this command and the timeouts it sets (None: not set;
    reset by every command).  ONE file, as Kafka's tools have one (``--command-config``): the command
    config when given, else the cluster directory's ``client.properties`` (:func:`bootstrap_from`)."""

    command_config: Path | None = None
    request_timeout_ms: int | None = None
    default_api_timeout_ms: int | None = None
    retry_backoff_ms: int | None = None
    max_block_ms: int | None = None

    def take(self, config: ClientConfig, origin: Path | str) -> None:
        """Use ``config`` (read from ``origin``), after Kafka's check of its effective timeouts."""
        from kraft.client.properties import check_effective_timeouts

        check_effective_timeouts(config, DEFAULT_REQUEST_TIMEOUT_MS, origin=str(origin))
        self.request_timeout_ms = config.request_timeout_ms
        self.default_api_timeout_ms = config.default_api_timeout_ms
        self.retry_backoff_ms = config.retry_backoff_ms
        self.max_block_ms = config.max_block_ms

    def forget(self) -> None:
        """A new command: no file read yet."""
        self.command_config = None
        self.request_timeout_ms = self.default_api_timeout_ms = None
        self.retry_backoff_ms = self.max_block_ms = None


_CLIENT_SETTINGS = _ClientSettings()


def request_timeout_s() -> float:
    """The admin client's attempt timeout for this command: ``request.timeout.ms`` of the client properties
    (default :data:`DEFAULT_REQUEST_TIMEOUT_MS`); kraft.client.controller cuts it to what is left."""
    return (_CLIENT_SETTINGS.request_timeout_ms or DEFAULT_REQUEST_TIMEOUT_MS) / 1000


DEFAULT_RETRY_BACKOFF_MS = 100
"""Kafka's ``retry.backoff.ms``: the broker commands' pause between metadata refreshes and the quorum
commands' between DescribeQuorum rounds (the admin client's first backoff keeps its 50 ms when unset)."""
DEFAULT_MAX_BLOCK_MS = 60_000
"""Kafka's producer ``max.block.ms``: how long ``kraft produce`` waits for metadata that knows its
partition (never longer than its ``--timeout``)."""


def retry_backoff_s(default_ms: int = DEFAULT_RETRY_BACKOFF_MS) -> float:
    """The client properties' ``retry.backoff.ms`` (0 allowed, as in Kafka), else ``default_ms``."""
    configured = _CLIENT_SETTINGS.retry_backoff_ms
    return (default_ms if configured is None else configured) / 1000


def max_block_s(timeout_s: float) -> float:
    """How long ``kraft produce`` waits for its partition to appear in metadata: the client properties'
    ``max.block.ms`` (default :data:`DEFAULT_MAX_BLOCK_MS`), capped by the command's ``timeout_s``."""
    configured = _CLIENT_SETTINGS.max_block_ms
    return min((DEFAULT_MAX_BLOCK_MS if configured is None else configured) / 1000, timeout_s)


def api_timeout_s(timeout_s: float) -> float:
    """The whole admin call's deadline: ``timeout_s`` when ``--timeout`` was given on the command line (or
    when called outside a command); otherwise the client properties' ``default.api.timeout.ms``, and
    without one ``timeout_s`` raised to ``request.timeout.ms`` — as Kafka's admin client raises its default
    API timeout to a larger configured request timeout, so one attempt is never cut by a default."""
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None or "timeout" not in ctx.params:
        return timeout_s
    if ctx.get_parameter_source("timeout") not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
        return timeout_s
    if _CLIENT_SETTINGS.default_api_timeout_ms is not None:
        return _CLIENT_SETTINGS.default_api_timeout_ms / 1000
    return max(timeout_s, request_timeout_s())


BOOTSTRAP_RANDOM = random.Random()
"""Where an admin command starts in its bootstrap list (:func:`admin_client`); tests replace it."""


def admin_client(bootstrap: str, timeout_s: float, verbose: bool = False) -> AdminClient:
    """The admin client of one command: the controllers of ``bootstrap``, the command's timeouts
    (:func:`api_timeout_s`, :func:`request_timeout_s`), ``--verbose``'s retry lines.

    It starts at a random address of the list, as Kafka's clients do (``NetworkClient.leastLoadedNode``
    starts at a random offset), so a dead first address does not cost every command one request timeout;
    within the command an address that failed is not asked again while another is untried
    (:class:`kraft.client.controller.ControllerClient`)."""
    from kraft.client.admin import ADMIN_RETRY_BACKOFF_S, AdminClient
    from kraft.clock import SystemClock

    targets = [hp.target for hp in parse_bootstrap(bootstrap)]
    configured_backoff = _CLIENT_SETTINGS.retry_backoff_ms
    return AdminClient(
        targets,
        api_timeout_s(timeout_s),
        request_timeout_s(),
        clock=SystemClock(),
        retry_backoff_s=ADMIN_RETRY_BACKOFF_S if configured_backoff is None else configured_backoff / 1000,
        on_retry=verbose_printer(verbose),
        first_target=bootstrap_start(len(targets)),
    )


def broker_client(targets: Sequence[str], timeout_s: float, *, cluster_id: str = "") -> BrokerClient:
    """The broker client of one command (``produce``, ``consume``, ``offsets``, ``log-dirs``) on ``targets``
    (:func:`bootstrap_targets`: the random start): one RPC at most ``request.timeout.ms``
    (:func:`request_timeout_s`, as the admin commands) and never more than ``timeout_s``; when no broker
    answers at all for :data:`kraft.client.rotation.UNREACHABLE_TIMEOUT_S` it gives up naming the list, as
    the admin commands do for their controllers; between metadata refreshes it pauses ``retry.backoff.ms``
    (:func:`retry_backoff_s`)."""
    from kraft.client.broker import BrokerClient
    from kraft.client.rotation import UNREACHABLE_TIMEOUT_S

    return BrokerClient(
        targets,
        cluster_id=cluster_id,
        request_timeout_s=min(request_timeout_s(), timeout_s),
        unreachable_timeout_s=UNREACHABLE_TIMEOUT_S,
        retry_backoff_s=retry_backoff_s(),
    )


def bootstrap_targets(bootstrap: str, option: str = "--bootstrap-controller") -> list[str]:
    """The gRPC targets of ``bootstrap`` rotated to start at :func:`bootstrap_start`'s index (their order
    otherwise kept): for the commands whose client asks its list in order — ``quorum describe|add-controller|
    remove-controller``, ``produce``, ``consume``, ``offsets``, ``log-dirs`` — the random start
    :func:`admin_client` gives the admin commands."""
    targets = [hp.target for hp in parse_bootstrap(bootstrap, option)]
    start = bootstrap_start(len(targets))
    return targets[start:] + targets[:start]


def bootstrap_start(count: int) -> int:
    """The index of the bootstrap address an admin command asks first: random (:func:`admin_client`).
    Tests pin it (``monkeypatch.setattr(common, "bootstrap_start", …)``) or seed :data:`BOOTSTRAP_RANDOM`."""
    return BOOTSTRAP_RANDOM.randrange(count)


def apply_command_config(path: Path | None) -> Path | None:
    """Open every channel of this command as ``path`` says (Kafka's admin client ``--command-config``:
    ``security.protocol=SSL``, ``ssl.truststore.location``/``ssl.truststore.certificates``,
    ``ssl.keystore.location`` or ``ssl.keystore.key`` + ``ssl.keystore.certificate.chain``) and take its
    ``request.timeout.ms`` (the limit of one RPC of an admin command) and ``default.api.timeout.ms`` (the
    whole command's, when ``--timeout`` is not given); :mod:`kraft.client.properties` parses it.

    It is the command's only client properties file: with ``--cluster-dir`` the directory then gives the
    bootstrap list alone, its ``client.properties`` is not read (:func:`bootstrap_from`)."""
    # one command's file, not the last one's
    _CLIENT_SETTINGS.forget()
    _CLIENT_SETTINGS.command_config = path
    if path is not None:
        # Imported here so `kraft --help` stays fast (TLS pulls in cryptography).
        from kraft.client.channel import set_default_security
        from kraft.client.properties import load_client_config

        config = load_client_config(path)
        _CLIENT_SETTINGS.take(config, path)
        set_default_security(config.security)
    return path


CommandConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--command-config",
        help="Client .properties: security.protocol=SSL and ssl.truststore.*/ssl.keystore.* (PEM) for TLS.",
        callback=apply_command_config,
        show_default=False,
    ),
]
"""Every command that talks to the cluster takes it (applied while the options are parsed)."""


_PIPE_WIDTH = 250


class CliError(Exception):
    """A user-facing failure whose message is already the one line to print."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def error_message(exc: BaseException) -> str:
    """The one line shown for ``exc`` (without the ``error:`` prefix)."""
    if isinstance(exc, KraftError):
        # ConfigError's str() is already the full sentence; other KraftErrors show their Kafka code.
        text = str(exc) if type(exc).__str__ is not KraftError.__str__ else f"{exc.code.name}: {exc.message}"
    elif isinstance(exc, grpc.RpcError):
        code = exc.code() if isinstance(exc, grpc.Call | grpc.aio.AioRpcError) else None
        details = exc.details() if isinstance(exc, grpc.Call | grpc.aio.AioRpcError) else str(exc)
        text = f"{code.name if code else 'RPC_ERROR'}: {details or 'no details'}"
    elif isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{exc.strerror or exc}"
    else:
        text = str(exc) or type(exc).__name__
    if "Socket closed" in text and not _channels_use_tls():
        # What gRPC says when a PLAINTEXT client meets an SSL listener (the server closes the socket).
        text += " (the listener may be SSL: pass --command-config with security.protocol=SSL)"
    return _one_line(text)


def _channels_use_tls() -> bool:
    from kraft.client.channel import default_security

    return default_security().is_ssl


def print_error(message: str) -> None:
    """Print ``error: message`` as one line on stderr (the caller decides the exit status)."""
    # Plain print, not rich: rich wraps long lines and would break the one-line contract.
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)


def fail(message: str) -> NoReturn:
    """Print ``error: message`` as one line on stderr and exit 1."""
    print_error(message)
    raise typer.Exit(code=1)


# The failures a command expects (bad config, unreachable node, refused request): one line, exit 1.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (
    KraftError,
    CliError,
    OSError,
    grpc.RpcError,
    TimeoutError,
)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn the expected failures raised inside the block into one line on stderr + exit 1."""
    try:
        yield
    except typer.Exit:
        raise
    except EXPECTED_ERRORS as exc:
        fail(error_message(exc))


def handle_errors(command: Callable[P, T]) -> Callable[P, T]:
    """Decorator form of :func:`cli_errors` for typer commands (keeps the signature typer reads)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return command(*args, **kwargs)
        except typer.Exit:
            raise
        except EXPECTED_ERRORS as exc:
            fail(error_message(exc))

    return wrapper


def run_async(coro: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
    """Run one coroutine from a synchronous typer command."""

    async def _await() -> T:
        return await coro

    return asyncio.run(_await())


def print_json(value: object) -> None:
    """Pretty JSON on stdout (Paths, enums and other objects via ``str``)."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")
    sys.stdout.flush()


def print_table(columns: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None) -> None:
    """A rich table on stdout; ``None`` cells print as ``-``."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*("-" if cell is None else str(cell) for cell in row))
    # Piped output (scripts, tests) gets no terminal width; do not squeeze ids into 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=_PIPE_WIDTH)
    console.print(table)


def print_key_values(pairs: Sequence[tuple[str, object]]) -> None:
    """``Key: value`` lines, Kafka-tool style (``kafka-metadata-quorum.sh describe --status``)."""
    width = max((len(key) for key, _ in pairs), default=0)
    for key, value in pairs:
        sys.stdout.write(f"{key + ':':<{width + 1}} {'-' if value is None else value}\n")
    sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @property
    def target(self) -> str:
        """The gRPC target (IPv6 bracketed)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.target


_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:\[\]]+)):(?P<port>\d{1,5})$")


def parse_bootstrap(text: str, option: str = "--bootstrap-controller") -> list[HostPort]:
    """``h1:9093,h2:9093`` → endpoints; raises :class:`CliError` naming ``option`` and the bad entry."""
    entries = [item.strip() for item in text.split(",") if item.strip()]
    if not entries:
        raise CliError(f"{option} is empty: expected host:port[,host:port…]")
    endpoints: list[HostPort] = []
    for entry in entries:
        match = _HOST_PORT.match(entry)
        port = int(match.group("port")) if match else 0
        if match is None or not 1 <= port <= 65535:
            raise CliError(f"{option} entry {entry!r} is not host:port with a port in 1..65535")
        endpoints.append(HostPort(match.group("v6") or match.group("host"), port))
    return endpoints


class WaitSpinner:
    """A spinner on stderr while a command waits on the network: ``with WaitSpinner("finding the leader"):``.

    Drawn only when stderr is a terminal, so pipes, log files and ``--json`` output never see it, and it
    never redirects stdout (rich's ``console.status`` would send stdout writes to the stderr console).
    """

    def __init__(self, message: str, *, enabled: bool | None = None) -> None:
        self._spinner = Spinner("dots", text=Text(message))
        self._enabled = sys.stderr.isatty() if enabled is None else enabled
        self._live: Live | None = None

    @property
    def active(self) -> bool:
        return self._live is not None

    def start(self) -> None:
        if not self._enabled or self._live is not None:
            return
        self._live = Live(
            self._spinner,
            console=Console(stderr=True),
            transient=True,  # leaves no trace on the terminal once the wait is over
            redirect_stdout=False,
            redirect_stderr=False,
            refresh_per_second=10,
        )
        self._live.start()

    def update(self, message: str) -> None:
        # Text, not a markup string: a topic named "[x]" must print as itself.
        self._spinner.update(text=Text(message))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    @contextmanager
    def hidden(self) -> Iterator[None]:
        """Hide the spinner while the block writes to a terminal stdout (the two would garble)."""
        if self._live is None or not sys.stdout.isatty():
            yield
            return
        self.stop()
        try:
            yield
        finally:
            sys.stdout.flush()
            self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def require_bootstrap(bootstrap: str | None, cluster_dir: Path | None, *, brokers: bool = False) -> str:
    """:func:`bootstrap_from` for a command whose bootstrap list was a required option: neither it nor
    ``--cluster-dir`` given is a usage error of that command, as the missing option was."""
    if not bootstrap and cluster_dir is None:
        from typer._click.exceptions import UsageError
        from typer._click.globals import get_current_context

        option = "--bootstrap-server" if brokers else "--bootstrap-controller"
        raise UsageError(
            f"Missing option '{option}' (or --cluster-dir, or KRAFT_CLUSTER_DIR)",
            ctx=get_current_context(silent=True),
        )
    return bootstrap_from(bootstrap, cluster_dir, brokers=brokers)


def timeout_seconds(timeout_s: float | None, timeout_ms: int | None, default_s: float) -> float:
    """The wait of a command that takes both ``--timeout`` (seconds) and its older ``--timeout-ms``."""
    if timeout_s is not None and timeout_ms is not None:
        raise CliError("give --timeout (seconds) or --timeout-ms, not both")
    if timeout_s is not None:
        return timeout_s
    return timeout_ms / 1000.0 if timeout_ms is not None else default_s


def bootstrap_from(bootstrap: str | None, cluster_dir: Path | None, *, brokers: bool = False) -> str:
    """``bootstrap`` when given, else the controllers (``brokers``: the brokers) of the local cluster in
    ``cluster_dir`` (``--cluster-dir`` / ``KRAFT_CLUSTER_DIR``).

    The directory's ``client.properties`` (:mod:`kraft.client.properties`) stands in for
    ``--command-config`` when that is not given: its channel security (a TLS cluster's) and timeouts are
    the command's, and a command whose admin client is built afterwards (:func:`admin_client`) sees them.
    With ``--command-config`` that file alone is the client config, as in Kafka's tools (one file); the
    directory's is not read, so a broken one does not matter — but a TLS cluster with a command config that
    does not say ``security.protocol=SSL`` is an error at once (every channel would fail the handshake)."""
    option = "--bootstrap-server" if brokers else "--bootstrap-controller"
    if bootstrap:
        return bootstrap
    if cluster_dir is None:
        raise CliError(f"give {option} host:port[,host:port…] or --cluster-dir (or set KRAFT_CLUSTER_DIR)")
    from kraft.client.channel import default_security, set_default_security
    from kraft.cluster.manager import ClusterError, LocalCluster
    from kraft.cluster.spec import NodeRole

    try:
        cluster = LocalCluster.open(cluster_dir)
    except ClusterError as exc:
        raise CliError(str(exc)) from None
    command_config = _CLIENT_SETTINGS.command_config
    if command_config is not None:
        if cluster.spec.tls and not default_security().is_ssl:
            raise CliError(
                f"the cluster in {cluster_dir} uses TLS but --command-config {command_config} does not set "
                "security.protocol=SSL (use the keys of its client.properties, or leave out --command-config)"
            )
    else:
        try:
            config = cluster.client_config()
        except ClusterError as exc:
            raise CliError(str(exc)) from None
        if cluster.spec.tls:
            set_default_security(config.security)
        _CLIENT_SETTINGS.take(config, cluster.layout.client_properties)
    role = NodeRole.BROKER if brokers else NodeRole.CONTROLLER
    targets = [n.target for n in cluster.spec.nodes if n.role is role]
    if not targets:
        raise CliError(f"the cluster in {cluster_dir} has no {role.value}s")
    return ",".join(targets)
