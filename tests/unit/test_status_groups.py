"""The status groups the scheduling rules are written in (KAI's "active used", "active allocated",
"allocated", "alive"): which pod statuses each holds."""

from __future__ import annotations

import pytest

from shared.model.status import ACTIVE_ALLOCATED, ACTIVE_USED, ALIVE, ALLOCATED, PodStatus

P = PodStatus


# status: in active used, active allocated, allocated, alive
_TABLE = [
    (P.PENDING, False, False, False, True),
    (P.GATED, False, False, False, True),
    (P.ALLOCATED, True, True, True, True),
    (P.PIPELINED, True, True, False, True),
    (P.BINDING, True, True, True, True),
    (P.BOUND, True, True, True, True),
    (P.RUNNING, True, True, True, True),
    (P.RELEASING, True, False, False, True),
    (P.STUCK_IN_RELEASING, True, False, False, True),
    (P.SUCCEEDED, False, False, False, False),
    (P.FAILED, False, False, False, False),
    (P.UNKNOWN, False, False, False, False),
    (P.DELETED, False, False, False, False),
]


@pytest.mark.parametrize(("status", "active_used", "active_allocated", "allocated", "alive"), _TABLE)
def test_each_status_belongs_to_the_groups_kai_puts_it_in(
    status: PodStatus, active_used: bool, active_allocated: bool, allocated: bool, alive: bool
) -> None:
    assert (status in ACTIVE_USED, status in ACTIVE_ALLOCATED, status in ALLOCATED, status in ALIVE) == (
        active_used,
        active_allocated,
        allocated,
        alive,
    )


def test_every_status_is_in_the_table() -> None:
    assert [row[0] for row in _TABLE] == list(PodStatus)
