"""The pod-grouper's decision for Ray (RayCluster, RayJob, RayService), as KAI v0.17's ray plugins decide: a
table per plugin, read from KAI's plugin code (``plugins/ray/*.go``) and docs, and the properties every Ray
cluster's grouping keeps (every pod in one PodGroup, a gang no larger than the pods KubeRay makes, hostile
worker-group specs refused naming the field)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.state.controllers.grouping import Grouping
from shared.errors import InvalidObject
from shared.kube import keys, wire
from tests.grouping import group, make_owner, make_pod, owned_by, ref, spec_of
from tests.hostile import HOSTILE_JSON
from tools.kubesim.operators.ray import cluster_problem, desired_replicas, worker_pods_wanted

RAY = "ray.io/"
VERSIONS = ("ray.io/v1", "ray.io/v1alpha1")


# --- builders ----------------------------------------------------------------------------------------------
ABSENT: Any = object()


def worker(name: str | None, replicas: Any = ABSENT, **fields: Any) -> dict[str, Any]:
    """A worker group spec (fields written as given, hostile values included; `ABSENT` leaves one out)."""
    group: dict[str, Any] = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "w"}]}}}
    if name is not None:
        group["groupName"] = name
    if replicas is not ABSENT:
        group["replicas"] = replicas
    group.update(fields)
    return group


def cluster_spec(*groups: dict[str, Any], **fields: Any) -> dict[str, Any]:
    head = {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "head"}]}}}
    spec: dict[str, Any] = {"headGroupSpec": head, **fields}
    if groups:
        spec["workerGroupSpecs"] = list(groups)
    return spec


def ray_cluster(
    spec: dict[str, Any],
    *,
    name: str = "rc",
    api_version: str = "ray.io/v1",
    labels: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
) -> wire.Owner:
    return make_owner(api_version, "RayCluster", name, spec=spec, labels=labels, owner=owner)


def ray_pod(cluster: wire.Owner, group: str | None, name: str = "rc-head-abcde") -> wire.Pod:
    """A pod of `cluster` as KubeRay labels it (`group` None: no ``ray.io/group`` label)."""
    labels = {RAY + "cluster": cluster.metadata.name}
    if group is not None:
        labels[RAY + "group"] = group
        labels[RAY + "node-type"] = "head" if group == "headgroup" else "worker"
    return make_pod(owned_by(cluster), labels=labels, name=name)


def gang(grouping: Any) -> tuple[int, list[tuple[str, int]]]:
    """(minMember, [(sub-group, minMember)]) of a decision."""
    spec = spec_of(grouping)
    return spec["minMember"], [(sg["name"], sg["minMember"]) for sg in spec.get("subGroups", [])]


def sub_group_label(grouping: Any) -> str | None:
    labels: dict[str, str] = grouping.pod_patch["metadata"].get("labels") or {}
    return labels.get(keys.SUBGROUP_LABEL)


def podgroup(name: str, sub_groups: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An existing PodGroup (as `Ctx.get` reads it), with or without ``subGroups``."""
    spec: dict[str, Any] = {"minMember": 4, "queue": "default-queue"}
    if sub_groups is not None:
        spec["subGroups"] = sub_groups
    return {
        "apiVersion": keys.PODGROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": spec,
    }


