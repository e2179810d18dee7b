"""Kairos's runtime library, imported by every service.

The data model (`model`), the pure scheduling core (`core`), the wire contract (`contracts`), the NATS shell
(`bus`), Kubernetes translation (`kube`) and API client (`kubeapi`), observability (`telemetry`), security
(`security`), the exception tree (`errors`), and pure helpers the services share (`clusterfile`, `explain`,
`backoff`). It never imports `services` or `tools` (import-linter).
"""
