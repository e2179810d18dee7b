"""deploy/'s Queue validation, rendered with the real kubectl: the API server sends every Queue created or
updated (never a status update) to the state replicas' endpoint behind the webhook Service, trusting the
same cert-manager certificate, and never waits on Kairos for it (failurePolicy Ignore, 5 s); the same
configuration `kairos up` registers with kubesim sends to the same path."""

from __future__ import annotations

from shared.kube import queue_admission
from tests.unit.test_deploy_manifests import NAMESPACE, base, find

CONFIGURATION = "kairos-queue-validation"


def test_queues_created_or_updated_go_to_the_state_replicas_queue_endpoint() -> None:
    config = find(base(), "ValidatingWebhookConfiguration", CONFIGURATION)
    [hook] = config["webhooks"]
    assert hook["name"] == "queues.scheduling.run.ai"
    assert hook["rules"] == [
        {
            "operations": ["CREATE", "UPDATE"],
            "apiGroups": ["scheduling.run.ai"],
            "apiVersions": ["*"],
            "resources": ["queues"],
            "scope": "Cluster",
        }
    ]
    assert hook["clientConfig"]["service"] == {
        "name": "kairos-state-webhook",
        "namespace": NAMESPACE,
        "path": queue_admission.PATH,
        "port": 443,
    }
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/kairos-state-webhook"
    )
    assert (hook["failurePolicy"], hook["timeoutSeconds"], hook["sideEffects"]) == ("Ignore", 5, "None")


def test_kairos_up_registers_the_same_rule_and_path() -> None:
    [deployed] = find(base(), "ValidatingWebhookConfiguration", CONFIGURATION)["webhooks"]
    [local] = queue_admission.webhook_configuration(["http://127.0.0.1:1"])["webhooks"]
    assert local["rules"] == deployed["rules"]
    assert local["clientConfig"]["url"].endswith(deployed["clientConfig"]["service"]["path"])
