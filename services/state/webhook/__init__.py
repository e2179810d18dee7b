"""The state service's admission webhooks, served by every replica with `webhook_port` (standbys too).

Started by `services.state.service`; the API server calls them (deploy/base's webhook configurations, or
kubesim's in `kairos up`).

- `webhook`: the HTTP server and the mutating pod webhook (GPU-sharing environment, the stages' and the
  quota gate, device access), over `admission_review` (the AdmissionReview protocol, sans-I/O),
  `gate_patches` (who gets a gate, the patches that set and lift one; the gate keepers lift with them),
  `device_access` (KAI's ``deviceaccess``, as values) and `podgroup_lookup` (a pod's PodGroup from the
  mirror, without an API read).
- `queue_validation`: the validating Queue endpoint (KAI's queue webhook), on the same port.
"""
