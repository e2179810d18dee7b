"""Time-based fair share (`shared.core.usage`): a queue's historical usage, decayed and windowed, as a
fraction of the cluster's capacity, and what it does to over-quota shares. Each example spells out its
arithmetic so a reader can check it by hand.

The cluster in the fair-share examples: 12 GPUs, two top-level queues `busy` and `idle`, no quota, GPU
over-quota weight 1 each, both asking for the whole cluster. Without usage each gets 12 * 1/2 = 6 GPUs.
With usage u, KAI's weight is w = max(0, n + k * (n - u)) with n = 1/2 the normalised weight.
"""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.policy import Policy, QueueUsage
from shared.core.queue_plan import plan_queues
from shared.core.usage import (
    MAX_BUCKETS,
    UsageLedger,
    UsageParams,
    record_interval,
    sample,
    usage_fractions,
    window_start,
)
from shared.model import Node, Snapshot
from tests import builders
from tests.builders import busy_and_idle

HOUR = 3600.0
NOW = 100 * HOUR
"""Aligned to every bucket length used here, so buckets fall on whole hours and minutes."""
GPUS = 12.0
CAPACITY = (GPUS, 48_000.0, 192e9)
EMPTY = UsageLedger()
DEFAULT = UsageParams()


def node(name: str) -> Node:
    return builders.node(name, 6, cpu_millis=24_000, memory_bytes=96e9)


def snapshot() -> Snapshot:
    """12 GPUs on two nodes; `busy` and `idle` each with 12 pending one-GPU pods."""
    return busy_and_idle((node("n1"), node("n2")))


def gpu_fair_shares(usage: dict[str, tuple[float, float, float]], k_value: float = 1.0) -> dict[str, float]:
    policy = Policy(
        k_value=k_value,
        queue_usage=tuple(QueueUsage(queue=q, gpu=v[0], cpu=v[1], memory=v[2]) for q, v in usage.items()),
    )
    plan = plan_queues(snapshot(), NOW, policy)
    return {s.queue: s.fair_share.gpu for s in plan.shares}


# --- the fractions ------------------------------------------------------------------------------------------
def test_no_usage_leaves_the_weights_as_they_were() -> None:
    # An empty ledger has no usage at all, so the division is KAI's plain one: 12 * 1/2 = 6 each.
    assert usage_fractions(EMPTY, NOW, DEFAULT) == {}
    assert gpu_fair_shares({}) == {"busy": 6.0, "idle": 6.0}
    assert plan_queues(snapshot(), NOW, Policy()) == plan_queues(snapshot(), NOW, Policy(queue_usage=()))


def test_a_queue_that_held_the_whole_cluster_for_the_last_hour_gets_no_over_quota_share_while_its_sibling_waits() -> (
    None
):
    # The ledger saw one hour: busy held all 12 GPUs. Capacity over the observed hour: 12 GPU-hours; busy
    # used 12 GPU-hours: u = 12/12 = 1 (the 7-day window counts only the time observed, as KAI's
    # sum_over_time does for a young cluster).
    ledger = record_interval(EMPTY, NOW - HOUR, NOW, {"busy": CAPACITY}, CAPACITY, DEFAULT)
    usage = usage_fractions(ledger, NOW, DEFAULT)
    assert usage == {"busy": (1.0, 1.0, 1.0)}
    # busy: w = max(0, 1/2 + 1 * (1/2 - 1)) = 0; idle: w = 1/2 + 1 * (1/2 - 0) = 1.
    # Over-quota round: busy 12 * 0/1 = 0, idle 12 * 1/1 = 12.
    assert gpu_fair_shares(usage) == {"busy": 0.0, "idle": 12.0}
    # kValue 0 switches the history off: 6 each again.
    assert gpu_fair_shares(usage, k_value=0.0) == {"busy": 6.0, "idle": 6.0}


def test_half_the_cluster_for_the_last_hour_makes_the_split_one_third_two_thirds() -> None:
    # busy held 6 of 12 GPUs for the hour: u = 6/12 = 0.5.
    ledger = record_interval(EMPTY, NOW - HOUR, NOW, {"busy": (6.0, 0.0, 0.0)}, CAPACITY, DEFAULT)
    usage = usage_fractions(ledger, NOW, DEFAULT)
    assert usage == {"busy": (0.5, 0.0, 0.0)}
    # busy: w = 1/2 + (1/2 - 1/2) = 1/2; idle: w = 1/2 + (1/2 - 0) = 1.
    # busy: 12 * (1/2) / (3/2) = 4; idle: 12 * 1 / (3/2) = 8.
    assert gpu_fair_shares(usage) == {"busy": 4.0, "idle": 8.0}


