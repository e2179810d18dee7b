"""The pod-grouper's decision for JobSets, as KAI's jobset plugin decides."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidObject
from shared.kube import wire
from tests.grouping import group, make_owner, make_pod, owned_by, spec_of


# --- JobSet ----------------------------------------------------------------------------------------------
def jobset(order: str | None = None) -> wire.Owner:
    spec: dict[str, Any] = {
        "replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4, "completions": 3}}},
        ]
    }
    if order is not None:
        spec["startupPolicy"] = {"startupPolicyOrder": order}
    return make_owner("jobset.x-k8s.io/v1alpha2", "JobSet", "js", spec=spec)


def jobset_pod(owner: wire.Owner, replicated_job: str) -> tuple[wire.Pod, wire.Owner]:
    """A pod of the JobSet's replicated job, and the Job between them."""
    j = make_owner("batch/v1", "Job", f"js-{replicated_job}-0", owner=owned_by(owner))
    labels = {"jobset.sigs.k8s.io/replicatedjob-name": replicated_job, "jobset.sigs.k8s.io/jobset-name": "js"}
    return make_pod(owned_by(j), labels=labels), j


def test_a_jobset_in_order_is_one_podgroup_per_replicated_job() -> None:
    owner = jobset()
    pod, j = jobset_pod(owner, "workers")
    g = group(pod, j, owner)
    assert (g.name, g.grouper) == ("pg-js-uid-js-workers", "jobset")
    assert spec_of(g)["minMember"] == 2 * 3


def test_a_jobset_started_in_any_order_is_one_podgroup() -> None:
    owner = jobset("AnyOrder")
    pod, j = jobset_pod(owner, "driver")
    g = group(pod, j, owner)
    assert g.name == "pg-js-uid-js"
    assert spec_of(g)["minMember"] == 1 + 6


def test_a_jobset_pod_must_name_its_replicated_job() -> None:
    owner = jobset()
    j = make_owner("batch/v1", "Job", "js-driver-0", owner=owned_by(owner))
    with pytest.raises(InvalidObject) as info:
        group(make_pod(owned_by(j)), j, owner)
    assert info.value.field == "metadata.labels[jobset.sigs.k8s.io/replicatedjob-name]"
