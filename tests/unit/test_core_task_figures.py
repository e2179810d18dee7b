"""Spec: what a session's task reads of its pod's GPU request once, when it is built (`TaskState`), is what
the request itself says (`GpuRequest`): its kind, its whole GPUs and KAI's ``GPUs()``, for any request; and a
job's gang question written out for speed (`SetState.gang_satisfied`) answers as the general rule does."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from shared.core.tasks import JobState, SetState, TaskState, _tree
from shared.model import GpuRequest, PodSet, PodStatus, SubGroupSet
from tests.builders import pod, podgroup

requests = st.builds(
    GpuRequest,
    devices=st.integers(0, 8),
    fraction=st.sampled_from([0.0, 0.1, 0.25, 0.333, 0.5, 0.999, 1.0]),
    memory_mib=st.sampled_from([0, 1, 5_000, 40_000]),
    mig=st.sampled_from([{}, {"nvidia.com/mig-1g.10gb": 1}, {"nvidia.com/mig-3g.40gb": 2}]),
)


@given(requests)
def test_a_task_reads_the_kind_and_the_gpus_of_its_pod_s_request(gpu: GpuRequest) -> None:
    task = TaskState(pod(gpu=gpu), JobState(podgroup()))
    kind = (
        "mig" if gpu.is_mig else "fraction" if gpu.is_fraction else "memory" if gpu.is_memory else "regular"
    )
    assert task.kind == kind
    assert task.requested_gpus == gpu.gpus
    assert type(task.requested_gpus) is float
    assert task.whole_gpus == (float(gpu.devices) if gpu.is_whole else 0.0)
    assert task.is_shared == gpu.is_shared


@st.composite
def trees(draw: st.DrawFn, depth: int = 0) -> SubGroupSet:
    name = f"s{depth}-{draw(st.integers(0, 10**6))}"
    pod_sets = tuple(
        PodSet(name=f"{name}-ps{i}", min_available=draw(st.integers(0, 3)))
        for i in range(draw(st.integers(0, 2)))
    )
    children = tuple(draw(trees(depth + 1)) for _ in range(draw(st.integers(0, 2 if depth < 2 else 0))))
    return SubGroupSet(
        name=name, pod_sets=pod_sets, children=children, min_sub_group=draw(st.none() | st.integers(0, 3))
    )


@given(trees(), st.data())
def test_a_gang_is_satisfied_when_enough_members_at_every_level_run_their_pods(
    root: SubGroupSet, data: st.DataObject
) -> None:
    job = JobState(msgspec.structs.replace(podgroup(), root=root))
    for ps in root.all_pod_sets():
        for i in range(data.draw(st.integers(0, 4))):
            status = data.draw(st.sampled_from(list(PodStatus)))
            job.add_task(TaskState(pod(f"{ps.name}-{i}", sub_group=ps.name, status=status), job))
    assert job.tree.gang_satisfied() == job.tree.satisfied_with(lambda ps: ps.active_used)


def _shape(group: SetState) -> tuple[object, ...]:
    return (
        group.name,
        group.min_sub_group,
        tuple(_shape(child) for child in group.children),
        tuple(id(ps) for ps in group.pod_sets),
    )


flat_roots = st.builds(
    lambda names, minimum: SubGroupSet(
        name="root", pod_sets=tuple(PodSet(name=n, min_available=1) for n in names), min_sub_group=minimum
    ),
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=4),
    st.none() | st.integers(0, 3),
)


@given(trees() | flat_roots)
def test_a_job_s_sub_group_tree_holds_its_pod_sets_as_the_podgroup_orders_them(root: SubGroupSet) -> None:
    if not root.all_pod_sets():
        return  # a podgroup without pod sets gets the default one
    job = JobState(msgspec.structs.replace(podgroup(), root=root))
    assert _shape(job.tree) == _shape(_tree(root, job.pod_sets))
