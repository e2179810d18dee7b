"""The mirror's flushes agree: whatever sequence of watch events arrives, the mirror that flushed only what
each one changed holds what a mirror that listed the final objects and flushed everything holds.

One path computes both (`Mirror._recompute`); a full flush marks every object dirty and recomputes the
queues and topologies too. The sequences change queues and relist pods (each a full flush in the middle of
incremental ones), and a mirror that starts from what KV held before (`adopt`) ends with exactly what a
fresh one writes: KV loses what nothing produces any more.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from services.state.mirror.cache import Mirror
from services.state.mirror.raw_objects import NAMESPACES, NODES, PODGROUPS, PODS, PRIORITY_CLASSES, QUEUES
from shared.contracts import subjects as s
from shared.kube import keys
from shared.model import PodGroup
from tests.unit.test_state_mirror import NOW, namespace, node, pod, podgroup, queue

POD_NAMES = ("p0", "p1", "p2")
RELIST = "relist"
"""An event that lists the pods afresh (the objects as they are): a full flush."""
GROUP_NAMES = ("g1", "g2")
GROUP_STATUSES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "running": {"phase": "Running", "running": 1, "resourcesStatus": {"allocated": {"cpu": "1"}}},
    "tried": {
        "phase": "Pending",
        "schedulingConditions": [
            {"type": "UnschedulableOnNodePool", "nodePool": "default", "status": "True", "transitionID": "1"}
        ],
    },
}
"""The write-back's status patches (a podgroup's status alone changing, which the mirror reuses the
translation for), one of which backs off a podgroup that asks for KAI's scheduling backoff."""


def pod_variant(name: str, variant: tuple[Any, ...]) -> bytes:
    group, gpus, node_name, phase, ours = variant
    return pod(
        name,
        group,
        gpus=gpus,
        node_name=node_name if phase != "Pending" or node_name else "",
        phase=phase,
        scheduler="kai-scheduler" if ours else "other",
    )


pod_variants = st.tuples(
    st.sampled_from(("g1", "g2", None)),
    st.integers(min_value=1, max_value=2),
    st.sampled_from(("", "n1", "n2")),
    st.sampled_from(("Pending", "Running", "Succeeded")),
    st.booleans(),
)
events = st.one_of(
    st.tuples(st.just(PODS), st.sampled_from(POD_NAMES), st.one_of(st.none(), pod_variants)),
    st.tuples(
        st.just(PODGROUPS),
        st.sampled_from(GROUP_NAMES),
        st.one_of(
            st.none(),
            st.tuples(
                st.sampled_from(("research", "ghost")),
                st.sampled_from(tuple(GROUP_STATUSES)),
                st.sampled_from((None, 1)),
            ),
        ),
    ),
    st.tuples(
        st.just(NODES),
        st.sampled_from(("n1", "n2")),
        st.one_of(st.none(), st.tuples(st.sampled_from((4, 8)), st.sampled_from((None, "40960", "81920")))),
    ),
    st.tuples(st.just(NAMESPACES), st.just("team"), st.one_of(st.none(), st.sampled_from(("a", "b")))),
    st.tuples(st.just(QUEUES), st.just("research"), st.one_of(st.none(), st.sampled_from(("org", "ghost")))),
    st.tuples(st.just(RELIST), st.just(PODS), st.none()),
)


def raw(kind: str, name: str, variant: Any) -> bytes:
    if kind == PODS:
        return pod_variant(name, variant)
    if kind == PODGROUPS:
        queue_name, status, backoff = variant
        return podgroup(name, queue_name, status=GROUP_STATUSES[status], backoff=backoff)
    if kind == NODES:
        gpus, memory = variant
        doc = json.loads(node(name, gpus=gpus))
        if memory is not None:
            doc["metadata"]["labels"] = {keys.GPU_MEMORY_LABEL: memory}
        return json.dumps(doc).encode()
    if kind == QUEUES:
        return queue(name, variant)
    return namespace(name, {"tier": variant})


def initial() -> dict[tuple[str, str], bytes]:
    return {(QUEUES, "org"): queue("org"), (QUEUES, "research"): queue("research", "org")}


def listed(objects: dict[tuple[str, str], bytes]) -> Mirror:
    m = Mirror()
    m.relist(PRIORITY_CLASSES, [])
    for kind in (QUEUES, NAMESPACES, NODES, PODGROUPS, PODS):
        m.relist(kind, of_kind(objects, kind))
    return m


def of_kind(objects: dict[tuple[str, str], bytes], kind: str) -> list[bytes]:
    return [data for (each, _), data in sorted(objects.items()) if each == kind]


def play(mirror: Mirror, objects: dict[tuple[str, str], bytes], sequence: list[tuple[str, str, Any]]) -> None:
    """Feed `sequence` to `mirror`, flushing after each event; `objects` ends holding the final objects."""
    for kind, name, variant in sequence:
        if kind == RELIST:
            mirror.relist(name, of_kind(objects, name))
            mirror.flush(NOW)
            continue
        before = objects.get((kind, name))
        if variant is None:
            if before is None:
                continue
            del objects[(kind, name)]
            mirror.change(kind, "DELETED", before)
        else:
            objects[(kind, name)] = raw(kind, name, variant)
            mirror.change(kind, "ADDED" if before is None else "MODIFIED", objects[(kind, name)])
        mirror.flush(NOW)


def assert_same(mirror: Mirror, full: Mirror) -> None:
    assert mirror.current == full.current
    assert mirror.held == full.held
    assert mirror.problems == full.problems
    assert mirror.reportable() == full.reportable()


