"""The simulated cluster's resourceclaim controller, DRA GPU driver and ComputeDomain controller
(`tools.kubesim.dra`): claims made from templates for pods, users that are gone released, slices and
classes published (again when deleted), and the work done per change (the store's listeners queue what a
change concerns; after settling, a full resync finds nothing left to do, whatever the writes were)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.kubesim_support import Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.dra import CHANNEL_CLASS, GPU_DRIVER
from tools.kubesim.nodes import generated_nodes, node_object

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
CLAIMS = f"{GROUP}/resourceclaims"
TEMPLATES = f"{GROUP}/resourceclaimtemplates"
SLICES = f"{GROUP}/resourceslices"
CLASSES = f"{GROUP}/deviceclasses"
DOMAINS = "resource.nvidia.com/computedomains"


# --- builders ------------------------------------------------------------------------------------------------
def new_cluster() -> Cluster:
    return two_node_cluster(Clock(), SimOptions(default_scheduler=False))


def template(name: str) -> Obj:
    request = {"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def pod(name: str, *templates: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [
                {"name": f"e{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)
            ],
        },
    }


def create(c: Cluster, key: str, obj: Obj) -> Obj:
    made = c.create(c.type_of(key), obj["metadata"].get("namespace"), obj)
    c.settle()
    return made


def current(c: Cluster, key: str, name: str, ns: str = "") -> Obj | None:
    return c.store.storage(key).get(ns, name)


def claims_of(c: Cluster, pod_name: str) -> list[Obj]:
    found = current(c, "pods", pod_name, "default")
    assert found is not None
    statuses = (found.get("status") or {}).get("resourceClaimStatuses") or []
    out = []
    for s in statuses:
        made = current(c, CLAIMS, s["resourceClaimName"], "default")
        assert made is not None
        out.append(made)
    return out


def reserve(c: Cluster, claim: Obj, *pods: Obj) -> Obj:
    """What the binder writes: an allocation, and the pods among the claim's users."""
    status = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": "node-0", "device": "gpu-0"}]
            }
        },
        "reservedFor": [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
        ],
    }
    written = c.store.put(CLAIMS, {**claim, "metadata": dict(claim["metadata"]), "status": status})
    c.settle()
    return written


def finish(c: Cluster, name: str) -> None:
    found = current(c, "pods", name, "default")
    assert found is not None
    status = {**(found.get("status") or {}), "phase": "Succeeded"}
    c.store.put("pods", {**found, "metadata": dict(found["metadata"]), "status": status})
    c.settle()


# --- the resourceclaim controller ---------------------------------------------------------------------------------
def test_a_pods_template_entry_gets_a_claim_owned_by_the_pod_and_named_in_its_status() -> None:
    c = new_cluster()
    create(c, TEMPLATES, template("one-gpu"))
    made = create(c, "pods", pod("p", "one-gpu"))
    (claim,) = claims_of(c, "p")
    assert claim["metadata"]["name"].startswith("p-e0-")
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "e0"}
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Pod", made["metadata"]["uid"], True)
    assert claim["spec"] == template("one-gpu")["spec"]["spec"]


def test_a_template_created_after_the_pod_gives_it_its_claim_then() -> None:
    c = new_cluster()
    create(c, TEMPLATES, template("first"))
    create(c, "pods", pod("p", "first", "later"))
    assert [
        cl["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] for cl in claims_of(c, "p")
    ] == ["e0"]
    create(c, TEMPLATES, template("later"))
    assert [
        cl["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] for cl in claims_of(c, "p")
    ] == [
        "e0",
        "e1",
    ]


def test_a_finished_user_leaves_the_claim_and_the_last_one_takes_the_allocation_with_it() -> None:
    c = new_cluster()
    create(c, TEMPLATES, template("one-gpu"))
    a = create(c, "pods", pod("a", "one-gpu"))
    b = create(c, "pods", pod("b"))
    (claim,) = claims_of(c, "a")
    reserve(c, claim, a, b)
    finish(c, "b")
    (claim,) = claims_of(c, "a")
    assert [u["name"] for u in claim["status"]["reservedFor"]] == ["a"]
    assert claim["status"]["allocation"]
    finish(c, "a")
    (claim,) = claims_of(c, "a")
    assert "reservedFor" not in claim["status"]
    assert "allocation" not in claim["status"]


def test_a_claim_made_for_a_pod_that_is_gone_is_deleted() -> None:
    c = new_cluster()
    create(c, TEMPLATES, template("one-gpu"))
    create(c, "pods", pod("p", "one-gpu"))
    (claim,) = claims_of(c, "p")
    c.store.remove("pods", "default", "p")
    c.settle()
    assert current(c, CLAIMS, claim["metadata"]["name"], "default") is None


# --- the driver and ComputeDomains -------------------------------------------------------------------------------
def test_every_gpu_node_publishes_its_slices_and_a_deleted_slice_or_class_is_published_again() -> None:
    c = new_cluster()
    (node,) = generated_nodes(1, 4)
    c.add_node(node_object(node) | {"metadata": {"name": "late"}})
    c.settle()
    names = {s["metadata"]["name"] for s in c.store.storage(SLICES).iter()}
    assert {"late-gpu.nvidia.com", "node-0-gpu.nvidia.com", "node-1-compute-domain.nvidia.com"} <= names
    c.store.remove(SLICES, "", "node-0-gpu.nvidia.com")
    c.store.remove(CLASSES, "", CHANNEL_CLASS)
    c.settle()
    assert current(c, SLICES, "node-0-gpu.nvidia.com") is not None
    assert current(c, CLASSES, CHANNEL_CLASS) is not None


def test_a_compute_domain_gets_its_template_and_gets_it_again_when_it_is_deleted() -> None:
    c = new_cluster()
    domain = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "imex", "namespace": "default"},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "imex-channel"}}},
    }
    create(c, DOMAINS, domain)
    assert current(c, TEMPLATES, "imex-channel", "default") is not None
    c.store.remove(TEMPLATES, "default", "imex-channel")
    c.settle()
    assert current(c, TEMPLATES, "imex-channel", "default") is not None


