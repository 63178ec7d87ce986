"""Structured logs: one line per event, logfmt (``key=value``), on stderr.

    ts=2026-11-29T17:00:00.123Z level=info event=heartbeat.ok node=42 msg="..."

Use :func:`event` everywhere; the event name is a stable dotted identifier that
tests and operators can grep for, the fields carry the details.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER_NAME = "lockstep.agent"
_logger = logging.getLogger(LOGGER_NAME)

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _quote(value: object) -> str:
    text = "" if value is None else str(value)
    if text and not any(c in text for c in ' "=\\\n\t') and text.isprintable():
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts += f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}"]
        name = getattr(record, "event", None)
        fields = getattr(record, "fields", None) or {}
        if name is None:
            parts.append("event=log")
            fields = {"msg": record.getMessage()}
        else:
            parts.append(f"event={_quote(name)}")
        for key, value in fields.items():
            parts.append(f"{key}={_quote(value)}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def setup(level: str = "info", stream=None) -> None:
    """Send agent logs to ``stream`` (stderr) at ``level``; idempotent."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    _logger.handlers[:] = [handler]
    _logger.setLevel(LEVELS.get(level, logging.INFO))
    _logger.propagate = False


def event(name: str, level: int = logging.INFO, exc_info: bool = False, **fields: object) -> None:
    """Log one event: ``event("command.done", id=..., status=...)``."""
    if _logger.isEnabledFor(level):
        _logger.log(level, name, exc_info=exc_info, extra={"event": name, "fields": fields})


def debug(name: str, **fields: object) -> None:
    event(name, logging.DEBUG, **fields)


def info(name: str, **fields: object) -> None:
    event(name, logging.INFO, **fields)


def warning(name: str, **fields: object) -> None:
    event(name, logging.WARNING, **fields)


def error(name: str, exc_info: bool = False, **fields: object) -> None:
    event(name, logging.ERROR, exc_info=exc_info, **fields)