# --- RayCluster ----------------------------------------------------------------------------------------------
RAY_CLUSTER_GANGS: list[tuple[str, dict[str, Any], int, list[tuple[str, int]]]] = [
    (
        "a cluster without worker groups is a gang of its head alone (KAI accepts it)",
        cluster_spec(),
        1,
        [("headgroup", 1)],
    ),
    (
        "an empty worker group list is the head alone",
        cluster_spec(workerGroupSpecs=[]),
        1,
        [("headgroup", 1)],
    ),
    (
        "a group without minReplicas counts its replicas",
        cluster_spec(worker("cpu", 3)),
        4,
        [("headgroup", 1), ("cpu", 3)],
    ),
    (
        "a group with minReplicas counts its minReplicas",
        cluster_spec(worker("gpu", 4, minReplicas=2)),
        3,
        [("headgroup", 1), ("gpu", 2)],
    ),
    (
        "replicas are multiplied by numOfHosts",
        cluster_spec(worker("tpu", 2, numOfHosts=4)),
        9,
        [("headgroup", 1), ("tpu", 8)],
    ),
    (
        "minReplicas are multiplied by numOfHosts",
        cluster_spec(worker("tpu", 3, minReplicas=2, numOfHosts=2)),
        5,
        [("headgroup", 1), ("tpu", 4)],
    ),
    (
        "numOfHosts 0 counts no worker but keeps the sub-group, as KAI counts it",
        cluster_spec(worker("odd", 3, numOfHosts=0)),
        1,
        [("headgroup", 1), ("odd", 0)],
    ),
    (
        "an autoscaling cluster without minReplicas may start without workers",
        cluster_spec(worker("elastic", 5), enableInTreeAutoscaling=True),
        1,
        [("headgroup", 1), ("elastic", 0)],
    ),
    (
        "an autoscaling cluster with minReplicas 0 may start without workers",
        cluster_spec(worker("elastic", 5, minReplicas=0, numOfHosts=2), enableInTreeAutoscaling=True),
        1,
        [("headgroup", 1), ("elastic", 0)],
    ),
    (
        "an autoscaling cluster counts minReplicas times numOfHosts",
        cluster_spec(worker("elastic", 5, minReplicas=2, numOfHosts=2), enableInTreeAutoscaling=True),
        5,
        [("headgroup", 1), ("elastic", 4)],
    ),
    (
        "autoscaling turned off counts replicas",
        cluster_spec(worker("elastic", 5, minReplicas=0), enableInTreeAutoscaling=False),
        6,
        [("headgroup", 1), ("elastic", 5)],
    ),
    (
        "a group suspended as KAI reads it (suspended) counts nothing and has no sub-group",
        cluster_spec(worker("a", 3, minReplicas=2), worker("b", 3, minReplicas=1, suspended=True)),
        3,
        [("headgroup", 1), ("a", 2)],
    ),
    (
        "a group suspended by KubeRay (suspend) counts nothing and has no sub-group either",
        cluster_spec(worker("a", 3), worker("b", 3, suspend=True)),
        4,
        [("headgroup", 1), ("a", 3)],
    ),
    (
        "a group with neither replicas nor minReplicas (missing replicas too) has no sub-group, as KAI accepts it",
        cluster_spec(worker("idle", 0), worker("absent"), worker("cpu", 1)),
        2,
        [("headgroup", 1), ("cpu", 1)],
    ),
    (
        "a group without a name is worker-group-<its index>",
        cluster_spec(worker(None, 0), worker(None, 2), worker("", 1)),
        4,
        [("headgroup", 1), ("worker-group-1", 2), ("worker-group-2", 1)],
    ),
    (
        "null fields are missing ones, as the API server prunes them",
        cluster_spec(
            worker("g", 2, minReplicas=None, maxReplicas=None, numOfHosts=None, suspend=None),
            enableInTreeAutoscaling=None,
        ),
        3,
        [("headgroup", 1), ("g", 2)],
    ),
    (
        "replicas within maxReplicas are counted as they are",
        cluster_spec(worker("g", 3, maxReplicas=3)),
        4,
        [("headgroup", 1), ("g", 3)],
    ),
    (
        "replicas beyond maxReplicas do not matter when minReplicas is what counts",
        cluster_spec(worker("g", 5, minReplicas=2, maxReplicas=3)),
        3,
        [("headgroup", 1), ("g", 2)],
    ),
    (
        "every group adds its minimum to the head's",
        cluster_spec(
            worker("gpu", 4, minReplicas=2, numOfHosts=2),
            worker("cpu", 3),
            worker("paused", 5, suspended=True),
        ),
        8,
        [("headgroup", 1), ("gpu", 4), ("cpu", 3)],
    ),
]


