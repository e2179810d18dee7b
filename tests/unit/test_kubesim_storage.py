"""The simulated cluster's volume controller and CSI provisioner (`tools.kubesim.storage`): claims bound as
kube-controller-manager binds them, volumes made for the claims of the simulated driver's classes, and the
work done per change (the store's listeners queue the claims a change concerns; after settling, a full
resync finds nothing left to do, whatever the writes were)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import claim_manifest, storage_class_manifest
from tests.unit.kubesim_support import Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.storage import DRIVER, FAIL_PARAMETER, PROVISIONING_FAILED

Obj = dict[str, Any]
CLAIMS = "persistentvolumeclaims"
VOLUMES = "persistentvolumes"
CLASSES = "storage.k8s.io/storageclasses"
SELECTED_NODE = "volume.kubernetes.io/selected-node"


# --- builders ------------------------------------------------------------------------------------------------
def new_cluster() -> Cluster:
    return two_node_cluster(Clock(), SimOptions(default_scheduler=False))


def storage_class(name: str, provisioner: str = DRIVER, *, wait: bool = False, fail: bool = False) -> Obj:
    """A class binding at once unless `wait`, whose provisioner always fails when `fail`."""
    return storage_class_manifest(
        name, provisioner, wait=wait, parameters={FAIL_PARAMETER: "true"} if fail else None
    )


def volume(name: str, cls: str, size: str = "10Gi", *, claim: Obj | None = None, modes: Any = None) -> Obj:
    obj: Obj = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": modes or ["ReadWriteOnce"],
            "storageClassName": cls,
            "hostPath": {"path": f"/mnt/{name}"},
        },
    }
    if claim is not None:
        md = claim["metadata"]
        obj["spec"]["claimRef"] = {"namespace": md["namespace"], "name": md["name"], "uid": md["uid"]}
    return obj


def claim(name: str, cls: str, size: str = "5Gi", modes: Any = None) -> Obj:
    return claim_manifest(name, cls, size=size, modes=modes or ["ReadWriteOnce"])


def create(c: Cluster, key: str, obj: Obj) -> Obj:
    made = c.create(c.type_of(key), obj["metadata"].get("namespace"), obj)
    c.settle()
    return made


def read(c: Cluster, key: str, name: str, ns: str = "") -> Obj:
    obj = c.store.storage(key).get(ns, name)
    assert obj is not None, f"{key} {ns}/{name} does not exist"
    return obj


def bound_to(c: Cluster, name: str) -> str | None:
    """The volume the claim is bound to (None while it is not)."""
    pvc = read(c, CLAIMS, name, "default")
    if (pvc.get("status") or {}).get("phase") != "Bound":
        return None
    return str(pvc["spec"]["volumeName"])


def select_node(c: Cluster, name: str, node: str) -> None:
    """What the binder does for a WaitForFirstConsumer claim to provision: the node chosen, on the claim."""
    pvc = read(c, CLAIMS, name, "default")
    annotated = {**pvc, "metadata": {**pvc["metadata"], "annotations": {SELECTED_NODE: node}}}
    c.store.put(CLAIMS, annotated)
    c.settle()


# --- binding ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("volumes", "wanted"),
    [
        ([("big", "20Gi", None), ("small", "8Gi", None)], "small"),
        ([("too-small", "1Gi", None), ("fits", "5Gi", None)], "fits"),
        ([("b", "10Gi", None), ("a", "10Gi", None)], "a"),
        ([("read-only", "10Gi", ["ReadOnlyMany"]), ("rwo", "50Gi", None)], "rwo"),
        ([("too-small", "1Gi", None)], None),
    ],
    ids=["smallest-with-room", "room-for-the-request", "name-breaks-ties", "access-modes", "none-fits"],
)
def test_an_immediate_claim_is_bound_to_the_smallest_available_volume_of_its_class_that_fits(
    volumes: list[tuple[str, str, Any]], wanted: str | None
) -> None:
    c = new_cluster()
    create(c, CLASSES, storage_class("manual", "kubernetes.io/no-provisioner"))
    create(c, VOLUMES, volume("other-class", "elsewhere", "5Gi"))
    for name, size, modes in volumes:
        create(c, VOLUMES, volume(name, "manual", size, modes=modes))
    create(c, CLAIMS, claim("data", "manual", "5Gi"))
    assert bound_to(c, "data") == wanted
    if wanted is not None:
        pv = read(c, VOLUMES, wanted)
        assert pv["spec"]["claimRef"]["name"] == "data"
        assert pv["status"]["phase"] == "Bound"


def test_a_claim_waiting_for_a_volume_is_bound_when_one_appears() -> None:
    c = new_cluster()
    create(c, CLAIMS, claim("data", "manual"))
    assert bound_to(c, "data") is None
    create(c, VOLUMES, volume("later", "manual"))
    assert bound_to(c, "data") == "later"


def test_a_volume_whose_claim_ref_names_the_claim_binds_it_whatever_its_class() -> None:
    """An external provisioner's volume: reserved for the claim, so the volume controller binds them."""
    c = new_cluster()
    create(c, CLASSES, storage_class("external", "example.com/external", wait=True))
    made = create(c, CLAIMS, claim("data", "external"))
    create(c, VOLUMES, volume("made-for-data", "another", claim=made))
    assert bound_to(c, "data") == "made-for-data"


