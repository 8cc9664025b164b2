"""How the engine's log lines look: text for people (the default) or JSON for machines
(``--log-format json``).

Lines about one instance carry its id and generation as record attributes
(``extra={"instance_id": ..., "generation": ...}``: every ``ctx.logger`` line does, and so
do the processor's and the worker's lines about failures). The text format shows them as
``[instance-id#generation]`` before the message; the JSON format has them as fields, with
the other known attributes (task id, attempt, error type) and the traceback, if any.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

__all__ = ["LOG_FORMATS", "JsonFormatter", "TextFormatter", "formatter"]

LOG_FORMATS = ("text", "json")

#: Record attributes a line about an instance may carry (shown by both formats).
FIELDS = ("instance_id", "generation", "task_id", "attempt", "error_type")

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The default: time, level, logger, ``[instance#generation]`` when known, message."""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        instance = getattr(record, "instance_id", None)
        if instance is not None:
            generation = getattr(record, "generation", None)
            where = instance if generation is None else f"{instance}#{generation}"
            record.message = f"[{where}] {record.message}"
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, the
    instance fields when known, and ``exception`` with the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def formatter(name: str) -> logging.Formatter:
    """The formatter of a ``--log-format`` choice."""
    return JsonFormatter() if name == "json" else TextFormatter()