@pytest.mark.parametrize("api_version", VERSIONS)
@pytest.mark.parametrize(
    ("spec", "min_member", "sub_groups"),
    [pytest.param(*row[1:], id=row[0]) for row in RAY_CLUSTER_GANGS],
)
def test_a_ray_cluster_gangs_its_head_and_each_worker_groups_minimum(
    api_version: str, spec: dict[str, Any], min_member: int, sub_groups: list[tuple[str, int]]
) -> None:
    owner = ray_cluster(spec, api_version=api_version)
    g = group(ray_pod(owner, "headgroup"), owner)
    assert g.grouper == "ray-cluster"
    assert gang(g) == (min_member, sub_groups)
    assert g.name == "pg-rc-uid-rc"
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": api_version, "kind": "RayCluster", "name": "rc", "uid": "uid-rc"}
    ]
    assert spec_of(g)["priorityClassName"] == "train"


@pytest.mark.parametrize(
    ("label", "sub_group"),
    [
        pytest.param("headgroup", "headgroup", id="the head pod joins headgroup"),
        pytest.param("gpu", "gpu", id="a worker joins its group's sub-group"),
        pytest.param("paused", None, id="a pod of a group without a sub-group joins none"),
        pytest.param("elsewhere", None, id="a pod naming no group of the cluster joins none"),
        pytest.param(None, None, id="a pod without ray.io/group joins none"),
    ],
)
def test_a_ray_pod_joins_the_sub_group_its_ray_group_label_names(
    label: str | None, sub_group: str | None
) -> None:
    owner = ray_cluster(cluster_spec(worker("gpu", 2), worker("paused", 2, suspended=True)))
    g = group(ray_pod(owner, label), owner)
    assert sub_group_label(g) == sub_group
    assert g.pod_patch["metadata"]["annotations"] == {"pod-group-name": "pg-rc-uid-rc"}


TOPOLOGY = {
    keys.TOPOLOGY_ANNOTATION: "cluster-topology",
    keys.TOPOLOGY_REQUIRED_ANNOTATION: "zone",
    keys.TOPOLOGY_PREFERRED_ANNOTATION: "rack",
}


