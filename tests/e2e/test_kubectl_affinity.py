"""kube-scheduler's placement rules through the real kubectl against `kairos up`: a Deployment with pod
anti-affinity puts one pod per node, an affinity with the Exists operator follows the pod it selects, a
NoSchedule taint keeps out every pod that does not tolerate it, a topology spread constraint is honoured,
and an anti-affinity term's namespaceSelector reads the labels `kubectl label namespace` set; a pod that
cannot be placed says why in kube-scheduler's words.

Four generated nodes; the test labels two zones and taints one node with kubectl first. One stack for
the module.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import manifests
from tests.e2e.kubectl import apply, kubectl, kubesim_stack
from tests.e2e.kubectl import wait_for as kubectl_wait_for
from tools.stack.supervisor import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES = ("node-0", "node-1", "node-2", "node-3")
ZONE = "topology.kubernetes.io/zone"
ZONES = {"node-0": "a", "node-1": "a", "node-2": "b", "node-3": "b"}
TAINTED = "node-3"
SETTLE = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with kubesim_stack(tmp_path_factory.mktemp("kairos"), nodes=len(NODES), gpus_per_node=8) as started:
        for node, zone in ZONES.items():
            kubectl(started, "label", "node", node, f"{ZONE}={zone}")
        kubectl(started, "taint", "node", TAINTED, "dedicated=ml:NoSchedule")
        yield started


def pods(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = json.loads(kubectl(stack, "get", "pods", "-o", "json"))
    return {item["metadata"]["name"]: item for item in listed["items"]}


def wait_for(stack: Stack, what: str, check: Any) -> Any:
    return kubectl_wait_for(what, check, lambda: json.dumps(pods(stack), indent=1), settle=SETTLE)


def labelled(stack: Stack, app: str) -> list[dict[str, Any]]:
    return [p for p in pods(stack).values() if p["metadata"].get("labels", {}).get("app") == app]


def running_nodes(stack: Stack, app: str, count: int) -> list[str] | None:
    nodes = [p["spec"].get("nodeName") for p in labelled(stack, app) if p["status"].get("phase") == "Running"]
    return sorted(nodes) if len(nodes) >= count else None


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    for condition in pod["status"].get("conditions", []):
        if (
            condition["type"] == "PodScheduled"
            and condition["status"] == "False"
            and condition.get("message")
        ):
            return str(condition["message"])
    return None


def deployment(
    name: str, replicas: int, spec: dict[str, Any], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Deployment for KAI's scheduler in `default-queue`, its pods labelled `app: name`."""
    pod_labels = {"app": name, manifests.QUEUE_LABEL: manifests.DEFAULT_QUEUE, **(labels or {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {manifests.QUEUE_LABEL: manifests.DEFAULT_QUEUE}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "schedulerName": manifests.SCHEDULER,
                    "containers": [manifests.container(cpu="1")],
                    **spec,
                },
            },
        },
    }


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    out = manifests.pod(name, cpu="1")
    out["metadata"]["labels"].update(labels or {})
    out["spec"].update(spec)
    return out


def test_an_anti_affinity_deployment_puts_one_pod_per_untainted_node_and_the_next_says_why(
    stack: Stack,
) -> None:
    apart = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    apply(stack, deployment("web", 3, {"affinity": apart}))
    placed = wait_for(stack, "three web pods Running", lambda: running_nodes(stack, "web", 3))
    assert placed == ["node-0", "node-1", "node-2"]

    kubectl(stack, "scale", "deployment", "web", "--replicas=4")

    def fourth_explained() -> str | None:
        waiting = [p for p in labelled(stack, "web") if not p["spec"].get("nodeName")]
        return unschedulable_message(waiting[0]) if waiting else None

    message = wait_for(stack, "the fourth web pod's PodScheduled=False", fourth_explained)
    assert "0/4 nodes are available" in message
    assert "3 node(s) didn't match pod anti-affinity rules" in message
    assert "1 node(s) had untolerated taint {dedicated: ml}" in message


def test_an_exists_affinity_follows_the_selected_pod_into_its_zone(stack: Stack) -> None:
    apply(stack, pod("db", {"role": "db"}, nodeSelector={"kubernetes.io/hostname": "node-2"}))
    near_db = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchExpressions": [{"key": "role", "operator": "Exists"}]},
                    "topologyKey": ZONE,
                }
            ]
        }
    }
    apply(stack, pod("follower", affinity=near_db))

    def follower_node() -> str | None:
        now = pods(stack)
        follower = now.get("follower", {})
        return (
            follower.get("spec", {}).get("nodeName")
            if follower.get("status", {}).get("phase") == "Running"
            else None
        )

    node = wait_for(stack, "the follower Running", follower_node)
    assert ZONES[node] == "b"
    assert node != TAINTED


