"""Tracing setup: the standard OTEL_* variables decide whether a service exports spans, and where to.

Called once per process by the service runner (`shared.bus.service.main`): `setup_tracing(service,
replica)` reads the environment and, when an OTLP endpoint is configured, installs an SDK tracer provider
(BatchSpanProcessor -> OTLP/HTTP protobuf) as this process's *active* tracer; `Tracing.shutdown()` flushes
what is queued when the service stops (SIGTERM). Everything else reads `tracer()` and `enabled()`.

Off by default: without `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` (or with
`OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`) the active tracer is OpenTelemetry's no-op tracer and
`enabled()` is False, so callers skip span work altogether. The active tracer is Kairos's own (not
OpenTelemetry's global provider, which can be set only once per process): tests swap it with `use()`.

Variables read (all standard): `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL) or
`OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended), `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` (only
`http/protobuf`), `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (default `parentbased_always_on`),
`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (defaults: `service.name=kairos-<service>`,
`service.instance.id=<replica>`, `service.namespace=kairos`), `OTEL_BSP_SCHEDULE_DELAY`,
`OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_BSP_EXPORT_TIMEOUT` (the batch
processor). A value Kairos cannot honour is a `ConfigError` naming the variable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanContext, TraceFlags

from shared.errors import ConfigError

log = logging.getLogger("kairos.tracing")

INSTRUMENTATION = "kairos"
"""The instrumentation scope of every Kairos span."""
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
PROTOCOL = "http/protobuf"
FLUSH_TIMEOUT_S = 5.0
"""How long a stopping service waits for its last spans to reach the collector."""


@dataclass(frozen=True)
class TracingSettings:
    """What the environment asks for, validated."""

    endpoint: str
    """The OTLP/HTTP traces URL."""
    sampler: str = "parentbased_always_on"
    ratio: float = 1.0
    """For the `traceidratio` samplers: the fraction of new traces kept."""


def settings_from_env(env: Mapping[str, str]) -> TracingSettings | None:
    """The tracing settings `env` asks for; None when tracing is off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter == "none":
        return None
    if exporter != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: Kairos exports over OTLP only, got {exporter!r}")
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not endpoint:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if not base:
            return None
        endpoint = base.rstrip("/") + "/v1/traces"
    if not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT: expected an http(s) URL, got {endpoint!r}")
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(variable, "").strip()
        if protocol:
            if protocol != PROTOCOL:
                raise ConfigError(f"{variable}: Kairos exports {PROTOCOL} only, got {protocol!r}")
            break
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if sampler not in SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER: expected one of {', '.join(SAMPLERS)}, got {sampler!r}")
    ratio = 1.0
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if arg and sampler.endswith("traceidratio"):
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in [0, 1], got {arg!r}")
    return TracingSettings(endpoint=endpoint, sampler=sampler, ratio=ratio)


_BATCH_VARIABLES = {
    "OTEL_BSP_SCHEDULE_DELAY": "schedule_delay_millis",
    "OTEL_BSP_MAX_QUEUE_SIZE": "max_queue_size",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "max_export_batch_size",
    "OTEL_BSP_EXPORT_TIMEOUT": "export_timeout_millis",
}


def batch_options(env: Mapping[str, str]) -> dict[str, int]:
    """The batch span processor's settings from `OTEL_BSP_*` (milliseconds and counts, positive)."""
    options: dict[str, int] = {}
    for variable, option in _BATCH_VARIABLES.items():
        text = env.get(variable, "").strip()
        if not text:
            continue
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise ConfigError(f"{variable}: expected a positive whole number, got {text!r}")
        options[option] = value
    return options


def sampler_of(settings: TracingSettings) -> Sampler:
    match settings.sampler:
        case "always_on":
            return ALWAYS_ON
        case "always_off":
            return ALWAYS_OFF
        case "traceidratio":
            return TraceIdRatioBased(settings.ratio)
        case "parentbased_always_off":
            return ParentBased(ALWAYS_OFF)
        case "parentbased_traceidratio":
            return ParentBased(TraceIdRatioBased(settings.ratio))
        case _:
            return ParentBased(ALWAYS_ON)


