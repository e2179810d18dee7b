"""The pod-grouper's decision for Ray (RayCluster), as KAI's ray plugin decides."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import group, make_owner, make_pod, owned_by, spec_of


# --- Ray ---------------------------------------------------------------------------------------------------
def ray_cluster(**kwargs: Any) -> wire.Owner:
    spec = {
        "headGroupSpec": {"template": {"spec": {}}},
        "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": 4, "minReplicas": 2, "numOfHosts": 2, "template": {"spec": {}}},
            {"groupName": "cpu", "replicas": 3, "template": {"spec": {}}},
            {"groupName": "idle", "replicas": 0},
            {"groupName": "paused", "replicas": 5, "suspended": True},
            {
                "replicas": 1,
                "template": {
                    "metadata": {
                        "annotations": {
                            keys.TOPOLOGY_ANNOTATION: "dc",
                            keys.TOPOLOGY_PREFERRED_ANNOTATION: "rack",
                        }
                    }
                },
            },
        ],
    }
    return make_owner("ray.io/v1", "RayCluster", "rc", spec=spec, **kwargs)


def test_a_ray_cluster_gangs_the_head_and_each_worker_groups_minimum() -> None:
    owner = ray_cluster()
    pod = make_pod(owned_by(owner), labels={"ray.io/group": "gpu"})
    g = group(pod, owner)
    assert g.grouper == "ray-cluster"
    assert spec_of(g)["minMember"] == 1 + 2 * 2 + 3 + 1
    assert spec_of(g)["subGroups"] == [
        {"name": "headgroup", "minMember": 1},
        {"name": "gpu", "minMember": 4},
        {"name": "cpu", "minMember": 3},
        {
            "name": "worker-group-4",
            "minMember": 1,
            "topologyConstraint": {"topology": "dc", "preferredTopologyLevel": "rack"},
        },
    ]
    assert g.pod_patch["metadata"]["labels"] == {keys.SUBGROUP_LABEL: "gpu"}


def test_a_ray_priority_class_label_wins() -> None:
    owner = ray_cluster(labels={"ray.io/priority-class-name": "high"})
    assert spec_of(group(make_pod(owned_by(owner)), owner))["priorityClassName"] == "high"


def test_a_ray_worker_group_with_more_min_replicas_than_replicas_is_invalid() -> None:
    spec = {"workerGroupSpecs": [{"groupName": "g", "replicas": 1, "minReplicas": 3}]}
    owner = make_owner("ray.io/v1", "RayCluster", "rc", spec=spec)
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(owner)), owner)
    assert info.value.field == "spec.workerGroupSpecs[0].minReplicas"
