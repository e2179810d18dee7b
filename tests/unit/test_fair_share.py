"""Specification of `shared.core.fair_share`: KAI's hierarchical per-resource fair-share division.

Cases marked "KAI test" reproduce `resource_division_test.go` of KAI Scheduler
(pkg/scheduler/plugins/proportion/resource_division); "KAI docs" cases reproduce the examples of
docs/fairness/README.md and docs/scheduling-deep-dive/README.md. Every expected number is worked out in
the test's docstring or comments.
"""

from __future__ import annotations

import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.fair_share import (
    RESOURCES,
    UNLIMITED,
    QueueShare,
    QueueSpec,
    ResourceSpec,
    Vector3,
    allocatable_share,
    allocatable_shares,
    compare_quantities,
    compute_fair_shares,
    dominant_resource_share,
    fair_share_less_than_allocated,
    less_equal,
    requestable_share,
    saturation_ratio,
)

R = ResourceSpec


def gq(
    name: str,
    quota: float = 0.0,
    weight: float = 0.0,
    limit: float = UNLIMITED,
    *,
    parent: str | None = None,
    priority: int = 100,
    age: int = 0,
) -> QueueSpec:
    """A queue with only a GPU setting (CPU and memory: quota 0, weight 0, no limit)."""
    return QueueSpec(name, parent, priority=priority, creation_index=age, gpu=R(quota, weight, limit))


def gpu_shares(
    queues: list[QueueSpec],
    requests: dict[str, float],
    total: float,
    *,
    usage: dict[str, tuple[float, float, float]] | None = None,
    k_value: float = 1.0,
) -> dict[str, float]:
    """The GPU fair share of every queue, for GPU-only requests and a GPU-only cluster."""
    result = compute_fair_shares(
        queues,
        {name: (gpus, 0.0, 0.0) for name, gpus in requests.items()},
        (total, 0.0, 0.0),
        usage=usage,
        k_value=k_value,
    )
    return {name: share.fair_share[0] for name, share in result.items()}


# ---------------------------------------------------------------------------------------------------------
# Deserved (quota) phase
# ---------------------------------------------------------------------------------------------------------


def test_quota_only_each_queue_gets_min_of_quota_and_request() -> None:
    """No over-quota weights: a queue gets min(quota, request) and the rest of the cluster stays unassigned."""
    queues = [gq("a", quota=3), gq("b", quota=2, age=1), gq("c", quota=4, age=2)]
    assert gpu_shares(queues, {"a": 5, "b": 1, "c": 4}, 20) == {"a": 3.0, "b": 1.0, "c": 4.0}


def test_quota_is_granted_in_full_even_beyond_the_total() -> None:
    """KAI test "all queues get their deserved fairShare - over subscription" (CPU, millicores).

    Three queues deserve 5000 each and request 5000; the cluster has 10000. KAI does not scale quotas
    down: each gets 5000 (15000 in all) and nothing is left for over-quota.
    """
    queues = [QueueSpec(n, None, creation_index=i, cpu=R(5000, 5000)) for i, n in enumerate("123")]
    result = compute_fair_shares(queues, dict.fromkeys("123", (0, 5000, 0)), (0, 10000, 0))
    assert [result[n].fair_share[1] for n in "123"] == [5000.0, 5000.0, 5000.0]


def test_quota_over_subscription_single_queue() -> None:
    """KAI test "gives up to deserved when over subscribed": deserved 3, request 2, total 1 -> 2."""
    assert gpu_shares([gq("1", quota=3)], {"1": 2}, 1) == {"1": 2.0}


def test_zero_quota_gets_nothing_without_weight() -> None:
    """KAI test "doesn't give if deserved is zero": deserved 0, weight 0, request 2, total 2 -> 0."""
    assert gpu_shares([gq("1", quota=0)], {"1": 2}, 2) == {"1": 0.0}


def test_fractional_quota_and_request() -> None:
    """KAI tests "gives with fraction, if stated in deserved / in request"."""
    assert gpu_shares([gq("1", quota=1.5)], {"1": 2}, 2) == {"1": 1.5}
    assert gpu_shares([gq("1", quota=3)], {"1": 1.5}, 2) == {"1": 1.5}


# ---------------------------------------------------------------------------------------------------------
# Over-quota phase
# ---------------------------------------------------------------------------------------------------------


def test_surplus_split_by_weight_3_to_1() -> None:
    """KAI test "allocates GPUs proportionally".

    8 GPUs; quotas 2 and 2, requests 6 and 6, weights 1 and 3. Deserved: 2 + 2, 4 left. Over quota:
    4 * 1/4 = 1 and 4 * 3/4 = 3, both below what is still wanted (4 each) -> 3 and 5.
    """
    queues = [gq("1", quota=2, weight=1), gq("2", quota=2, weight=3, age=1)]
    assert gpu_shares(queues, {"1": 6, "2": 6}, 8) == {"1": 3.0, "2": 5.0}


def test_weight_zero_queue_gets_no_over_quota() -> None:
    """A queue with over-quota weight 0 keeps its quota; its sibling with weight 1 takes all the surplus.

    10 GPUs, quotas 2 and 2, requests 10 each: deserved 2 + 2, then 6 to "b" alone -> 2 and 8.
    """
    queues = [gq("a", quota=2, weight=0), gq("b", quota=2, weight=1, age=1)]
    assert gpu_shares(queues, {"a": 10, "b": 10}, 10) == {"a": 2.0, "b": 8.0}


