"""Kairos's scheduling gates: their names, and the webhook registration through which they are set.

Two gates, both set only when a pod is created (Kubernetes allows nothing else), by the state service's
mutating admission webhook (`services.state.webhook`), and both lifted by the state service's owner
(`services.state.gate_keepers`, with the patches of `services.state.gate_patches`):

- `GATE` (`kairos.io/after`): for each pod of ours created while its workload says `kairos.io/after` (on
  the pod, on its PodGroup, or on any owner up its chain). Lifted once its podgroup's dependencies have
  succeeded (`services.state.dependencies`), and also for a pod gated while its podgroup has no
  dependencies (over-gating is harmless, only a moment's delay). The state service also holds a waiting
  podgroup back from scheduling itself, so a pod created without the gate still waits.
- `ADMISSION_GATE` (`kairos.io/admission`, the quota gate, state option `quota_gate`): for every pod of
  ours. Lifted once the queue leader says the podgroup's queues have room for its gang
  (`shared.core.quota_gate`). The core enforces queue limits and quotas itself, so a pod created without
  it is scheduled correctly.

A gated pod is `SchedulingGated`: no scheduler binds it and cluster autoscalers do not scale up for it.
The webhook is fail-open (`failurePolicy: Ignore`): a pod created while it is down is not gated.

Shared because more than the state service reads them: `shared.explain` names the quota gate, and the local
stack (`tools.stack`) registers the webhook with kubesim (`webhook_configuration`). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

GATE = "kairos.io/after"
"""The stages' scheduling gate (the annotation's name, so `kubectl get pod -o yaml` says what it is for)."""
ADMISSION_GATE = "kairos.io/admission"
"""The quota gate: held until the pod's queues have room for its gang (state option `quota_gate`)."""

WEBHOOK_CONFIGURATION = "kairos-after-gate"


def webhook_configuration(urls: list[str], name: str = WEBHOOK_CONFIGURATION) -> dict[str, Any]:
    """A MutatingWebhookConfiguration calling the state replicas' webhooks at `urls` (plain URLs: what
    `kairos up` registers with kubesim; deploy/ has the in-cluster one, behind a Service with TLS). Each
    replica is its own webhook: the first that answers gates the pod, the others then see it gated.
    `failurePolicy: Ignore`: Kairos down must not stop pods from being created (it still holds them)."""
    webhooks = [
        {
            "name": f"r{index}.after-gate.kairos.io",
            "clientConfig": {"url": url},
            "rules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
            "reinvocationPolicy": "Never",
        }
        for index, url in enumerate(urls)
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "kairos"}},
        "webhooks": webhooks,
    }
