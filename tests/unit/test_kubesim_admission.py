"""Which admission webhooks a request goes to (tools.kubesim.admission.matching), as the real API server
decides: rule resources with their subresource forms, operations, groups, versions and scope, and the
namespace and object selectors."""

from __future__ import annotations

from typing import Any

import pytest

from tools.kubesim.admission import Attributes, matching, routed
from tools.kubesim.resources import Registry, builtin_types

Obj = dict[str, Any]
REGISTRY = Registry(builtin_types())
PODS = REGISTRY.lookup("", "v1", "pods")
NODES = REGISTRY.lookup("", "v1", "nodes")
JOBS = REGISTRY.lookup("batch", "v1", "jobs")


def config(*rules: Obj, **hook: Any) -> Obj:
    return {"metadata": {"name": "c"}, "webhooks": [{"name": "h.kairos.test", "rules": list(rules), **hook}]}


def rule(resources: list[str], *, ops: tuple[str, ...] = ("*",), scope: str = "*", group: str = "") -> Obj:
    return {
        "operations": list(ops),
        "apiGroups": [group],
        "apiVersions": ["*"],
        "resources": resources,
        "scope": scope,
    }


def request(
    rt: Any = PODS, sub: str = "", op: str = "CREATE", labels: dict[str, str] | None = None
) -> Attributes:
    obj = {"metadata": {"name": "x", "labels": labels or {}}}
    return Attributes(operation=op, rt=rt, subresource=sub, namespace="ns", name="x", obj=obj, old=None)


@pytest.mark.parametrize(
    ("resources", "sub", "sent"),
    [
        (["pods"], "", True),
        (["pods"], "status", False),
        (["pods/status"], "status", True),
        (["pods/status"], "", False),
        (["pods/*"], "", True),
        (["pods/*"], "binding", True),
        (["*"], "", True),
        (["*"], "status", False),
        (["*/status"], "status", True),
        (["*/status"], "binding", False),
        (["*/*"], "eviction", True),
        (["nodes"], "", False),
    ],
)
def test_resources_name_a_resource_or_its_subresources(resources: list[str], sub: str, sent: bool) -> None:
    assert bool(matching([config(rule(resources))], request(sub=sub), {}, mutating=True)) is sent
    # The server's first question (may this request go anywhere?) answers the same by the rules alone.
    assert routed([config(rule(resources))], "CREATE", PODS, sub, ()) is sent


def test_routing_reads_operations_groups_scope_and_equivalent_versions_but_not_selectors() -> None:
    assert not routed([config(rule(["pods"], ops=("UPDATE",)))], "CREATE", PODS, "", ())
    assert routed([config(rule(["pods"], ops=("UPDATE",)))], "UPDATE", PODS, "", ())
    assert not routed([config(rule(["*"], scope="Cluster"))], "CREATE", PODS, "", ())
    assert not routed([config(rule(["*"], group="batch"))], "CREATE", PODS, "", ())
    # A rule for another version of the same resource: matched under matchPolicy Equivalent only.
    other = [("apps", "v1", "pods")]
    assert routed([config(rule(["*"], group="apps"))], "CREATE", PODS, "", tuple(other))
    exact = [config(rule(["*"], group="apps"), matchPolicy="Exact")]
    assert not routed(exact, "CREATE", PODS, "", tuple(other))
    # Selectors are left to `matching`: a request they would spare is still routed to it.
    spared = [config(rule(["*"]), objectSelector={"matchLabels": {"gate": "yes"}})]
    assert routed(spared, "CREATE", PODS, "", ())
    assert matching(spared, request(labels={"gate": "no"}), {}, mutating=True) == []
    assert not routed([], "CREATE", PODS, "", ())


def test_operations_groups_and_scope_must_all_match() -> None:
    assert matching([config(rule(["pods"], ops=("UPDATE",)))], request(), {}, mutating=True) == []
    assert matching([config(rule(["*"], group="batch"))], request(), {}, mutating=True) == []
    assert matching([config(rule(["*"], group="batch"))], request(JOBS), {}, mutating=True)
    assert matching([config(rule(["*"], scope="Cluster"))], request(), {}, mutating=True) == []
    assert matching([config(rule(["*"], scope="Cluster"))], request(NODES), None, mutating=True)


def test_a_namespace_selector_reads_the_namespace_s_labels_and_spares_cluster_objects() -> None:
    selector = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}
    configs = [config(rule(["*"]), namespaceSelector=selector)]
    assert matching(configs, request(), {"team": "a"}, mutating=True)
    assert matching(configs, request(), {"team": "b"}, mutating=True) == []
    # A cluster-scoped object other than a Namespace is never skipped by a namespaceSelector.
    assert matching(configs, request(NODES), None, mutating=True)


def test_an_object_selector_reads_the_object_s_labels() -> None:
    configs = [config(rule(["*"]), objectSelector={"matchLabels": {"gate": "yes"}})]
    assert matching(configs, request(labels={"gate": "yes"}), {}, mutating=True)
    assert matching(configs, request(labels={"gate": "no"}), {}, mutating=True) == []


def test_configurations_are_called_in_name_order_then_webhook_order() -> None:
    def named(name: str, *hooks: str) -> Obj:
        return {
            "metadata": {"name": name},
            "webhooks": [{"name": h, "rules": [rule(["*"])]} for h in hooks],
        }

    hooks = matching([named("b", "b1.k.t"), named("a", "a2.k.t", "a1.k.t")], request(), {}, mutating=True)
    assert [(h.configuration, h.name) for h in hooks] == [("a", "a2.k.t"), ("a", "a1.k.t"), ("b", "b1.k.t")]