def test_surplus_stays_unassigned_when_only_weight_zero_queues_want_more() -> None:
    """KAI test "doesn't give when over quota weight is zero" (two queues).

    "1": quota 3, weight 0, request 5; "2": quota 3, weight 1, request 3. 16 GPUs: deserved 3 + 3, and
    the 10 left go to nobody ("2" is satisfied, "1" has no weight).
    """
    queues = [gq("1", quota=3, weight=0), gq("2", quota=3, weight=1, age=1)]
    assert gpu_shares(queues, {"1": 5, "2": 3}, 16) == {"1": 3.0, "2": 3.0}


def test_higher_priority_bucket_is_satisfied_before_lower() -> None:
    """KAI test "priority does affect over-quota".

    6 GPUs; both queues deserve 2, request 6, weight 2; "2" has priority 2, "1" priority 1. Deserved:
    2 + 2. The 2 left go to the priority-2 bucket first: "2" wants 4 more and takes both -> 2 and 4.
    """
    queues = [gq("1", quota=2, weight=2, priority=1), gq("2", quota=2, weight=2, priority=2, age=1)]
    assert gpu_shares(queues, {"1": 6, "2": 6}, 6) == {"1": 2.0, "2": 4.0}


def test_priority_overrides_weight() -> None:
    """KAI test "priority does affect over-quota, even when overQuotaWeight is set" (weights 100 vs 1)."""
    queues = [gq("1", quota=2, weight=100, priority=1), gq("2", quota=2, weight=1, priority=2, age=1)]
    assert gpu_shares(queues, {"1": 6, "2": 6}, 6) == {"1": 2.0, "2": 4.0}


def test_priority_does_not_affect_deserved() -> None:
    """KAI test "priority doesn't affect deserved": 4 GPUs, quotas 2 and 2 -> 2 and 2 whatever the priority."""
    queues = [gq("1", quota=2, weight=2, priority=1), gq("2", quota=2, weight=2, priority=2, age=1)]
    assert gpu_shares(queues, {"1": 6, "2": 6}, 4) == {"1": 2.0, "2": 2.0}


def test_lower_priority_bucket_gets_what_the_higher_one_leaves() -> None:
    """The priority-2 queue wants 1 more GPU; the 4 others of the surplus go to the priority-1 bucket.

    10 GPUs; "hi" quota 2 request 3; "lo1"/"lo2" quota 2 request 10, weights 1 and 3. Deserved 6, left 4:
    "hi" takes 1, then 3 split 1:3 among "lo1"/"lo2": 0.75 and 2.25, both floored (0 and 2), fractions
    0.75 and 0.25 lost; the remaining 1 goes to the largest fraction ("lo1") -> hi 3, lo1 3, lo2 4.
    """
    queues = [
        gq("hi", quota=2, weight=1, priority=2),
        gq("lo1", quota=2, weight=1, priority=1, age=1),
        gq("lo2", quota=2, weight=3, priority=1, age=2),
    ]
    assert gpu_shares(queues, {"hi": 3, "lo1": 10, "lo2": 10}, 10) == {"hi": 3.0, "lo1": 3.0, "lo2": 4.0}


def test_limit_caps_and_leftover_flows_to_others() -> None:
    """Two queues with no quota and weight 1 each, 10 GPUs; "a" has a limit of 3.

    Round 1: shares 5 and 5; "a" can only take 3 (limit) and is satisfied below its share, "b" takes 5.
    Round 2: the 2 left go to "b" -> 3 and 7.
    """
    queues = [gq("a", weight=1, limit=3), gq("b", weight=1, age=1)]
    assert gpu_shares(queues, {"a": 10, "b": 10}, 10) == {"a": 3.0, "b": 7.0}


def test_limit_caps_and_surplus_nobody_wants_stays_unassigned() -> None:
    """KAI test "doesn't allocate more than allowed": 12 GPUs, quotas 2, weights 2, requests 6, limit 5 on "1".

    Deserved 2 + 2; 8 left: shares 4 and 4; "1" may take 3 more (limit 5), "2" takes 4 (satisfied at 6);
    round 2: "1" is at its limit -> 5 and 6, 1 GPU left over.
    """
    queues = [gq("1", quota=2, weight=2, limit=5), gq("2", quota=2, weight=2, age=1)]
    assert gpu_shares(queues, {"1": 6, "2": 6}, 12) == {"1": 5.0, "2": 6.0}


def test_limit_below_quota_caps_the_deserved_share() -> None:
    """The deserved share is min(quota, min(limit, request)): quota 5, limit 2, request 10 -> 2."""
    assert gpu_shares([gq("a", quota=5, weight=1, limit=2)], {"a": 10}, 10) == {"a": 2.0}


def test_limit_zero_means_nothing() -> None:
    """A limit of 0 is a real limit (KAI docs: "limit 0 or unset: no additional resources allowed")."""
    assert gpu_shares([gq("a", quota=5, weight=1, limit=0)], {"a": 10}, 10) == {"a": 0.0}


def test_request_caps_and_another_round_hands_out_the_rest() -> None:
    """No quotas, weights 1 and 1, 10 GPUs; "a" wants 2, "b" wants 10.

    Round 1: shares 5 and 5; "a" takes its 2 (satisfied below its share), "b" 5. Round 2: 3 left -> "b".
    """
    queues = [gq("a", weight=1), gq("b", weight=1, age=1)]
    assert gpu_shares(queues, {"a": 2, "b": 10}, 10) == {"a": 2.0, "b": 8.0}


