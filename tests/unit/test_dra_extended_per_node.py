"""Specs for KEP-5004 per node (issue 30): a pod requesting a DeviceClass's extended resource without a
claim is served, node by node, as kube-scheduler decides it: a node whose allocatable lists the resource (a
device plugin's) serves it from allocatable, as any extended resource, and no claim is made there; a node
that does not list it serves it through DRA, from devices of the class (`shared.core.dra_accounting`,
`shared.core.dra`).
"""

from __future__ import annotations

import msgspec
import pytest

from shared.core.dra_accounting import DRA_SERVED, account, plugin_serves
from shared.model import Node, Snapshot
from shared.model.dra import DeviceClass, Dra
from tests.unit.test_dra_allocator import (
    GPU_CLASS,
    gpu,
    gpu_slice,
    job,
    node,
    pending_reason,
    placements,
    run,
    snapshot,
)

RESOURCE = "example.com/gpu"
BACKED = msgspec.structs.replace(GPU_CLASS, extended_resource_name=RESOURCE)


def with_resource(n: Node, amount: float | None) -> Node:
    return n if amount is None else msgspec.structs.replace(n, scalars={RESOURCE: amount})


def cluster(listed: float | None, dra_devices: int, wants: float = 1.0) -> Snapshot:
    """node-1 lists the resource (`listed` of it; None: not at all) and has no DRA devices; node-2 does not
    list it and publishes `dra_devices` GPUs of the class."""
    nodes = [with_resource(node("node-1"), listed), node("node-2")]
    slices = (gpu_slice("node-2", *(gpu(i) for i in range(dra_devices))),) if dra_devices else ()
    pg, pods = job("job")
    pods = [msgspec.structs.replace(p, scalars={RESOURCE: wants}) for p in pods]
    return snapshot(nodes, [(pg, pods)], Dra(classes=(BACKED,), slices=slices))


@pytest.mark.parametrize(
    ("listed", "dra_devices", "wants", "where", "devices"),
    [
        pytest.param(2.0, 0, 1.0, "node-1", 0, id="a node listing it serves it from allocatable, no claim"),
        pytest.param(
            1.0, 2, 2.0, "node-2", 2, id="the listing node has too little: a node without it serves it by DRA"
        ),
        pytest.param(None, 2, 1.0, "node-2", 1, id="no node lists it: DRA serves it"),
        pytest.param(0.0, 1, 1.0, "node-2", 1, id="listed as 0: that node never serves it through DRA"),
    ],
)
def test_an_extended_resource_is_served_per_node_by_allocatable_or_by_dra(
    listed: float | None, dra_devices: int, wants: float, where: str, devices: int
) -> None:
    node_name, claims = placements(run(cluster(listed, dra_devices, wants)))["job-0"]
    assert node_name == where
    assert sum(len(a.devices) for a in claims) == devices
    if devices:
        (allocation,) = claims
        assert allocation.claim == "job-0-extended-resources"
    else:
        assert claims == ()


def test_a_pod_neither_kind_of_node_can_serve_is_held_naming_both_reasons() -> None:
    reason = pending_reason(run(cluster(1.0, 1, wants=2.0)))
    assert f"didn't have enough resources: {RESOURCE}" in reason
    assert "cannot allocate all claims" in reason


def test_only_nodes_without_the_resource_are_given_room_for_dra_to_decide() -> None:
    snap = account(cluster(2.0, 1))
    scalars = {n.name: n.scalars for n in snap.nodes}
    assert scalars == {"node-1": {RESOURCE: 2.0}, "node-2": {RESOURCE: DRA_SERVED}}
    assert plugin_serves(scalars["node-1"], RESOURCE)
    assert not plugin_serves(scalars["node-2"], RESOURCE)
    (pod,) = snap.pods
    assert pod.scalars == {RESOURCE: 1.0}, "the request stays where a device plugin serves it"


def test_where_no_node_lists_it_the_request_leaves_the_pod_and_nodes_are_untouched() -> None:
    snap = account(cluster(None, 1))
    assert all(RESOURCE not in n.scalars for n in snap.nodes)
    (pod,) = snap.pods
    assert RESOURCE not in pod.scalars
    assert [(e.device_class, e.count) for e in pod.resource_claims] == [(BACKED.name, 1)]


def test_every_class_answers_to_its_own_deviceclass_resource_name() -> None:
    plain = DeviceClass(name="gpu.nvidia.com", selectors=GPU_CLASS.selectors)
    nodes = [node("node-1")]
    pg, pods = job("job")
    pods = [
        msgspec.structs.replace(p, scalars={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1.0})
        for p in pods
    ]
    snap = snapshot(nodes, [(pg, pods)], Dra(classes=(plain,), slices=(gpu_slice("node-1", gpu(0)),)))
    (allocation,) = placements(run(snap))["job-0"][1]
    assert len(allocation.devices) == 1
