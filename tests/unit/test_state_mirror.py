"""The state service's mirror of Kubernetes: what reaches KV is always a cluster the core can use.

Objects go in as the JSON an API server sends (list items and watch events); what comes out are the
`Change`s the state writer stores.
"""

from __future__ import annotations

import json
from typing import Any

from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import NAMESPACES, NODES, PODGROUPS, PODS, PRIORITY_CLASSES, QUEUES
from services.state.sources.kv_objects import Change
from shared.contracts import subjects as s
from shared.contracts.inventory import GpuDevice, GpuInventory
from shared.model import HostPort, Namespace, Node, Pod, PodGroup, PodStatus, Queue
from tests.admitted_pods import admitted

NOW = 1_800_000_000.0


def js(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def node(name: str, gpus: int = 8) -> bytes:
    return js(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
            "status": {
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def queue(name: str, parent: str | None = None, created: str = "2026-01-01T00:00:00Z") -> bytes:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    return js(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": spec,
        }
    )


def podgroup(
    name: str,
    queue_name: str,
    priority_class: str = "",
    namespace: str = "team",
    *,
    status: dict[str, Any] | None = None,
    backoff: int | None = None,
) -> bytes:
    spec: dict[str, Any] = {"minMember": 1, "queue": queue_name}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if backoff is not None:
        spec["schedulingBackoff"] = backoff
    doc: dict[str, Any] = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
    }
    if status is not None:
        doc["status"] = status
    return js(doc)


def pod(
    name: str,
    group: str | None = "train",
    *,
    gpus: int = 1,
    node_name: str = "",
    phase: str = "Pending",
    scheduler: str = "kai-scheduler",
    annotations: dict[str, str] | None = None,
    namespace: str = "team",
    labels: dict[str, str] | None = None,
) -> bytes:
    notes = dict(annotations or {})
    if group:
        notes["pod-group-name"] = group
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "1"}}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return js(
        admitted(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": f"uid-{name}",
                    "annotations": notes,
                    "labels": labels or {},
                    "creationTimestamp": "2026-01-01T00:00:01Z",
                },
                "spec": spec,
                "status": {"phase": phase},
            }
        )
    )


def cluster() -> Mirror:
    """Two nodes, a parent and a leaf queue, podgroup team/train in the leaf, one pending pod in it."""
    m = Mirror()
    m.relist(NODES, [node("n1"), node("n2")])
    m.relist(QUEUES, [queue("org"), queue("research", "org")])
    m.relist(PODGROUPS, [podgroup("train", "research")])
    m.relist(PODS, [pod("train-0")])
    m.relist(PRIORITY_CLASSES, [])
    return m


def by_key(changes: list[Change]) -> dict[str, Any]:
    return {c.key: c.after for c in changes}


def test_a_consistent_cluster_is_written_whole() -> None:
    written = by_key(cluster().flush(NOW))
    assert isinstance(written[s.node_key("n1")], Node)
    assert isinstance(written[s.queue_key("research")], Queue)
    group = written[s.podgroup_key("team", "train")]
    assert isinstance(group, PodGroup)
    assert group.key == "team/train"
    p = written[s.pod_key("team", "train-0")]
    assert isinstance(p, Pod)
    assert p.podgroup == group.key
    assert p.gpu.devices == 1
    assert p.status == PodStatus.PENDING


def test_nothing_changed_writes_nothing() -> None:
    m = cluster()
    m.flush(NOW)
    assert m.flush(NOW) == []
    m.change(PODS, "MODIFIED", pod("train-0"))
    assert m.flush(NOW) == []


def test_a_queue_status_update_recomputes_nothing_but_a_spec_change_recomputes_everything() -> None:
    # The write-back patches a Queue's status whenever its fair share moves: that must not make every
    # flush read the whole cluster again.
    m = cluster()
    m.flush(NOW)
    assert m.full_flushes == 1
    patched = json.loads(queue("research", "org"))
    patched["metadata"]["resourceVersion"] = "7"
    patched["status"] = {"allocated": {"gpu": "1"}, "requested": {"gpu": "2"}}
    m.change(QUEUES, "MODIFIED", js(patched))
    assert m.flush(NOW) == []
    assert m.full_flushes == 1
    moved = json.loads(queue("research", "org"))
    moved["spec"]["resources"]["gpu"]["quota"] = 4
    m.change(QUEUES, "MODIFIED", js(moved))
    research = by_key(m.flush(NOW))[s.queue_key("research")]
    assert m.full_flushes == 2
    assert isinstance(research, Queue)
    assert research.gpu.quota == 4