def test_cpu_three_queues_one_over_quota() -> None:
    """KAI test "reclaims unneeded resources from an allocated queue to fulfill the unallocated queue" (CPU).

    10000 millicores; quotas 5000 each; requests 7000, 2000, 2000. Deserved 5000 + 2000 + 2000, 1000
    left to the only unsatisfied queue -> 6000, 2000, 2000.
    """
    queues = [QueueSpec(n, None, creation_index=i, cpu=R(5000, 5000)) for i, n in enumerate("123")]
    result = compute_fair_shares(
        queues, {"1": (0, 7000, 0), "2": (0, 2000, 0), "3": (0, 2000, 0)}, (0, 10000, 0)
    )
    assert [result[n].fair_share[1] for n in "123"] == [6000.0, 2000.0, 2000.0]


def test_resources_are_divided_independently() -> None:
    """KAI test "Request more than total with different Over Quota and max allowed" (SetResourcesShare).

    1000 of each resource; "1": quota 250, weight 1; "2": quota 150, weight 2, limit 400; both request
    5000. Deserved 250 + 150, 600 left: shares 200 and 400; "2" can take 250 more (limit 400) and is
    satisfied below its share, "1" takes 200; round 2: the 150 left go to "1" -> 600 and 400.
    """
    spec1, spec2 = R(250, 1), R(150, 2, 400)
    queues = [QueueSpec("1", None, gpu=spec1, cpu=spec1, memory=spec1)]
    queues.append(QueueSpec("2", None, creation_index=1, gpu=spec2, cpu=spec2, memory=spec2))
    result = compute_fair_shares(queues, {"1": (5000,) * 3, "2": (5000,) * 3}, (1000,) * 3)
    assert result["1"].fair_share == (600.0, 600.0, 600.0)
    assert result["2"].fair_share == (400.0, 400.0, 400.0)


def test_three_equal_queues_split_an_odd_total() -> None:
    """KAI test "divide resource evenly queues": 9999 among three queues deserving 1000 -> 3333 each."""
    spec = R(1000, 1)
    queues = [QueueSpec(n, None, creation_index=i, gpu=spec) for i, n in enumerate("123")]
    assert gpu_shares(queues, dict.fromkeys("123", 10000.0), 9999) == dict.fromkeys("123", 3333.0)


# ---------------------------------------------------------------------------------------------------------
# Rounding and leftovers
# ---------------------------------------------------------------------------------------------------------


def test_rounding_leftover_goes_to_the_largest_lost_fraction() -> None:
    """KAI test "distributes remainder between queues based on largest remaining".

    11 GPUs; quotas 2 and 2, weights 1 and 4, requests 10. Deserved 4, 7 left: 1.4 and 5.6, floored to
    1 and 5 (fractions 0.4 and 0.6 lost); the last GPU goes to the larger fraction -> 3 and 8.
    """
    queues = [gq("1", quota=2, weight=1), gq("2", quota=2, weight=4, age=1)]
    assert gpu_shares(queues, {"1": 10, "2": 10}, 11) == {"1": 3.0, "2": 8.0}


def test_rounding_leftover_tie_goes_to_the_older_queue() -> None:
    """KAI test "distributes remainder between queues based on creation time".

    11 GPUs; quotas 2, weights 2, requests 6. 7 left: 3.5 each, floored to 3 (0.5 lost each); the last
    GPU goes to the older queue, whatever the names.
    """
    queues = [gq("z-old", quota=2, weight=2), gq("a-new", quota=2, weight=2, age=1)]
    assert gpu_shares(queues, {"z-old": 6, "a-new": 6}, 11) == {"z-old": 6.0, "a-new": 5.0}


def test_rounding_leftover_tie_of_age_goes_to_the_smaller_name() -> None:
    """Same as above with equal creation indexes: KAI then orders by queue UID (the name)."""
    queues = [gq("b", quota=2, weight=2), gq("a", quota=2, weight=2)]
    assert gpu_shares(queues, {"a": 6, "b": 6}, 11) == {"a": 6.0, "b": 5.0}


def test_rounding_leftover_with_priorities() -> None:
    """KAI test "divides the remainder even when using priorities".

    5 GPUs; "1" and "2" (priority 2) deserve 2, weight 2, request 5; "3" (priority 1) deserves 1 and
    requests nothing. Deserved 2 + 2 + 0, 1 left: 0.5 each in the priority-2 bucket, floored to 0; the
    leftover GPU goes to the older "1" -> 3, 2, 0.
    """
    queues = [
        gq("1", quota=2, weight=2, priority=2),
        gq("2", quota=2, weight=2, priority=2, age=1),
        gq("3", quota=1, weight=2, priority=1, age=2),
    ]
    assert gpu_shares(queues, {"1": 5, "2": 5, "3": 0}, 5) == {"1": 3.0, "2": 2.0, "3": 0.0}


def test_rounding_leftover_is_not_given_to_a_lower_priority_bucket() -> None:
    """KAI test "does not give rounding remainder to lower-priority queues while higher-priority queues are
    unsatisfied".

    6 GPUs; high-1 and high-2 (priority 2) and low-1 (priority 1) deserve 1, weight 1, request 5. Deserved
    1 + 1 + 1, 3 left: 1.5 each in the priority-2 bucket, floored to 1; the leftover GPU stays in that
    bucket (older high-1) -> 3, 2, and low-1 keeps 1.
    """
    queues = [
        gq("high-1", quota=1, weight=1, priority=2),
        gq("high-2", quota=1, weight=1, priority=2, age=1),
        gq("low-1", quota=1, weight=1, priority=1, age=2),
    ]
    shares = gpu_shares(queues, {"high-1": 5, "high-2": 5, "low-1": 5}, 6)
    assert shares == {"high-1": 3.0, "high-2": 2.0, "low-1": 1.0}


