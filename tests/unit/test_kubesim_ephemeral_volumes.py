"""kubesim's ephemeral volume controller: a pod's generic ephemeral volume gets its claim `<pod>-<volume>`
from the template, owned by the pod as its controller, and nothing else is touched (a claim of that name
that exists already stays as it is; a finished or deleted pod gets none)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.kubesim_support import Clock, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions

Obj = dict[str, Any]
CLAIMS = "persistentvolumeclaims"
CLASSES = "storage.k8s.io/storageclasses"
TEMPLATE: Obj = {
    "metadata": {"labels": {"app": "train"}, "annotations": {"note": "scratch"}},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


def new_cluster() -> Cluster:
    return two_node_cluster(Clock(), SimOptions(default_scheduler=False))


def pod(name: str, volumes: list[Obj]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "volumes": volumes},
    }


def ephemeral(name: str, template: Obj = TEMPLATE) -> Obj:
    return {"name": name, "ephemeral": {"volumeClaimTemplate": template}}


def create(c: Cluster, key: str, obj: Obj) -> Obj:
    made = c.create(c.type_of(key), obj["metadata"].get("namespace"), obj)
    c.settle()
    return made


def claim_of(c: Cluster, name: str) -> Obj | None:
    return c.store.storage(CLAIMS).get("default", name)


def test_each_ephemeral_volume_gets_its_claim_from_the_template_owned_by_the_pod() -> None:
    c = new_cluster()
    made = create(
        c, "pods", pod("train-0", [ephemeral("scratch"), ephemeral("cache"), {"name": "cfg", "emptyDir": {}}])
    )
    for volume in ("scratch", "cache"):
        claim = claim_of(c, f"train-0-{volume}")
        assert claim is not None
        md = claim["metadata"]
        assert md["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "train-0",
                "uid": made["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert md["labels"] == {"app": "train"}
        assert md["annotations"]["note"] == "scratch"
        assert claim["spec"]["resources"] == {"requests": {"storage": "1Gi"}}
    assert claim_of(c, "train-0-cfg") is None


def test_a_template_naming_no_class_gets_the_default_class_as_a_created_claim_does() -> None:
    c = new_cluster()
    create(
        c,
        CLASSES,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": "standard",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "csi.kubesim.kairos.io",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    create(c, "pods", pod("p", [ephemeral("data")]))
    claim = claim_of(c, "p-data")
    assert claim is not None
    assert claim["spec"]["storageClassName"] == "standard"


def test_a_claim_of_that_name_that_exists_already_is_left_as_it_is() -> None:
    c = new_cluster()
    theirs = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "p-data", "namespace": "default", "labels": {"made": "by-hand"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
    }
    create(c, CLAIMS, theirs)
    create(c, "pods", pod("p", [ephemeral("data")]))
    claim = claim_of(c, "p-data")
    assert claim is not None
    assert claim["metadata"]["labels"] == {"made": "by-hand"}
    assert "ownerReferences" not in claim["metadata"]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_gets_no_claim(phase: str) -> None:
    c = new_cluster()
    finished = pod("done", [ephemeral("data")])
    finished["status"] = {"phase": phase}
    c.store.put("pods", finished)
    c.settle()
    assert claim_of(c, "done-data") is None


def test_the_claim_goes_with_its_pod() -> None:
    c = new_cluster()
    create(c, "pods", pod("p", [ephemeral("data")]))
    assert claim_of(c, "p-data") is not None
    c.delete(c.type_of("pods"), "default", "p", {"gracePeriodSeconds": 0})
    c.settle()
    assert claim_of(c, "p-data") is None
