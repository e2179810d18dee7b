"""deploy/'s admission webhook for the `kairos.io/after` gate, rendered with the real kubectl: the API server
can reach the state replicas (Service -> container port), trusts them (cert-manager's certificate for the
Service's name, its CA injected into the configuration), never waits on Kairos for a pod (failurePolicy
Ignore, 5 s) nor sends it the system's or Kairos's own pods; the state pods serve it with the key they can
read; and the component deploy/no-webhook takes it all out for a cluster without cert-manager."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.test_deploy_manifests import (
    NAMESPACE,
    WEBHOOK_PORT,
    base,
    container,
    env_of,
    find,
    of_kind,
    pod_spec,
    render,
    schema_errors,
    with_component,
)
from tools.kubesim.assembly import build_cluster
from tools.kubesim.errors import ApiError

Obj = dict[str, Any]
CONFIGURATION = "kairos-after-gate"
SERVICE = "kairos-state-webhook"
SECRET = "kairos-webhook-tls"


def the_webhook(objects: tuple[Obj, ...]) -> Obj:
    [hook] = find(objects, "MutatingWebhookConfiguration", CONFIGURATION)["webhooks"]
    return hook


def test_the_webhook_gates_new_pods_without_ever_blocking_them() -> None:
    hook = the_webhook(base())
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["clientConfig"]["service"] == {
        "name": SERVICE,
        "namespace": NAMESPACE,
        "path": "/mutate-pods",
        "port": 443,
    }
    # Kairos down must not stop pod creation anywhere (the state service holds waiting podgroups itself).
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] == 5
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["matchPolicy"] == "Equivalent"
    assert "caBundle" not in hook["clientConfig"]  # cert-manager's CA injector writes it


def test_the_system_s_and_kairos_s_own_pods_are_never_sent() -> None:
    selector = the_webhook(base())["namespaceSelector"]
    [expression] = selector["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    assert set(expression["values"]) == {"kube-system", NAMESPACE}


def test_the_service_reaches_the_state_containers_webhook_port() -> None:
    objects = base()
    service = find(objects, "Service", SERVICE)
    state = find(objects, "Deployment", "kairos-state")
    assert service["metadata"]["namespace"] == NAMESPACE
    assert service["spec"]["selector"].items() <= state["spec"]["template"]["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (443, "webhook")
    ports = {p["name"]: p["containerPort"] for p in container(state)["ports"]}
    assert ports["webhook"] == WEBHOOK_PORT
    # No other workload's pods are behind it.
    for workload in (
        of_kind(objects, "Deployment") + of_kind(objects, "StatefulSet") + of_kind(objects, "DaemonSet")
    ):
        if workload["metadata"]["name"] != "kairos-state":
            labels = workload["spec"]["template"]["metadata"]["labels"].items()
            assert not service["spec"]["selector"].items() <= labels, workload["metadata"]["name"]


def test_the_state_service_serves_it_over_tls_with_the_certificate_s_secret() -> None:
    objects = base()
    state = find(objects, "Deployment", "kairos-state")
    env = {name: item["value"] for name, item in env_of(state).items() if "value" in item}
    assert env["KAIROS_WEBHOOK_PORT"] == str(WEBHOOK_PORT)
    volumes = {v["name"]: v for v in pod_spec(state)["volumes"]}
    [mount] = [m for m in container(state)["volumeMounts"] if m["mountPath"] == "/etc/kairos/webhook"]
    assert mount["readOnly"] is True
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == SECRET
    assert env["KAIROS_WEBHOOK_CERT"] == "/etc/kairos/webhook/tls.crt"
    assert env["KAIROS_WEBHOOK_KEY"] == "/etc/kairos/webhook/tls.key"
    # The key is readable by the pod's non-root user: group-readable, the group being the pod's fsGroup.
    security = pod_spec(state)["securityContext"]
    assert secret["defaultMode"] & 0o040
    assert security["fsGroup"] == security["runAsGroup"]
    assert find(objects, "Certificate", "kairos-state-webhook")["spec"]["secretName"] == SECRET


def test_cert_manager_issues_a_certificate_for_the_service_and_injects_its_ca() -> None:
    objects = base()
    certificate = find(objects, "Certificate", "kairos-state-webhook")
    spec = certificate["spec"]
    # The name the API server dials: <service>.<namespace>.svc.
    assert f"{SERVICE}.{NAMESPACE}.svc" in spec["dnsNames"]
    assert "server auth" in spec["usages"]
    issuer = find(objects, "Issuer", spec["issuerRef"]["name"])
    assert spec["issuerRef"]["kind"] == "Issuer"
    assert issuer["metadata"]["namespace"] == certificate["metadata"]["namespace"] == NAMESPACE
    assert "selfSigned" in issuer["spec"]
    annotations = find(objects, "MutatingWebhookConfiguration", CONFIGURATION)["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/kairos-state-webhook"


def test_the_cert_manager_check_catches_a_misspelt_field() -> None:
    certificate = copy.deepcopy(find(base(), "Certificate", "kairos-state-webhook"))
    certificate["spec"]["dnsName"] = certificate["spec"].pop("dnsNames")
    [error] = schema_errors((certificate,))
    assert error.startswith("Certificate kairos-state-webhook: spec: ")
    assert "dnsName" in error


def test_the_configuration_is_accepted_by_the_simulated_api_server() -> None:
    """kubesim checks a configuration as the real API server does (three-segment webhook names, timeouts,
    side effects, review versions): the rendered one passes, and a broken copy is refused."""
    cluster = build_cluster(clock=lambda: 1_700_000_000.0)
    configuration = find(base(), "MutatingWebhookConfiguration", CONFIGURATION)
    stored = cluster.apply_manifest(copy.deepcopy(configuration))
    assert stored["webhooks"][0]["name"] == "after-gate.kairos.io"
    broken = copy.deepcopy(configuration)
    broken["metadata"]["name"] = "broken"
    broken["webhooks"][0]["timeoutSeconds"] = 60
    with pytest.raises(ApiError, match=r"webhooks\[0\]\.timeoutSeconds"):
        cluster.apply_manifest(broken)


# --- without cert-manager: deploy/no-webhook ----------------------------------------------------------------
WEBHOOK_OBJECTS = {
    ("MutatingWebhookConfiguration", CONFIGURATION),
    ("ValidatingWebhookConfiguration", "kairos-queue-validation"),
    ("Service", SERVICE),
    ("Certificate", "kairos-state-webhook"),
    ("Issuer", "kairos-selfsigned"),
    ("NetworkPolicy", "kairos-state-webhook"),
}


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
def test_no_webhook_removes_the_webhook_and_keeps_everything_else(path: str) -> None:
    full = render(path)
    without = with_component(path, "no-webhook")
    assert {(o["kind"], o["metadata"]["name"]) for o in full} - {
        (o["kind"], o["metadata"]["name"]) for o in without
    } == WEBHOOK_OBJECTS
    assert {o["apiVersion"].split("/")[0] for o in without}.isdisjoint({"cert-manager.io"})
    state = find(without, "Deployment", "kairos-state")
    main = container(state)
    assert not any(name.startswith("KAIROS_WEBHOOK_") for name in env_of(state))
    assert [p["name"] for p in main["ports"]] == ["health"]
    assert all(m["mountPath"] != "/etc/kairos/webhook" for m in main["volumeMounts"])
    assert all(v.get("secret", {}).get("secretName") != SECRET for v in pod_spec(state)["volumes"])
    # Every other object is as the base renders it.
    untouched = [o for o in full if (o["kind"], o["metadata"]["name"]) not in WEBHOOK_OBJECTS]
    changed = [o for o in untouched if o not in without]
    assert [(o["kind"], o["metadata"]["name"]) for o in changed] == [("Deployment", "kairos-state")]
    assert schema_errors(without) == []
