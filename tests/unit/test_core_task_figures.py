"""Spec: what a session's task reads of its pod's GPU request once, when it is built (`TaskState`), is what
the request itself says (`GpuRequest`): its kind, its whole GPUs and KAI's ``GPUs()``, for any request."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.core.tasks import JobState, TaskState
from shared.model import GpuRequest
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