def test_a_half_life_halves_the_weight_of_usage_one_half_life_older() -> None:
    params = UsageParams(half_life=HOUR, fetch_interval=HOUR)
    # Hour-long buckets: old held the cluster in [now-2h, now-1h), new in [now-1h, now).
    ledger = record_interval(EMPTY, NOW - 2 * HOUR, NOW - HOUR, {"old": CAPACITY}, CAPACITY, params)
    ledger = record_interval(ledger, NOW - HOUR, NOW, {"new": CAPACITY}, CAPACITY, params)
    # Bucket centres are 1.5 h and 0.5 h old: decays 2^-1.5 and 2^-0.5, the first half the second.
    # Capacity: 12 * (2^-1.5 + 2^-0.5) GPU-hours; old: 12 * 2^-1.5, new: 12 * 2^-0.5.
    # old: 2^-1.5 / (2^-1.5 + 2^-0.5) = 1 / (1 + 2) = 1/3; new: 2/3.
    usage = usage_fractions(ledger, NOW, params)
    assert usage["old"][0] == pytest.approx(1 / 3)
    assert usage["new"][0] == pytest.approx(2 / 3)
    assert usage["old"][0] == pytest.approx(usage["new"][0] / 2)
    # Without a half-life both hours weigh the same: 1/2 each.
    flat = usage_fractions(ledger, NOW, UsageParams(fetch_interval=HOUR))
    assert flat["old"][0] == flat["new"][0] == 0.5


def test_a_window_drops_usage_older_than_it() -> None:
    params = UsageParams(window=HOUR)  # 1-minute buckets (fetch interval 60 s > 3600 / 256)
    ledger = record_interval(EMPTY, NOW - 3 * HOUR, NOW - 2 * HOUR, {"a": CAPACITY}, CAPACITY, params)
    ledger = record_interval(ledger, NOW - 2 * HOUR, NOW - HOUR / 2, {}, CAPACITY, params)
    ledger = record_interval(ledger, NOW - HOUR / 2, NOW, {"b": CAPACITY}, CAPACITY, params)
    # Window [now-1h, now): a's hour is outside; b held the cluster for 30 of the 60 minutes: 1/2.
    assert usage_fractions(ledger, NOW, params) == {"b": (0.5, 0.5, 0.5)}
    # A 4-hour window sees the 3 observed hours: a 1/3, b 0.5/3 = 1/6.
    wide = usage_fractions(ledger, NOW, UsageParams(window=4 * HOUR))
    assert wide["a"][0] == pytest.approx(1 / 3)
    assert wide["b"][0] == pytest.approx(1 / 6)


def test_a_tumbling_window_starts_again_at_each_boundary() -> None:
    params = UsageParams(window=HOUR, window_type="tumbling")
    now = NOW + HOUR / 4  # 15 minutes into a window that started at NOW
    assert window_start(now, params) == NOW
    ledger = record_interval(EMPTY, NOW - HOUR / 2, NOW, {"a": CAPACITY}, CAPACITY, params)
    ledger = record_interval(ledger, NOW, now, {"b": CAPACITY}, CAPACITY, params)
    # a's usage belongs to the previous window; b held everything for the 15 minutes of this one: 1.
    assert usage_fractions(ledger, now, params) == {"b": (1.0, 1.0, 1.0)}
    # The same ledger with a sliding hour: a 30 min, b 15 min of 45 observed: 2/3 and 1/3.
    sliding = usage_fractions(ledger, now, UsageParams(window=HOUR))
    assert sliding["a"][0] == pytest.approx(2 / 3)
    assert sliding["b"][0] == pytest.approx(1 / 3)


def test_the_window_counts_the_part_of_a_bucket_it_cuts() -> None:
    params = UsageParams(window=HOUR, fetch_interval=HOUR)  # one bucket per hour
    ledger = record_interval(EMPTY, NOW - HOUR, NOW, {"a": (3.0, 0, 0)}, CAPACITY, params)
    # Half an hour later the window [now-30m, now+30m) keeps half of the old bucket (as if observed
    # evenly) and nothing else was observed: a = (3 * 1800) / (12 * 1800) = 1/4.
    assert usage_fractions(ledger, NOW + HOUR / 2, params)["a"][0] == pytest.approx(0.25)


# --- samples ------------------------------------------------------------------------------------------------
def test_samples_credit_the_time_since_the_previous_one_with_what_it_saw() -> None:
    params = UsageParams(window=HOUR)
    ledger = sample(EMPTY, NOW, {"a": (12.0, 0, 0)}, CAPACITY, params)
    assert ledger.observed == 0.0  # one sample: nothing observed yet
    ledger = sample(ledger, NOW + 60, {"b": (12.0, 0, 0)}, CAPACITY, params)
    # [NOW, NOW+60) ran what the first sample saw: a held 12 GPUs for 60 s.
    assert usage_fractions(ledger, NOW + 60, params) == {"a": (1.0, 0.0, 0.0)}
    ledger = sample(ledger, NOW + 120, {}, CAPACITY, params)
    # Then b for 60 s: a 12*60 / (12*120) = 1/2, b the same.
    assert usage_fractions(ledger, NOW + 120, params) == {"a": (0.5, 0.0, 0.0), "b": (0.5, 0.0, 0.0)}


