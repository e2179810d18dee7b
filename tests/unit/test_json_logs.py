"""`--log-format json`: one JSON object per line with the service, the replica and, inside a span, the trace
and span ids; the text format stays the default; a bad format is an error naming the field."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider

from shared.bus.service import parse_config
from shared.errors import ConfigError
from shared.telemetry import tracing
from shared.telemetry.logs import JsonFormatter


def record(message: str, *args: object, exc_info: bool = False) -> logging.LogRecord:
    info = sys.exc_info() if exc_info else None
    return logging.LogRecord("kairos.placement", logging.WARNING, __file__, 1, message, args, info)


def test_a_line_holds_time_level_service_replica_logger_and_message() -> None:
    line = json.loads(JsonFormatter("placement", "placement-2").format(record("work %s: %d binds", "w1", 3)))
    assert set(line) == {"time", "level", "service", "replica", "logger", "message"}
    assert (line["level"], line["service"], line["replica"]) == ("WARNING", "placement", "placement-2")
    assert (line["logger"], line["message"]) == ("kairos.placement", "work w1: 3 binds")
    assert dt.datetime.fromisoformat(line["time"]).utcoffset() == dt.timedelta(0)


def test_inside_a_span_the_line_names_its_trace_and_span() -> None:
    provider = TracerProvider()
    with tracing.use(provider), tracing.tracer().start_as_current_span("placement.place") as span:
        line = json.loads(JsonFormatter("placement", "p-0").format(record("placing")))
    ctx = span.get_span_context()
    assert line["trace_id"] == f"{ctx.trace_id:032x}"
    assert line["span_id"] == f"{ctx.span_id:016x}"
    provider.shutdown()


def _fail() -> None:
    raise ValueError("bad\nthing")


def test_an_exception_is_kept_whole_in_one_line() -> None:
    try:
        _fail()
    except ValueError:
        text = JsonFormatter("binder", "b-0").format(record("failed", exc_info=True))
    assert "\n" not in text
    line = json.loads(text)
    assert "ValueError: bad\nthing" in line["exception"]


def test_the_format_comes_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config("queue", []).log_format == "text"
    assert parse_config("queue", ["--log-format", "json"]).log_format == "json"
    monkeypatch.setenv("KAIROS_LOG_FORMAT", "JSON")
    assert parse_config("queue", []).log_format == "json"


def test_an_unknown_format_is_an_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="log_format"):
        parse_config("queue", ["--log-format", "yaml"])


def test_a_service_started_with_json_logs_writes_json_lines() -> None:
    # With tracing on, the runner's first line says where spans go; nothing needs to listen for that.
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.placement", "--log-format", "json", "--replica", "placement-9"],
        stderr=subprocess.PIPE,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "KAIROS_NATS_URL": "nats://127.0.0.1:1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
        },
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    line = json.loads(first)
    assert (line["service"], line["replica"], line["logger"]) == (
        "placement",
        "placement-9",
        "kairos.tracing",
    )
    assert line["message"].startswith("tracing to http://127.0.0.1:1/v1/traces")
