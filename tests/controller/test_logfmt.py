"""Daemon log lines: event fields lifted out of messages into JSON lines."""

from __future__ import annotations

import json
import logging

from gpud.logfmt import JsonFormatter, event_fields


def test_event_fields_come_from_the_start_of_the_message() -> None:
    assert event_fields("event=started job=42 node=- started on n1") == {"event": "started", "job": "42"}
    assert event_fields("event=drained job=- node=gpu-3 drained by root: fan") == {"event": "drained",
                                                                                  "node": "gpu-3"}
    assert event_fields("no fields here job=1") == {}


def test_a_json_line_per_record_with_the_fields() -> None:
    record = logging.LogRecord("gpud.controller", logging.INFO, __file__, 1,
                               "event=%s job=%s node=%s %s", ("completed", "7", "-", "exit 0"), None)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["event"] == "completed" and data["job"] == "7" and "node" not in data
    assert data["level"] == "info" and data["logger"] == "gpud.controller"
    assert data["msg"] == "event=completed job=7 node=- exit 0"


def test_exceptions_stay_on_one_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line and "RuntimeError: boom" in json.loads(line)["exc"]