def with_annotations(group: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    return {**group, "template": {**group["template"], "metadata": {"annotations": annotations}}}


@pytest.mark.parametrize(
    ("annotations", "constraint"),
    [
        pytest.param(
            TOPOLOGY,
            {
                "topology": "cluster-topology",
                "requiredTopologyLevel": "zone",
                "preferredTopologyLevel": "rack",
            },
            id="a required and a preferred level",
        ),
        pytest.param(
            {keys.TOPOLOGY_ANNOTATION: "t", keys.TOPOLOGY_PREFERRED_ANNOTATION: "host"},
            {"topology": "t", "preferredTopologyLevel": "host"},
            id="a preferred level alone",
        ),
        pytest.param({keys.TOPOLOGY_ANNOTATION: "t"}, None, id="a topology without a level sets none"),
        pytest.param({}, None, id="no annotation sets none"),
    ],
)
def test_a_group_template_s_topology_annotations_constrain_its_sub_group(
    annotations: dict[str, str], constraint: dict[str, str] | None
) -> None:
    spec = cluster_spec(with_annotations(worker("gpu", 2), annotations))
    spec["headGroupSpec"] = with_annotations(spec["headGroupSpec"], annotations)
    owner = ray_cluster(spec)
    subs = spec_of(group(ray_pod(owner, "gpu"), owner))["subGroups"]
    assert [sg.get("topologyConstraint") for sg in subs] == [constraint, constraint]


@pytest.mark.parametrize(
    ("labels", "priority"),
    [
        pytest.param({}, "train", id="without a label a Ray cluster trains"),
        pytest.param({keys.PRIORITY_CLASS_LABEL: "high"}, "high", id="KAI's priority label names a class"),
        pytest.param(
            {keys.PRIORITY_CLASS_LABEL: "high", RAY + "priority-class-name": "low"},
            "low",
            id="ray.io/priority-class-name wins over KAI's label",
        ),
        pytest.param(
            {RAY + "priority-class-name": "no-such-class"},
            "no-such-class",
            id="ray.io/priority-class-name wins even naming a class that does not exist",
        ),
    ],
)
def test_a_ray_cluster_s_priority(labels: dict[str, str], priority: str) -> None:
    owner = ray_cluster(cluster_spec(worker("w", 1)), labels=labels)
    assert spec_of(group(ray_pod(owner, "w"), owner))["priorityClassName"] == priority


# --- PodGroups made before sub-groups (KAI's shouldUseSubGroups) ---------------------------------------------
@pytest.mark.parametrize(
    ("existing", "sub_groups"),
    [
        pytest.param(None, ["headgroup", "w"], id="no PodGroup yet: sub-groups"),
        pytest.param(
            [{"name": "headgroup", "minMember": 1}],
            ["headgroup", "w"],
            id="a PodGroup with sub-groups keeps them",
        ),
        pytest.param("absent", [], id="a PodGroup without subGroups stays without"),
        pytest.param([], [], id="a PodGroup with an empty subGroups list stays without"),
    ],
)
def test_a_podgroup_made_before_sub_groups_keeps_none(existing: Any, sub_groups: list[str]) -> None:
    owner = ray_cluster(cluster_spec(worker("w", 3)))
    objects = (
        [] if existing is None else [podgroup("pg-rc-uid-rc", None if existing == "absent" else existing)]
    )
    g = group(ray_pod(owner, "w"), owner, objects=objects)
    assert [sg["name"] for sg in spec_of(g).get("subGroups", [])] == sub_groups
    assert spec_of(g)["minMember"] == 4
    assert sub_group_label(g) == ("w" if sub_groups else None)


# --- RayJob --------------------------------------------------------------------------------------------------
def ray_job(
    status: dict[str, Any] | None, *, api_version: str = "ray.io/v1", labels: dict[str, str] | None = None
) -> wire.Owner:
    spec = {"entrypoint": "python main.py", "rayClusterSpec": cluster_spec(worker("w", 9))}
    return make_owner(api_version, "RayJob", "job", spec=spec, labels=labels, status=status)


@pytest.mark.parametrize("api_version", VERSIONS)
def test_a_ray_job_is_one_podgroup_sized_by_the_ray_cluster_its_status_names(api_version: str) -> None:
    job = ray_job({"rayClusterName": "job-x7k2p"}, api_version=api_version)
    cluster = ray_cluster(
        cluster_spec(worker("w", 3, minReplicas=2)),
        name="job-x7k2p",
        api_version=api_version,
        owner=owned_by(job),
    )
    g = group(ray_pod(cluster, "w", name="job-x7k2p-w-worker-abcde"), cluster, job, objects=[cluster])
    assert g.grouper == "ray-job"
    assert gang(g) == (3, [("headgroup", 1), ("w", 2)])
    assert g.name == "pg-job-uid-job"
    assert g.podgroup["metadata"]["ownerReferences"] == [
        {"apiVersion": api_version, "kind": "RayJob", "name": "job", "uid": "uid-job"}
    ]
    assert sub_group_label(g) == "w"
    assert "kai.scheduler/eviction-strategy" not in g.podgroup["metadata"].get("annotations", {})


def test_a_ray_job_s_submitter_pod_joins_its_podgroup_in_no_sub_group() -> None:
    job = ray_job({"rayClusterName": "job-x7k2p"})
    cluster = ray_cluster(cluster_spec(worker("w", 2)), name="job-x7k2p", owner=owned_by(job))
    submitter_job = make_owner("batch/v1", "Job", "job", owner=owned_by(job))
    submitter = make_pod(
        owned_by(submitter_job), name="job-q8v4m", labels={"batch.kubernetes.io/job-name": "job"}
    )
    g = group(submitter, submitter_job, job, objects=[cluster])
    assert g.name == "pg-job-uid-job"
    assert gang(g) == (3, [("headgroup", 1), ("w", 2)])
    assert sub_group_label(g) is None


def test_a_ray_job_s_priority_label_wins_and_its_cluster_s_does_not() -> None:
    job = ray_job({"rayClusterName": "c"}, labels={RAY + "priority-class-name": "high"})
    cluster = ray_cluster(
        cluster_spec(), name="c", owner=owned_by(job), labels={RAY + "priority-class-name": "low"}
    )
    g = group(ray_pod(cluster, "headgroup"), cluster, job, objects=[cluster])
    assert spec_of(g)["priorityClassName"] == "high"


def test_a_ray_job_whose_podgroup_predates_sub_groups_keeps_none() -> None:
    job = ray_job({"rayClusterName": "c"})
    cluster = ray_cluster(cluster_spec(worker("w", 2)), name="c", owner=owned_by(job))
    g = group(ray_pod(cluster, "w"), cluster, job, objects=[cluster, podgroup("pg-job-uid-job", None)])
    assert gang(g) == (3, [])


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        pytest.param(None, "names no RayCluster yet", id="before KubeRay writes the status"),
        pytest.param({"rayClusterName": ""}, "names no RayCluster yet", id="an empty name"),
        pytest.param({"rayClusterName": 7}, "names no RayCluster yet", id="a number"),
        pytest.param({"rayClusterName": "gone"}, "which does not exist", id="a cluster that does not exist"),
    ],
)
def test_a_ray_job_without_its_ray_cluster_is_refused_naming_the_status_field(
    status: dict[str, Any] | None, problem: str
) -> None:
    job = ray_job(status)
    cluster = ray_cluster(cluster_spec(), name="gone", owner=owned_by(job))
    with pytest.raises(InvalidObject) as info:
        group(ray_pod(cluster, "headgroup"), cluster, job)
    assert (info.value.kind, info.value.name, info.value.field) == (
        "RayJob",
        "ml/job",
        "status.rayClusterName",
    )
    assert problem in info.value.problem