def test_fraction_left_over_is_handed_out_whole() -> None:
    """KAI tests "gives with fraction if requested" and "gives remainder fraction".

    Quota 3, weight 1: request 4.5 with 5 GPUs -> 4.5 (0.5 left over); request 5 with 3.5 GPUs -> 3.5.
    """
    assert gpu_shares([gq("1", quota=3, weight=1)], {"1": 4.5}, 5) == {"1": 4.5}
    assert gpu_shares([gq("1", quota=3, weight=1)], {"1": 5}, 3.5) == {"1": 3.5}


def test_leftover_unit_can_exceed_a_fractional_request() -> None:
    """KAI quirk: a leftover unit is given whole, even past the queue's request.

    3 GPUs, no quotas, weights 1 and 1, requests 1.7 and 10. Shares 1.5 and 1.5, floored to 1 (0.5 lost
    each); the last GPU goes to the older "a", which ends at 2 > 1.7 requested.
    """
    queues = [gq("a", weight=1), gq("b", weight=1, age=1)]
    assert gpu_shares(queues, {"a": 1.7, "b": 10}, 3) == {"a": 2.0, "b": 1.0}


# ---------------------------------------------------------------------------------------------------------
# Unlimited quota (-1)
# ---------------------------------------------------------------------------------------------------------


def test_unlimited_quota_deserves_the_whole_amount_up_to_its_request() -> None:
    """Quota -1 means "deserves all that is divided at its level": min(10, 5) = 5; the other 5 go over quota."""
    queues = [gq("u", quota=-1, weight=1), gq("b", quota=0, weight=1, age=1)]
    assert gpu_shares(queues, {"u": 5, "b": 10}, 10) == {"u": 5.0, "b": 5.0}


def test_unlimited_quota_over_subscribes_with_other_quotas() -> None:
    """Quota -1 takes min(total, request) = 7 of 8 GPUs; "b" still gets its quota 2 (9 in all: KAI does so)."""
    queues = [gq("u", quota=-1, weight=1), gq("b", quota=2, weight=1, age=1)]
    assert gpu_shares(queues, {"u": 7, "b": 5}, 8) == {"u": 7.0, "b": 2.0}


def test_unlimited_quota_of_a_child_is_its_parents_share() -> None:
    """A child with quota -1 deserves its parent's fair share (the amount divided at its level)."""
    queues = [gq("p", quota=4, weight=0), gq("c", quota=-1, parent="p", age=1)]
    assert gpu_shares(queues, {"c": 10}, 10) == {"p": 4.0, "c": 4.0}


# ---------------------------------------------------------------------------------------------------------
# KAI documentation examples
# ---------------------------------------------------------------------------------------------------------


def test_docs_scheduling_deep_dive_queue_priority_example() -> None:
    """KAI docs/scheduling-deep-dive (diagram queue-priority): 10 GPUs, three queues.

    Vision (priority 2, quota 2, weight 2), LLM (priority 2, quota 2, weight 1), Data Processing
    (priority 1, quota 3, weight 1). Quotas 2 + 2 + 3; the 3 surplus GPUs go to the priority-2 bucket,
    split 2:1 -> 4, 3, 3.
    """
    queues = [
        gq("vision", quota=2, weight=2, priority=2),
        gq("llm", quota=2, weight=1, priority=2, age=1),
        gq("data-processing", quota=3, weight=1, priority=1, age=2),
    ]
    requests = {"vision": 10.0, "llm": 10.0, "data-processing": 10.0}
    assert gpu_shares(queues, requests, 10) == {"vision": 4.0, "llm": 3.0, "data-processing": 3.0}


def test_docs_priority_creates_buckets() -> None:
    """KAI docs/scheduling-deep-dive FAQ: priority=2, weight=1 gets surplus before priority=1, weight=100."""
    queues = [gq("p1", quota=1, weight=100, priority=1), gq("p2", quota=1, weight=1, priority=2, age=1)]
    assert gpu_shares(queues, {"p1": 10, "p2": 10}, 8) == {"p1": 1.0, "p2": 7.0}


def test_docs_fairness_readme_algorithm() -> None:
    """KAI docs/fairness/README.md pseudo-code: fairShare += min(deserved, requested), then rounds of
    remaining * weight / totalWeights capped by the remaining request.

    10 GPUs; "a" deserves 2 and requests 8, "b" deserves 2 and requests 3, weights 1. Deserved 2 + 2,
    6 left: shares 3 and 3; "b" takes its 1, "a" 3; next round the 2 left go to "a" -> 7 and 3.
    """
    queues = [gq("a", quota=2, weight=1), gq("b", quota=2, weight=1, age=1)]
    assert gpu_shares(queues, {"a": 8, "b": 3}, 10) == {"a": 7.0, "b": 3.0}


# ---------------------------------------------------------------------------------------------------------
# Hierarchy
# ---------------------------------------------------------------------------------------------------------


def test_two_level_hierarchy() -> None:
    """Departments share the cluster, then each department's fair share is divided among its queues.

    10 GPUs. Department A (quota 6, weight 1) has a1 (quota 2, weight 1, request 4) and a2 (quota 2,
    weight 3, request 10): A requests 14. Department B (quota 2, weight 1) has b1 (request 10).
    Top level: deserved 6 and 2, 2 left split 1:1 -> A 7, B 3.
    Inside A (7): deserved 2 + 2, 3 left split 1:3 = 0.75 and 2.25, floored to 0 and 2 (0.75 and 0.25
    lost); the leftover GPU goes to the largest lost fraction (a1) -> a1 3, a2 4. Inside B: b1 gets 3.
    """
    queues = [
        gq("A", quota=6, weight=1),
        gq("B", quota=2, weight=1, age=1),
        gq("a1", quota=2, weight=1, parent="A", age=2),
        gq("a2", quota=2, weight=3, parent="A", age=3),
        gq("b1", quota=0, weight=1, parent="B", age=4),
    ]
    shares = gpu_shares(queues, {"a1": 4, "a2": 10, "b1": 10}, 10)
    assert shares == {"A": 7.0, "B": 3.0, "a1": 3.0, "a2": 4.0, "b1": 3.0}


