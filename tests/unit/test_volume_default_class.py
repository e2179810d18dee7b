"""The default StorageClass in the simulated cluster (`tools.kubesim.default_storage_class`; issue 30): the
DefaultStorageClass admission plugin gives a claim created without a class the default one, and
kube-controller-manager gives it retroactively to a claim created before any default existed.

Kubernetes' rules: a class is the default when annotated ``storageclass.kubernetes.io/is-default-class``
(or its beta name) exactly ``"true"``; of several, the newest wins, then the first by name; only a claim
that names no class at all gets it (``storageClassName: ""`` asks for a volume of no class); a claim of no
class that a volume of no class can meet is bound to that volume rather than given the default. On the
scheduler's side a claim of no class is one of Immediate binding, held until the volume controller acts.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core import volumes as v
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.model import Node
from shared.model.builders import gang
from shared.model.volumes import Claim, Volumes
from tests import builders as tb
from tests.builders import claim_manifest, storage_class_manifest
from tests.unit.kubesim_support import START, Clock, two_node_cluster
from tools.kubesim import default_storage_class as dsc
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.objects import rfc3339
from tools.kubesim.storage import DRIVER

Obj = dict[str, Any]
CLAIMS = "persistentvolumeclaims"
VOLUMES = "persistentvolumes"
CLASSES = "storage.k8s.io/storageclasses"


def storage_class(
    name: str, *, default: str | None = "true", beta: bool = False, created: float = START
) -> Obj:
    annotations = {} if default is None else {dsc.BETA_IS_DEFAULT if beta else dsc.IS_DEFAULT: default}
    return storage_class_manifest(
        name, DRIVER, wait=False, annotations=annotations, creationTimestamp=rfc3339(created)
    )


def claim(name: str, **spec: Any) -> Obj:
    return claim_manifest(name, size="5Gi", **spec)


def new_cluster() -> tuple[Cluster, Clock]:
    clock = Clock()
    return two_node_cluster(clock, SimOptions(default_scheduler=False)), clock


def create(c: Cluster, key: str, obj: Obj) -> Obj:
    made = c.create(c.type_of(key), obj["metadata"].get("namespace"), obj)
    c.settle()
    return made


def class_of(c: Cluster, name: str) -> Any:
    pvc = c.store.storage(CLAIMS).get("default", name)
    assert pvc is not None
    return pvc["spec"].get("storageClassName", "<unset>")


# --- which class is the default ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        pytest.param([], None, id="no class: no default"),
        pytest.param([storage_class("a", default=None)], None, id="a class not annotated is no default"),
        pytest.param([storage_class("a")], "a", id="the one class annotated true"),
        pytest.param([storage_class("a", beta=True)], "a", id="the beta annotation counts too"),
        pytest.param([storage_class("a", default="True")], None, id="only the exact string true counts"),
        pytest.param([storage_class("a", default="false")], None, id="annotated false"),
        pytest.param(
            [storage_class("old", created=START), storage_class("new", created=START + 60)],
            "new",
            id="of two defaults the newest wins",
        ),
        pytest.param(
            [storage_class("b"), storage_class("a")],
            "a",
            id="of two defaults created together the first by name wins",
        ),
    ],
)
def test_the_default_class_is_the_newest_annotated_true(classes: list[Obj], expected: str | None) -> None:
    chosen = dsc.default_class(classes)
    assert (chosen["metadata"]["name"] if chosen is not None else None) == expected


# --- admission ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "annotations", "expected"),
    [
        pytest.param({}, {}, "standard", id="no storageClassName: the default"),
        pytest.param({"storageClassName": None}, {}, "standard", id="storageClassName null: the default"),
        pytest.param({"storageClassName": ""}, {}, "", id="storageClassName empty asks for no class: kept"),
        pytest.param({"storageClassName": "fast"}, {}, "fast", id="a class named: kept"),
        pytest.param(
            {},
            {"volume.beta.kubernetes.io/storage-class": "fast"},
            "<unset>",
            id="the legacy annotation: kept",
        ),
    ],
)
def test_a_claim_created_without_a_class_gets_the_default_one(
    spec: Obj, annotations: dict[str, str], expected: str
) -> None:
    c, _ = new_cluster()
    create(c, CLASSES, storage_class("standard"))
    obj = claim("data", **spec)
    obj["metadata"]["annotations"] = annotations
    create(c, CLAIMS, obj)
    assert class_of(c, "data") == expected


def test_with_two_defaults_a_new_claim_gets_the_newer() -> None:
    c, clock = new_cluster()
    create(c, CLASSES, storage_class("old"))
    clock.now += 60
    create(c, CLASSES, storage_class("new"))
    create(c, CLAIMS, claim("data"))
    assert class_of(c, "data") == "new"


def test_without_a_default_a_claim_keeps_no_class() -> None:
    c, _ = new_cluster()
    create(c, CLASSES, storage_class("plain", default=None))
    create(c, CLAIMS, claim("data"))
    assert class_of(c, "data") == "<unset>"


# --- retroactive assignment -------------------------------------------------------------------------------------
def test_a_claim_created_before_any_default_gets_it_once_one_appears_and_is_provisioned() -> None:
    c, _ = new_cluster()
    create(c, CLAIMS, claim("early"))
    create(c, CLAIMS, claim("none", storageClassName=""))
    assert class_of(c, "early") == "<unset>"
    create(c, CLASSES, storage_class("standard"))
    assert class_of(c, "early") == "standard"
    assert class_of(c, "none") == ""
    pvc = c.store.storage(CLAIMS).get("default", "early")
    assert pvc is not None
    assert pvc["status"]["phase"] == "Bound"


def test_a_class_later_marked_default_is_given_to_the_waiting_claims() -> None:
    c, _ = new_cluster()
    create(c, CLASSES, storage_class("standard", default=None))
    create(c, CLAIMS, claim("early"))
    marked = c.store.storage(CLASSES).get("", "standard")
    assert marked is not None
    create_or_replace = {
        **marked,
        "metadata": {**marked["metadata"], "annotations": {dsc.IS_DEFAULT: "true"}},
    }
    c.store.put(CLASSES, create_or_replace)
    c.settle()
    assert class_of(c, "early") == "standard"


def test_a_claim_of_no_class_that_a_volume_of_no_class_meets_is_bound_to_it_not_given_the_default() -> None:
    c, _ = new_cluster()
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "handmade"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/x"},
        },
    }
    create(c, VOLUMES, pv)
    create(c, CLAIMS, claim("early"))
    create(c, CLASSES, storage_class("standard"))
    pvc = c.store.storage(CLAIMS).get("default", "early")
    assert pvc is not None
    assert pvc["spec"].get("storageClassName") is None
    assert pvc["spec"]["volumeName"] == "handmade"


# --- the scheduler's side ----------------------------------------------------------------------------------------
def test_the_scheduler_holds_a_pod_whose_claim_names_no_class_as_an_unbound_immediate_one() -> None:
    """kube-scheduler reads a claim of no class as Immediate binding: with no default class it waits for
    the volume controller (a volume of no class), and never provisions it."""
    pg, pods = gang("job", "team", 1, 0.0)
    pods = [msgspec.structs.replace(p, claims=("data",)) for p in pods]
    snap = tb.snapshot(
        [Node(name="node-1", cpu_millis=8000, memory_bytes=2**36, gpus=0)],
        (pg, pods),
        queues=[tb.queue("team", parent=None)],
        volumes=Volumes(claims=(Claim(name="data", namespace=pods[0].namespace),)),
    )
    result = schedule(snap, 10_000.0, Policy(actions=("allocate",)))
    assert not result.binds
    assert v.UNBOUND_IMMEDIATE in (result.podgroups[pg.name].fit_error or "")
