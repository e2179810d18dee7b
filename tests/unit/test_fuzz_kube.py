"""Fuzzing the CRD and pod translation, and the state service's mirror that runs it: random Queue,
PodGroup, Pod, Node, Topology and Namespace objects (the wire shape, with wrong values at any depth, KAI's annotations
and resource names with random text) decode and translate or raise `InvalidObject` naming the kind, the
object and the field; fed as watch events into `services.state.mirror.cache.Mirror`, they never make a flush or
the problem report raise, and whatever reaches KV refers only to objects KV holds.

Complements test_kube_wire.py (random bytes) and test_kube_translate.py (random annotation text on one
pod). Deterministic (derandomized) and sized to run in a few seconds.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import NAMESPACES, NODES, PODGROUPS, PODS, QUEUES, TOPOLOGIES
from shared.errors import InvalidObject
from shared.kube import keys, translate, wire
from shared.model import Pod, PodGroup, Queue
from tests.unit.test_fuzz_contracts import shaped

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NOW = 1_800_000_000.0
NAMES = ["a", "b", "c"]
ANNOTATIONS = [
    keys.GPU_FRACTION,
    keys.GPU_MEMORY,
    keys.GPU_FRACTION_NUM_DEVICES,
    keys.PODGROUP_ANNOTATION,
    keys.TASK_PRIORITY_LABEL,
    keys.LAST_START_ANNOTATION,
    keys.STALE_SINCE_ANNOTATION,
    keys.STALENESS_GRACE_PERIOD_ANNOTATION,
    keys.GPU_GROUPS_ANNOTATION,
    keys.TOPOLOGY_ANNOTATION,
    keys.TOPOLOGY_REQUIRED_ANNOTATION,
    keys.BATCH_MIN_MEMBER_ANNOTATION,
    "nvidia.com/mig-1g.5gb",
]
RESOURCES = [keys.CPU, keys.MEMORY, keys.PODS, keys.NVIDIA_GPU, keys.AMD_GPU, "nvidia.com/mig-1g.5gb"]
TEXT = st.one_of(
    st.text(max_size=8),
    st.sampled_from(NAMES),
    st.from_regex(r"-?[0-9]{0,4}(\.[0-9]{0,3})?(m|Mi|Gi|k|e[0-9])?", fullmatch=True),
    st.sampled_from(["2026-01-01T00:00:00Z", "1h", "30s", "-1", "nan", "1e400"]),
)
QUANTITY = st.one_of(TEXT, st.integers(-5, 10**12), st.floats(allow_nan=True, allow_infinity=True))
KINDS: dict[str, type[Any]] = {
    QUEUES: wire.Queue,
    PODGROUPS: wire.PodGroup,
    PODS: wire.Pod,
    NODES: wire.Node,
    TOPOLOGIES: wire.Topology,
    NAMESPACES: wire.Namespace,
}


@st.composite
def kube_object(draw: st.DrawFn, kind: type[Any]) -> dict[str, Any]:
    """A random object of `kind` as an API server would send it, names and references from `NAMES`."""
    doc = draw(shaped(mi.type_info(kind)))
    if not isinstance(doc, dict):
        doc = {}
    doc["apiVersion"] = kind().api_version if hasattr(kind(), "api_version") else "v1"
    doc["kind"] = kind.KIND
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    meta["name"] = draw(st.sampled_from(NAMES))
    if kind in (wire.Pod, wire.PodGroup):
        meta["namespace"] = "ns"
    else:
        meta.pop("namespace", None)
    meta["annotations"] = draw(st.dictionaries(st.sampled_from(ANNOTATIONS), TEXT, max_size=4))
    doc["metadata"] = meta
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    if kind is wire.Queue:
        spec["parentQueue"] = draw(st.sampled_from(["", *NAMES]))
    elif kind is wire.PodGroup:
        spec["queue"] = draw(st.sampled_from(NAMES))
    elif kind is wire.Pod:
        spec["schedulerName"] = draw(st.sampled_from(["kai-scheduler", "kai-scheduler", "default-scheduler"]))
        meta["annotations"][keys.PODGROUP_ANNOTATION] = draw(st.sampled_from(NAMES))
        resources = st.dictionaries(st.sampled_from(RESOURCES), QUANTITY, max_size=3)
        spec["containers"] = [
            {"name": "main", "resources": {"requests": draw(resources), "limits": draw(resources)}}
        ]
    elif kind is wire.Node:
        doc["status"] = {
            "allocatable": draw(st.dictionaries(st.sampled_from(RESOURCES), QUANTITY, max_size=4))
        }
    doc["spec"] = spec
    return doc


def translate_one(kind: type[Any], obj: Any) -> object:
    if kind is wire.Queue:
        return translate.queue_of(obj, creation_index=0)
    if kind is wire.PodGroup:
        return translate.podgroup_of(obj, priority_classes={"high": 1000})
    if kind is wire.Pod:
        translate.pod_requests(obj)
        return translate.pod_of(obj, podgroup="ns/a")
    if kind is wire.Node:
        return translate.node_of(obj)
    if kind is wire.Namespace:
        return translate.namespace_of(obj)
    return translate.topology_of(obj)


@pytest.mark.parametrize("plural", sorted(KINDS))
@FUZZ
@given(data=st.data())
def test_any_object_translates_or_is_an_invalid_object_naming_it(plural: str, data: Any) -> None:
    kind = KINDS[plural]
    doc = data.draw(kube_object(kind))
    name = wire.object_name(doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
    error: InvalidObject | None = None
    try:
        translate_one(kind, wire.decode(kind, msgspec.json.encode(doc)))
    except InvalidObject as exc:
        error = exc
    if error is not None:
        assert (error.kind, error.name) == (kind.KIND, name)
        assert error.problem
        assert error.kind in str(error)


EVENTS = st.tuples(
    st.sampled_from(sorted(KINDS)),
    st.sampled_from(["ADDED", "MODIFIED", "MODIFIED", "DELETED"]),
    st.data(),
)


@settings(FUZZ, max_examples=25)
@given(steps=st.lists(EVENTS, min_size=1, max_size=10))
def test_the_mirror_never_fails_and_keeps_kv_consistent(steps: list[tuple[str, str, Any]]) -> None:
    m = Mirror()
    for plural, event, data in steps:
        doc = data.draw(kube_object(KINDS[plural]))
        m.change(plural, event, msgspec.json.encode(doc))
        m.flush(NOW)
        for label, problem in m.reportable().items():
            assert problem.label == label
            assert problem.message
    queues = {o.name for o in m.current.values() if isinstance(o, Queue)}
    groups = {o.key for o in m.current.values() if isinstance(o, PodGroup)}
    for obj in m.current.values():
        if isinstance(obj, Queue) and obj.parent is not None:
            assert obj.parent in queues
        if isinstance(obj, PodGroup):
            assert obj.queue in queues
        if isinstance(obj, Pod):
            assert obj.podgroup in groups