def test_three_level_hierarchy() -> None:
    """16 GPUs through department -> team -> project.

    Top: D1 (quota 8, weight 1) and D2 (quota 4, weight 1); both request more, 4 left split 1:1 ->
    D1 10, D2 6. Inside D1 (10): T1 (quota 6, weight 0) and T2 (quota 2, weight 1): deserved 6 + 2, the
    2 left go to T2 (T1 has no weight) -> T1 6, T2 4. Inside T1 (6): P1 (quota 1, weight 1, request 3)
    and P2 (quota 1, weight 2, request 10): deserved 1 + 1, 4 left: shares 1.33 and 2.67; P1 wants 2,
    floored to 1 (0.33 lost); P2 floored to 2 (0.67 lost); the leftover GPU goes to P2 -> P1 2, P2 4.
    D2's only child P3 gets all 6 it requests.
    """
    queues = [
        gq("D1", quota=8, weight=1),
        gq("D2", quota=4, weight=1, age=1),
        gq("T1", quota=6, weight=0, parent="D1", age=2),
        gq("T2", quota=2, weight=1, parent="D1", age=3),
        gq("P1", quota=1, weight=1, parent="T1", age=4),
        gq("P2", quota=1, weight=2, parent="T1", age=5),
        gq("P3", quota=0, weight=1, parent="D2", age=6),
        gq("P4", quota=0, weight=1, parent="T2", age=7),
    ]
    shares = gpu_shares(queues, {"P1": 3, "P2": 10, "P3": 6, "P4": 10}, 16)
    assert shares == {
        "D1": 10.0,
        "D2": 6.0,
        "T1": 6.0,
        "T2": 4.0,
        "P1": 2.0,
        "P2": 4.0,
        "P3": 6.0,
        "P4": 4.0,
    }


@pytest.mark.parametrize(
    ("total", "deserved", "weight", "priority", "expected"),
    [
        pytest.param(4, {}, {}, {}, (2, 2, 2, 2), id="sanity"),
        # q2 keeps its quota 2 although its department only gets 1: over-subscription.
        pytest.param(4, {"d1": 3, "d2": 1}, {}, {}, (3, 3, 1, 2), id="deserved department quota"),
        pytest.param(12, {"d1": 3, "d2": 1}, {}, {}, (7, 7, 5, 5), id="over-quota"),
        pytest.param(12, {"d1": 3, "d2": 1}, {"d1": 1, "d2": 7}, {}, (4, 4, 8, 8), id="over-quota weight"),
        pytest.param(12, {"d1": 3, "d2": 1}, {"d1": 7, "d2": 1}, {}, (10, 10, 2, 2), id="weight reversed"),
        pytest.param(
            12, dict.fromkeys(("d1", "q1", "d2", "q2"), 1), {"d1": 7, "d2": 1}, {"d1": 1, "d2": 2},
            (1, 1, 11, 11), id="priority",
        ),
        pytest.param(
            12, dict.fromkeys(("d1", "q1", "d2", "q2"), 1), {"d1": 1, "d2": 7}, {"d1": 2, "d2": 1},
            (11, 11, 1, 1), id="priority reversed",
        ),
    ],
)  # fmt: skip
def test_kai_two_level_table(
    total: float,
    deserved: dict[str, float],
    weight: dict[str, float],
    priority: dict[str, int],
    expected: tuple[float, float, float, float],
) -> None:
    """KAI test table "Set fair share for 2 hierarchy queues - simplified" (proportion_test.go).

    Departments d1 and d2 each hold one queue (q1, q2); everything deserves 2 GPUs with weight 1 unless
    overridden, and each queue requests 100 GPUs.
    """
    names = ("d1", "q1", "d2", "q2")
    parents = {"d1": None, "q1": "d1", "d2": None, "q2": "d2"}
    queues = [
        gq(
            n,
            quota=deserved.get(n, 2),
            weight=weight.get(n, 1),
            parent=parents[n],
            priority=priority.get(n, 100),
            age=i,
        )
        for i, n in enumerate(names)
    ]
    shares = gpu_shares(queues, {"q1": 100, "q2": 100}, total)
    assert tuple(shares[n] for n in names) == expected


def test_kai_multi_hierarchy_tests() -> None:
    """KAI tests "simple scenario with single top queue" and "two top parent queues" (proportion_test.go).

    Weights are 0 unless given. 3 GPUs: top (quota 3) -> mid (quota 3) -> leaves with quotas 2 and 1
    requesting as much -> 3, 3, 2, 1. 4 GPUs: top-1 (quota 2) with two queues deserving and requesting 1;
    top-2 (quota 2) with c3 (nothing) and c4 (quota 1, weight 1, request 2) -> 2, 1, 1, 2, 0, 2.
    """
    queues = [
        gq("top", quota=3),
        gq("mid", quota=3, parent="top"),
        gq("leaf-1", quota=2, parent="mid"),
        gq("leaf-2", quota=1, parent="mid"),
    ]
    assert gpu_shares(queues, {"leaf-1": 2, "leaf-2": 1}, 3) == {"top": 3, "mid": 3, "leaf-1": 2, "leaf-2": 1}
    queues = [
        gq("top-1", quota=2),
        gq("child-1", quota=1, parent="top-1"),
        gq("child-2", quota=1, parent="top-1"),
        gq("top-2", quota=2),
        gq("child-3", quota=0, parent="top-2"),
        gq("child-4", quota=1, weight=1, parent="top-2"),
    ]
    shares = gpu_shares(queues, {"child-1": 1, "child-2": 1, "child-3": 0, "child-4": 2}, 4)
    assert shares == {"top-1": 2, "child-1": 1, "child-2": 1, "top-2": 2, "child-3": 0, "child-4": 2}