def test_a_gap_longer_than_the_staleness_period_is_not_observed() -> None:
    params = UsageParams(window=HOUR, staleness=300)
    ledger = sample(EMPTY, NOW, {"a": (12.0, 0, 0)}, CAPACITY, params)
    ledger = sample(ledger, NOW + 60, {"a": (12.0, 0, 0)}, CAPACITY, params)
    # No leader for 20 minutes: that time counts neither as a's usage nor as capacity.
    ledger = sample(ledger, NOW + 60 + 1200, {}, CAPACITY, params)
    assert ledger.observed == 60.0
    assert usage_fractions(ledger, NOW + 1260, params) == {"a": (1.0, 0.0, 0.0)}


def test_the_ledger_keeps_at_most_one_window_of_buckets() -> None:
    params = UsageParams(window=HOUR, fetch_interval=60)
    ledger = EMPTY
    for minute in range(5 * 60):  # five hours, one sample a minute
        ledger = sample(ledger, NOW + minute * 60, {"a": (1.0, 0, 0)}, CAPACITY, params)
    assert len(ledger.buckets) <= HOUR / 60 + 1
    week = UsageParams()  # 7 days: 40-minute buckets
    assert week.bucket_length() == pytest.approx(7 * 24 * HOUR / MAX_BUCKETS)
    # The ledger round-trips as msgpack (it is stored in JetStream KV).
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(ledger), type=UsageLedger) == ledger


def test_bad_input_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="'half_life'"):
        UsageParams(half_life=-1)
    with pytest.raises(ValueError, match="'window'"):
        UsageParams(window=0)
    with pytest.raises(ValueError, match="queue 'a'"):
        record_interval(EMPTY, 0, 1, {"a": (math.nan, 0, 0)}, CAPACITY, DEFAULT)
    with pytest.raises(ValueError, match="queue_usage"):
        Policy(queue_usage=(QueueUsage(queue="a", gpu=-0.5),))


def test_usage_of_a_queue_that_no_longer_exists_is_ignored() -> None:
    assert gpu_fair_shares({"gone": (1.0, 0, 0)}) == {"busy": 6.0, "idle": 6.0}


# --- properties ---------------------------------------------------------------------------------------------
_share = st.floats(min_value=0.0, max_value=1.0)
_intervals = st.lists(
    st.tuples(st.floats(min_value=1.0, max_value=2 * HOUR), _share, _share), min_size=1, max_size=12
)


def _ledger(intervals: list[tuple[float, float, float]], params: UsageParams) -> tuple[UsageLedger, float]:
    """Consecutive intervals ending at the returned time; a holds `x` of the cluster and b `y * (1 - x)`."""
    ledger, t = EMPTY, NOW
    for length, x, y in intervals:
        a = (GPUS * x, 0.0, 0.0)
        b = (GPUS * (1 - x) * y, 0.0, 0.0)
        ledger = record_interval(ledger, t, t + length, {"a": a, "b": b}, CAPACITY, params)
        t += length
    return ledger, t


_params = st.builds(
    UsageParams,
    half_life=st.sampled_from([0.0, 600.0, HOUR]),
    window=st.sampled_from([HOUR, 6 * HOUR, 7 * 24 * HOUR]),
    window_type=st.sampled_from(["sliding", "tumbling"]),
)


@settings(max_examples=80, deadline=None)
@given(_intervals, _params)
def test_usage_fractions_stay_between_0_and_1_and_add_up_to_at_most_1(
    intervals: list[tuple[float, float, float]], params: UsageParams
) -> None:
    ledger, now = _ledger(intervals, params)
    usage = usage_fractions(ledger, now, params)
    for v in usage.values():
        assert all(-1e-9 <= x <= 1 + 1e-9 for x in v)
    assert sum(v[0] for v in usage.values()) <= 1 + 1e-9


@settings(max_examples=80, deadline=None)
@given(_intervals, _params, st.integers(min_value=0, max_value=11), st.floats(min_value=0.0, max_value=1.0))
def test_more_allocation_never_means_less_usage(
    intervals: list[tuple[float, float, float]], params: UsageParams, at: int, extra: float
) -> None:
    ledger, now = _ledger(intervals, params)
    i = min(at, len(intervals) - 1)
    length, x, _ = intervals[i]
    more = list(intervals)
    more[i] = (length, x + (1 - x) * extra, 0.0)  # a takes more, from b
    bigger, _ = _ledger(more, params)
    before = usage_fractions(ledger, now, params).get("a", (0.0, 0.0, 0.0))[0]
    after = usage_fractions(bigger, now, params).get("a", (0.0, 0.0, 0.0))[0]
    assert after >= before - 1e-9