def test_a_volume_reserved_for_an_earlier_claim_of_the_same_name_is_not_bound() -> None:
    c = new_cluster()
    create(c, CLASSES, storage_class("external", "example.com/external", wait=True))
    made = create(c, CLAIMS, claim("data", "external"))
    earlier = {**made, "metadata": {**made["metadata"], "uid": "an-earlier-claim"}}
    create(c, VOLUMES, volume("stale", "external", claim=earlier))
    assert bound_to(c, "data") is None


# --- provisioning -----------------------------------------------------------------------------------------------
def test_a_wait_for_first_consumer_claim_is_provisioned_on_its_selected_node_only_once_it_has_one() -> None:
    c = new_cluster()
    create(c, CLASSES, storage_class("fast", wait=True))
    made = create(c, CLAIMS, claim("data", "fast"))
    assert bound_to(c, "data") is None
    select_node(c, "data", "node-1")
    name = f"pvc-{made['metadata']['uid']}"
    assert bound_to(c, "data") == name
    terms = read(c, VOLUMES, name)["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}]}
    ]


def test_a_claim_of_a_class_created_after_it_is_provisioned_when_the_class_arrives() -> None:
    c = new_cluster()
    made = create(c, CLAIMS, claim("data", "fast"))
    assert bound_to(c, "data") is None
    create(c, CLASSES, storage_class("fast"))
    assert bound_to(c, "data") == f"pvc-{made['metadata']['uid']}"


def test_a_failing_class_warns_on_the_claim_and_hands_back_its_selected_node() -> None:
    c = new_cluster()
    create(c, CLASSES, storage_class("flaky", wait=True, fail=True))
    create(c, CLAIMS, claim("data", "flaky"))
    select_node(c, "data", "node-0")
    pvc = read(c, CLAIMS, "data", "default")
    assert SELECTED_NODE not in (pvc["metadata"].get("annotations") or {})
    assert bound_to(c, "data") is None
    events = [e for e in c.store.storage("events").iter("default") if e["reason"] == PROVISIONING_FAILED]
    assert [e["involvedObject"]["name"] for e in events] == ["data"]


# --- the work per change ----------------------------------------------------------------------------------------
def test_a_volume_queues_only_the_claims_it_may_bind() -> None:
    """An Available volume of a WaitForFirstConsumer class concerns no claim (the scheduler chooses it);
    one of an Immediate class concerns that class's unbound claims, and no other."""
    c = new_cluster()
    create(c, CLASSES, storage_class("local", "kubernetes.io/no-provisioner", wait=True))
    create(c, CLASSES, storage_class("manual", "kubernetes.io/no-provisioner"))
    for name, cls in (("w1", "local"), ("w2", "local"), ("m1", "manual"), ("x1", "other")):
        create(c, CLAIMS, claim(name, cls, "50Gi"))
    controller = c.controllers.storage
    assert not controller.queue
    c.create(c.type_of(VOLUMES), None, volume("local-a", "local"))
    assert not controller.queue
    c.create(c.type_of(VOLUMES), None, volume("manual-a", "manual"))
    assert list(controller.queue) == [("default", "m1")]


def write(c: Cluster, op: tuple[Any, ...]) -> None:
    """One write of the property below (a refused one is skipped: the API server would refuse it too)."""
    kind = op[0]
    if kind == "class":
        _, name, provisioner, wait = op
        obj = storage_class(name, provisioner, wait=wait)
        key = CLASSES
    elif kind == "volume":
        _, name, cls, size, ref = op
        target = c.store.storage(CLAIMS).get("default", ref) if ref else None
        obj, key = volume(name, cls, size, claim=target), VOLUMES
    elif kind == "claim":
        _, name, cls, size = op
        obj, key = claim(name, cls, size), CLAIMS
    elif kind == "select":
        pvc = c.store.storage(CLAIMS).get("default", op[1])
        if pvc is not None:
            annotations = {**(pvc["metadata"].get("annotations") or {}), SELECTED_NODE: op[2]}
            c.store.put(CLAIMS, {**pvc, "metadata": {**pvc["metadata"], "annotations": annotations}})
        return
    else:
        c.store.remove(VOLUMES, "", op[1])
        return
    if c.store.storage(key).get(obj["metadata"].get("namespace", ""), obj["metadata"]["name"]) is None:
        c.create(c.type_of(key), obj["metadata"].get("namespace"), obj)


CLASS_NAMES = st.sampled_from(["manual", "local", "fast", "slow", ""])
CLAIM_NAMES = st.sampled_from(["c0", "c1", "c2", "c3"])
SIZES = st.sampled_from(["1Gi", "5Gi", "10Gi"])
OPS = st.one_of(
    st.tuples(
        st.just("class"),
        CLASS_NAMES.filter(bool),
        st.sampled_from([DRIVER, "kubernetes.io/no-provisioner"]),
        st.booleans(),
    ),
    st.tuples(
        st.just("volume"),
        st.sampled_from(["v0", "v1", "v2", "v3"]),
        CLASS_NAMES,
        SIZES,
        st.one_of(st.none(), CLAIM_NAMES),
    ),
    st.tuples(st.just("claim"), CLAIM_NAMES, CLASS_NAMES, SIZES),
    st.tuples(st.just("select"), CLAIM_NAMES, st.sampled_from(["node-0", "node-1"])),
    st.tuples(st.just("delete-volume"), st.sampled_from(["v0", "v1", "v2", "v3"])),
)


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
    c.controllers.storage.resync()
    c.settle()
    assert c.store.rv == before
