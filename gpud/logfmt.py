"""The daemons' log lines: plain text, or JSON lines with the ``key=value`` fields of event messages lifted out."""

from __future__ import annotations

import json
import logging
import re
import time

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Event messages start with fields such as "event=started job=42 node=-"; JSON lines carry them as keys.
_FIELD = re.compile(r"(\w+)=(\S+)\s*")
_FIELD_NAMES = frozenset({"event", "job", "node", "task"})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and the event fields the message starts with."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        message = record.getMessage()
        line: dict = {"ts": round(record.created, 3),
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                      + f".{int(record.msecs):03d}Z",
                      "level": record.levelname.lower(), "logger": record.name}
        line.update(event_fields(message))
        line["msg"] = message
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def event_fields(message: str) -> dict[str, str]:
    """The leading ``event=``, ``job=``, ``node=``, ``task=`` fields of a message ("-" means absent)."""
    fields: dict[str, str] = {}
    pos = 0
    while (match := _FIELD.match(message, pos)) and match.group(1) in _FIELD_NAMES:
        if match.group(2) != "-":
            fields[match.group(1)] = match.group(2)
        pos = match.end()
    return fields


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger for a daemon: ``fmt`` is "text" or "json" (one object per line)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