def test_parent_limit_caps_the_whole_subtree() -> None:
    """A department limited to 4 GPUs gets at most 4, and its queues share those 4."""
    queues = [
        gq("D", quota=2, weight=1, limit=4),
        gq("q1", quota=1, weight=1, parent="D", age=1),
        gq("q2", quota=1, weight=1, parent="D", age=2),
    ]
    assert gpu_shares(queues, {"q1": 10, "q2": 10}, 100) == {"D": 4.0, "q1": 2.0, "q2": 2.0}


def test_children_quotas_over_subscribe_their_parent() -> None:
    """Children deserving more than their parent's share still get their quotas (KAI over-subscribes)."""
    queues = [
        gq("D", quota=3, weight=0),
        gq("q1", quota=2, parent="D", age=1),
        gq("q2", quota=2, parent="D", age=2),
    ]
    assert gpu_shares(queues, {"q1": 5, "q2": 5}, 10) == {"D": 3.0, "q1": 2.0, "q2": 2.0}


def test_requests_are_aggregated_up_the_hierarchy() -> None:
    """A parent's request is the sum of its subtree's (uncapped by limits); own entries count too."""
    queues = [
        QueueSpec("D", None),
        QueueSpec("T", "D", gpu=R(limit=1)),
        QueueSpec("a", "T"),
        QueueSpec("b", "T"),
        QueueSpec("c", "D"),
    ]
    result = compute_fair_shares(
        queues, {"a": (1, 100, 1e9), "b": (2.5, 200, 2e9), "c": (4, 0, 0), "D": (1, 1, 1)}, (0, 0, 0)
    )
    assert result["T"].requested == (3.5, 300.0, 3e9)
    assert result["D"].requested == (8.5, 301.0, 3e9 + 1)
    assert result["a"].requested == (1.0, 100.0, 1e9)


def test_result_carries_the_queue_settings() -> None:
    """deserved, limit and over_quota_weight are reported as given, -1 included, in (gpu, cpu, memory) order."""
    queue = QueueSpec("q", None, gpu=R(-1, 2, 8), cpu=R(1000, 1, -1), memory=R(0, 0, 5e9))
    result = compute_fair_shares([queue], {}, (8, 4000, 1e10))["q"]
    assert RESOURCES == ("gpu", "cpu", "memory")
    assert result == QueueShare(
        deserved=(-1.0, 1000.0, 0.0),
        fair_share=(0.0, 0.0, 0.0),
        requested=(0.0, 0.0, 0.0),
        limit=(8.0, -1.0, 5e9),
        over_quota_weight=(2.0, 1.0, 0.0),
    )


def test_every_queue_is_reported_and_unrequested_queues_get_nothing() -> None:
    queues = [gq("a", quota=4, weight=1), gq("b", quota=4, weight=1, age=1)]
    assert gpu_shares(queues, {}, 10) == {"a": 0.0, "b": 0.0}
    assert compute_fair_shares([], {}, (1, 1, 1)) == {}


# ---------------------------------------------------------------------------------------------------------
# Time-aware fairness (usage, kValue)
# ---------------------------------------------------------------------------------------------------------


def test_usage_shifts_the_over_quota_split_away_from_heavy_users() -> None:
    """Weights 1 and 1 (normalized 0.5 each); "a" used half the cluster, "b" nothing; k = 1.

    Share weights: a = max(0, 0.5 + (0.5 - 0.5)) = 0.5, b = 0.5 + (0.5 - 0) = 1.0. 10 GPUs: 3.33 and
    6.67, floored to 3 and 6; the leftover GPU goes to the larger lost fraction ("b") -> 3 and 7.
    """
    queues = [gq("a", weight=1), gq("b", weight=1, age=1)]
    requests = {"a": 10.0, "b": 10.0}
    usage = {"a": (0.5, 0.0, 0.0)}
    assert gpu_shares(queues, requests, 10, usage=usage) == {"a": 3.0, "b": 7.0}
    assert gpu_shares(queues, requests, 10, usage=usage, k_value=0.0) == {"a": 5.0, "b": 5.0}
    assert gpu_shares(queues, requests, 10, usage=usage, k_value=-3.0) == {"a": 5.0, "b": 5.0}


