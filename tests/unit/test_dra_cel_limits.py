"""Specs: a tenant's CEL selector cannot stop scheduling (`shared.core.dra_cel`; issue 30, deliverable 2).

Claims and claim templates are tenants' objects, and the core evaluates their selectors synchronously.
Kubernetes refuses an expression over 10 KiB and one whose estimated cost exceeds the limit, and stops an
evaluation at a runtime cost limit; Kairos does the three in its own units (steps of cel-python's
interpreter). Every bound here is asserted on counted steps, never on time.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import dra as core_dra
from shared.core import dra_cel
from shared.core.dra_cel import COST_EXCEEDED, MAX_COST, MAX_LENGTH, TOO_COMPLEX
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.kube import dra as kd
from shared.model import Node, Pod
from shared.model.builders import gang
from shared.model.dra import (
    Attribute,
    Device,
    DeviceClass,
    DeviceRequest,
    Dra,
    PodClaim,
    ResourceClaim,
    ResourceSlice,
)
from tests import builders as tb

DRIVER = "gpu.nvidia.com"
GPU = Device(
    name="gpu-0",
    attributes={
        f"{DRIVER}/productName": Attribute(text="NVIDIA H100 80GB HBM3"),
        f"{DRIVER}/type": Attribute(text="gpu"),
        f"{DRIVER}/index": Attribute(number=0),
        f"{DRIVER}/driverVersion": Attribute(version="550.54.15"),
    },
    capacity={f"{DRIVER}/memory": 80 * 2**30 * 1000},
)
DEVICE = dra_cel.activation(DRIVER, GPU)
RUNAWAY = 3 * MAX_COST
"""Most steps a stopped evaluation may have counted: the limit, plus the size of the last value it built."""


def numbers(n: int) -> str:
    return "[" + ",".join(str(i) for i in range(n)) + "]"


def nested(macro: str, levels: int, size: int) -> str:
    body = " + ".join(f"v{i}" for i in range(levels)) + " >= 0"
    for i in reversed(range(levels)):
        body = f"{numbers(size)}.{macro}(v{i}, {body})"
    return body


def refusal(expression: str) -> str:
    """The problem translation records for a claim with this selector (empty: it translates)."""
    raw = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "g",
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }
    return kd.claim_of(msgspec.json.decode(msgspec.json.encode(raw), type=kd.WireClaim)).problem


FIELD = "ResourceClaim 'ns/c': spec.devices.requests[0].exactly.selectors[0].cel.expression: "
LONG_STRING = "x" * 3000


# --- hostile selectors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "refused"),
    [
        pytest.param(nested("all", 4, 10), TOO_COMPLEX, id="four nested all() over ten numbers"),
        pytest.param(nested("exists", 3, 100), TOO_COMPLEX, id="three nested exists() over a hundred"),
        pytest.param(
            nested("map", 3, 30).replace(">= 0", "") + ".size() > 0", TOO_COMPLEX, id="nested map()"
        ),
        pytest.param(
            "[" + ",".join(["1"] * 2000) + "].filter(x, x > 0).exists_one(y, y == 1)",
            TOO_COMPLEX,
            id="a huge list literal",
        ),
        pytest.param(
            f'{numbers(10)}.all(i, ("{LONG_STRING}" + "{LONG_STRING}").size() > 0)',
            TOO_COMPLEX,
            id="long strings built in a comprehension",
        ),
        pytest.param(
            f'{numbers(30)}.map(i, device.driver + device.driver).all(a, {numbers(30)}.all(b, a != ""))',
            TOO_COMPLEX,
            id="comprehensions over lists built from the device",
        ),
        pytest.param("(" * 400 + "true" + ")" * 400, "nested too deeply", id="deep nesting"),
        pytest.param("||".join(["false"] * 1200) + "||true", "nested too deeply", id="a long chain of ors"),
        pytest.param(
            f'device.driver == "{"x" * MAX_LENGTH}"',
            f"Too long: may not be more than {MAX_LENGTH} bytes",
            id="over 10 KiB",
        ),
        pytest.param(
            f'{numbers(40)}.reduce(r, i, "ab", r + r).size() > 0',
            "undeclared reference to 'reduce'",
            id="cel-python's reduce doubling a string",
        ),
    ],
)
def test_a_hostile_selector_is_refused_naming_the_field_and_stopped_if_it_ever_runs(
    expression: str, refused: str
) -> None:
    assert refusal(expression).startswith(FIELD)
    assert refused in refusal(expression)
    failure = ""
    try:
        dra_cel.matches(expression, DEVICE)
    except dra_cel.CelError as exc:
        failure = str(exc)
    assert failure == "" or failure.startswith("CEL runtime error: ")
    steps = dra_cel.evaluation_cost(expression, DEVICE)
    assert steps <= RUNAWAY


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param(nested("all", 4, 10), id="nested all()"),
        pytest.param(nested("exists", 5, 20), id="five nested exists()"),
        pytest.param(f"{numbers(3000)}.all(x, x >= 0)", id="a huge list literal"),
        pytest.param(
            f'{numbers(40)}.reduce(r, i, "ab", r + r).size() > 0', id="a string doubled forty times"
        ),
        pytest.param(
            f'{numbers(100)}.all(i, ("{LONG_STRING}" + "{LONG_STRING}").size() > 0)', id="long strings"
        ),
    ],
)
def test_an_evaluation_that_slips_past_the_estimate_stops_at_the_cost_limit_with_cel_gos_words(
    expression: str,
) -> None:
    with pytest.raises(dra_cel.CelError, match=f"^CEL runtime error: {COST_EXCEEDED}$"):
        dra_cel.matches(expression, DEVICE)
    assert MAX_COST < dra_cel.evaluation_cost(expression, DEVICE) <= RUNAWAY


def test_percent_is_arithmetic_only_so_a_format_string_cannot_build_a_gigabyte() -> None:
    with pytest.raises(dra_cel.CelError, match="CEL runtime error: found no matching overload"):
        dra_cel.matches('size("%999999999d" % 1) > 0', DEVICE)
    assert dra_cel.matches("-7 % 3 == -1 && 7u % 3u == 1u", DEVICE)


@st.composite
def comprehensions(draw: st.DrawFn) -> str:
    levels = draw(st.integers(1, 4))
    body = draw(
        st.sampled_from(["true", "v0 >= 0", "v0 + v0 > 1", 'string(v0) + "x" != ""', "v0 in [1, 2, 3]"])
    )
    for i in reversed(range(levels)):
        macro = draw(st.sampled_from(["all", "exists", "exists_one", "map", "filter"]))
        size = draw(st.integers(0, 40))
        inner = body.replace("v0", f"v{i}") if i else body
        if macro in ("map", "filter"):
            body = f"{numbers(size)}.{macro}(v{i}, {inner}).size() >= 0"
        else:
            body = f"{numbers(size)}.{macro}(v{i}, {inner})"
    return body


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comprehensions())
def test_a_nested_comprehension_is_refused_at_check_or_its_evaluation_finishes_under_the_bound(
    expression: str,
) -> None:
    refused = ""
    try:
        dra_cel.check(expression)
    except dra_cel.CelError as exc:
        refused = str(exc)
    if refused:
        assert TOO_COMPLEX in refused
        return
    assert dra_cel.estimated_cost(expression) <= MAX_COST
    assert dra_cel.evaluation_cost(expression, DEVICE) <= MAX_COST


# --- real selectors -------------------------------------------------------------------------------------------
REAL = [
    # NVIDIA's k8s-dra-driver-gpu DeviceClasses (gpu, mig, ComputeDomain daemon and channel).
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'daemon'",
    (
        "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel'"
        " && device.attributes['compute-domain.nvidia.com'].id == 0"
    ),
    # kubesim's DeviceClasses for examples/kai/dra (gpu-imex-pod) and the specs' claims.
    'device.driver == "gpu.nvidia.com"',
    'device.driver == "compute-domain.nvidia.com"',
    'device.attributes["gpu.nvidia.com"].productName == "H100"',
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("60Gi")) >= 0',
    # Kubernetes' documentation and KEP examples.
    "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))",
    "device.attributes['gpu.nvidia.com'].productName.matches('H100|H200')",
    "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('535.0.0'))",
    (
        "'gpu.nvidia.com' in device.attributes && has(device.attributes['gpu.nvidia.com'].index)"
        " && device.attributes['gpu.nvidia.com'].index < 4"
    ),
    "device.attributes['gpu.nvidia.com'].exists(name, name.startsWith('product'))",
    "['H100', 'H200', 'B200'].exists(p, device.attributes['gpu.nvidia.com'].productName.contains(p))",
]


@pytest.mark.parametrize("expression", REAL)
def test_the_selectors_drivers_publish_still_compile_and_evaluate_well_under_the_bound(
    expression: str,
) -> None:
    dra_cel.check(expression)
    assert refusal(expression) == ""
    assert dra_cel.estimated_cost(expression) <= MAX_COST // 4
    assert dra_cel.evaluation_cost(expression, DEVICE) <= MAX_COST // 4


# --- the cycle ---------------------------------------------------------------------------------------------
def test_a_claim_whose_selector_runs_away_holds_only_its_pod_and_a_pod_in_another_namespace_is_placed() -> (
    None
):
    """The claim reaches the core without translation's check (a selector that slips past the estimate):
    its evaluation is stopped at the cost limit, its pod waits with the runtime error, and the other
    namespace's pod is placed in the same cycle."""
    gpu_class = DeviceClass(name=DRIVER, selectors=(f'device.driver == "{DRIVER}"',))
    runaway = ResourceClaim(
        name="c",
        namespace="tenant-a",
        uid="uid-c",
        queue="team",
        requests=(DeviceRequest(name="gpu", device_class=DRIVER, selectors=(nested("all", 5, 10),)),),
    )
    nodes = [
        Node(name=n, cpu_millis=8000, memory_bytes=64 * 2**30, labels={"kubernetes.io/hostname": n})
        for n in ("node-1", "node-2")
    ]
    slices = tuple(
        ResourceSlice(name=f"{n}-gpu", driver=DRIVER, pool=n, node=n, devices=(GPU,))
        for n in ("node-1", "node-2")
    )

    def job(name: str, namespace: str, claims: tuple[PodClaim, ...]) -> tuple[Any, list[Pod]]:
        pg, pods = gang(name, "team", 1, 0.0, created=1.0)
        pods = [msgspec.structs.replace(p, namespace=namespace, resource_claims=claims) for p in pods]
        return msgspec.structs.replace(pg, namespace=namespace), pods

    snap = tb.snapshot(
        nodes,
        job("hostile", "tenant-a", (PodClaim(name="gpu", claim="c"),)),
        job("plain", "tenant-b", ()),
        queues=[tb.queue("team", parent=None)],
        dra=Dra(classes=(gpu_class,), slices=slices, claims=(runaway,)),
    )
    result = schedule(snap, 10.0, Policy(actions=("allocate",)))
    assert [b.name for p in result.binds for b in p.bindings] == ["plain-0"]
    status = result.podgroups["hostile"]
    assert status.pending
    assert f"CEL runtime error: {COST_EXCEEDED}" in (status.fit_error or "")