def resource_of(service: str, replica: str, env: Mapping[str, str]) -> Resource:
    """The resource every span of this process carries: Kairos's defaults, overridden by what `env` gives
    (`OTEL_RESOURCE_ATTRIBUTES`, then `OTEL_SERVICE_NAME`)."""
    attributes: dict[str, str] = {
        "service.name": f"kairos-{service}",
        "service.namespace": "kairos",
        "service.instance.id": replica,
    }
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = urllib.parse.unquote(value.strip())
    name = env.get("OTEL_SERVICE_NAME", "").strip()
    if name:
        attributes["service.name"] = name
    # Resource.create adds the SDK's own attributes (telemetry.sdk.*); explicit ones win over its reading.
    return Resource.create(attributes)


# --- W3C values ---------------------------------------------------------------------------------------------
def traceparent(ctx: SpanContext) -> str:
    """The W3C `traceparent` value of a span context."""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def context_of(value: str) -> Context | None:
    """The OpenTelemetry context a `traceparent` value names (a remote parent), or None if malformed.
    Parsed here rather than by the W3C propagator: it runs once per podgroup per hop, at a fifth of the
    cost, and accepts exactly what `traceparent` writes (version 00, non-zero ids)."""
    parts = value.split("-")
    if (
        len(parts) != 4
        or parts[0] != "00"
        or len(parts[1]) != 32
        or len(parts[2]) != 16
        or len(parts[3]) != 2
    ):
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return trace.set_span_in_context(trace.NonRecordingSpan(ctx))


# --- the active tracer --------------------------------------------------------------------------------------
@dataclass
class _Active:
    tracer: trace.Tracer
    enabled: bool


_NOOP = trace.NoOpTracer()
_active = _Active(_NOOP, enabled=False)


def tracer() -> trace.Tracer:
    """The process's tracer: the SDK's when tracing is on, else a no-op one."""
    return _active.tracer


def enabled() -> bool:
    """Whether spans are recorded and exported (callers skip span work when not)."""
    return _active.enabled


@contextlib.contextmanager
def use(provider: trace.TracerProvider) -> Iterator[trace.Tracer]:
    """Make `provider`'s tracer the active one for the duration (tests, benchmarks)."""
    global _active  # noqa: PLW0603 -- one active tracer per process, swapped as a whole
    previous = _active
    _active = _Active(provider.get_tracer(INSTRUMENTATION), enabled=True)
    try:
        yield _active.tracer
    finally:
        _active = previous


@dataclass
class Tracing:
    """What `setup_tracing` installed; `shutdown()` flushes and stops it (a no-op when tracing is off)."""

    settings: TracingSettings | None = None
    provider: TracerProvider | None = None

    def shutdown(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        global _active  # noqa: PLW0603
        if self.provider is None:
            return
        _active = _Active(_NOOP, enabled=False)
        self.provider.force_flush(int(timeout * 1000))
        self.provider.shutdown()
        self.provider = None


def setup_tracing(
    service: str,
    replica: str,
    env: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
) -> Tracing:
    """Read the environment and, when it configures an endpoint, start exporting this process's spans.
    `exporter` replaces the OTLP exporter (tests); the settings still decide whether tracing is on."""
    global _active  # noqa: PLW0603
    env = os.environ if env is None else env
    settings = settings_from_env(env)
    if settings is None:
        return Tracing()
    batching = batch_options(env)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.endpoint)
    provider = TracerProvider(
        sampler=sampler_of(settings), resource=resource_of(service, replica, env), shutdown_on_exit=False
    )
    processor = BatchSpanProcessor(
        exporter,
        max_queue_size=batching.get("max_queue_size"),
        schedule_delay_millis=batching.get("schedule_delay_millis"),
        max_export_batch_size=batching.get("max_export_batch_size"),
        export_timeout_millis=batching.get("export_timeout_millis"),
    )
    provider.add_span_processor(processor)
    _active = _Active(provider.get_tracer(INSTRUMENTATION), enabled=True)
    log.info("tracing to %s (sampler %s)", settings.endpoint, settings.sampler)
    return Tracing(settings, provider)