def test_without_usage_k_value_changes_nothing() -> None:
    queues = [gq("1", quota=2, weight=1), gq("2", quota=2, weight=4, age=1)]
    requests = {"1": 10.0, "2": 10.0}
    expected = {"1": 3.0, "2": 8.0}
    for k in (0.0, 0.5, 1.0, 7.0):
        assert gpu_shares(queues, requests, 11, k_value=k) == expected


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (R(quota=-2), "queue 'a': field 'gpu.quota': must be >= 0 or -1 (unlimited), got -2"),
        (R(quota=-0.5), "queue 'a': field 'gpu.quota'"),
        (R(quota=math.nan), "queue 'a': field 'gpu.quota'"),
        (R(over_quota_weight=-1), "queue 'a': field 'gpu.over_quota_weight': must be finite and >= 0"),
        (R(limit=-3), "queue 'a': field 'gpu.limit': must be >= 0 or -1 (no limit), got -3"),
        (R(limit=math.inf), "queue 'a': field 'gpu.limit'"),
    ],
)
def test_invalid_resource_settings_are_rejected(spec: ResourceSpec, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        compute_fair_shares([QueueSpec("a", None, gpu=spec)], {}, (1, 1, 1))


def test_invalid_memory_setting_names_the_memory_field() -> None:
    with pytest.raises(ValueError, match=re.escape("queue 'm': field 'memory.over_quota_weight'")):
        compute_fair_shares([QueueSpec("m", None, memory=R(over_quota_weight=-0.1))], {}, (1, 1, 1))


def test_unknown_parent_is_rejected() -> None:
    with pytest.raises(ValueError, match=re.escape("queue 'a': field 'parent': unknown queue 'nope'")):
        compute_fair_shares([QueueSpec("a", "nope")], {}, (1, 1, 1))


def test_cycle_of_parents_is_rejected() -> None:
    queues = [QueueSpec("a", "b"), QueueSpec("b", "a"), QueueSpec("top", None)]
    with pytest.raises(ValueError, match=re.escape("queue 'a': field 'parent': cycle a -> b -> a") + "$"):
        compute_fair_shares(queues, {}, (1, 1, 1))


def test_cycle_below_a_chain_is_reported_from_its_first_queue() -> None:
    queues = [QueueSpec("x", "b"), QueueSpec("b", "c"), QueueSpec("c", "b")]
    with pytest.raises(ValueError, match=re.escape("queue 'b': field 'parent': cycle b -> c -> b") + "$"):
        compute_fair_shares(queues, {}, (1, 1, 1))


def test_self_parent_is_a_cycle() -> None:
    with pytest.raises(ValueError, match=re.escape("queue 'a': field 'parent': cycle a -> a") + "$"):
        compute_fair_shares([QueueSpec("a", "a")], {}, (1, 1, 1))


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match=re.escape("queue 'a': field 'name': duplicate queue name")):
        compute_fair_shares([QueueSpec("a", None), QueueSpec("a", None)], {}, (1, 1, 1))


def test_request_for_an_unknown_queue_is_rejected() -> None:
    with pytest.raises(ValueError, match=re.escape("queue 'ghost': field 'requested': unknown queue")):
        compute_fair_shares([QueueSpec("a", None)], {"ghost": (1, 1, 1)}, (1, 1, 1))


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_request_values_are_rejected(bad: float) -> None:
    with pytest.raises(
        ValueError, match=re.escape("queue 'a': field 'requested.cpu': must be finite and >= 0")
    ):
        compute_fair_shares([QueueSpec("a", None)], {"a": (1, bad, 1)}, (1, 1, 1))


def test_bad_total_and_usage_are_rejected() -> None:
    with pytest.raises(ValueError, match=re.escape("field 'total.memory': must be finite and >= 0")):
        compute_fair_shares([QueueSpec("a", None)], {}, (1, 1, -5))
    with pytest.raises(ValueError, match=re.escape("queue 'a': field 'usage.gpu': must be finite and >= 0")):
        compute_fair_shares([QueueSpec("a", None)], {}, (1, 1, 1), usage={"a": (-0.1, 0, 0)})
    with pytest.raises(ValueError, match=re.escape("queue 'b': field 'usage': unknown queue")):
        compute_fair_shares([QueueSpec("a", None)], {}, (1, 1, 1), usage={"b": (0, 0, 0)})
    with pytest.raises(ValueError, match=re.escape("field 'k_value': must be finite")):
        compute_fair_shares([QueueSpec("a", None)], {}, (1, 1, 1), k_value=math.nan)


# ---------------------------------------------------------------------------------------------------------
# Shares used by queue ordering and reclaim
# ---------------------------------------------------------------------------------------------------------


def test_requestable_and_allocatable_share() -> None:
    assert requestable_share(10, UNLIMITED) == 10
    assert requestable_share(10, 4) == 4
    # max(deserved, fair share), capped by the limit; an unlimited quota makes it the limit (maybe -1).
    assert allocatable_share(2, 5, UNLIMITED) == 5
    assert allocatable_share(6, 5, UNLIMITED) == 6
    assert allocatable_share(6, 5, 4) == 4
    assert allocatable_share(UNLIMITED, 5, 7) == 7
    assert allocatable_share(UNLIMITED, 5, UNLIMITED) == UNLIMITED
    share = QueueShare((2, -1, 0), (5, 3, 0), (9, 9, 9), (4, 8, -1), (1, 1, 1))
    assert allocatable_shares(share) == (4.0, 8.0, 0.0)


def test_dominant_resource_share() -> None:
    total = (8.0, 8000.0, 8e9)
    # The largest allocated/allocatable ratio.
    assert dominant_resource_share((2, 3000, 1e9), (4, 6000, 8e9), total) == 0.5
    # Unlimited allocatable: the cluster total stands in.
    assert dominant_resource_share((4, 0, 0), (UNLIMITED, 1, 1), total) == 0.5
    # Zero allocatable: allocated * 1000.
    assert dominant_resource_share((0.5, 0, 0), (0, 1, 1), total) == 500.0
    assert dominant_resource_share((0, 0, 0), (0, 0, 0), total) == 0.0


def test_saturation_ratio() -> None:
    assert saturation_ratio(3, 4) == 0.75
    assert saturation_ratio(1, 0) == math.inf
    assert saturation_ratio(0, 0) == 0.0
    assert saturation_ratio(5, UNLIMITED) == 0.0


