"""Kairos's scheduling gates: their names, and the webhook registration through which they are set.

Two gates, both set only when a pod is created (Kubernetes allows nothing else), by the state service's
mutating admission webhook (`services.state.webhook.webhook`), and both lifted by the state service's owner
(`services.state.controllers.gate_keepers`, with the patches of `services.state.webhook.gate_patches`):

- `GATE` (`kairos.io/after`): for each pod of ours created while its workload says `kairos.io/after` (on
  the pod, on its PodGroup, or on any owner up its chain). Lifted once its podgroup's dependencies have
  succeeded (`services.state.mirror.dependencies`), and also for a pod gated while its podgroup has no
  dependencies (over-gating is harmless, only a moment's delay). The state service also holds a waiting
  podgroup back from scheduling itself, so a pod created without the gate still waits.
- `ADMISSION_GATE` (`kairos.io/admission`, the quota gate, state option `quota_gate`): for every pod of
  ours. Lifted once the queue leader says the podgroup's queues have room for its gang
  (`shared.core.quota_gate`). The core enforces queue limits and quotas itself, so a pod created without
  it is scheduled correctly.

A gated pod is `SchedulingGated`: no scheduler binds it and cluster autoscalers do not scale up for it.
The webhook is fail-open (`failurePolicy: Ignore`): a pod created while it is down is not gated.

Shared because more than the state service reads them: `shared.explain` names the quota gate, and the local
stack (`tools.stack`) registers the webhook with kubesim (`service_webhook_configuration`: one webhook
behind a Service, as deploy/ does; `webhook_configuration` calls URLs, each its own webhook). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

GATE = "kairos.io/after"
"""The stages' scheduling gate (the annotation's name, so `kubectl get pod -o yaml` says what it is for)."""
ADMISSION_GATE = "kairos.io/admission"
"""The quota gate: held until the pod's queues have room for its gang (state option `quota_gate`)."""

WEBHOOK_CONFIGURATION = "kairos-after-gate"
WEBHOOK_NAME = "after-gate.kairos.io"
"""The webhook's name behind a Service (deploy/base/webhook.yaml's; `kairos up` registers the same)."""
WEBHOOK_PATH = "/mutate-pods"
"""Where a state replica serves the webhook (`services.state.webhook.webhook.PATH`)."""

_RULES = [
    {
        "operations": ["CREATE"],
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
        "scope": "Namespaced",
    }
]


def webhook_configuration(urls: list[str], name: str = WEBHOOK_CONFIGURATION) -> dict[str, Any]:
    """A MutatingWebhookConfiguration calling the state webhooks at `urls` (plain URLs, for a test's webhook
    server or a replica of known address). Each URL is its own webhook, so the API server calls every one
    of them for each pod: the first that answers gates the pod, the others then see it gated (the local
    stack and deploy/ use `service_webhook_configuration` instead, one call per pod)."""
    return _configuration(
        name, [(f"r{index}.{WEBHOOK_NAME}", {"url": url}) for index, url in enumerate(urls)]
    )


def service_webhook_configuration(
    namespace: str,
    service: str,
    *,
    port: int = 443,
    path: str = WEBHOOK_PATH,
    name: str = WEBHOOK_CONFIGURATION,
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration with one webhook calling the state replicas behind the Service
    `namespace/service` on `port`: the API server sends each pod's review to one of the Service's
    endpoints, as on a cluster (what `kairos up` registers with kubesim; deploy/ has its own, with TLS)."""
    reference = {"namespace": namespace, "name": service, "port": port, "path": path}
    return _configuration(name, [(WEBHOOK_NAME, {"service": reference})])


def _configuration(name: str, hooks: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    # failurePolicy Ignore: Kairos down must not stop pods from being created (it still holds them).
    webhooks = [
        {
            "name": hook_name,
            "clientConfig": client_config,
            "rules": [dict(rule) for rule in _RULES],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
            "reinvocationPolicy": "Never",
        }
        for hook_name, client_config in hooks
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "kairos"}},
        "webhooks": webhooks,
    }
