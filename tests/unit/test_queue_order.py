"""KAI's queue order (which queue's job an action takes next), as specifications."""

from __future__ import annotations

import functools

from shared.core.proportion import QueueState, compare_views, queue_view

TOTAL = [10.0, 10000.0, 1e10]
UNLIMITED = -1.0


def _queue(
    name: str,
    *,
    fair: list[float],
    allocated: list[float],
    deserved: list[float] | None = None,
    priority: int = 100,
    age: int = 0,
) -> QueueState:
    q = QueueState(
        name=name,
        parent=None,
        priority=priority,
        creation_index=age,
        deserved=deserved or [0.0, 0.0, 0.0],
        limit=[UNLIMITED] * 3,
        weight=[1.0] * 3,
        fair_share=fair,
        allocated=allocated,
    )
    q.freeze_shares()
    return q


def order(left: QueueState, right: QueueState, job: list[float] | None = None) -> int:
    return compare_views(queue_view(left, job, None, TOTAL), queue_view(right, job, None, TOTAL))


def test_under_utilised_before_over_utilised_whatever_the_priority() -> None:
    over = _queue("over", fair=[1, 1, 1], allocated=[2, 2, 2], priority=999)
    under = _queue("under", fair=[4, 4, 4], allocated=[1, 1, 1])
    assert order(under, over) == -1
    assert order(over, under) == 1


def test_within_deserved_quota_with_the_job_before_priority() -> None:
    starved = _queue("starved", fair=[4, 0, 0], allocated=[1, 0, 0], deserved=[2, 0, 0])
    rich = _queue("rich", fair=[4, 0, 0], allocated=[2, 0, 0], deserved=[2, 0, 0], priority=200)
    assert order(starved, rich, job=[1, 0, 0]) == -1


def test_priority_then_dominant_share_then_age() -> None:
    lo = _queue("lo", fair=[4, 4, 4], allocated=[1, 1, 1], priority=50)
    hi = _queue("hi", fair=[4, 4, 4], allocated=[1, 1, 1], priority=100)
    assert order(lo, hi) == 1
    light = _queue("light", fair=[4, 4, 4], allocated=[1, 0, 0], age=5)
    heavy = _queue("heavy", fair=[4, 4, 4], allocated=[3, 0, 0], age=1)
    assert order(light, heavy) == -1
    twin_old = _queue("b", fair=[4, 4, 4], allocated=[1, 0, 0], age=1)
    twin_new = _queue("a", fair=[4, 4, 4], allocated=[1, 0, 0], age=2)
    ordered = sorted([twin_new, heavy, twin_old, light], key=functools.cmp_to_key(order))
    assert [q.name for q in ordered] == ["b", "a", "light", "heavy"]


def test_a_queue_using_what_it_has_no_share_of_goes_last() -> None:
    squatter = _queue("squatter", fair=[0, 4, 4], allocated=[1, 0, 0])
    fair = _queue("fair", fair=[4, 4, 4], allocated=[3, 3, 3], age=9)
    assert order(squatter, fair) == 1