def test_quantity_comparisons() -> None:
    assert compare_quantities(1.0, 1.0 + 1e-10) == 0
    assert compare_quantities(1.0, 2.0) == -1
    assert compare_quantities(UNLIMITED, 1e12) == 1
    assert compare_quantities(5.0, UNLIMITED) == -1
    assert compare_quantities(UNLIMITED, UNLIMITED) == 0
    assert less_equal((1, 2, 3), (1, 2, UNLIMITED))
    assert not less_equal((1, 2, 3.1), (1, 2, 3))
    # Over-utilized only when over the fair share in every resource.
    assert fair_share_less_than_allocated((1, 1, 1), (2, 2, 2))
    assert not fair_share_less_than_allocated((1, 1, 1), (2, 2, 1))


# ---------------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------------

EPS = 1e-9


@st.composite
def scenarios(
    draw: st.DrawFn, whole: bool = True
) -> tuple[list[QueueSpec], dict[str, tuple[float, float, float]], Vector3]:
    """A random hierarchy (each queue's parent drawn among the earlier ones), leaf requests and a total."""
    amount = st.integers(0, 12).map(float) if whole else st.floats(0, 12).map(lambda v: round(v, 2))

    def resource() -> ResourceSpec:
        quota = draw(st.one_of(st.just(UNLIMITED), amount)) if draw(st.integers(0, 5)) == 0 else draw(amount)
        limit = draw(amount.map(lambda v: v + 1)) if draw(st.booleans()) else UNLIMITED
        return ResourceSpec(quota, float(draw(st.integers(0, 3))), limit)

    n = draw(st.integers(1, 10))
    queues: list[QueueSpec] = []
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.sampled_from([q.name for q in queues]))) if queues else None
        queues.append(
            QueueSpec(
                f"q{i}",
                parent,
                priority=draw(st.sampled_from((1, 2, 3))),
                creation_index=draw(st.integers(0, 3)),
                gpu=resource(),
                cpu=resource(),
                memory=resource(),
            )
        )
    parents = {q.parent for q in queues}
    requested = {q.name: (draw(amount), draw(amount), draw(amount)) for q in queues if q.name not in parents}
    total = (draw(amount) * 3, draw(amount) * 3, draw(amount) * 3)
    return queues, requested, total


def _levels(
    queues: list[QueueSpec], result: dict[str, QueueShare], total: Vector3, r: int
) -> dict[str, float]:
    """The amount divided at each queue's level: the total for top queues, the parent's share otherwise."""
    return {q.name: total[r] if q.parent is None else result[q.parent].fair_share[r] for q in queues}


def _requestable(share: QueueShare, r: int) -> float:
    return requestable_share(share.requested[r], share.limit[r])


def _deserved_part(share: QueueShare, level: float, r: int) -> float:
    quota = level if share.deserved[r] == UNLIMITED else share.deserved[r]
    return min(quota, _requestable(share, r))


@settings(deadline=None)
@given(scenarios())
def test_property_whole_numbers_never_exceed_request_or_limit(
    scenario: tuple[list[QueueSpec], dict[str, tuple[float, float, float]], Vector3],
) -> None:
    """With whole-number inputs every share is whole and within min(request, limit), and at least the
    deserved part min(quota, request) (quota -1: the amount divided at the queue's level)."""
    queues, requested, total = scenario
    result = compute_fair_shares(queues, requested, total)
    for r in range(3):
        levels = _levels(queues, result, total, r)
        for q in queues:
            share = result[q.name]
            fair = share.fair_share[r]
            assert fair == math.floor(fair)
            assert fair <= _requestable(share, r) + EPS
            if share.limit[r] >= 0:
                assert fair <= share.limit[r] + EPS
            assert fair >= _deserved_part(share, levels[q.name], r) - EPS


@settings(deadline=None)
@given(scenarios(whole=False))
def test_property_fractions_overshoot_the_request_by_less_than_one_unit(
    scenario: tuple[list[QueueSpec], dict[str, tuple[float, float, float]], Vector3],
) -> None:
    """With fractional inputs the whole-unit leftover may pass the request, by less than one unit."""
    queues, requested, total = scenario
    result = compute_fair_shares(queues, requested, total)
    for r in range(3):
        levels = _levels(queues, result, total, r)
        for q in queues:
            share = result[q.name]
            assert share.fair_share[r] < _requestable(share, r) + 1
            assert share.fair_share[r] >= _deserved_part(share, levels[q.name], r) - EPS


@settings(deadline=None)
@given(st.one_of(scenarios(), scenarios(whole=False)))
def test_property_shares_stay_within_the_amount_divided(
    scenario: tuple[list[QueueSpec], dict[str, tuple[float, float, float]], Vector3],
) -> None:
    """Top-level shares sum to at most the total, children's to at most their parent's share, whenever the
    deserved parts (min of quota and request) fit in that amount; KAI over-subscribes otherwise."""
    queues, requested, total = scenario
    result = compute_fair_shares(queues, requested, total)
    for r in range(3):
        levels = _levels(queues, result, total, r)
        groups: dict[str | None, list[QueueSpec]] = {}
        for q in queues:
            groups.setdefault(q.parent, []).append(q)
        for parent, members in groups.items():
            amount = total[r] if parent is None else result[parent].fair_share[r]
            deserved = sum(_deserved_part(result[q.name], levels[q.name], r) for q in members)
            if deserved <= amount:
                assert sum(result[q.name].fair_share[r] for q in members) <= amount + 1e-6


@settings(deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_property_input_order_does_not_matter(
    scenario: tuple[list[QueueSpec], dict[str, tuple[float, float, float]], Vector3], rnd: random.Random
) -> None:
    queues, requested, total = scenario
    shuffled = list(queues)
    rnd.shuffle(shuffled)
    assert compute_fair_shares(shuffled, requested, total) == compute_fair_shares(queues, requested, total)