def test_a_ray_job_whose_cluster_is_malformed_is_refused_naming_the_cluster_and_its_field() -> None:
    job = ray_job({"rayClusterName": "c"})
    cluster = ray_cluster(cluster_spec(worker("w", -2)), name="c", owner=owned_by(job))
    with pytest.raises(InvalidObject) as info:
        group(ray_pod(cluster, "w"), cluster, job, objects=[cluster])
    assert (info.value.kind, info.value.name) == ("RayCluster", "ml/c")
    assert info.value.field == "spec.workerGroupSpecs[0].replicas"


# --- RayService ----------------------------------------------------------------------------------------------
def ray_service(status: dict[str, Any] | None) -> wire.Owner:
    spec = {"serveConfigV2": "applications: []", "rayClusterConfig": cluster_spec()}
    return make_owner("ray.io/v1", "RayService", "svc", spec=spec, status=status)


@pytest.mark.parametrize(
    ("status", "sized_by"),
    [
        pytest.param(
            {
                "activeServiceStatus": {"rayClusterName": "active"},
                "pendingServiceStatus": {"rayClusterName": "new"},
            },
            "active",
            id="the active cluster sizes the gang",
        ),
        pytest.param(
            {"activeServiceStatus": {}, "pendingServiceStatus": {"rayClusterName": "new"}},
            "new",
            id="before one serves, the pending cluster sizes it",
        ),
    ],
)
def test_a_ray_service_is_one_podgroup_sized_by_its_active_else_pending_cluster(
    status: dict[str, Any], sized_by: str
) -> None:
    svc = ray_service(status)
    active = ray_cluster(cluster_spec(worker("w", 2)), name="active", owner=owned_by(svc))
    pending = ray_cluster(cluster_spec(worker("w", 5)), name="new", owner=owned_by(svc))
    clusters = {"active": active, "new": pending}
    pod_cluster = clusters[sized_by]
    g = group(ray_pod(pod_cluster, "w"), pod_cluster, svc, objects=list(clusters.values()))
    assert g.grouper == "ray-service"
    assert g.name == "pg-svc-uid-svc"
    assert g.podgroup["metadata"]["ownerReferences"][0]["kind"] == "RayService"
    assert gang(g)[0] == {"active": 3, "new": 6}[sized_by]
    assert spec_of(g)["priorityClassName"] == "train"


