"""A podgroup's phase as people read it (`kairos status`, `kairos simulate`), from its pods' statuses."""

from __future__ import annotations

import pytest

from shared.model.status import PodStatus, podgroup_phase

P = PodStatus


@pytest.mark.parametrize(
    ("statuses", "min_member", "phase"),
    [
        ([], 2, "Empty"),
        ([P.SUCCEEDED, P.SUCCEEDED], 2, "Succeeded"),
        ([P.RUNNING, P.FAILED], 1, "Failed"),
        ([P.RUNNING, P.BOUND], 2, "Running"),
        ([P.RUNNING, P.PENDING, P.PENDING], 1, "Running"),
        ([P.RUNNING, P.PENDING], 2, "Starting"),
        ([P.PIPELINED, P.PIPELINED], 2, "Pending"),
        ([P.PENDING, P.GATED], 0, "Pending"),
        ([P.RUNNING], 0, "Running"),
        ([P.SUCCEEDED, P.RUNNING], 2, "Starting"),
    ],
)
def test_the_phase_of_a_podgroup_is_read_from_its_pods(
    statuses: list[PodStatus], min_member: int, phase: str
) -> None:
    assert podgroup_phase(statuses, min_member) == phase