def test_selectors_kept_under_the_per_evaluation_bound_cost_a_namespace_a_bounded_total_per_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A selector that costs most of `MAX_COST` on every device and matches none would be evaluated on
    every device of the cluster: past its namespace's budget for the cycle, the rest of its evaluations
    fail with the cost error without running, its pod waits, and another namespace's claim with a plain
    selector is allocated in the same cycle."""
    expensive = f"{numbers(300)}.exists(i, i < 0)"
    per_evaluation = dra_cel.evaluation_cost(expensive, DEVICE)
    assert MAX_COST // 2 < per_evaluation <= MAX_COST
    gpu_class = DeviceClass(name=DRIVER, selectors=(f'device.driver == "{DRIVER}"',))

    def claim(name: str, namespace: str, selector: str) -> ResourceClaim:
        request = DeviceRequest(name="gpu", device_class=DRIVER, selectors=(selector,))
        return ResourceClaim(
            name=name, namespace=namespace, uid=f"uid-{name}", queue="team", requests=(request,)
        )

    names = [f"node-{i:03d}" for i in range(60)]
    nodes = [
        Node(name=n, cpu_millis=8000, memory_bytes=64 * 2**30, labels={"kubernetes.io/hostname": n})
        for n in names
    ]
    devices = tuple(msgspec.structs.replace(GPU, name=f"gpu-{i}") for i in range(8))
    slices = tuple(
        ResourceSlice(name=f"{n}-gpu", driver=DRIVER, pool=n, node=n, devices=devices) for n in names
    )

    def job(name: str, namespace: str, claim_name: str) -> tuple[Any, list[Pod]]:
        pg, pods = gang(name, "team", 1, 0.0, created=1.0)
        pods = [
            msgspec.structs.replace(
                p, namespace=namespace, resource_claims=(PodClaim(name="gpu", claim=claim_name),)
            )
            for p in pods
        ]
        return msgspec.structs.replace(pg, namespace=namespace), pods

    snap = tb.snapshot(
        nodes,
        job("costly", "tenant-a", "a"),
        job("plain", "tenant-b", "b"),
        queues=[tb.queue("team", parent=None)],
        dra=Dra(
            classes=(gpu_class,),
            slices=slices,
            claims=(claim("a", "tenant-a", expensive), claim("b", "tenant-b", 'device.driver != ""')),
        ),
    )
    spent = {"steps": 0}
    counted = dra_cel.counted_match

    def spy(expression: str, device: Any) -> tuple[bool | dra_cel.CelError, int]:
        verdict, steps = counted(expression, device)
        if expression == expensive:
            spent["steps"] += steps
        return verdict, steps

    monkeypatch.setattr(dra_cel, "counted_match", spy)
    result = schedule(snap, 10.0, Policy(actions=("allocate",)))

    assert [b.name for p in result.binds for b in p.bindings] == ["plain-0"]
    status = result.podgroups["costly"]
    assert status.pending
    assert core_dra.OVER_BUDGET in (status.fit_error or "")
    every_device = len(names) * len(devices) * per_evaluation
    budget = core_dra.TENANT_FREE_STEPS + core_dra.TENANT_STEPS_PER_EVALUATION * len(names) * len(devices)
    assert spent["steps"] <= budget + per_evaluation < every_device