@pytest.mark.parametrize(
    ("status", "field"),
    [
        pytest.param(None, "status.activeServiceStatus.rayClusterName", id="no status yet"),
        pytest.param(
            {
                "activeServiceStatus": {"rayClusterName": ""},
                "pendingServiceStatus": {"rayClusterName": "new"},
            },
            "status.activeServiceStatus.rayClusterName",
            id="an empty active name is not passed over for the pending one (KAI's order)",
        ),
    ],
)
def test_a_ray_service_without_a_cluster_name_is_refused_naming_the_field(
    status: dict[str, Any] | None, field: str
) -> None:
    svc = ray_service(status)
    cluster = ray_cluster(cluster_spec(), name="new", owner=owned_by(svc))
    with pytest.raises(InvalidObject) as info:
        group(ray_pod(cluster, "headgroup"), cluster, svc, objects=[cluster])
    assert (info.value.kind, info.value.field) == ("RayService", field)


# --- bad input -----------------------------------------------------------------------------------------------
BAD_CLUSTERS: list[tuple[str, dict[str, Any], str]] = [
    ("worker groups that are not a list", {"workerGroupSpecs": {"w": 1}}, "spec.workerGroupSpecs"),
    ("a worker group that is not an object", {"workerGroupSpecs": ["w"]}, "spec.workerGroupSpecs[0]"),
    ("a negative replicas", {"workerGroupSpecs": [worker("w", -1)]}, "spec.workerGroupSpecs[0].replicas"),
    ("replicas as text", {"workerGroupSpecs": [worker("w", "3")]}, "spec.workerGroupSpecs[0].replicas"),
    (
        "a null replicas is missing (the API server prunes it) and minReplicas 2 is above it",
        {"workerGroupSpecs": [worker("w", None, minReplicas=2)]},
        "spec.workerGroupSpecs[0].replicas",
    ),
    ("replicas true", {"workerGroupSpecs": [worker("w", True)]}, "spec.workerGroupSpecs[0].replicas"),
    ("replicas 2.5", {"workerGroupSpecs": [worker("w", 2.5)]}, "spec.workerGroupSpecs[0].replicas"),
    (
        "minReplicas above replicas (KAI asks to fix replicas)",
        {"workerGroupSpecs": [worker("w", 1, minReplicas=3)]},
        "spec.workerGroupSpecs[0].replicas",
    ),
    (
        "missing replicas with a minReplicas (KAI reads replicas as 0)",
        {"workerGroupSpecs": [worker("w", minReplicas=2)]},
        "spec.workerGroupSpecs[0].replicas",
    ),
    (
        "a negative minReplicas",
        {"workerGroupSpecs": [worker("w", 2, minReplicas=-1)]},
        "spec.workerGroupSpecs[0].minReplicas",
    ),
    (
        "minReplicas above maxReplicas: KubeRay makes at most maxReplicas workers (KAI accepts it)",
        {"workerGroupSpecs": [worker("w", 5, minReplicas=4, maxReplicas=2)]},
        "spec.workerGroupSpecs[0].minReplicas",
    ),
    (
        "counted replicas above maxReplicas (KAI accepts it)",
        {"workerGroupSpecs": [worker("w", 5, maxReplicas=3)]},
        "spec.workerGroupSpecs[0].replicas",
    ),
    (
        "a maxReplicas as text",
        {"workerGroupSpecs": [worker("w", 5, maxReplicas="x")]},
        "spec.workerGroupSpecs[0].maxReplicas",
    ),
    (
        "a negative numOfHosts",
        {"workerGroupSpecs": [worker("w", 2, numOfHosts=-2)]},
        "spec.workerGroupSpecs[0].numOfHosts",
    ),
    (
        "suspended as text",
        {"workerGroupSpecs": [worker("w", 2, suspended="yes")]},
        "spec.workerGroupSpecs[0].suspended",
    ),
    (
        "suspend as a number",
        {"workerGroupSpecs": [worker("w", 2, suspend=1)]},
        "spec.workerGroupSpecs[0].suspend",
    ),
    (
        "enableInTreeAutoscaling as text",
        {"workerGroupSpecs": [worker("w", 2)], "enableInTreeAutoscaling": "true"},
        "spec.enableInTreeAutoscaling",
    ),
    ("a head group that is not an object", {"headGroupSpec": ["head"]}, "spec.headGroupSpec"),
    (
        "two groups of one name (KAI's PodGroup validation refuses duplicate sub-groups)",
        {"workerGroupSpecs": [worker("w", 1), worker("w", 2)]},
        "spec.workerGroupSpecs[1].groupName",
    ),
    (
        "a worker group named headgroup",
        {"workerGroupSpecs": [worker("headgroup", 1)]},
        "spec.workerGroupSpecs[0].groupName",
    ),
    (
        "a placement level without a topology",
        {"workerGroupSpecs": [with_annotations(worker("w", 1), {keys.TOPOLOGY_REQUIRED_ANNOTATION: "zone"})]},
        f"spec.workerGroupSpecs[0].template.metadata.annotations[{keys.TOPOLOGY_ANNOTATION}]",
    ),
    (
        "a minimum beyond a PodGroup's int32",
        {"workerGroupSpecs": [worker("w", 2**31 - 1, numOfHosts=2)]},
        "spec.workerGroupSpecs[0]",
    ),
]