# --- the work per change ----------------------------------------------------------------------------------------
def test_a_pods_change_queues_that_pod_and_nothing_else() -> None:
    c = new_cluster()
    create(c, TEMPLATES, template("one-gpu"))
    for name in ("a", "b", "c"):
        create(c, "pods", pod(name, "one-gpu"))
    controller = c.controllers.dra
    found = current(c, "pods", "b", "default")
    assert found is not None
    c.store.put("pods", {**found, "metadata": {**found["metadata"], "labels": {"x": "y"}}})
    assert (controller.pods, controller.claims, controller.nodes, controller.domains) == (
        {("default", "b"): None},
        {},
        {},
        {},
    )


POD_NAMES = st.sampled_from(["p0", "p1", "p2"])
TEMPLATE_NAMES = st.sampled_from(["t0", "t1"])
OPS = st.one_of(
    st.tuples(st.just("template"), TEMPLATE_NAMES),
    st.tuples(st.just("delete-template"), TEMPLATE_NAMES),
    st.tuples(st.just("pod"), POD_NAMES, st.lists(TEMPLATE_NAMES, max_size=2)),
    st.tuples(st.just("finish"), POD_NAMES),
    st.tuples(st.just("delete-pod"), POD_NAMES),
    st.tuples(st.just("reserve"), POD_NAMES, st.lists(POD_NAMES, max_size=2)),
    st.tuples(st.just("delete-slice"), st.sampled_from(["node-0", "node-1"])),
)


def write(c: Cluster, op: tuple[Any, ...]) -> None:
    """One write of the property below (one that makes no sense in the cluster's state is skipped)."""
    kind, name = op[0], op[1]
    if kind == "template" and current(c, TEMPLATES, name, "default") is None:
        c.create(c.type_of(TEMPLATES), "default", template(name))
    elif kind == "delete-template":
        c.store.remove(TEMPLATES, "default", name)
    elif kind == "pod" and current(c, "pods", name, "default") is None:
        c.create(c.type_of("pods"), "default", pod(name, *op[2]))
    elif kind == "finish" and (found := current(c, "pods", name, "default")) is not None:
        status = {**(found.get("status") or {}), "phase": "Failed"}
        c.store.put("pods", {**found, "metadata": dict(found["metadata"]), "status": status})
    elif kind == "delete-pod":
        c.store.remove("pods", "default", name)
    elif kind == "reserve" and (found := current(c, "pods", name, "default")) is not None:
        statuses = (found.get("status") or {}).get("resourceClaimStatuses") or []
        users = [u for u in (current(c, "pods", n, "default") for n in op[2]) if u is not None]
        for s in statuses:
            claim = current(c, CLAIMS, s["resourceClaimName"], "default")
            if claim is not None:
                status = {
                    "allocation": {"devices": {"results": []}},
                    "reservedFor": [
                        {"resource": "pods", "name": u["metadata"]["name"], "uid": u["metadata"]["uid"]}
                        for u in users
                    ],
                }
                c.store.put(CLAIMS, {**claim, "metadata": dict(claim["metadata"]), "status": status})
    elif kind == "delete-slice":
        c.store.remove(SLICES, "", f"{name}-gpu.nvidia.com")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(OPS, st.booleans()), max_size=14))
def test_after_any_writes_a_full_resync_finds_nothing_left_to_do(ops: list[tuple[Any, bool]]) -> None:
    c = new_cluster()
    for op, settle in ops:
        write(c, op)
        if settle:
            c.settle()
    c.settle()
    before = c.store.rv
    c.controllers.dra.resync()
    c.settle()
    assert c.store.rv == before