def test_a_pod_waits_for_its_podgroup_and_appears_with_it() -> None:
    m = cluster()
    m.change(PODS, "ADDED", pod("eval-0", "eval"))
    assert s.pod_key("team", "eval-0") not in by_key(m.flush(NOW))
    assert "podgroup team/eval does not exist" in m.held["pod team/eval-0"]
    m.change(PODGROUPS, "ADDED", podgroup("eval", "research"))
    written = by_key(m.flush(NOW))
    assert isinstance(written[s.pod_key("team", "eval-0")], Pod)
    assert isinstance(written[s.podgroup_key("team", "eval")], PodGroup)
    assert "pod team/eval-0" not in m.held


def test_pods_without_a_podgroup_are_the_pod_groupers_work() -> None:
    m = cluster()
    m.change(PODS, "ADDED", pod("lonely", group=None))
    m.change(PODS, "ADDED", pod("other", group=None, scheduler="default-scheduler"))
    assert [p.metadata.name for p in m.ungrouped()] == ["lonely"]
    assert s.pod_key("team", "lonely") not in by_key(m.flush(NOW))
    assert "pod-grouper" in m.held["pod team/lonely"]


def test_a_queue_with_an_unknown_parent_is_held_back_with_its_work() -> None:
    m = cluster()
    m.change(QUEUES, "ADDED", queue("orphan", "nowhere"))
    m.change(PODGROUPS, "ADDED", podgroup("lost", "orphan"))
    m.change(PODS, "ADDED", pod("lost-0", "lost"))
    written = by_key(m.flush(NOW))
    assert s.queue_key("orphan") not in written
    assert s.podgroup_key("team", "lost") not in written
    assert s.pod_key("team", "lost-0") not in written
    assert "parent queue 'nowhere' does not exist" in m.held["queue orphan"]
    assert "spec.queue: queue 'orphan' is held back" in m.held["podgroup team/lost"]
    assert "queue 'orphan' is held back" in m.held["pod team/lost-0"]


def test_a_cycle_of_parent_queues_is_refused_naming_the_cycle() -> None:
    m = cluster()
    m.change(QUEUES, "ADDED", queue("a", "b"))
    m.change(QUEUES, "ADDED", queue("b", "a"))
    written = by_key(m.flush(NOW))
    assert s.queue_key("a") not in written
    assert s.queue_key("b") not in written
    assert "cycle of parent queues a -> b -> a" in m.held["queue a"]


def test_a_pod_of_another_scheduler_takes_its_share_of_the_node() -> None:
    m = cluster()
    m.change(PODS, "ADDED", pod("web", group=None, scheduler="default-scheduler", node_name="n1", gpus=3))
    n1 = by_key(m.flush(NOW))[s.node_key("n1")]
    assert n1.gpus == 5
    assert n1.max_pods == 109
    m.change(PODS, "DELETED", pod("web", group=None, scheduler="default-scheduler", node_name="n1", gpus=3))
    assert by_key(m.flush(NOW))[s.node_key("n1")].gpus == 8


