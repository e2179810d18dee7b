"""Specs for the DRA filter (`shared.core.dra`; issue 30, deliverable 2): kube-scheduler's DynamicResources
and its structured allocator over a pod's ResourceClaims, in its words, the allocation carried on the
pod's Binding, and DRA GPUs counted as KAI counts them (`shared.core.dra_accounting`).

Each table row is a rule of the upstream allocator (DeviceClass and request selectors, ExactCount and All,
firstAvailable, matchAttribute, allocated and shared claims); the properties hold over random clusters: no
device is allocated to two claims, a gang's claims are all allocated or none, and any selector text is
compiled or refused by field, never a crash.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import dra as d
from shared.core import dra_cel
from shared.core.dra_accounting import account, claim_gpus
from shared.core.policy import Policy
from shared.core.result import ClaimAllocation, CycleResult
from shared.core.scheduler import schedule
from shared.model import Node, Pod, PodGroup, Snapshot
from shared.model.dra import (
    ALL,
    Attribute,
    ClaimConstraint,
    Device,
    DeviceClass,
    DeviceRequest,
    DeviceResult,
    Dra,
    PodClaim,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from tests import builders as tb
from tests.builders import gang

NOW = 10_000.0
ALLOCATE = Policy(actions=("allocate",))
GI = 1024**3
DRIVER = "gpu.nvidia.com"
GPU_CLASS = DeviceClass(name="gpu.nvidia.com", selectors=(f'device.driver == "{DRIVER}"',))
NIC_CLASS = DeviceClass(name="nic", selectors=('device.driver == "nic.example.com"',))


def node(name: str, gpus: int = 0) -> Node:
    return tb.node(name, gpus, cpu_millis=8000, memory_bytes=64 * GI, labels={tb.HOSTNAME: name})


def gpu(index: int, product: str = "H100", memory_gi: int = 80, **attrs: Attribute) -> Device:
    return Device(
        name=f"gpu-{index}",
        attributes={
            f"{DRIVER}/productName": Attribute(text=product),
            f"{DRIVER}/index": Attribute(number=index),
            **{f"{DRIVER}/{k}": v for k, v in attrs.items()},
        },
        capacity={f"{DRIVER}/memory": memory_gi * GI * 1000},
    )


def gpu_slice(on: str, *devices: Device) -> ResourceSlice:
    return ResourceSlice(name=f"{on}-gpu", driver=DRIVER, pool=on, node=on, devices=devices)


def request(name: str = "gpu", cls: str = "gpu.nvidia.com", count: int = 1, **kw: object) -> DeviceRequest:
    return DeviceRequest(name=name, device_class=cls, count=count, **kw)  # type: ignore[arg-type]


def claim(name: str, *requests: DeviceRequest, **kw: object) -> ResourceClaim:
    """A claim in namespace "ns", labelled for the queue every job here is in (KAI lets only that queue's
    pods use a GPU claim they name)."""
    kw.setdefault("queue", "team")
    return ResourceClaim(
        name=name,
        namespace="ns",
        uid=f"uid-{name}",
        requests=requests or (request(),),
        **kw,  # type: ignore[arg-type]
    )


def job(name: str, *claims: str, size: int = 1, gpus: float = 0.0) -> tuple[PodGroup, list[Pod]]:
    pg, pods = gang(name, "team", size, gpus, created=NOW)
    entries = tuple(PodClaim(name=c, claim=c) for c in claims)
    pods = [msgspec.structs.replace(p, namespace="ns", resource_claims=entries) for p in pods]
    return msgspec.structs.replace(pg, namespace="ns"), pods


def snapshot(
    nodes: Sequence[Node], jobs: Sequence[tuple[PodGroup, list[Pod]]], dra: Dra, gpu_quota: float = -1
) -> Snapshot:
    team = tb.queue("team", gpu_quota, parent=None, limit=gpu_quota)
    return tb.snapshot(nodes, *jobs, queues=[team], dra=dra)


def run(snap: Snapshot) -> CycleResult:
    return schedule(snap, NOW, ALLOCATE)


def placements(result: CycleResult) -> dict[str, tuple[str, tuple[ClaimAllocation, ...]]]:
    return {b.name: (b.node, b.claims) for p in result.binds for b in p.bindings}


def pending_reason(result: CycleResult, podgroup: str = "job") -> str:
    status = result.podgroups[podgroup]
    assert status.pending, status
    return status.fit_error or ""


def devices_of(result: CycleResult) -> list[tuple[str, str, str]]:
    return [r.id for p in result.binds for b in p.bindings for a in b.claims for r in a.devices]


NODES = [node("node-1"), node("node-2")]
SLICES = (gpu_slice("node-1", gpu(0, "A100", 40), gpu(1, "A100", 40)), gpu_slice("node-2", gpu(0), gpu(1)))


# --- allocation --------------------------------------------------------------------------------------------
def test_a_claim_for_one_gpu_is_allocated_a_device_on_the_node_and_carried_on_the_binding() -> None:
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("c"),))
    node_name, allocations = placements(run(snapshot(NODES, [job("job", "c")], dra)))["job-0"]
    assert allocations == (
        ClaimAllocation(
            claim="c",
            devices=(DeviceResult(request="gpu", driver=DRIVER, pool=node_name, device="gpu-0"),),
            node=node_name,
        ),
    )


@pytest.mark.parametrize(
    ("requests", "constraints", "node_name", "devices"),
    [
        pytest.param(
            (request(selectors=(f'device.attributes["{DRIVER}"].productName == "H100"',)),),
            (),
            "node-2",
            ["gpu-0"],
            id="a request selector on an attribute picks the node whose device has it",
        ),
        pytest.param(
            (request(selectors=(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("60Gi")) >= 0',)),),
            (),
            "node-2",
            ["gpu-0"],
            id="a capacity compared with quantity() picks the 80Gi devices",
        ),
        pytest.param(
            (request(count=2),), (), "node-1", ["gpu-0", "gpu-1"], id="ExactCount 2 takes two devices"
        ),
        pytest.param(
            (DeviceRequest(name="gpu", device_class="gpu.nvidia.com", mode=ALL),),
            (),
            "node-1",
            ["gpu-0", "gpu-1"],
            id="All takes every matching device of the node",
        ),
        pytest.param(
            (
                DeviceRequest(
                    name="gpu",
                    first_available=(
                        request("big", count=3),
                        request("h100", selectors=(f'device.attributes["{DRIVER}"].productName == "H100"',)),
                    ),
                ),
            ),
            (),
            "node-2",
            ["gpu-0"],
            id="firstAvailable falls back to its second subrequest when the first cannot be met",
        ),
        pytest.param(
            (request("a"), request("b")),
            (ClaimConstraint(match_attribute=f"{DRIVER}/group"),),
            "node-2",
            ["gpu-0", "gpu-2"],
            id="matchAttribute keeps a claim's devices on one value of the attribute",
        ),
    ],
)
def test_the_allocator_follows_the_requests_selectors_counts_and_constraints(
    requests: tuple[DeviceRequest, ...],
    constraints: tuple[ClaimConstraint, ...],
    node_name: str,
    devices: list[str],
) -> None:
    grouped = gpu_slice(
        "node-2",
        gpu(0, group=Attribute(text="x")),
        gpu(1, group=Attribute(text="y")),
        gpu(2, group=Attribute(text="x")),
    )
    slices = SLICES if not constraints else (grouped,)
    dra = Dra(classes=(GPU_CLASS,), slices=slices, claims=(claim("c", *requests, constraints=constraints),))
    got_node, allocations = placements(run(snapshot(NODES, [job("job", "c")], dra)))["job-0"]
    assert got_node == node_name
    assert [r.device for r in allocations[0].devices] == devices


def test_a_subrequests_results_are_named_request_slash_subrequest() -> None:
    req = DeviceRequest(name="gpu", first_available=(request("any"),))
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("c", req),))
    _, allocations = placements(run(snapshot(NODES, [job("job", "c")], dra)))["job-0"]
    assert allocations[0].devices[0].request == "gpu/any"


def test_an_allocated_claim_keeps_the_pod_on_its_node_and_is_only_reserved() -> None:
    held = claim(
        "c",
        allocated=True,
        node="node-2",
        devices=(DeviceResult(request="gpu", driver=DRIVER, pool="node-2", device="gpu-1"),),
        reserved_for=("other-pod",),
    )
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(held,))
    assert placements(run(snapshot(NODES, [job("job", "c")], dra)))["job-0"] == (
        "node-2",
        (ClaimAllocation(claim="c", node="node-2"),),
    )


def test_devices_other_claims_hold_are_not_allocated_again() -> None:
    held = claim(
        "held",
        allocated=True,
        node="node-1",
        devices=tuple(
            DeviceResult(request="gpu", driver=DRIVER, pool="node-1", device=f"gpu-{i}") for i in (0, 1)
        ),
    )
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(held, claim("c")))
    assert placements(run(snapshot(NODES, [job("job", "c")], dra)))["job-0"][0] == "node-2"


def test_a_claim_shared_by_two_pods_is_allocated_once_and_both_go_to_its_node() -> None:
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("shared"),))
    result = run(snapshot(NODES, [job("job", "shared", size=2)], dra))
    got = placements(result)
    assert got["job-0"][0] == got["job-1"][0]
    assert got["job-0"][1] == got["job-1"][1]
    assert len(set(devices_of(result))) == 1


@pytest.mark.parametrize(
    ("dra", "entries", "reason"),
    [
        pytest.param(
            Dra(classes=(GPU_CLASS,), slices=SLICES),
            None,
            'resourceclaim "c" not found',
            id="a missing claim is named",
        ),
        pytest.param(
            Dra(
                classes=(GPU_CLASS,),
                slices=SLICES,
                claims=(
                    claim("c", request(selectors=(f'device.attributes["{DRIVER}"].productName == "B200"',))),
                ),
            ),
            None,
            d.CANNOT_ALLOCATE,
            id="no node has a device the selectors accept: cannot allocate all claims",
        ),
        pytest.param(
            Dra(slices=SLICES, claims=(claim("c"),)),
            None,
            'resourceclaim "c": spec.devices.requests[0].exactly.deviceClassName: '
            'deviceclass.resource.k8s.io "gpu.nvidia.com" not found',
            id="a DeviceClass that does not exist names the claim, the field and the class",
        ),
        pytest.param(
            Dra(
                classes=(
                    msgspec.structs.replace(
                        GPU_CLASS,
                        problem="DeviceClass 'gpu.nvidia.com': spec.selectors[0].cel.expression: compilation failed",
                    ),
                ),
                slices=SLICES,
                claims=(claim("c"),),
            ),
            None,
            "DeviceClass 'gpu.nvidia.com': spec.selectors[0].cel.expression: compilation failed",
            id="a class whose selector did not compile holds the pod with its problem",
        ),
        pytest.param(
            Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("c", deleting=True),)),
            None,
            'resourceclaim "c" is being deleted',
            id="a claim being deleted",
        ),
        pytest.param(
            Dra(
                classes=(GPU_CLASS,),
                slices=SLICES,
                claims=(
                    claim(
                        "c",
                        allocated=True,
                        node="node-9",
                        devices=(DeviceResult(request="gpu", driver=DRIVER, pool="node-9", device="gpu-0"),),
                    ),
                ),
            ),
            None,
            d.NOT_AVAILABLE,
            id="a claim allocated for a node not in the cluster: resourceclaim not available on the node",
        ),
        pytest.param(
            Dra(
                classes=(GPU_CLASS,),
                slices=SLICES,
                templates=(ResourceClaimTemplate(name="t", namespace="ns", requests=(request(),)),),
            ),
            (PodClaim(name="gpu", template="t"),),
            'resourceclaim of pod claim "gpu" (resourceclaimtemplate "t"): not created yet',
            id="a template's claim not made yet holds the pod",
        ),
        pytest.param(
            Dra(classes=(GPU_CLASS,), slices=SLICES),
            (PodClaim(name="gpu", template="t"),),
            'resourceclaimtemplate "t" not found',
            id="a missing template is named",
        ),
        pytest.param(
            Dra(
                classes=(GPU_CLASS,),
                slices=SLICES,
                templates=(
                    ResourceClaimTemplate(
                        name="t",
                        namespace="ns",
                        problem="ResourceClaimTemplate 'ns/t': spec.spec.devices.requests: must have at least one request",
                    ),
                ),
            ),
            (PodClaim(name="gpu", template="t"),),
            "ResourceClaimTemplate 'ns/t': spec.spec.devices.requests: must have at least one request",
            id="a template without requests holds the pod naming the field",
        ),
        pytest.param(
            Dra(
                classes=(GPU_CLASS,),
                slices=SLICES,
                claims=(claim("c", request(selectors=('device.attributes["other.com"].x == 1',))),),
            ),
            None,
            "claim ns/c, request gpu: selector #0: CEL runtime error: no such key",
            id="a selector failing at evaluation is reported as Kubernetes' CEL runtime error",
        ),
    ],
)
def test_a_pod_whose_claims_cannot_be_met_stays_pending_with_kube_schedulers_words(
    dra: Dra, entries: tuple[PodClaim, ...] | None, reason: str
) -> None:
    pg, pods = job("job", "c")
    if entries is not None:
        pods = [msgspec.structs.replace(p, resource_claims=entries) for p in pods]
    result = run(snapshot(NODES, [(pg, pods)], dra))
    assert not result.binds
    assert reason in pending_reason(result)


def test_a_bad_claim_holds_only_its_own_pod() -> None:
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("good"),))
    result = run(snapshot(NODES, [job("bad", "missing"), job("job", "good")], dra))
    assert "job-0" in placements(result)
    assert 'resourceclaim "missing" not found' in pending_reason(result, "bad")


# --- KAI's GPU accounting and KEP-5004 -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requests", "gpus"),
    [
        pytest.param((request(count=2),), 2, id="ExactCount of a GPU class counts its count"),
        pytest.param(
            (DeviceRequest(name="g", device_class="gpu.nvidia.com", mode=ALL),), 1, id="All counts one"
        ),
        pytest.param((request(cls="nic"),), 0, id="a class without gpu in its name counts none"),
        pytest.param(
            (DeviceRequest(name="g", first_available=(request(),)),), 0, id="firstAvailable is not counted"
        ),
    ],
)
def test_a_claims_gpus_count_as_kai_counts_them(requests: tuple[DeviceRequest, ...], gpus: int) -> None:
    assert claim_gpus(requests) == gpus


def test_dra_gpus_count_in_the_queues_gpu_quota() -> None:
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("c", request(count=2)),))
    nodes = [node("node-1", gpus=2), node("node-2", gpus=2)]
    over = run(snapshot(nodes, [job("job", "c")], dra, gpu_quota=1))
    assert not over.binds
    within = run(snapshot(nodes, [job("job", "c")], dra, gpu_quota=2))
    assert [b.gpus for p in within.binds for b in p.bindings] == [2.0]


def test_a_node_without_device_plugin_gpus_counts_its_dra_gpu_devices() -> None:
    snap = account(snapshot(NODES, [], Dra(slices=SLICES)))
    assert [n.gpus for n in snap.nodes] == [2, 2]


def test_an_extended_resource_backed_by_a_device_class_is_allocated_through_a_claim_kairos_makes() -> None:
    backed = msgspec.structs.replace(GPU_CLASS, extended_resource_name="example.com/gpu")
    pg, pods = job("job")
    pods = [msgspec.structs.replace(p, scalars={"example.com/gpu": 1.0}) for p in pods]
    result = run(snapshot(NODES, [(pg, pods)], Dra(classes=(backed,), slices=SLICES)))
    (allocation,) = placements(result)["job-0"][1]
    assert allocation.claim == "job-0-extended-resources"
    assert [r.device_class for r in allocation.extended] == ["gpu.nvidia.com"]
    assert len(allocation.devices) == 1


# --- properties ----------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_node=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    wants=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    gang_size=st.integers(1, 3),
)
def test_no_device_is_allocated_to_two_claims_and_a_gang_gets_all_or_none(
    per_node: list[int], wants: list[int], gang_size: int
) -> None:
    nodes = [node(f"node-{i}") for i in range(len(per_node))]
    slices = tuple(
        gpu_slice(n.name, *(gpu(j) for j in range(k))) for n, k in zip(nodes, per_node, strict=True) if k
    )
    claims = [claim(f"c{i}", request(count=n)) for i, n in enumerate(wants)]
    claims += [claim(f"g{i}") for i in range(gang_size)]
    jobs = [job(f"solo{i}", f"c{i}") for i in range(len(wants))]
    pg, pods = gang("gang", "team", gang_size, 0.0, created=NOW)
    pods = [
        msgspec.structs.replace(p, namespace="ns", resource_claims=(PodClaim(name="g", claim=f"g{i}"),))
        for i, p in enumerate(pods)
    ]
    jobs.append((msgspec.structs.replace(pg, namespace="ns"), pods))
    result = run(snapshot(nodes, jobs, Dra(classes=(GPU_CLASS,), slices=slices, claims=tuple(claims))))
    devices = devices_of(result)
    assert len(devices) == len(set(devices))
    gang_bound = [b for p in result.binds for b in p.bindings if b.podgroup.endswith("gang")]
    assert len(gang_bound) in (0, gang_size)
    assert all(len(b.claims) == 1 and b.claims[0].devices for b in gang_bound)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_any_selector_text_is_compiled_or_refused_never_a_crash(text: str) -> None:
    refusal = _refusal(text)
    assert refusal is None or refusal.startswith(("compilation failed", "must not be empty"))


def _refusal(text: str) -> str | None:
    try:
        dra_cel.check(text)
    except dra_cel.CelError as exc:
        return str(exc)
    return None


def test_claims_are_the_dynamicresources_plugins_and_go_unchecked_where_a_shard_disables_it() -> None:
    """KAI checks claims in its ``dynamicresources`` plugin, so a SchedulingShard that turns the plugin off
    turns the check off: a claim no node can meet then keeps nobody pending, and binds carry no allocation."""
    from shared.core.builtin_plugins import DEFAULT_REGISTRY
    from shared.core.policy import PluginConfig

    nowhere = request(selectors=(f'device.attributes["{DRIVER}"].productName == "B200"',))
    dra = Dra(classes=(GPU_CLASS,), slices=SLICES, claims=(claim("c", nowhere),))
    snap = snapshot(NODES, [job("job", "c")], dra)
    assert not run(snap).binds
    without = Policy(
        actions=("allocate",),
        plugins=tuple(
            PluginConfig(name=n) for n in DEFAULT_REGISTRY if n not in ("dynamicresources", "numa")
        ),
    )
    bound = schedule(snap, NOW, without)
    assert [b.claims for p in bound.binds for b in p.bindings] == [()]


@pytest.mark.parametrize("text", ["1e999999999", "9" * 5000, "NaN", "٣Gi", "-1e3000"])
def test_a_hostile_quantity_in_a_selector_is_no_match_and_never_a_hang(text: str) -> None:
    """`quantity()` reads through the project's one bounded quantity parser: a hostile amount never matches
    a device, and a text no quantity can be is a CEL runtime error (the claim is not allocated, with the
    error), at once."""
    expression = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{text}")) >= 0'
    assert _refusal(expression) is None  # it compiles: the text is only read when evaluated
    problem, matched = "", False
    try:
        matched = dra_cel.matches(expression, dra_cel.activation(DRIVER, gpu(0)))
    except dra_cel.CelError as exc:
        problem = str(exc)
    assert not matched
    assert not problem or "runtime error" in problem
