"""Tracing is configured by the standard OTEL_* variables: off (no-op) without an endpoint, on with one,
errors naming the variable, per-service resource, and spans that reach a real OTLP/HTTP receiver and are
flushed on shutdown."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.telemetry import tracing
from shared.telemetry.tracing import TracingSettings, resource_of, settings_from_env, setup_tracing
from tests.otlp_receiver import otlp_receiver


def test_tracing_is_off_without_an_endpoint() -> None:
    assert settings_from_env({}) is None


def test_the_generic_endpoint_gets_the_traces_path() -> None:
    settings = settings_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318/"})
    assert settings == TracingSettings(endpoint="http://jaeger:4318/v1/traces")


def test_the_traces_endpoint_is_used_as_given() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/otlp/v1/traces",
    }
    settings = settings_from_env(env)
    assert settings is not None
    assert settings.endpoint == "http://tempo:4318/otlp/v1/traces"


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"},
    ],
)
def test_tracing_can_be_switched_off_with_an_endpoint_set(env: dict[str, str]) -> None:
    assert settings_from_env(env) is None


def test_the_sampler_and_its_ratio_are_read() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    settings = settings_from_env(env)
    assert settings is not None
    assert (settings.sampler, settings.ratio) == ("parentbased_traceidratio", 0.25)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        ("OTEL_TRACES_SAMPLER_ARG", "half"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "jaeger:4318"),
        ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
    ],
)
def test_a_value_kairos_cannot_honour_is_an_error_naming_the_variable(variable: str, value: str) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        variable: value,
    }
    with pytest.raises(ConfigError, match=variable):
        setup_tracing("queue", "queue-0", env=env)
    assert not tracing.enabled()


def test_each_service_is_named_after_itself_with_its_replica_as_instance() -> None:
    attributes = resource_of("placement", "placement-1", {}).attributes
    assert attributes["service.name"] == "kairos-placement"
    assert attributes["service.instance.id"] == "placement-1"
    assert attributes["service.namespace"] == "kairos"


def test_the_environment_names_win_over_the_defaults() -> None:
    env = {
        "OTEL_SERVICE_NAME": "scheduler-binder",
        "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=pod-7,deployment.environment=lab%20one",
    }
    attributes = resource_of("binder", "binder-0", env).attributes
    assert attributes["service.name"] == "scheduler-binder"
    assert attributes["service.instance.id"] == "pod-7"
    assert attributes["deployment.environment"] == "lab one"


def test_without_an_endpoint_the_tracer_is_a_no_op_and_tracing_reports_off() -> None:
    installed = setup_tracing("queue", "queue-0", env={})
    assert installed.provider is None
    assert not tracing.enabled()
    span = tracing.tracer().start_span("anything")
    assert not span.is_recording()
    installed.shutdown()


def test_spans_reach_an_otlp_receiver_and_shutdown_flushes_them() -> None:
    with otlp_receiver() as receiver:
        # A long batch delay: only the shutdown's flush can deliver the span in time.
        env = {**receiver.environment(), "OTEL_BSP_SCHEDULE_DELAY": "60000"}
        installed = setup_tracing("state", "state-0", env=env)
        try:
            assert tracing.enabled()
            with tracing.tracer().start_as_current_span("state.observe", attributes={"kairos.podgroup": "a"}):
                pass
        finally:
            installed.shutdown()
        assert not tracing.enabled()
        (span,) = receiver.wait_for(lambda spans: spans, timeout=10)
    assert span.name == "state.observe"
    assert span.service == "kairos-state"
    assert span.instance == "state-0"
    assert span.attributes == {"kairos.podgroup": "a"}