def test_only_a_pod_that_tolerates_the_taint_lands_on_the_tainted_node(stack: Stack) -> None:
    pinned = {"kubernetes.io/hostname": TAINTED}
    tolerating = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    apply(
        stack,
        pod("tolerant", nodeSelector=pinned, tolerations=tolerating),
        pod("intolerant", nodeSelector=pinned),
    )

    def both_decided() -> tuple[str, str] | None:
        now = pods(stack)
        tolerant = now.get("tolerant", {})
        message = unschedulable_message(now.get("intolerant", {"status": {}}))
        if tolerant.get("status", {}).get("phase") != "Running" or message is None:
            return None
        return tolerant["spec"]["nodeName"], message

    node, message = wait_for(stack, "the tolerant pod Running and the other explained", both_decided)
    assert node == TAINTED
    assert "1 node(s) had untolerated taint {dedicated: ml}" in message
    assert not pods(stack)["intolerant"]["spec"].get("nodeName")


def test_a_zone_spread_constraint_is_honoured(stack: Stack) -> None:
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}},
            }
        ],
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
    }
    apply(stack, deployment("spread", 4, spread))
    placed = wait_for(stack, "four spread pods Running", lambda: running_nodes(stack, "spread", 4))
    assert Counter(ZONES[n] for n in placed) == {"a": 2, "b": 2}


def test_bad_affinity_input_is_a_warning_event_and_a_condition_naming_the_pod_and_field(stack: Stack) -> None:
    unknown_operator = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchExpressions": [{"key": "role", "operator": "Near"}]},
                    "topologyKey": ZONE,
                }
            ]
        }
    }
    no_such_key = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"role": "db"}}, "topologyKey": "rack"}
            ]
        }
    }
    apply(stack, pod("bad-operator", affinity=unknown_operator), pod("bad-key", affinity=no_such_key))
    operator_field = (
        "requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator"
    )
    key_field = "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey"

    def warned() -> str | None:
        events = kubectl(stack, "get", "events", "-o", "json")
        text = " ".join(
            f"{e['type']} {e['involvedObject']['name']} {e['message']}" for e in json.loads(events)["items"]
        )
        return text if operator_field in text and key_field in text else None

    events = wait_for(stack, "Warning events naming both fields", warned)
    assert "Warning bad-operator" in events
    assert "Warning bad-key" in events
    now = pods(stack)
    assert operator_field in (unschedulable_message(now["bad-operator"]) or "")
    assert key_field in (unschedulable_message(now["bad-key"]) or "")
    assert not now["bad-operator"]["spec"].get("nodeName")
    assert not now["bad-key"]["spec"].get("nodeName")


def test_a_namespace_selector_reads_the_labels_kubectl_put_on_namespaces(stack: Stack) -> None:
    # Two namespaces labelled with kubectl, a cache pod in each, on the two nodes of zone a; a pod that
    # repels the caches of the namespaces labelled team=red (resp. blue) takes the other node of the zone.
    # (Label values that YAML 1.1 does not read as booleans, unlike "y".)
    caches = {"red": ("team-red", "node-1"), "blue": ("team-blue", "node-0")}
    for team, (namespace, node) in caches.items():
        kubectl(stack, "create", "namespace", namespace)
        kubectl(stack, "label", "namespace", namespace, f"team={team}")
        pinned = pod("cache", {"role": "cache"}, nodeSelector={"kubernetes.io/hostname": node})
        apply(stack, pinned, namespace=namespace)

    def caches_running() -> dict[str, str] | None:
        found = {}
        for team, (namespace, _) in caches.items():
            listed = json.loads(kubectl(stack, "get", "pods", "-n", namespace, "-o", "json"))["items"]
            running = [p for p in listed if p["status"].get("phase") == "Running"]
            if not running:
                return None
            found[team] = running[0]["spec"]["nodeName"]
        return found

    running = kubectl_wait_for("both caches Running", caches_running, settle=SETTLE)
    assert running == {team: node for team, (_, node) in caches.items()}

    def avoiding(team: str) -> dict[str, Any]:
        term = {
            "labelSelector": {"matchLabels": {"role": "cache"}},
            "topologyKey": "kubernetes.io/hostname",
            "namespaceSelector": {"matchLabels": {"team": team}},
        }
        return pod(
            f"avoid-{team}",
            nodeSelector={ZONE: "a"},
            affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
        )

    apply(stack, avoiding("red"), avoiding("blue"))

    def avoiders_running() -> dict[str, str] | None:
        now = pods(stack)
        found = {
            team: now[f"avoid-{team}"]["spec"].get("nodeName")
            for team in caches
            if now.get(f"avoid-{team}", {}).get("status", {}).get("phase") == "Running"
        }
        return found if len(found) == len(caches) else None

    placed = wait_for(stack, "both avoiders Running", avoiders_running)
    assert placed == {"red": running["blue"], "blue": running["red"]}


def test_nothing_else_was_left_unexplained(stack: Stack) -> None:
    # Every pod the module created is either placed or says why not: none is silently dropped.
    for name, item in pods(stack).items():
        placed = bool(item["spec"].get("nodeName"))
        assert placed or unschedulable_message(item), f"{name} is neither placed nor explained"
