"""Log formats of the service runner: the default text line, or one JSON object per line with trace ids.

Called by `shared.bus.service.setup_logging` (`--log-format json`, env KAIROS_LOG_FORMAT=json). A JSON line
holds `time` (UTC, ISO 8601 with milliseconds), `level`, `service`, `replica`, `logger`, `message`, and
`trace_id` / `span_id` (hex, as tracing UIs show them) when a sampled or unsampled span is current, so a
log line leads to its trace; `exception` holds the traceback when there is one. Log collectors (Loki,
Elasticsearch, Cloud Logging) read it without parsing rules.
"""

from __future__ import annotations

import datetime as dt
import logging

import msgspec
from opentelemetry import trace

_ENCODER = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def __init__(self, service: str, replica: str) -> None:
        super().__init__()
        self.service = service
        self.replica = replica

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "replica": self.replica,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            line["trace_id"] = f"{ctx.trace_id:032x}"
            line["span_id"] = f"{ctx.span_id:016x}"
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return _ENCODER.encode(line).decode()


def text_format(service: str, replica: str) -> str:
    """The default line: `time service/replica LEVEL logger: message`."""
    return f"%(asctime)s {service}/{replica} %(levelname)s %(name)s: %(message)s"
