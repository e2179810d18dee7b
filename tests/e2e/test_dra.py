"""Dynamic Resource Allocation on `kairos up`, with the real kubectl (issue 30, deliverable 2): kubesim's
simulated NVIDIA DRA driver publishes a ResourceSlice per GPU node and the DeviceClass gpu.nvidia.com,
its resourceclaim controller makes claims from templates, and its kubelet starts a pod only once its
claims are allocated and reserved for it.

- a pod whose claim template asks for one GPU is bound, its claim allocated one device of its node and
  reserved for it, and runs;
- a pod naming a claim that does not exist waits, with a Warning naming the claim;
- KAI's docs/dra example (examples/kai/dra/gpu-imex-pod.yaml: a ComputeDomain and a pod using its IMEX
  channel template) applies unchanged and its pod is scheduled with its claim allocated;
- a pod naming a shared GPU claim without its queue's kai.scheduler/queue label waits with KAI's words,
  and is bound once the claim is labelled;
- an adminAccess claim is refused in kube-apiserver's words until its namespace is labelled
  resource.kubernetes.io/admin-access=true, then bound with adminAccess on its result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kubectl, kubesim_stack, wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kai" / "dra" / "gpu-imex-pod.yaml"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("dra"), nodes=2, gpus_per_node=2) as started:
        yield started


def got(stack: Stack, *args: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(kubectl(stack, "get", *args, "-o", "json"))
    return answer


def claim_of(stack: Stack, pod: dict[str, Any], entry: str) -> dict[str, Any]:
    statuses = {s["name"]: s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses", [])}
    return got(stack, "resourceclaims", statuses[entry], "-n", "default")


def test_a_pod_whose_claim_template_asks_for_one_gpu_is_bound_with_its_claim_allocated_and_reserved(
    stack: Stack,
) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
            }
        },
    }
    pod = manifests.pod("dra-train")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    apply(stack, template, pod)

    def running() -> dict[str, Any] | None:
        found = got(stack, "pod", "dra-train", "-n", "default")
        return found if found["status"].get("phase") == "Running" else None

    found = wait_for("the pod running", running)
    claim = claim_of(stack, found, "gpu")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (
        "gpu.nvidia.com",
        found["spec"]["nodeName"],
        "gpu",
    )
    assert [u["uid"] for u in claim["status"]["reservedFor"]] == [found["metadata"]["uid"]]


def test_a_pod_naming_a_missing_claim_waits_with_a_warning_naming_it(stack: Stack) -> None:
    pod = manifests.pod("dra-missing")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "nowhere"}]
    apply(stack, pod)

    def warned() -> str | None:
        events = got(stack, "events", "-n", "default")["items"]
        for event in events:
            about = event["involvedObject"]["name"] == "dra-missing" and event["type"] == "Warning"
            if about and 'resourceclaim "nowhere" not found' in event.get("message", ""):
                return str(event["message"])
        return None

    wait_for("the Warning naming the claim", warned)
    found = got(stack, "pod", "dra-missing", "-n", "default")
    assert not found["spec"].get("nodeName")
    conditions = {c["type"]: c for c in found["status"].get("conditions", [])}
    assert conditions["PodScheduled"]["status"] == "False"


def test_kais_dra_example_is_scheduled_with_its_claim_allocated(stack: Stack) -> None:
    kubectl(stack, "apply", "-f", str(EXAMPLE))

    def bound() -> dict[str, Any] | None:
        found = got(stack, "pod", "gpu-imex-pod", "-n", "default")
        return (
            found if found["spec"].get("nodeName") and found["status"].get("resourceClaimStatuses") else None
        )

    found = wait_for("the example's pod bound", bound)
    claim = claim_of(stack, found, "imex-channel-0")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["device"]) == ("compute-domain.nvidia.com", "channel-0")
    assert result["pool"] == found["spec"]["nodeName"]


def _warning_about(stack: Stack, pod: str, words: str) -> str | None:
    for event in got(stack, "events", "-n", "default")["items"]:
        about = event["involvedObject"]["name"] == pod and event["type"] == "Warning"
        if about and words in event.get("message", ""):
            return str(event["message"])
    return None


def _said_about(stack: Stack, pod: str) -> str:
    """The event messages about `pod`, for a failure's report."""
    events = got(stack, "events", "-n", "default")["items"]
    return json.dumps([e.get("message") for e in events if e["involvedObject"]["name"] == pod])


def _bound(stack: Stack, pod: str) -> dict[str, Any] | None:
    found = got(stack, "pod", pod, "-n", "default")
    return found if found["spec"].get("nodeName") else None


def _claim(name: str, exactly: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", **({"labels": labels} if labels else {})},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _pod_naming(name: str, claim: str) -> dict[str, Any]:
    pod = manifests.pod(name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def test_a_shared_gpu_claim_without_its_queues_label_holds_the_pod_until_labelled(stack: Stack) -> None:
    """KAI's queue check: a GPU claim a pod names must carry the kai.scheduler/queue label of the pod's
    queue; once labelled, the pod is bound."""
    apply(
        stack,
        _claim("shared-gpu", {"deviceClassName": "gpu.nvidia.com"}),
        _pod_naming("dra-shared", "shared-gpu"),
    )
    wait_for(
        "the Warning in KAI's words",
        lambda: _warning_about(stack, "dra-shared", "is a shared GPU claim but does not have a queue label"),
        lambda: _said_about(stack, "dra-shared"),
    )
    kubectl(
        stack, "label", "resourceclaim", "shared-gpu", "-n", "default", "kai.scheduler/queue=default-queue"
    )
    wait_for("the pod bound once the claim carries its queue", lambda: _bound(stack, "dra-shared"))


def test_admin_access_is_refused_outside_an_admin_namespace_and_given_in_one(stack: Stack) -> None:
    """adminAccess: refused in kube-apiserver's words while the namespace lacks the label; once the namespace
    carries it, the pod is bound and its claim's result says adminAccess."""
    exactly = {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}
    labels = {"kai.scheduler/queue": "default-queue"}
    apply(stack, _claim("admin-gpu", exactly, labels), _pod_naming("dra-admin", "admin-gpu"))
    wait_for(
        "the Warning naming the field",
        lambda: _warning_about(stack, "dra-admin", "exactly.adminAccess: admin access to devices requires"),
    )
    kubectl(stack, "label", "namespace", "default", "resource.kubernetes.io/admin-access=true")
    try:
        wait_for("the pod bound in an admin namespace", lambda: _bound(stack, "dra-admin"))
        claim = got(stack, "resourceclaims", "admin-gpu", "-n", "default")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result.get("adminAccess") is True
    finally:
        kubectl(stack, "label", "namespace", "default", "resource.kubernetes.io/admin-access-")
