"""The admission webhook under a pod whose examination fails unforeseen (a bug its content reaches): that
pod is admitted as it is with a warning, and the next pod is examined as before."""

from __future__ import annotations

from typing import Any

import pytest

from services.state.webhook import webhook
from services.state.webhook.webhook import AdmissionServer, WebhookOptions
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext
from shared.kube import keys
from shared.kubeapi.client import Kube
from tests.integration.test_webhook_owner_reads import Api, api, creation

pytestmark = pytest.mark.integration

__all__ = ["api"]  # the fixture, used by name


async def test_a_pod_the_webhook_fails_on_is_admitted_with_a_warning_and_the_next_is_examined(
    api: tuple[Api, Kube], bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, kube = api
    real = webhook.gpu_sharing.admission_patch

    def failing(pod: Any, random_chars: str) -> Any:
        if pod.metadata.name == "odd":
            raise RecursionError("maximum recursion depth exceeded")
        return real(pod, random_chars)

    monkeypatch.setattr(webhook.gpu_sharing, "admission_patch", failing)
    ctx = ServiceContext("state", ServiceConfig(), bus)
    server = AdmissionServer(ctx, kube, WebhookOptions(port=0))
    try:
        # Fractional, as the next: the webhook examines a pod's GPU sharing only when it shares a GPU.
        odd = creation("odd", podgroup="pg", annotations={keys.GPU_FRACTION: "0.5"})
        patch, warning = await server.decide(odd)
        assert patch is None
        assert "RecursionError" in warning
        fractional = creation("half", podgroup="pg", annotations={keys.GPU_FRACTION: "0.5"})
        patch, warning = await server.decide(fractional)
        assert warning == ""
        assert patch is not None
    finally:
        await server.stop()
    assert ctx.counters["admission_unforeseen"] == 1
