"""Specs for DRA admin access (issue 30; on by default in Kubernetes 1.34): a request with
``adminAccess: true`` gets devices without taking them (in use or not, and left free for every other
claim), and only in a namespace labelled ``resource.kubernetes.io/admin-access: "true"``; elsewhere the
claim is refused in kube-apiserver's words, naming the field. The result carries ``adminAccess`` to the
claim's status, and neither the core nor the binders' ledger counts such a device as taken.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.binder.ledger import device_clash, reservation_of
from shared.contracts.messages import Binding, NodeLedger
from shared.core.dra_accounting import claim_gpus
from shared.core.result import ClaimAllocation
from shared.kube import dra as kd
from shared.model import Namespace, Snapshot
from shared.model.dra import ADMIN_ACCESS_LABEL, DeviceResult, Dra
from tests.unit.test_dra_allocator import (
    GPU_CLASS,
    NODES,
    SLICES,
    claim,
    gpu,
    gpu_slice,
    job,
    node,
    pending_reason,
    placements,
    request,
    run,
    snapshot,
)

ADMIN = Namespace(name="ns", labels={ADMIN_ACCESS_LABEL: "true"})


def admin_request(count: int = 1) -> Any:
    return request(count=count, admin_access=True)


def in_namespace(snap: Snapshot, *namespaces: Namespace) -> Snapshot:
    return msgspec.structs.replace(snap, namespaces=namespaces)


def taken(device: str = "gpu-0", node_name: str = "node-1") -> DeviceResult:
    return DeviceResult(request="gpu", driver="gpu.nvidia.com", pool=node_name, device=device)


# --- the namespace rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("namespaces", "allowed"),
    [
        pytest.param((ADMIN,), True, id='labelled "true": allowed'),
        pytest.param((), False, id="namespace unknown: refused"),
        pytest.param((Namespace(name="ns"),), False, id="no label: refused"),
        pytest.param(
            (Namespace(name="ns", labels={ADMIN_ACCESS_LABEL: "True"}),), False, id="not exactly true"
        ),
        pytest.param(
            (Namespace(name="other", labels={ADMIN_ACCESS_LABEL: "true"}),),
            False,
            id="another namespace's label",
        ),
    ],
)
def test_admin_access_is_allowed_only_in_a_namespace_labelled_for_it(
    namespaces: tuple[Namespace, ...], allowed: bool
) -> None:
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("c", admin_request()),))
    result = run(in_namespace(snapshot(NODES, [job("job", "c")], dra), *namespaces))
    if allowed:
        assert "job-0" in placements(result)
    else:
        assert (
            'resourceclaim "c": spec.devices.requests[0].exactly.adminAccess: admin access to devices requires '
            "the `resource.kubernetes.io/admin-access: true` label on the containing namespace"
        ) in pending_reason(result)


def test_a_refused_admin_claim_holds_only_its_own_pod() -> None:
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("admin", admin_request()), claim("plain")))
    result = run(snapshot(NODES, [job("bad", "admin"), job("job", "plain")], dra))
    assert "job-0" in placements(result)
    assert "adminAccess" in pending_reason(result, "bad")


# --- devices given without being taken ---------------------------------------------------------------------
def test_an_admin_request_gets_a_device_another_claim_holds() -> None:
    one = (gpu_slice("node-1", gpu(0)),)
    held = claim("held", allocated=True, devices=(taken(),), node="node-1")
    dra = Dra(classes=(GPU_CLASS,), slices=one, claims=(held, claim("c", admin_request())))
    result = run(in_namespace(snapshot([node("node-1")], [job("job", "c")], dra), ADMIN))
    ((allocation,),) = [claims for _, claims in placements(result).values()]
    (device,) = allocation.devices
    assert device.id == taken().id
    assert device.admin_access


def test_a_device_an_admin_claim_got_stays_free_for_every_other_claim() -> None:
    one = (gpu_slice("node-1", gpu(0)),)
    admin = claim("admin", allocated=True, devices=(msgspec.structs.replace(taken(), admin_access=True),))
    dra = Dra(classes=(GPU_CLASS,), slices=one, claims=(admin, claim("c")))
    result = run(in_namespace(snapshot([node("node-1")], [job("job", "c")], dra), ADMIN))
    assert [a.devices[0].id for _, claims in placements(result).values() for a in claims] == [taken().id]


def test_in_one_cycle_an_admin_pod_and_a_plain_pod_both_get_the_one_device() -> None:
    one = (gpu_slice("node-1", gpu(0)),)
    dra = Dra(classes=(GPU_CLASS,), slices=one, claims=(claim("admin", admin_request()), claim("plain")))
    result = run(in_namespace(snapshot([node("node-1")], [job("a", "admin"), job("p", "plain")], dra), ADMIN))
    assert set(placements(result)) == {"a-0", "p-0"}


def test_an_admin_hold_in_the_ledger_clashes_with_no_claim() -> None:
    admin = msgspec.structs.replace(taken(), admin_access=True)

    def binding(pod: str, claim_name: str, device: DeviceResult) -> Binding:
        return Binding(
            pod=f"ns/{pod}",
            namespace="ns",
            name=pod,
            podgroup=pod,
            node="node-1",
            claims=(ClaimAllocation(claim=claim_name, devices=(device,), node="node-1"),),
        )

    held = NodeLedger(node="node-1", pods={"ns/a": reservation_of(binding("a", "admin", admin), "p-a")})
    assert device_clash(held, {"ns/b": reservation_of(binding("b", "plain", taken()), "p-b")}) is None
    plain = NodeLedger(node="node-1", pods={"ns/a": reservation_of(binding("a", "plain", taken()), "p-a")})
    assert device_clash(plain, {"ns/b": reservation_of(binding("b", "admin", admin), "p-b")}) is None


# --- reading it from the API -------------------------------------------------------------------------------
def _claim(request_json: dict[str, Any], **status: Any) -> kd.WireClaim:
    doc = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": {"requests": [request_json]}},
        "status": status,
    }
    return msgspec.json.decode(msgspec.json.encode(doc), type=kd.WireClaim)


@pytest.mark.parametrize(
    ("value", "admin", "problem"),
    [
        pytest.param(True, True, "", id="true"),
        pytest.param(False, False, "", id="false"),
        pytest.param(None, False, "", id="absent"),
        pytest.param(
            "yes", False, "spec.devices.requests[0].exactly.adminAccess: must be a boolean", id="a string"
        ),
        pytest.param(
            1, False, "spec.devices.requests[0].exactly.adminAccess: must be a boolean", id="a number"
        ),
    ],
)
def test_an_admin_access_request_is_read_and_a_malformed_one_names_its_field(
    value: Any, admin: bool, problem: str
) -> None:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if value is not None:
        exactly["adminAccess"] = value
    read = kd.claim_of(_claim({"name": "gpu", "exactly": exactly}))
    if problem:
        assert problem in read.problem
        assert "ResourceClaim" in read.problem
    else:
        assert not read.problem
        assert read.requests[0].admin_access is admin


def test_an_allocation_result_reads_its_admin_access() -> None:
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.nvidia.com",
                        "pool": "n1",
                        "device": "gpu-0",
                        "adminAccess": True,
                    }
                ]
            }
        }
    }
    read = kd.claim_of(_claim({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}, **status))
    assert [d.admin_access for d in read.devices] == [True]


# --- the safety property -----------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_node=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    wants=st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=6),
)
def test_no_device_is_taken_by_two_claims_whatever_admin_claims_share(
    per_node: list[int], wants: list[tuple[int, bool]]
) -> None:
    nodes = [node(f"node-{i}") for i in range(len(per_node))]
    slices = tuple(
        gpu_slice(n.name, *(gpu(j) for j in range(k))) for n, k in zip(nodes, per_node, strict=True) if k
    )
    claims = [claim(f"c{i}", request(count=n, admin_access=admin)) for i, (n, admin) in enumerate(wants)]
    jobs = [job(f"solo{i}", f"c{i}") for i in range(len(wants))]
    result = run(
        in_namespace(
            snapshot(nodes, jobs, Dra(classes=(GPU_CLASS,), slices=slices, claims=tuple(claims))), ADMIN
        )
    )
    plain = [
        r.id
        for p in result.binds
        for b in p.bindings
        for a in b.claims
        for r in a.devices
        if not r.admin_access
    ]
    assert len(plain) == len(set(plain))
    for bound in placements(result).values():
        for allocation in bound[1]:
            assert len({r.id for r in allocation.devices}) == len(allocation.devices), (
                "one device twice in a claim"
            )
    admin_jobs = {f"solo{i}-0" for i, (_, admin) in enumerate(wants) if admin}
    fits = {f"solo{i}-0" for i, (n, _) in enumerate(wants) if any(k >= n for k in per_node)}
    assert admin_jobs & fits <= set(placements(result)), "an admin claim that fits some node is never blocked"


def test_an_admin_request_counts_for_no_gpus_in_quota() -> None:
    """It takes no device from anyone (Kairos's reading: KAI v0.17 counts GPU-class requests by count)."""
    assert claim_gpus((request(count=2, admin_access=True),)) == 0
    assert claim_gpus((request(count=2),)) == 2