def test_a_pod_of_another_scheduler_takes_its_extended_resources_and_host_ports_off_the_node() -> None:
    m = cluster()
    n1 = json.loads(node("n1"))
    n1["status"]["allocatable"].update({"rdma/ib": "4", "ephemeral-storage": "100Gi"})
    m.change(NODES, "MODIFIED", js(n1))
    web = json.loads(pod("web", group=None, scheduler="default-scheduler", node_name="n1", gpus=0))
    web["spec"]["containers"][0]["resources"]["requests"] = {"rdma/ib": "1", "ephemeral-storage": "10Gi"}
    web["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    m.change(PODS, "ADDED", js(web))
    taken = by_key(m.flush(NOW))[s.node_key("n1")]
    assert taken.scalars == {"ephemeral-storage": 90.0 * 2**30, "rdma/ib": 3.0}
    assert taken.used_host_ports == (HostPort(8080),)
    m.change(PODS, "DELETED", js(web))
    freed = by_key(m.flush(NOW))[s.node_key("n1")]
    assert freed.scalars == {"ephemeral-storage": 100.0 * 2**30, "rdma/ib": 4.0}
    assert freed.used_host_ports == ()


def test_a_gpu_reservation_pod_counts_only_while_no_live_pod_shares_its_device() -> None:
    m = cluster()
    reservation = pod(
        "gpu-reservation-1",
        group=None,
        scheduler="default-scheduler",
        node_name="n1",
        phase="Running",
        namespace="kai-resource-reservation",
        labels={"runai-gpu-group": "g1"},
    )
    sharer = pod(
        "half",
        node_name="n1",
        phase="Running",
        gpus=0,
        annotations={"gpu-fraction": "0.5", "kairos.io/gpu-groups": "g1"},
        labels={"runai-gpu-group": "g1", "kairos.io/gpu-sharing": "true"},
    )
    m.change(PODS, "ADDED", sharer)
    m.change(PODS, "ADDED", reservation)
    m.flush(NOW)
    assert m.current[s.node_key("n1")].gpus == 8, "the device is the sharers' group, counted by them"
    m.change(PODS, "DELETED", sharer)
    assert by_key(m.flush(NOW))[s.node_key("n1")].gpus == 7, "held by the reservation until it goes"
    m.change(PODS, "DELETED", reservation)
    assert by_key(m.flush(NOW))[s.node_key("n1")].gpus == 8


def test_a_bad_annotation_holds_a_new_pod_back_with_the_field_named() -> None:
    m = cluster()
    m.change(PODS, "ADDED", pod("bad", annotations={"gpu-fraction": "abc"}, gpus=0))
    assert s.pod_key("team", "bad") not in by_key(m.flush(NOW))
    assert "gpu-fraction" in m.problems["pod team/bad"]


def test_a_running_pod_that_turns_invalid_stays_counted_on_its_node() -> None:
    m = cluster()
    m.change(PODS, "MODIFIED", pod("train-0", node_name="n1", phase="Running"))
    assert by_key(m.flush(NOW))[s.pod_key("team", "train-0")].node == "n1"
    m.change(
        PODS,
        "MODIFIED",
        pod("train-0", node_name="n1", phase="Running", annotations={"gpu-fraction": "1.5"}, gpus=0),
    )
    assert m.flush(NOW) == []
    assert m.current[s.pod_key("team", "train-0")].node == "n1"
    assert "gpu-fraction" in m.problems["pod team/train-0"]


def test_deletions_and_missed_deletions_leave_kv() -> None:
    m = cluster()
    m.flush(NOW)
    m.change(PODS, "DELETED", pod("train-0"))
    assert by_key(m.flush(NOW)) == {s.pod_key("team", "train-0"): None}
    m.relist(NODES, [node("n1")])  # n2 was deleted while the watch was down
    assert by_key(m.flush(NOW)) == {s.node_key("n2"): None}


def namespace(name: str, labels: dict[str, str] | None = None, version: str = "1") -> bytes:
    return js(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "resourceVersion": version,
                "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
                "annotations": {"note": version},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
    )


def test_namespaces_reach_kv_as_names_and_labels_and_a_label_change_rewrites_only_its_key() -> None:
    m = cluster()
    m.relist(NAMESPACES, [namespace("team", {"team": "a"}), namespace("other")])
    written = by_key(m.flush(NOW))
    assert written[s.namespace_key("team")] == Namespace(
        "team", {"kubernetes.io/metadata.name": "team", "team": "a"}
    )
    assert written[s.namespace_key("other")] == Namespace("other", {"kubernetes.io/metadata.name": "other"})
    full = m.full_flushes
    # What the core does not read (annotations, status, the resource version) writes nothing.
    m.change(NAMESPACES, "MODIFIED", namespace("team", {"team": "a"}, version="2"))
    assert m.flush(NOW) == []
    m.change(NAMESPACES, "MODIFIED", namespace("team", {"team": "b"}, version="3"))
    assert by_key(m.flush(NOW)) == {
        s.namespace_key("team"): Namespace("team", {"kubernetes.io/metadata.name": "team", "team": "b"})
    }
    m.change(NAMESPACES, "ADDED", namespace("new"))
    assert by_key(m.flush(NOW)) == {
        s.namespace_key("new"): Namespace("new", {"kubernetes.io/metadata.name": "new"})
    }
    m.change(NAMESPACES, "DELETED", namespace("other"))
    assert by_key(m.flush(NOW)) == {s.namespace_key("other"): None}
    # None of it recomputed the cluster.
    assert m.full_flushes == full


def test_a_priority_class_sets_the_podgroups_priority_and_preemptibility() -> None:
    m = Mirror()
    m.relist(QUEUES, [queue("org")])
    m.relist(
        PRIORITY_CLASSES,
        [
            js(
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": "inference"},
                    "value": 125,
                }
            )
        ],
    )
    m.relist(PODGROUPS, [podgroup("serve", "org", priority_class="inference")])
    group = by_key(m.flush(NOW))[s.podgroup_key("team", "serve")]
    assert group.priority == 125
    assert group.preemptible is False


def test_the_gpu_agent_hides_an_unhealthy_device_while_its_report_is_fresh() -> None:
    m = cluster()
    devices = tuple(GpuDevice(index=i, memory_mib=81_920, healthy=i != 3) for i in range(8))
    m.inventory(GpuInventory(node="n1", time=NOW, period=30.0, devices=devices))
    n1 = by_key(m.flush(NOW))[s.node_key("n1")]
    assert n1.gpus == 7
    assert n1.gpu_memory_mib == 81_920
    m.touch_nodes()
    assert by_key(m.flush(NOW + 1000))[s.node_key("n1")].gpus == 8


def test_members_of_a_podgroup_follow_the_pods_annotations() -> None:
    m = cluster()
    m.change(PODS, "ADDED", pod("train-1"))
    assert [p.metadata.name for p in m.members("team", "train")] == ["train-0", "train-1"]
    m.change(PODS, "DELETED", pod("train-0"))
    assert [p.metadata.name for p in m.members("team", "train")] == ["train-1"]
