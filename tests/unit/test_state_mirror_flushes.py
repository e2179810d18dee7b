"""The mirror's two flushes agree: whatever sequence of watch events arrives, the mirror that flushed only what
each one changed holds what a mirror that listed the final objects and flushed everything holds.

This is the property a full flush that goes through the incremental path has to keep (issue 32): the
incremental flush (`Mirror._changed`) and the full one (`Mirror.desired`) are two computations of one diff.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from services.state.mirror.cache import NAMESPACES, NODES, PODGROUPS, PODS, PRIORITY_CLASSES, QUEUES, Mirror
from tests.unit.test_state_mirror import NOW, namespace, node, pod, podgroup, queue

POD_NAMES = ("p0", "p1", "p2")
GROUP_NAMES = ("g1", "g2")


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
        st.one_of(st.none(), st.sampled_from(("research", "ghost"))),
    ),
    st.tuples(st.just(NODES), st.sampled_from(("n1", "n2")), st.one_of(st.none(), st.sampled_from((4, 8)))),
    st.tuples(st.just(NAMESPACES), st.just("team"), st.one_of(st.none(), st.sampled_from(("a", "b")))),
)


def raw(kind: str, name: str, variant: Any) -> bytes:
    if kind == PODS:
        return pod_variant(name, variant)
    if kind == PODGROUPS:
        return podgroup(name, variant)
    if kind == NODES:
        return node(name, gpus=variant)
    return namespace(name, {"tier": variant})


def listed(objects: dict[tuple[str, str], bytes]) -> Mirror:
    m = Mirror()
    m.relist(QUEUES, [queue("org"), queue("research", "org")])
    m.relist(PRIORITY_CLASSES, [])
    for kind in (NAMESPACES, NODES, PODGROUPS, PODS):
        m.relist(kind, [data for (each, _), data in sorted(objects.items()) if each == kind])
    return m


@given(st.lists(events, max_size=25))
def test_flushing_each_change_ends_where_one_full_flush_of_the_final_objects_does(
    sequence: list[tuple[str, str, Any]],
) -> None:
    objects: dict[tuple[str, str], bytes] = {}
    incremental = listed(objects)
    incremental.flush(NOW)
    for kind, name, variant in sequence:
        before = objects.get((kind, name))
        if variant is None:
            if before is None:
                continue
            del objects[(kind, name)]
            incremental.change(kind, "DELETED", before)
        else:
            objects[(kind, name)] = raw(kind, name, variant)
            incremental.change(kind, "ADDED" if before is None else "MODIFIED", objects[(kind, name)])
        incremental.flush(NOW)
    full = listed(objects)
    full.flush(NOW)
    assert incremental.current == full.current
    assert incremental.held == full.held
    assert incremental.problems == full.problems
