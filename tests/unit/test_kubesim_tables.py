"""Server-side printing: the meta.k8s.io/v1 Tables `kubectl get` asks the simulated API server for."""

from __future__ import annotations

from typing import Any

import pytest

from tools.kubesim.objects import rfc3339
from tools.kubesim.resources import PrinterColumn, ResourceType, builtin_types
from tools.kubesim.tables import human_duration, jsonpath_value, table

NOW = 1_800_000_000.0
TYPES = {rt.storage: rt for rt in builtin_types() if not rt.view}


def columns(t: dict[str, Any], wide: bool = False) -> list[str]:
    return [c["name"] for c in t["columnDefinitions"] if wide or c["priority"] == 0]


def row(t: dict[str, Any], wide: bool = False) -> dict[str, Any]:
    names = [c["name"] for c in t["columnDefinitions"]]
    keep = {c["name"] for c in t["columnDefinitions"] if wide or c["priority"] == 0}
    return {n: v for n, v in zip(names, t["rows"][0]["cells"], strict=True) if n in keep}


POD = {
    "kind": "Pod",
    "apiVersion": "v1",
    "metadata": {"name": "p", "namespace": "default", "creationTimestamp": rfc3339(NOW - 75)},
    "spec": {"nodeName": "node-3", "containers": [{"name": "a"}, {"name": "b"}]},
    "status": {
        "phase": "Running",
        "podIP": "10.0.0.7",
        "containerStatuses": [
            {"name": "a", "ready": True, "restartCount": 1},
            {"name": "b", "ready": False, "restartCount": 0},
        ],
    },
}


def test_pods_show_the_usual_columns_and_the_node_when_wide() -> None:
    t = table(TYPES["pods"], [POD], now=NOW)
    assert columns(t) == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert columns(t, wide=True)[5:] == ["IP", "Node", "Nominated Node", "Readiness Gates"]
    assert row(t) == {"Name": "p", "Ready": "1/2", "Status": "Running", "Restarts": 1, "Age": "75s"}
    assert row(t, wide=True)["Node"] == "node-3"
    assert row(t, wide=True)["IP"] == "10.0.0.7"


def test_a_terminated_container_s_reason_is_the_pod_status() -> None:
    done = {
        **POD,
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"state": {"terminated": {"reason": "Completed"}}}],
        },
    }
    assert row(table(TYPES["pods"], [done], now=NOW))["Status"] == "Completed"


@pytest.mark.parametrize(
    ("include", "expected"),
    [("Object", "Pod"), ("Metadata", "PartialObjectMetadata"), ("None", None)],
)
def test_each_row_carries_the_object_as_include_object_asks(include: str, expected: str | None) -> None:
    t = table(TYPES["pods"], [POD], now=NOW, include=include)
    carried = t["rows"][0].get("object")
    assert (carried or {}).get("kind") == expected


def test_nodes_show_status_roles_and_version() -> None:
    node = {
        "metadata": {
            "name": "n",
            "creationTimestamp": rfc3339(NOW - 3600),
            "labels": {"node-role.kubernetes.io/gpu": ""},
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0"},
        },
    }
    assert row(table(TYPES["nodes"], [node], now=NOW)) == {
        "Name": "n",
        "Status": "Ready,SchedulingDisabled",
        "Roles": "gpu",
        "Age": "60m",
        "Version": "v1.32.0",
    }


def test_custom_resources_show_their_printer_columns_after_the_name() -> None:
    queues = ResourceType(
        group="scheduling.run.ai",
        version="v2",
        plural="queues",
        kind="Queue",
        namespaced=False,
        crd="queues.scheduling.run.ai",
        printer_columns=(
            PrinterColumn("Priority", "integer", ".spec.priority"),
            PrinterColumn("Parent", "string", ".spec.parentQueue"),
            PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
        ),
    )
    queue = {"metadata": {"name": "q", "creationTimestamp": rfc3339(NOW - 10)}, "spec": {"priority": 100}}
    t = table(queues, [queue], now=NOW)
    assert columns(t) == ["Name", "Priority", "Parent", "Age"]
    assert row(t) == {"Name": "q", "Priority": 100, "Parent": None, "Age": "10s"}


def test_kinds_without_their_own_columns_show_name_and_age() -> None:
    lease_like = ResourceType(
        group="example.com", version="v1", plural="things", kind="Thing", namespaced=True
    )
    t = table(lease_like, [{"metadata": {"name": "x", "creationTimestamp": rfc3339(NOW - 5)}}], now=NOW)
    assert row(t) == {"Name": "x", "Age": "5s"}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (3 * 86400, "3d"),
        (800 * 86400, "2y70d"),
    ],
)
def test_ages_read_as_kubectl_prints_them(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_jsonpath_follows_dots_and_indexes() -> None:
    obj = {"status": {"conditions": [{"type": "A"}, {"type": "B"}]}}
    assert jsonpath_value(obj, ".status.conditions[1].type") == "B"
    assert jsonpath_value(obj, ".status.missing") is None