@pytest.mark.parametrize(("fields", "field"), [pytest.param(*row[1:], id=row[0]) for row in BAD_CLUSTERS])
def test_a_malformed_ray_cluster_is_refused_naming_the_owner_and_the_field(
    fields: dict[str, Any], field: str
) -> None:
    spec = cluster_spec()
    spec.update(fields)
    owner = ray_cluster(spec)
    with pytest.raises(InvalidObject) as info:
        group(ray_pod(owner, "headgroup"), owner)
    assert (info.value.kind, info.value.name, info.value.field) == ("RayCluster", "ml/rc", field)


# --- properties ----------------------------------------------------------------------------------------------
@st.composite
def worker_groups(draw: st.DrawFn, index: int) -> dict[str, Any]:
    """A worker group KubeRay accepts and Kairos groups (counted replicas within maxReplicas)."""
    replicas = draw(st.integers(0, 5))
    group = worker(f"g{index}", replicas)
    minimum = draw(st.one_of(st.none(), st.integers(0, replicas)))
    if minimum is not None:
        group["minReplicas"] = minimum
    if draw(st.booleans()):
        group["maxReplicas"] = draw(st.integers(max(replicas, minimum or 0), 8))
    if draw(st.booleans()):
        group["numOfHosts"] = draw(st.integers(0, 3))
    suspension = draw(st.sampled_from([None, "suspended", "suspend"]))
    if suspension is not None:
        group[suspension] = draw(st.booleans())
    return group


@st.composite
def ray_clusters(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(0, 4))
    groups = [draw(worker_groups(i)) for i in range(count)]
    spec = cluster_spec(*groups)
    autoscaling = draw(st.sampled_from([None, True, False]))
    if autoscaling is not None:
        spec["enableInTreeAutoscaling"] = autoscaling
    return spec


