"""Logging setup shared by Tandem's servers: text for people, JSON lines for log pipelines.

``configure_logging(level="info", json=True)`` puts one handler on the root
logger whose lines look like::

    {"timestamp": "2026-01-02T03:04:05.678Z", "level": "error", "logger": "tandem.hub.mqtt",
     "message": "request 3f… failed: …", "request_id": "3f…", "device": "cam-7", "model": "mnist"}

Context travels in ``extra=`` (``log.error("…", extra={"request_id": rid})``);
the keys in ``CONTEXT_FIELDS`` are copied into the JSON object (and appended
as ``key=value`` to text lines), so a log search by request id finds every
line about one request. Calling ``configure_logging`` again replaces the
handler it installed before and leaves any other handler alone.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json as _json
import logging
import sys
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "quiet_loggers",
]

CONTEXT_FIELDS = ("request_id", "device", "model", "model_version")
LEVELS = ("debug", "info", "warning", "error", "critical")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_MARK = "_tandem_handler"  # set on the handler we install, so a second call replaces it


def _context(record: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in CONTEXT_FIELDS if getattr(record, k, None) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp (UTC, ISO 8601), level, logger, message, context."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = _dt.datetime.fromtimestamp(record.created, tz=_dt.UTC)
        entry: dict[str, Any] = {
            "timestamp": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_context(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: a context value that JSON cannot carry still logs, as text.
        return _json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The classic one-line format, with any context appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = _context(record)
        if not context:
            return line
        head, sep, tail = line.partition("\n")  # keep a traceback below the context
        pairs = " ".join(f"{k}={v}" for k, v in context.items())
        return f"{head} [{pairs}]{sep}{tail}"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as logging's last resort
    does): a stream captured at configure time may be closed by then (a CLI run inside
    another program, a test runner's capture)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass  # always the current sys.stderr


def configure_logging(
    level: str | int = "info", *, json: bool = False, stream: TextIO | None = None
) -> logging.Handler:
    """Install Tandem's handler on the root logger (JSON lines with ``json=True``); returns it.

    ``level`` is a name from ``LEVELS`` (any case) or a ``logging`` constant;
    ``stream`` defaults to standard error, looked up at each record.
    """
    if isinstance(level, str):
        if level.lower() not in LEVELS:
            raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LEVELS)}")
        numeric = logging.getLevelName(level.upper())
    elif isinstance(level, int) and not isinstance(level, bool):
        numeric = level
    else:
        raise ValueError(f"log level must be a name or an int, got {level!r}")
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    setattr(handler, _MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Raise the named loggers to ERROR for the duration (e.g. the ONNX exporter's chatter)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
