"""Specs for reading DRA objects (`shared.kube.dra`) and mirroring them (`services.state.mirror.dra_mirror`):
resource.k8s.io/v1 as kube-scheduler reads it, and bad input (a selector that does not compile, a claim
template without requests, a request without a class) named by object and field, nothing else affected.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.mirror.dra_mirror import DraMirror
from shared.kube import dra as kd
from shared.kube import wire
from shared.model.dra import Attribute, DeviceResult, PodClaim, ResourceClaim

W = TypeVar("W", kd.WireDeviceClass, kd.WireResourceSlice, kd.WireClaim, kd.WireClaimTemplate)


def encode(obj: dict[str, Any]) -> bytes:
    return msgspec.json.encode(obj)


def wire_of(cls: type[W], data: bytes) -> W:
    """`kd.decode` for one kind, typed."""
    return msgspec.json.decode(data, type=cls)


def claim_json(requests: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": {"requests": requests}},
        "status": status,
    }


GPU = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}


def test_a_slices_devices_are_read_with_qualified_attributes_and_capacities_in_thousandths() -> None:
    raw = wire_of(
        kd.WireResourceSlice,
        encode(
            {
                "metadata": {"name": "n1-gpu"},
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                    "nodeName": "n1",
                    "devices": [
                        {
                            "name": "gpu-0",
                            "attributes": {"uuid": {"string": "GPU-0"}, "example.com/x": {"int": 3}},
                            "capacity": {"memory": {"value": "1Gi"}},
                        }
                    ],
                },
            }
        ),
    )
    s = kd.slice_of(raw)
    assert (s.driver, s.pool, s.node) == ("gpu.nvidia.com", "n1", "n1")
    device = s.devices[0]
    assert device.attributes == {
        "gpu.nvidia.com/uuid": Attribute(text="GPU-0"),
        "example.com/x": Attribute(number=3),
    }
    assert device.capacity == {"gpu.nvidia.com/memory": 2**30 * 1000}


def test_an_allocated_claim_reads_its_devices_node_and_users() -> None:
    allocation = {
        "devices": {"results": [{"request": "gpu", "driver": "d", "pool": "n1", "device": "gpu-0"}]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }
    raw = wire_of(
        kd.WireClaim,
        encode(
            claim_json(
                [GPU], allocation=allocation, reservedFor=[{"resource": "pods", "name": "p", "uid": "pu"}]
            )
        ),
    )
    claim = kd.claim_of(raw)
    assert (claim.allocated, claim.node, claim.reserved_for) == (True, "n1", ("pu",))
    assert claim.devices == (DeviceResult(request="gpu", driver="d", pool="n1", device="gpu-0"),)


@pytest.mark.parametrize(
    ("requests", "problem"),
    [
        pytest.param(
            [],
            "ResourceClaim 'ns/c': spec.devices.requests: must have at least one request",
            id="no requests",
        ),
        pytest.param(
            [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "g",
                        "selectors": [{"cel": {"expression": "device.driver =="}}],
                    },
                }
            ],
            "ResourceClaim 'ns/c': spec.devices.requests[0].exactly.selectors[0].cel.expression: compilation failed",
            id="a selector that does not compile",
        ),
        pytest.param(
            [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": "g", "selectors": [{"cel": {"expression": "nope == 1"}}]},
                }
            ],
            "spec.devices.requests[0].exactly.selectors[0].cel.expression: compilation failed: undeclared reference to 'nope'",
            id="a selector naming a variable the environment does not have",
        ),
        pytest.param(
            [{"name": "gpu", "exactly": {}}],
            "ResourceClaim 'ns/c': spec.devices.requests[0].exactly.deviceClassName: required",
            id="a request without a class",
        ),
        pytest.param(
            [{"name": "gpu", "exactly": {"deviceClassName": "g", "allocationMode": "Some"}}],
            "spec.devices.requests[0].exactly.allocationMode: must be ExactCount or All, got 'Some'",
            id="an unknown allocation mode",
        ),
        pytest.param(
            [{"name": "gpu"}],
            "spec.devices.requests[0]: exactly one of exactly and firstAvailable must be set",
            id="neither exactly nor firstAvailable",
        ),
    ],
)
def test_a_claim_that_does_not_translate_keeps_its_name_and_carries_the_field(
    requests: list[dict[str, Any]], problem: str
) -> None:
    claim = kd.claim_of(wire_of(kd.WireClaim, encode(claim_json(requests))))
    assert (claim.namespace, claim.name) == ("ns", "c")
    assert problem in claim.problem


def test_a_template_without_requests_carries_the_problem() -> None:
    raw = wire_of(
        kd.WireClaimTemplate, encode({"metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": {}}})
    )
    assert kd.template_of(raw).problem == (
        "ResourceClaimTemplate 'ns/t': spec.spec.devices.requests: must have at least one request"
    )


def test_a_device_class_whose_selector_does_not_compile_carries_the_field() -> None:
    raw = wire_of(
        kd.WireDeviceClass,
        encode({"metadata": {"name": "g"}, "spec": {"selectors": [{"cel": {"expression": "("}}]}}),
    )
    assert "DeviceClass 'g': spec.selectors[0].cel.expression: compilation failed" in kd.class_of(raw).problem


def test_a_pods_claims_by_name_and_from_templates_once_made() -> None:
    pod = msgspec.json.decode(
        encode(
            {
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {
                    "resourceClaims": [
                        {"name": "a", "resourceClaimName": "shared"},
                        {"name": "b", "resourceClaimTemplateName": "t"},
                        {"name": "c", "resourceClaimTemplateName": "t"},
                    ]
                },
                "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]},
            }
        ),
        type=wire.Pod,
    )
    assert kd.pod_claims_of(pod) == (
        PodClaim(name="a", claim="shared"),
        PodClaim(name="b", claim="p-b-x1", template="t"),
        PodClaim(name="c", template="t"),
    )


def test_the_mirror_keeps_a_bad_claim_under_its_name_and_leaves_a_bad_slice_out() -> None:
    mirror = DraMirror()
    mirror.relist(
        "resourceclaims",
        [encode(claim_json([])), b'{"metadata": {"name": "x", "namespace": "ns"}, "spec": 5}'],
    )
    mirror.relist("resourceslices", [encode({"metadata": {"name": "s"}, "spec": {"driver": "d"}})])
    claims = {o.name: o for o in mirror.objects.values() if isinstance(o, ResourceClaim)}
    assert set(claims) == {"c", "x"}
    assert all(c.problem for c in claims.values())
    assert "resourceslices s" in mirror.problems
    assert "spec.pool.name" in mirror.problems["resourceslices s"]
    mirror.change("resourceclaims", "DELETED", encode(claim_json([])))
    assert "c" not in {o.name for o in mirror.objects.values()}


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
        max_leaves=12,
    )
)
def test_hostile_documents_never_crash_the_mirror(doc: Any) -> None:
    mirror = DraMirror()
    for resource in ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates"):
        mirror.relist(resource, [encode({"metadata": {"name": "h", "namespace": "ns"}, "spec": doc})])