def kuberay_pods(owner: wire.Owner) -> list[wire.Pod]:
    """The pods KubeRay makes for `owner` (counted as kubesim's simulated KubeRay counts them)."""
    pods = [ray_pod(owner, "headgroup", name="rc-head-0")]
    for spec in owner.spec.get("workerGroupSpecs") or ():
        name = spec["groupName"]
        pods.extend(ray_pod(owner, name, f"rc-{name}-worker-{i}") for i in range(worker_pods_wanted(spec)))
    return pods


def kuberay_count(spec: dict[str, Any]) -> int:
    """How many pods KubeRay makes for a RayCluster spec it accepts (without kubesim's cap)."""
    groups: list[dict[str, Any]] = spec.get("workerGroupSpecs") or []
    return 1 + sum(desired_replicas(g) * max(1, int(g.get("numOfHosts") or 1)) for g in groups)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ray_clusters())
def test_every_pod_of_a_ray_cluster_lands_in_one_podgroup_whose_gang_kuberay_can_fill(
    spec: dict[str, Any],
) -> None:
    owner = ray_cluster(spec)
    pods = kuberay_pods(owner)
    decisions = [group(pod, owner) for pod in pods]
    assert {d.name for d in decisions} == {"pg-rc-uid-rc"}
    min_member, sub_groups = gang(decisions[0])
    assert all(gang(d) == (min_member, sub_groups) for d in decisions)
    assert min_member <= len(pods)
    for name, minimum in sub_groups:
        members = [d for d in decisions if sub_group_label(d) == name]
        assert minimum <= len(members), f"sub-group {name} needs {minimum} of {len(members)} pods"
    labelled = [sub_group_label(d) for d in decisions]
    assert all(label is None or label in dict(sub_groups) for label in labelled)


HOSTILE_SPOTS = st.sampled_from(
    [
        "replicas",
        "minReplicas",
        "maxReplicas",
        "numOfHosts",
        "suspended",
        "suspend",
        "groupName",
        "template",
        None,
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTILE_SPOTS, HOSTILE_JSON, st.booleans())
def test_a_hostile_worker_group_is_refused_naming_the_field_and_never_crashes(
    spot: str | None, value: Any, autoscaling: bool
) -> None:
    hostile: Any = worker("w", 3, minReplicas=1) if spot is not None else value
    if spot is not None:
        hostile[spot] = value
    spec = cluster_spec(hostile, worker("other", 2), enableInTreeAutoscaling=autoscaling)
    owner = ray_cluster(spec)
    outcome: Grouping | InvalidObject
    try:
        outcome = group(ray_pod(owner, "headgroup"), owner)
    except InvalidObject as error:
        outcome = error
    if isinstance(outcome, InvalidObject):
        assert (outcome.kind, outcome.name) == ("RayCluster", "ml/rc")
        assert outcome.field.startswith("spec.workerGroupSpecs["), outcome.field
    else:
        assert 1 <= spec_of(outcome)["minMember"] <= 2**31 - 1
        if cluster_problem(spec) is None:  # KubeRay makes this cluster's pods (else none at all)
            assert spec_of(outcome)["minMember"] <= kuberay_count(spec)


@pytest.mark.parametrize("api_version", VERSIONS)
@pytest.mark.parametrize(
    ("kind", "status", "plugin"),
    [
        ("RayCluster", None, "ray-cluster"),
        ("RayJob", {"rayClusterName": "c"}, "ray-job"),
        ("RayService", {"activeServiceStatus": {"rayClusterName": "c"}}, "ray-service"),
    ],
)
def test_each_ray_kind_has_its_plugin_in_both_api_versions(
    api_version: str, kind: str, status: dict[str, Any] | None, plugin: str
) -> None:
    top = make_owner(api_version, kind, "top", spec=cluster_spec(), status=status)
    cluster = ray_cluster(cluster_spec(), name="c", api_version=api_version)
    pod = make_pod(ref(api_version, kind, "top", "uid-top"))
    assert group(pod, top, objects=[cluster]).grouper == plugin