@given(st.lists(events, max_size=25))
def test_flushing_each_change_ends_where_one_full_flush_of_the_final_objects_does(
    sequence: list[tuple[str, str, Any]],
) -> None:
    objects = initial()
    incremental = listed(objects)
    incremental.flush(NOW)
    play(incremental, objects, sequence)
    full = listed(objects)
    full.flush(NOW)
    assert_same(incremental, full)


def counted_from(mirror: Mirror, name: str) -> tuple[object, ...]:
    """What the write-back counts a podgroup's ``resourcesStatus`` from: its PodGroup and its pods (the
    objects: the mirror replaces one that changes), the GPU memory label of their nodes and whether its
    translation is preemptible."""
    namespace, group = name.split("/", 1)
    pods = mirror.members(namespace, group)
    nodes = [mirror.raw.nodes.get(each.spec.node_name or "") for each in pods]
    model = mirror.current.get(s.podgroup_key(namespace, group))
    return (
        mirror.raw.podgroups.get(name),
        *pods,
        *(None if each is None else each.metadata.labels.get(keys.GPU_MEMORY_LABEL) for each in nodes),
        model.preemptible if isinstance(model, PodGroup) else None,
    )


def same_objects(left: tuple[object, ...], right: tuple[object, ...]) -> bool:
    return len(left) == len(right) and all(a is b or a == b for a, b in zip(left, right, strict=True))


@given(st.lists(st.tuples(events, st.booleans()), max_size=25))
@example(
    [  # a pod of a podgroup not there yet, bound to a node added after it; then the podgroup comes
        ((PODS, "p0", ("g1", 1, "n1", "Pending", False)), False),
        ((NODES, "n1", (4, "40960")), False),
        ((PODGROUPS, "g1", ("research", "none", None)), True),
    ]
)
@example(
    [  # a pod of g1 running on n1, whose GPU memory label (what a fractional pod holds) then changes
        ((PODGROUPS, "g1", ("research", "none", None)), False),
        ((NODES, "n1", (4, None)), False),
        ((PODS, "p0", ("g1", 1, "n1", "Running", True)), True),
        ((NODES, "n1", (4, "40960")), False),
    ]
)
def test_a_podgroup_the_mirror_does_not_name_as_touched_counts_from_what_it_counted_from_before(
    sequence: list[tuple[tuple[str, str, Any], bool]],
) -> None:
    objects = initial()
    mirror = listed(objects)
    mirror.flush(NOW)
    assert mirror.take_resources_touched() == set(mirror.raw.podgroups), "the first sweep counts every one"
    names = [f"team/{group}" for group in GROUP_NAMES]
    counted = {name: counted_from(mirror, name) for name in names}
    for event, flushed in sequence:
        kind, name, variant = event
        if kind == RELIST:
            mirror.relist(name, of_kind(objects, name))
        else:
            before = objects.get((kind, name))
            if variant is not None:
                objects[(kind, name)] = raw(kind, name, variant)
                mirror.change(kind, "ADDED" if before is None else "MODIFIED", objects[(kind, name)])
            elif before is not None:
                del objects[(kind, name)]
                mirror.change(kind, "DELETED", before)
        if flushed:
            mirror.flush(NOW)
        touched = mirror.take_resources_touched()
        for group in names:
            now = counted_from(mirror, group)
            # A podgroup the cluster does not have is not counted (its pods may name it before it comes);
            # when it comes, its PodGroup's arrival touches it.
            held = group in mirror.raw.podgroups
            assert not held or group in touched or same_objects(now, counted[group]), (
                f"{group} changed after {event} and was not named"
            )
            counted[group] = now


@given(st.lists(events, max_size=15), st.lists(events, max_size=15))
def test_a_mirror_that_adopts_what_kv_held_writes_what_a_fresh_one_does_and_removes_the_rest(
    before: list[tuple[str, str, Any]], after: list[tuple[str, str, Any]]
) -> None:
    earlier = initial()
    previous = listed(earlier)
    previous.flush(NOW)
    play(previous, earlier, before)
    objects = initial()
    play(listed(objects), objects, after)
    restarted = listed(objects)
    restarted.adopt(previous.current)
    changes = restarted.flush(NOW)
    full = listed(objects)
    full.flush(NOW)
    assert_same(restarted, full)
    assert {c.key for c in changes} == {
        key
        for key in previous.current.keys() | full.current.keys()
        if previous.current.get(key) != full.current.get(key)
    }


def test_a_podgroup_status_patch_keeps_its_translation_and_writes_nothing() -> None:
    """The write-back patches a PodGroup's status about once per bound pod: the mirror keeps the
    translation it has (the very object) instead of translating the podgroup and its pods again."""
    objects = initial()
    objects[(PODGROUPS, "g1")] = podgroup("g1", "research")
    objects[(PODS, "p0")] = pod_variant("p0", ("g1", 1, "n1", "Running", True))
    mirror = listed(objects)
    mirror.flush(NOW)
    kept = mirror.translations.last("podgroup team/g1")
    assert kept is not None
    mirror.change(PODGROUPS, "MODIFIED", podgroup("g1", "research", status=GROUP_STATUSES["running"]))
    assert mirror.flush(NOW) == []
    now = mirror.translations.last("podgroup team/g1")
    assert now is not None
    assert now[1] is kept[1]
    assert now[0] is not kept[0]  # the new version is what it now stands for


def test_a_podgroup_backed_off_by_a_status_patch_is_written_backed_off() -> None:
    objects = initial()
    objects[(PODGROUPS, "g1")] = podgroup("g1", "research", backoff=1)
    mirror = listed(objects)
    mirror.flush(NOW)
    mirror.change(
        PODGROUPS, "MODIFIED", podgroup("g1", "research", status=GROUP_STATUSES["tried"], backoff=1)
    )
    (change,) = mirror.flush(NOW)
    assert isinstance(change.after, PodGroup)
    assert change.after.backed_off
