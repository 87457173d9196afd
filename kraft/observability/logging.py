"""Structured ``key=value`` logging on top of the standard library.

Every line looks like::

    ts=2026-11-22T00:01:07.123Z level=info logger=raft event=state_changed node=1 state=Leader epoch=3

Callers get a :class:`StructLogger` from :func:`get_logger`; it carries static fields (``node=1``), can
bind more (:meth:`StructLogger.bind`) and can attach a *context provider* — a callable evaluated for each
emitted line, so fast-changing state (role, epoch) is always current without re-binding.

Hot-path rule: the level is checked before anything is formatted or any provider is called, so a
disabled ``debug`` costs one method call and one integer comparison.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import IO, Any, Final

ContextProvider = Callable[[], Mapping[str, object]]

_ROOT_NAME: Final = "kraft"
_FIELDS_ATTR: Final = "kraft_fields"
_LEVEL_NAMES: Final = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
# Characters that force a value into double quotes so a line splits unambiguously on spaces.
_NEEDS_QUOTES: Final = frozenset(' "=\\\n\r\t')


def format_value(value: object) -> str:
    """Render one value: bare when it is a plain token, otherwise a double-quoted escaped string."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = value if isinstance(value, str) else str(value)
    if text and not any(ch in _NEEDS_QUOTES for ch in text):
        return text
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def format_fields(fields: Mapping[str, object]) -> str:
    """``k1=v1 k2=v2`` in insertion order."""
    return " ".join(f"{key}={format_value(value)}" for key, value in fields.items())


def _utc_timestamp(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class KeyValueFormatter(logging.Formatter):
    """Formats kraft records (fields in ``record.kraft_fields``) and foreign stdlib records alike."""

    def format(self, record: logging.LogRecord) -> str:
        name = record.name
        if name.startswith(_ROOT_NAME + "."):
            name = name[len(_ROOT_NAME) + 1 :]
        head: dict[str, object] = {
            "ts": _utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": name,
            "event": record.getMessage(),
        }
        fields: Mapping[str, object] | None = getattr(record, _FIELDS_ATTR, None)
        if fields:
            head.update(fields)
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            head["exc_type"] = type(exc).__name__
            head["exc"] = str(exc)
            head["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return format_fields(head)


class StructLogger:
    """A logger emitting one ``key=value`` line per call; immutable — ``bind`` returns a new one."""

    __slots__ = ("_fields", "_logger", "_providers")

    def __init__(
        self,
        logger: logging.Logger,
        fields: Mapping[str, object] | None = None,
        providers: tuple[ContextProvider, ...] = (),
    ) -> None:
        self._logger = logger
        self._fields: dict[str, object] = dict(fields or {})
        self._providers = providers

    @property
    def name(self) -> str:
        return self._logger.name

    @property
    def fields(self) -> Mapping[str, object]:
        return dict(self._fields)

    def bind(self, **fields: object) -> StructLogger:
        """A new logger with ``fields`` added to (or overriding) this one's static fields."""
        return StructLogger(self._logger, {**self._fields, **fields}, self._providers)

    def with_context(self, provider: ContextProvider) -> StructLogger:
        """A new logger that calls ``provider()`` for every emitted line and adds what it returns."""
        return StructLogger(self._logger, self._fields, (*self._providers, provider))

    def debug(self, event: str, **fields: object) -> None:
        if self._logger.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, event, fields, None)

    def info(self, event: str, **fields: object) -> None:
        if self._logger.isEnabledFor(logging.INFO):
            self._emit(logging.INFO, event, fields, None)

    def warning(self, event: str, **fields: object) -> None:
        if self._logger.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, event, fields, None)

    def error(self, event: str, **fields: object) -> None:
        if self._logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, event, fields, None)

    def exception(self, event: str, **fields: object) -> None:
        """Log at ERROR with the exception currently being handled (call from an ``except`` block)."""
        if self._logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, event, fields, sys.exc_info())

    def _emit(self, level: int, event: str, fields: Mapping[str, object], exc_info: Any) -> None:
        merged: dict[str, object] = dict(self._fields)
        for provider in self._providers:
            try:
                merged.update(provider())
            except Exception as exc:  # a broken provider must never take the caller down with it
                merged["context_error"] = f"{type(exc).__name__}: {exc}"
        merged.update(fields)
        # stacklevel=3: attribute the record to the caller of info()/debug(), not to this module.
        self._logger.log(level, event, exc_info=exc_info, extra={_FIELDS_ATTR: merged}, stacklevel=3)


def get_logger(name: str, **static_fields: object) -> StructLogger:
    """The structured logger for component ``name`` (``raft``, ``controller``, …), under ``kraft.``."""
    full = name if name == _ROOT_NAME or name.startswith(_ROOT_NAME + ".") else f"{_ROOT_NAME}.{name}"
    return StructLogger(logging.getLogger(full), static_fields)


def parse_level(level: str | int) -> int:
    """``"info"``/``"INFO"``/``20`` → 20; anything else raises ``ValueError`` naming the allowed values."""
    if isinstance(level, int):
        return level
    try:
        return _LEVEL_NAMES[level.strip().upper()]
    except KeyError:
        raise ValueError(
            f"unknown log level {level!r}: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
        ) from None


_handler: logging.Handler | None = None


def configure_logging(level: str | int = "INFO", stream: IO[str] | None = None) -> logging.Handler:
    """Send every log record (kraft's and libraries') to ``stream`` as key=value lines at ``level``.

    Idempotent: calling it again replaces the handler installed by the previous call.
    """
    global _handler
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root.addHandler(handler)
    numeric = parse_level(level)
    root.setLevel(numeric)
    logging.getLogger(_ROOT_NAME).setLevel(numeric)
    _handler = handler
    return handler
