"""deploy/base/admission-policy.yaml as a specification (issue 27, finding 12): Kairos's service accounts
may change only what Kairos writes, and nobody else's requests are touched.

RBAC lets the state service and the binder patch any pod and the binder write any ConfigMap; the
ValidatingAdmissionPolicies narrow that. Their CEL is evaluated here with cel-python (`celpy`) on
AdmissionRequest-shaped `request`, `object` and `oldObject` values, as the API server evaluates a policy:
match constraints (operation, resource, subresource), then match conditions, then the variables in
order, then every validation (a false one refuses with its message; one that cannot be evaluated refuses
too, `failurePolicy: Fail`).

The allowed requests are built from Kairos's own patch builders (the pod-grouper's keys, the gate
keeper's `ungate_patch`, the write-back's `pod_scheduled_patch`, the binder's `sharer_patch`,
`touch_patch` and `configmap_body`, the reservation container's `reserved_device_patch`), applied the way
the API server applies them (JSON merge patch, JSON patch, the strategic merge of a pod's conditions),
so a key Kairos starts writing that the policy does not allow fails here.

What cel-python does not do that the API server does: type-check the expressions against the pods' and
ConfigMaps' OpenAPI schemas and estimate their cost. The expressions therefore keep to CEL's standard
functions and macros (no Kubernetes extension library such as `optional`, `strings` or `lists`; checked
below), and every pod field they name is checked against the Kubernetes 1.30 and 1.32 schemas instead.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
from celpy import celtypes

from services.binder import gpu_sharing_plan
from services.state.mirror.problems import POD_SCHEDULED, Problem, pod_scheduled_patch
from services.state.webhook import gate_patches
from shared.kube import gpu_sharing as gs
from shared.kube import keys, wire
from shared.kube.scheduling_gates import ADMISSION_GATE, GATE
from shared.kube.translate.pod_patches import gpu_groups_patch
from tests.builders import pod_manifest, stored
from tests.unit.test_deploy_manifests import DEPLOY, NAMESPACE, base, env_of, find

Obj = dict[str, Any]

STATE = f"system:serviceaccount:{NAMESPACE}:kairos-state"
BINDER = f"system:serviceaccount:{NAMESPACE}:kairos-binder"
RESERVATION = f"system:serviceaccount:{gs.RESERVATION_NAMESPACE}:kairos-reservation"
SOMEONE = "system:serviceaccount:team-a:ci-bot"
ADMIN = "kubernetes-admin"
PODS = "kairos-pod-writes"
CONFIGMAPS = "kairos-configmap-writes"


# --- the evaluator ------------------------------------------------------------------------------------------
_ENV = celpy.Environment()


def _cel(expression: str, activation: dict[str, Any]) -> Any:
    return _ENV.program(_ENV.compile(expression)).evaluate(activation)


def _matches_rules(policy: Obj, request: Obj) -> bool:
    resource = request["resource"]["resource"]
    if request["subResource"]:
        resource += "/" + request["subResource"]
    return any(
        request["operation"] in rule["operations"]
        and request["resource"]["group"] in rule["apiGroups"]
        and request["resource"]["version"] in rule["apiVersions"]
        and resource in rule["resources"]
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
    )


def admit(policy: Obj, request: Obj) -> list[str] | None:
    """None when `policy` does not apply to `request` (an AdmissionRequest with `object` and `oldObject`);
    else the messages of the validations that refuse it (empty: allowed)."""
    if not _matches_rules(policy, request):
        return None
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel({k: v for k, v in request.items() if k not in ("object", "oldObject")}),
        "object": celpy.json_to_cel(request.get("object")),
        "oldObject": celpy.json_to_cel(request.get("oldObject")),
    }
    spec = policy["spec"]
    try:
        if not all(_cel(c["expression"], activation) for c in spec.get("matchConditions", [])):
            return None
    except celpy.CELEvalError as exc:
        return [f"match condition failed: {exc}"]
    variables = celtypes.MapType()
    activation["variables"] = variables
    for variable in spec.get("variables", []):
        try:
            value = _cel(variable["expression"], activation)
        except celpy.CELEvalError as exc:
            value = exc  # evaluated lazily by the API server: an error only where it is used
        variables[celtypes.StringType(variable["name"])] = value
    refusals = []
    for validation in spec["validations"]:
        try:
            if not _cel(validation["expression"], activation):
                refusals.append(validation["message"])
        except celpy.CELEvalError as exc:
            refusals.append(f"{validation['message']} (not evaluated: {exc})")
    return refusals


def policy(name: str) -> Obj:
    return find(base(), "ValidatingAdmissionPolicy", name)


# --- requests -----------------------------------------------------------------------------------------------
def request(user: str, operation: str, old: Obj | None, new: Obj | None, sub_resource: str = "") -> Obj:
    some = new or old
    assert some is not None
    kind = some["kind"]
    return {
        "uid": "0b7e6c1a",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "subResource": sub_resource,
        "operation": operation,
        "namespace": some["metadata"]["namespace"],
        "name": some["metadata"]["name"],
        "userInfo": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": new,
        "oldObject": old,
    }


def pod(**fields: Any) -> Obj:
    """A pod of Kairos's (schedulerName kai-scheduler), gated and pending, with a user's own labels,
    annotations, gate, owner and finalizer: `fields` replaces top-level parts (`metadata=...`)."""
    manifest = pod_manifest(
        "train-0",
        "team-a",
        labels={"app": "train", keys.QUEUE_LABEL: "team-a"},
        annotations={keys.GPU_FRACTION: "0.5", gs.CONFIGMAP_ANNOTATION: "train-abcdefg-shared-gpu"},
        owners=[{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j-1"}],
        image="registry.example.com/train:1",
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        schedulingGates=[{"name": "team-a.example.com/approval"}, {"name": GATE}, {"name": ADMISSION_GATE}],
    )
    status = {
        "qosClass": "BestEffort",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "False"},
            {"type": POD_SCHEDULED, "status": "False", "reason": "SchedulingGated"},
        ],
    }
    obj = stored(
        manifest,
        uid="5f0d9e1c-0000-4000-8000-000000000001",
        resource_version=None,
        created=None,
        status=status,
        finalizers=["team-a.example.com/audit"],
    )
    obj.update(fields)
    return obj


def reservation_pod() -> Obj:
    body = gs.reservation_pod("node-1", "group-1", image="kairos:0.1.0", service_account="kairos-reservation")
    body["metadata"].setdefault("namespace", gs.RESERVATION_NAMESPACE)
    body["metadata"]["uid"] = "5f0d9e1c-0000-4000-8000-000000000002"
    body["status"] = {"phase": "Running"}
    return body


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(target: Obj, ops: Iterable[Obj]) -> Obj:
    """RFC 6902 for the operations Kairos sends (test, remove, add), as application/json-patch+json."""
    out = copy.deepcopy(target)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        index: Any = int(last) if isinstance(node, list) and last != "-" else last
        if op["op"] == "test":
            assert node[index] == op["value"]
        elif op["op"] == "remove":
            del node[index]
        elif op["op"] == "add" and isinstance(node, list):
            node.insert(len(node) if index == "-" else index, op["value"])
        else:
            node[index] = op["value"]
    return out


def status_patch(target: Obj, patch: Obj) -> Obj:
    """The strategic merge of `pod_scheduled_patch` into a pod's status: conditions merge by `type`, and
    `$patch: delete` removes one. The rest of the status is kept (pods/status changes nothing else)."""
    out = copy.deepcopy(target)
    conditions = out["status"].setdefault("conditions", [])
    for change in patch["status"]["conditions"]:
        kept = [c for c in conditions if c["type"] != change["type"]]
        if change.get("$patch") != "delete":
            before = next((c for c in conditions if c["type"] == change["type"]), {})
            kept.append({**before, **change})
        conditions[:] = kept
    return out


def wire_pod(obj: Obj) -> wire.Pod:
    return wire.decode_pod(json.dumps(obj).encode())


def with_(obj: Obj, path: tuple[str | int, ...], value: Any) -> Obj:
    """`obj` with the value at `path` (keys and list indexes) set, or removed when None."""
    out = copy.deepcopy(obj)
    *parents, last = path
    node: Any = out
    for part in parents:
        node = node[part] if isinstance(part, int) else node.setdefault(part, {})
    if value is None:
        del node[last]
    else:
        node[last] = value
    return out


# --- what Kairos writes on pods is allowed ------------------------------------------------------------------
def test_the_pod_grouper_annotates_a_pod_with_its_podgroup_and_sub_group() -> None:
    old = pod()
    patch = {
        "metadata": {
            "annotations": {keys.PODGROUP_ANNOTATION: "pg-train"},
            "labels": {keys.SUBGROUP_LABEL: "workers"},
        }
    }
    assert admit(policy(PODS), request(STATE, "UPDATE", old, merge_patch(old, patch))) == []


@pytest.mark.parametrize("gate", [GATE, ADMISSION_GATE])
def test_the_gate_keepers_lift_their_own_scheduling_gate(gate: str) -> None:
    old = pod()
    ops = gate_patches.ungate_patch(wire_pod(old), gate)
    assert ops is not None
    assert admit(policy(PODS), request(STATE, "UPDATE", old, json_patch(old, ops))) == []


def test_the_state_service_sets_and_clears_the_pod_scheduled_condition_through_the_status() -> None:
    old = pod()
    problem = Problem(
        kind="Pod",
        namespace="team-a",
        name="train-0",
        reason="InvalidPod",
        message="Pod 'team-a/train-0': ...",
    )
    conditions = wire_pod(old).status.conditions
    held = status_patch(old, pod_scheduled_patch(conditions, problem, now=1_800_000_000.0) or {})
    assert held["status"]["conditions"][-1]["reason"] == "InvalidPod"
    assert admit(policy(PODS), request(STATE, "UPDATE", old, held, "status")) == []
    cleared = pod_scheduled_patch(wire_pod(held).status.conditions, None, now=1_800_000_001.0)
    assert cleared is not None
    assert admit(policy(PODS), request(STATE, "UPDATE", held, status_patch(held, cleared), "status")) == []


@pytest.mark.parametrize("groups", [["group-1"], ["group-1", "group-2"]])
def test_the_binder_labels_a_sharer_with_its_gpu_groups(groups: list[str]) -> None:
    old = pod()
    new = merge_patch(old, gpu_sharing_plan.sharer_patch(old["metadata"]["labels"], groups))
    assert admit(policy(PODS), request(BINDER, "UPDATE", old, new)) == []
    # Bound elsewhere later: the stale group labels go, the new ones come; rolled back: the annotation goes.
    moved = merge_patch(new, gpu_sharing_plan.sharer_patch(new["metadata"]["labels"], ["group-3"]))
    assert admit(policy(PODS), request(BINDER, "UPDATE", new, moved)) == []
    rolled_back = merge_patch(moved, gpu_groups_patch([]))
    assert admit(policy(PODS), request(BINDER, "UPDATE", moved, rolled_back)) == []


def test_the_binder_marks_a_reused_reservation_pod_and_the_reservation_container_writes_its_device() -> None:
    old = reservation_pod()
    touched = merge_patch(old, gpu_sharing_plan.touch_patch("team-a/train-0", 1_800_000_000.0))
    assert admit(policy(PODS), request(BINDER, "UPDATE", old, touched)) == []
    device = merge_patch(old, gs.reserved_device_patch(["GPU-0"]))
    assert admit(policy(PODS), request(RESERVATION, "UPDATE", old, device)) == []


# --- anything else on a pod is refused ----------------------------------------------------------------------
LABELS_REFUSED = "Kairos may change only its own labels on a pod"
ANNOTATIONS_REFUSED = "Kairos may change only its own annotations on a pod"
SPEC_REFUSED = "Kairos may not change a pod's spec"
GATES_REFUSED = "Kairos may only lift its own scheduling gates"
OWNERS_REFUSED = "Kairos may not change a pod's owner references or finalizers"
STATUS_REFUSED = "Kairos may not change a pod's status other than its PodScheduled condition"
CONDITIONS_REFUSED = "Kairos may change only a pod's PodScheduled condition"
NOT_OURS = "Kairos changes only the pods it schedules"


@pytest.mark.parametrize(
    ("user", "path", "value", "sub_resource", "refused"),
    [
        # Labels and annotations: another one, or the other service's.
        (STATE, ("metadata", "labels", "app"), "hijacked", "", LABELS_REFUSED),
        (BINDER, ("metadata", "labels", "app"), None, "", LABELS_REFUSED),
        (STATE, ("metadata", "labels", keys.KAI_GPU_GROUP_LABEL), "group-1", "", LABELS_REFUSED),
        (BINDER, ("metadata", "labels", keys.SUBGROUP_LABEL), "workers", "", LABELS_REFUSED),
        (BINDER, ("metadata", "annotations", "sidecar.example.com/inject"), "true", "", ANNOTATIONS_REFUSED),
        (
            BINDER,
            ("metadata", "annotations", keys.PODGROUP_ANNOTATION),
            "another-gang",
            "",
            ANNOTATIONS_REFUSED,
        ),
        (STATE, ("metadata", "annotations", gs.CONFIGMAP_ANNOTATION), "victim", "", ANNOTATIONS_REFUSED),
        (
            RESERVATION,
            ("metadata", "annotations", gpu_sharing_plan.TOUCH_ANNOTATION),
            "x",
            "",
            ANNOTATIONS_REFUSED,
        ),
        # The spec: an image (code in someone else's pod), tolerations, node selection.
        (BINDER, ("spec", "containers", 0, "image"), "registry.example.com/miner:1", "", SPEC_REFUSED),
        (STATE, ("spec", "tolerations"), [{"operator": "Exists"}], "", SPEC_REFUSED),
        (STATE, ("spec", "nodeSelector"), {"kubernetes.io/hostname": "node-9"}, "", SPEC_REFUSED),
        (STATE, ("spec", "activeDeadlineSeconds"), 1, "", SPEC_REFUSED),
        # Gates: someone else's, or Kairos's by the binder.
        (STATE, ("spec", "schedulingGates"), [{"name": GATE}, {"name": ADMISSION_GATE}], "", GATES_REFUSED),
        (
            BINDER,
            ("spec", "schedulingGates"),
            [{"name": "team-a.example.com/approval"}, {"name": ADMISSION_GATE}],
            "",
            GATES_REFUSED,
        ),
        # Owners and finalizers: an owner that is gone has the garbage collector delete the pod.
        (
            STATE,
            ("metadata", "ownerReferences"),
            [{"apiVersion": "v1", "kind": "Pod", "name": "gone", "uid": "x"}],
            "",
            OWNERS_REFUSED,
        ),
        (BINDER, ("metadata", "finalizers"), [], "", OWNERS_REFUSED),
        # The status: anything but PodScheduled, PodScheduled by the binder.
        (STATE, ("status", "phase"), "Failed", "status", STATUS_REFUSED),
        (STATE, ("status", "nominatedNodeName"), "node-9", "status", STATUS_REFUSED),
        (STATE, ("status", "conditions", 0, "status"), "True", "status", CONDITIONS_REFUSED),
        (BINDER, ("status", "conditions", 1, "reason"), "Unschedulable", "status", CONDITIONS_REFUSED),
    ],
)
def test_a_change_to_anything_but_kairos_s_own_keys_is_refused(
    user: str, path: tuple[str | int, ...], value: Any, sub_resource: str, refused: str
) -> None:
    old = pod()
    new = with_(old, path, value)
    assert new != old
    refusals = admit(policy(PODS), request(user, "UPDATE", old, new, sub_resource))
    assert refusals is not None
    assert [r for r in refusals if r.startswith(refused)] == refusals, refusals
    assert len(refusals) == 1


def test_a_pod_of_another_scheduler_is_not_kairos_s_to_change_even_with_its_own_keys() -> None:
    old = with_(pod(), ("spec", "schedulerName"), "default-scheduler")
    new = merge_patch(old, {"metadata": {"annotations": {keys.PODGROUP_ANNOTATION: "pg"}}})
    refusals = admit(policy(PODS), request(STATE, "UPDATE", old, new))
    assert refusals is not None
    assert [r[: len(NOT_OURS)] for r in refusals] == [NOT_OURS]


# --- everyone else is not affected --------------------------------------------------------------------------
@pytest.mark.parametrize("user", [SOMEONE, ADMIN, f"system:serviceaccount:{NAMESPACE}:kairos-queue"])
def test_the_policies_do_not_apply_to_anyone_else(user: str) -> None:
    old = pod()
    new = with_(
        with_(old, ("spec", "containers", 0, "image"), "registry.example.com/train:2"),
        ("metadata", "labels", "app"),
        "x",
    )
    assert admit(policy(PODS), request(user, "UPDATE", old, new)) is None
    cm = configmap("team-a-settings", labels={})
    assert admit(policy(CONFIGMAPS), request(user, "CREATE", None, cm)) is None


def test_kairos_s_binding_eviction_and_reservation_pods_are_other_requests() -> None:
    sharer = pod()
    for operation, sub_resource in (
        ("CREATE", "binding"),
        ("CREATE", "eviction"),
        ("CREATE", ""),
        ("DELETE", ""),
    ):
        assert admit(policy(PODS), request(BINDER, operation, None, sharer, sub_resource)) is None


# --- ConfigMaps ---------------------------------------------------------------------------------------------
def configmap(name: str, *, labels: dict[str, str] | None = None, owner_kind: str = "Pod") -> Obj:
    obj: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {gs.SHARING_LABEL: "true"} if labels is None else labels,
            "ownerReferences": [{"apiVersion": "v1", "kind": owner_kind, "name": "train-0", "uid": "p-1"}],
        },
        "data": {"team": "a"},
    }
    return obj


def sharing_configmaps() -> list[Obj]:
    """The binder's two ConfigMaps for the pod's first container, as it creates them."""
    sharer = wire_pod(pod())
    prefix = sharer.metadata.annotations[gs.CONFIGMAP_ANNOTATION]
    ref = gs.fraction_container(sharer)
    data = {gs.NVIDIA_VISIBLE_DEVICES: "GPU-0", gs.GPU_PORTION: "0.50"}
    return [
        gs.configmap_body(sharer, gs.capabilities_configmap(prefix, ref), data),
        gs.configmap_body(sharer, gs.direct_env_configmap(prefix, ref), {}),
    ]


def test_the_binder_creates_and_fills_its_gpu_sharing_configmaps() -> None:
    for body in sharing_configmaps():
        body["metadata"]["namespace"] = "team-a"
        assert admit(policy(CONFIGMAPS), request(BINDER, "CREATE", None, body)) == []
        filled = merge_patch(body, {"data": {gs.NVIDIA_VISIBLE_DEVICES: "GPU-1"}})
        assert admit(policy(CONFIGMAPS), request(BINDER, "UPDATE", body, filled)) == []


@pytest.mark.parametrize(
    ("operation", "old", "new", "refused"),
    [
        # A name that is not a GPU-sharing ConfigMap's: a pod annotated runai/shared-gpu-configmap: settings.
        ("CREATE", None, configmap("settings-0"), "Kairos writes only GPU-sharing ConfigMaps"),
        (
            "CREATE",
            None,
            configmap("train-abcdefg-shared-gpu-0", labels={}),
            "Kairos writes only ConfigMaps labelled",
        ),
        (
            "CREATE",
            None,
            configmap("train-abcdefg-shared-gpu-0", owner_kind="Deployment"),
            "A GPU-sharing ConfigMap is owned by its pod",
        ),
        # Someone else's ConfigMap of a sharing name, unlabelled: the binder's 409-then-patch must not take it.
        (
            "UPDATE",
            configmap("train-abcdefg-shared-gpu-0", labels={}),
            with_(configmap("train-abcdefg-shared-gpu-0", labels={}), ("data",), {gs.GPU_PORTION: "1"}),
            "Kairos updates only ConfigMaps that were already its own",
        ),
        (
            "UPDATE",
            configmap("train-abcdefg-shared-gpu-0"),
            with_(configmap("train-abcdefg-shared-gpu-0"), ("metadata", "annotations"), {"x": "y"}),
            "Kairos changes only the data of its GPU-sharing ConfigMaps",
        ),
        (
            "UPDATE",
            configmap("train-abcdefg-shared-gpu-0"),
            with_(configmap("train-abcdefg-shared-gpu-0"), ("metadata", "labels", "team"), "b"),
            "Kairos changes only the data of its GPU-sharing ConfigMaps",
        ),
    ],
)
def test_a_configmap_kairos_does_not_own_is_refused(
    operation: str, old: Obj | None, new: Obj, refused: str
) -> None:
    refusals = admit(policy(CONFIGMAPS), request(BINDER, operation, old, new))
    assert refusals is not None
    assert refused in [r[: len(refused)] for r in refusals], refusals


# --- the manifests ------------------------------------------------------------------------------------------
def test_the_policies_and_their_bindings_are_part_of_the_install() -> None:
    listed = (DEPLOY / "base" / "kustomization.yaml").read_text()
    assert "admission-policy.yaml" in listed
    for name in (PODS, CONFIGMAPS):
        assert "namespace" not in policy(name)["metadata"]  # cluster-scoped
        binding = find(base(), "ValidatingAdmissionPolicyBinding", name)
        assert "namespace" not in binding["metadata"]
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        assert policy(name)["spec"]["failurePolicy"] == "Fail"


def test_the_users_matched_are_the_base_s_service_accounts_and_the_scheduler_its_state_service_s() -> None:
    accounts = {
        f"system:serviceaccount:{o['metadata']['namespace']}:{o['metadata']['name']}"
        for o in base()
        if o["kind"] == "ServiceAccount"
    }
    text = (DEPLOY / "base" / "admission-policy.yaml").read_text()
    named = set(re.findall(r"system:serviceaccount:[a-z0-9-]+:[a-z0-9-]+", text))
    assert named == {STATE, BINDER, RESERVATION}
    assert named <= accounts
    scheduler = env_of(find(base(), "Deployment", "kairos-state"))["KAIROS_SCHEDULER_NAME"]["value"]
    assert f"oldObject.spec.schedulerName == '{scheduler}'" in text


STANDARD_FUNCTIONS = {"has", "size", "matches", "startsWith", "all", "exists", "filter", "map"}
"""CEL's standard functions and macros the policies use; the API server has them all without any of its
extension libraries."""


def expressions() -> list[str]:
    found = []
    for name in (PODS, CONFIGMAPS):
        spec = policy(name)["spec"]
        for part in ("matchConditions", "variables", "validations"):
            found += [item["expression"] for item in spec.get(part, [])]
    return found


def test_the_expressions_use_only_cel_s_standard_functions() -> None:
    called = {
        m for e in expressions() for m in re.findall(r"([A-Za-z_]\w*)\s*\(", re.sub(r"'[^']*'", "''", e))
    }
    assert called <= STANDARD_FUNCTIONS, called - STANDARD_FUNCTIONS


def pod_schema(version: str) -> dict[str, Obj]:
    """Kubernetes `version`'s schemas of PodSpec, PodStatus and ObjectMeta, by their short names."""
    folder = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}.0-local"
    defs = json.loads((folder / "_definitions.json").read_text())["$defs"]
    return {
        "spec": defs["io.k8s.api.core.v1.PodSpec"],
        "status": defs["io.k8s.api.core.v1.PodStatus"],
        "metadata": defs["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"],
    }


@pytest.mark.parametrize("version", ["1.30", "1.32"])
def test_every_pod_field_the_policy_names_is_in_the_schema_and_every_status_field_is_compared(
    version: str,
) -> None:
    schema = pod_schema(version)
    spec = policy(PODS)["spec"]
    text = " ".join(item["expression"] for item in spec["validations"] + spec["variables"])
    named = set(re.findall(r"\b(?:object|oldObject)\.(spec|status|metadata)\.(\w+)", text))
    for part, field in named:
        assert field in schema[part]["properties"], f"{part}.{field} is not a field of a {version} pod"
    status = {field for part, field in named if part == "status"}
    assert status == set(schema["status"]["properties"])
