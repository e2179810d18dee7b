"""Observability for the service shells: OpenTelemetry tracing (`tracing`, `spans`, `logs`) and Prometheus
metrics (`metrics`). Imported by `shared.bus` and the services, never by the core (import-linter)."""
