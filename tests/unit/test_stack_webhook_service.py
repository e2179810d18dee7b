"""What `kairos up` registers with kubesim for the state replicas' admission webhooks
(tools.stack.webhook_service): one pod webhook and one Queue validation behind the Service deploy/ has,
whose endpoints are every state replica's webhook port on loopback, so kubesim sends each review to one
replica."""

from __future__ import annotations

from typing import Any

import pytest

from services.state.webhook import webhook as state_webhook
from shared.kube import queue_admission
from shared.kube.scheduling_gates import WEBHOOK_PATH
from tests.unit.test_deploy_manifests import base, find
from tools.kubesim import admission
from tools.stack import webhook_service

Obj = dict[str, Any]
PORTS = [40001, 40002, 40003]


def by_kind(kind: str) -> Obj:
    [found] = [o for o in webhook_service.objects(PORTS) if o["kind"] == kind]
    return found


@pytest.mark.parametrize(
    ("kind", "storage", "path"),
    [
        ("MutatingWebhookConfiguration", admission.MUTATING, WEBHOOK_PATH),
        ("ValidatingWebhookConfiguration", admission.VALIDATING, queue_admission.PATH),
    ],
)
def test_each_configuration_has_one_webhook_naming_the_service_and_kubesim_accepts_it(
    kind: str, storage: str, path: str
) -> None:
    config = by_kind(kind)
    admission.default_configuration(storage, config)
    admission.validate_configuration(storage, config)
    [hook] = config["webhooks"]
    assert hook["clientConfig"] == {
        "service": {"namespace": "kai-scheduler", "name": "kairos-state-webhook", "port": 443, "path": path}
    }
    assert hook["failurePolicy"] == "Ignore"


def test_every_state_replica_is_a_ready_endpoint_of_the_service() -> None:
    hook = by_kind("MutatingWebhookConfiguration")["webhooks"][0]
    reference = hook["clientConfig"]["service"]
    endpoints = admission.service_endpoints(
        reference, webhook_service.service(), webhook_service.endpoint_slices(PORTS)
    )
    assert [admission.endpoint_url(reference, e) for e in endpoints] == [
        f"http://127.0.0.1:{port}/mutate-pods" for port in PORTS
    ]


def test_the_local_webhooks_are_deploys_by_name_service_path_and_rules() -> None:
    deployed = base()
    for kind, name in (
        ("MutatingWebhookConfiguration", "kairos-after-gate"),
        ("ValidatingWebhookConfiguration", "kairos-queue-validation"),
    ):
        [theirs] = find(deployed, kind, name)["webhooks"]
        local = by_kind(kind)
        assert local["metadata"]["name"] == name
        [ours] = local["webhooks"]
        assert (ours["name"], ours["rules"]) == (theirs["name"], theirs["rules"])
        assert ours["clientConfig"]["service"] == theirs["clientConfig"]["service"]
    service = find(deployed, "Service", webhook_service.SERVICE)
    assert service["spec"]["ports"][0]["name"] == webhook_service.PORT_NAME
    assert service["spec"]["ports"][0]["port"] == webhook_service.PORT


def test_the_pod_webhook_path_is_the_one_the_state_replicas_serve() -> None:
    assert WEBHOOK_PATH == state_webhook.PATH
