"""NodeResourceTopology objects and pods as the numa plugin reads them (`shared.kube.numa`), as
specifications: what a node's zones and Topology Manager setting come to, what a pod asks the kubelet to
align, and every way an object can be wrong, each named by its field (hostile objects too: never a crash).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.errors import InvalidObject
from shared.kube import wire
from shared.kube.numa import decode_topology, node_numa_of, numa_request_of
from shared.kube.translate.pods import pod_of
from shared.model import Node
from shared.model.numa import NodeNuma, NumaRequest
from tests.builders import pod_manifest

GPU = "nvidia.com/gpu"
NODE = Node(name="gpu-0", cpu_millis=64_000, memory_bytes=2.0**39, gpus=8, scalars={"hugepages-1Gi": 2.0**34})


def nrt(
    zones: list[dict[str, Any]],
    *,
    policy: str | None = "single-numa-node",
    scope: str | None = None,
    legacy: list[str] | None = None,
) -> dict[str, Any]:
    attributes = []
    if policy is not None:
        attributes.append({"name": "topologyManagerPolicy", "value": policy})
    if scope is not None:
        attributes.append({"name": "topologyManagerScope", "value": scope})
    obj: dict[str, Any] = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "gpu-0"},
        "attributes": attributes,
        "zones": zones,
    }
    if legacy is not None:
        obj["topologyPolicies"] = legacy
    return obj


def numa_zone(name: str, **resources: tuple[Any, Any]) -> dict[str, Any]:
    """A zone of type Node; each resource as (allocatable, available), its capacity the allocatable."""
    return {
        "name": name,
        "type": "Node",
        "resources": [
            {"name": GPU if r == "gpu" else r, "capacity": a, "allocatable": a, "available": v}
            for r, (a, v) in resources.items()
        ],
    }


def read(obj: dict[str, Any], node: Node = NODE) -> NodeNuma | None:
    return node_numa_of(decode_topology(json.dumps(obj)), node)


# --- zones and settings ---------------------------------------------------------------------------------
def test_zones_become_the_nodes_numa_zones_in_model_units() -> None:
    numa = read(nrt([numa_zone("node-0", cpu=("16", "12"), memory=("64Gi", "60Gi"), gpu=(4, 2))]))
    assert numa is not None
    (zone,) = numa.zones
    assert zone.allocatable == {"cpu": 16_000.0, "memory": 64 * 2.0**30, GPU: 4.0}
    assert zone.available == {"cpu": 12_000.0, "memory": 60 * 2.0**30, GPU: 2.0}


def test_zones_are_ordered_by_their_numa_id_and_other_zone_types_are_left_out() -> None:
    zones = [numa_zone("node-10", cpu=(1, 1)), numa_zone("node-2", cpu=(1, 1))]
    zones.append({"name": "socket-0", "type": "Socket", "resources": []})
    numa = read(nrt(zones))
    assert numa is not None
    assert [z.name for z in numa.zones] == ["node-2", "node-10"]


def test_an_object_without_numa_zones_gives_the_node_none() -> None:
    assert read(nrt([{"name": "socket-0", "type": "Socket"}])) is None


@pytest.mark.parametrize(
    ("policy", "scope", "legacy", "expected"),
    [
        ("single-numa-node", None, None, ("single-numa-node", "container")),
        ("restricted", "pod", None, ("restricted", "pod")),
        ("best-effort", "container", ["SingleNUMANodePodLevel"], ("best-effort", "container")),
        (None, None, ["SingleNUMANodePodLevel"], ("single-numa-node", "pod")),
        (None, None, ["RestrictedContainerLevel"], ("restricted", "container")),
        (None, None, ["BestEffort"], ("best-effort", "container")),
        (None, None, None, ("none", "container")),
    ],
    ids=[
        "attribute, container scope by default",
        "attributes policy and scope",
        "attributes win over the older topologyPolicies",
        "older exporter: single NUMA node, pod level",
        "older exporter: restricted, container level",
        "older exporter: best effort",
        "neither: none",
    ],
)
def test_the_policy_and_scope_come_from_the_attributes_else_the_older_field(
    policy: str | None, scope: str | None, legacy: list[str] | None, expected: tuple[str, str]
) -> None:
    numa = read(nrt([numa_zone("node-0", cpu=(4, 4))], policy=policy, scope=scope, legacy=legacy))
    assert numa is not None
    assert (numa.policy, numa.scope) == expected


# --- zones that do not add up ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("zones", "field", "problem"),
    [
        (
            [numa_zone("node-0", gpu=(4, "lots"))],
            "zones[0].resources[0].available",
            "'lots' is not a quantity",
        ),
        ([numa_zone("node-0", gpu=(4, "-1"))], "zones[0].resources[0].available", "is negative"),
        (
            [numa_zone("node-0", gpu=(2, 3))],
            "zones[0].resources[0].available",
            "3 available is more than the zone's allocatable 2",
        ),
        (
            [numa_zone("node-0", gpu=(9, 1))],
            "zones[0].resources[0].allocatable",
            "more than node gpu-0's allocatable 8",
        ),
        (
            [numa_zone("node-0", cpu=("65", "1"))],
            "zones[0].resources[0].allocatable",
            "65 cpu in zone 'node-0' is more than node gpu-0's allocatable 64",
        ),
        ([numa_zone("node-0", cpu=(1, 1)), numa_zone("node-0", cpu=(1, 1))], "zones[1].name", "listed twice"),
        ([{"name": "", "type": "Node"}], "zones[0].name", "a zone needs a name"),
        (
            [{"name": "node-0", "type": "Node", "resources": [{"name": "cpu"}, {"name": "cpu"}]}],
            "zones[0].resources[1].name",
            "listed twice",
        ),
        (
            [numa_zone("node-0", **{"example.com/nic": (1, 1)})],
            "zones[0].resources[0].allocatable",
            "more than node gpu-0's allocatable 0",
        ),
    ],
)
def test_a_zone_that_does_not_add_up_is_refused_naming_the_field(
    zones: list[dict[str, Any]], field: str, problem: str
) -> None:
    with pytest.raises(InvalidObject) as caught:
        read(nrt(zones))
    assert (caught.value.kind, caught.value.name, caught.value.field) == (
        "NodeResourceTopology",
        "gpu-0",
        field,
    )
    assert problem in caught.value.problem


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (nrt([numa_zone("node-0", cpu=(1, 1))], policy="strict"), "attributes[0].value"),
        (nrt([numa_zone("node-0", cpu=(1, 1))], scope="node"), "attributes[1].value"),
        (nrt([numa_zone("node-0", cpu=(1, 1))], policy=None, legacy=["Sometimes"]), "topologyPolicies[0]"),
        ({"metadata": {"name": "gpu-0"}, "zones": {"node-0": {}}}, "zones"),
        (
            {"metadata": {"name": "gpu-0"}, "zones": [{"name": "node-0", "resources": [{"available": []}]}]},
            "zones[0].resources[0].available",
        ),
    ],
)
def test_a_setting_or_shape_the_kubelet_does_not_have_is_refused_naming_the_field(
    obj: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidObject) as caught:
        read(obj)
    assert (caught.value.kind, caught.value.name, caught.value.field) == (
        "NodeResourceTopology",
        "gpu-0",
        field,
    )


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)
_RESOURCE = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["cpu", "memory", GPU, "hugepages-1Gi", "x"]) | _JSON,
        "capacity": st.sampled_from(["1", "8", "-1", "1e400", "2Gi", "x"]) | _JSON,
        "allocatable": st.sampled_from(["1", "8", "-1", "100m", "2Gi", "x"]) | _JSON,
        "available": st.sampled_from(["0", "1", "9", "-3", "x"]) | _JSON,
    },
)
_ZONE = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["node-0", "node-1", ""]) | _JSON,
        "type": st.sampled_from(["Node", "Socket"]) | _JSON,
        "resources": st.lists(_RESOURCE, max_size=3) | _JSON,
    },
)
_NRT = st.fixed_dictionaries(
    {"metadata": st.just({"name": "gpu-0"})},
    optional={
        "attributes": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.sampled_from(["topologyManagerPolicy", "topologyManagerScope"]) | _JSON,
                    "value": st.sampled_from(["restricted", "pod", "bogus"]) | _JSON,
                },
            ),
            max_size=2,
        )
        | _JSON,
        "topologyPolicies": st.lists(st.sampled_from(["Restricted", "bogus"]) | _JSON, max_size=2) | _JSON,
        "zones": st.lists(_ZONE, max_size=3) | _JSON,
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_NRT)
def test_a_hostile_object_gives_zones_or_an_error_naming_it_never_a_crash(obj: dict[str, Any]) -> None:
    data = msgspec.json.encode(obj)
    try:
        numa = node_numa_of(decode_topology(data), NODE)
    except InvalidObject as exc:
        named = (exc.kind, exc.name)
        numa = None
    else:
        named = ("NodeResourceTopology", "gpu-0")
    assert named == ("NodeResourceTopology", "gpu-0")
    if numa is not None:
        for zone in numa.zones:
            for resource, amount in zone.free.items():
                assert 0 <= amount <= zone.allocatable[resource]


# --- pods -------------------------------------------------------------------------------------------------
def container(
    requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}, **extra}


def pod(
    *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), overhead: dict[str, Any] | None = None
) -> wire.Pod:
    spec: dict[str, Any] = {"containers": list(containers), "initContainers": list(init)}
    if overhead:
        spec["overhead"] = overhead
    return wire.convert(wire.Pod, pod_manifest("p", "ns", **spec))


def same(amounts: dict[str, Any]) -> dict[str, Any]:
    """A container whose requests equal its limits (a Guaranteed one)."""
    return container(amounts, amounts)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            pod(same({"cpu": "4", "memory": "8Gi", GPU: "2"})),
            NumaRequest(
                guaranteed=True,
                pod={"cpu": 4000.0, "memory": 8 * 2.0**30, GPU: 2.0},
                containers=({"cpu": 4000.0, "memory": 8 * 2.0**30, GPU: 2.0},),
            ),
            id="Guaranteed: whole CPUs, memory and GPUs",
        ),
        pytest.param(
            pod(container(limits={"cpu": "2", "memory": "1Gi"})),
            NumaRequest(
                guaranteed=True,
                pod={"cpu": 2000.0, "memory": 2.0**30},
                containers=({"cpu": 2000.0, "memory": 2.0**30},),
            ),
            id="Guaranteed with limits alone (requests default to them)",
        ),
        pytest.param(
            pod(same({"cpu": "1500m", "memory": "1Gi"})),
            NumaRequest(guaranteed=True, pod={"memory": 2.0**30}, containers=({"memory": 2.0**30},)),
            id="a fraction of a CPU stays in the shared pool",
        ),
        pytest.param(
            pod(container({"cpu": "2", "memory": "1Gi", GPU: "1"}, {GPU: "1"})),
            NumaRequest(guaranteed=False, pod={GPU: 1.0}, containers=({GPU: 1.0},)),
            id="Burstable with a GPU: only the device is aligned",
        ),
        pytest.param(
            pod(container({"cpu": "2", "memory": "1Gi"})), None, id="Burstable without a device: nothing"
        ),
        pytest.param(pod(container()), None, id="BestEffort: nothing"),
        pytest.param(
            pod(
                same({"cpu": "2", "memory": "1Gi"}),
                init=(
                    same({"cpu": "6", "memory": "1Gi"}),
                    {**same({"cpu": "1", "memory": "1Gi"}), "restartPolicy": "Always"},
                ),
            ),
            NumaRequest(
                guaranteed=True,
                pod={"cpu": 6000.0, "memory": 2 * 2.0**30},
                containers=({"cpu": 1000.0, "memory": 2.0**30}, {"cpu": 2000.0, "memory": 2.0**30}),
                init=({"cpu": 6000.0, "memory": 2.0**30},),
            ),
            id="init peak against sidecar plus app",
        ),
        pytest.param(
            pod(same({"cpu": "2", "memory": "1Gi"}), overhead={"cpu": "1", "memory": "1Gi"}),
            NumaRequest(
                guaranteed=True,
                pod={"cpu": 2000.0, "memory": 2 * 2.0**30},
                containers=({"cpu": 2000.0, "memory": 2.0**30},),
            ),
            id="the overhead adds to the pod's memory, not its CPUs",
        ),
    ],
)
def test_a_pods_numa_request_is_what_the_kubelet_aligns(spec: wire.Pod, expected: NumaRequest | None) -> None:
    assert numa_request_of(spec) == expected


def test_the_translated_pod_carries_its_numa_request() -> None:
    raw = wire.convert(
        wire.Pod,
        {
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"pod-group-name": "g"}},
            "spec": {"containers": [same({"cpu": "4", "memory": "8Gi", GPU: "2"})]},
        },
    )
    translated = pod_of(raw, podgroup="ns/g")
    assert translated.numa is not None
    assert translated.numa.guaranteed
