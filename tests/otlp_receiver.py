"""An OTLP/HTTP trace receiver for tests: what the services export, decoded with opentelemetry-proto.

Used by the end-to-end tracing tests (fixture `otlp` in tests/e2e/conftest.py) and anywhere a test needs to
see real OTLP export. It serves `POST /v1/traces` (protobuf `ExportTraceServiceRequest`, gzip or not) on a
free loopback port in a background thread, so both synchronous tests (which start the stack as
processes) and async ones can use it; every span is kept as a `ReceivedSpan` with its resource's
`service.name` and `service.instance.id`. `wait_for(predicate)` blocks on a condition variable until the
spans received so far satisfy the predicate (no polling sleeps).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    service: str
    instance: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    """(trace id, span id) of each link."""
    start_ns: int
    end_ns: int
    status_code: int


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one `ExportTraceServiceRequest`."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        instance = str(resource.get("service.instance.id", ""))
        spans.extend(
            ReceivedSpan(
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                name=span.name,
                service=service,
                instance=instance,
                attributes={kv.key: _value(kv.value) for kv in span.attributes},
                links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                start_ns=span.start_time_unix_nano,
                end_ns=span.end_time_unix_nano,
                status_code=span.status.code,
            )
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        )
    return spans


@dataclass
class OtlpReceiver:
    url: str = ""
    """The base URL to give as OTEL_EXPORTER_OTLP_ENDPOINT."""
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self.spans.extend(spans)
            self.requests += 1
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], Any], timeout: float) -> Any:
        """The first truthy `predicate(spans)` as spans arrive; AssertionError after `timeout` seconds."""
        result: Any = None

        def ready() -> bool:
            nonlocal result
            result = predicate(list(self.spans))
            return bool(result)

        with self._changed:
            if not self._changed.wait_for(ready, timeout):
                names = sorted({(s.service, s.name) for s in self.spans})
                raise AssertionError(f"not seen within {timeout:.0f} s; {len(self.spans)} spans: {names}")
        return result

    def environment(self, delay_ms: int = 100) -> dict[str, str]:
        """OTEL_* variables that make a service export every span here, promptly."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_SCHEDULE_DELAY": str(delay_ms),
        }


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            try:
                spans = decode(body)
            except Exception:  # noqa: BLE001 -- a bad request is the exporter's bug: say so
                self.send_error(400, "not an ExportTraceServiceRequest")
                return
            receiver.add(spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A running receiver on a free loopback port; stopped on exit."""
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
