"""The SchedulingShard a Kairos shard serves, as its KV record (`services.state.controllers.shards`), and the queue
leader's policy from that record (`services.queue.planning.shard_policy`)."""

from __future__ import annotations

import json
from typing import Any

from services.queue.batching import ALL_ACTIONS
from services.queue.planning import shard_policy
from services.state.controllers.shards import read_shard, read_shards, seen
from services.state.mirror.problems import INVALID_SCHEDULING_SHARD, Problem
from shared.contracts import subjects as s
from shared.contracts.messages import SHARD_RECORDS, ShardRecord, encode
from shared.core.policy import Policy


def raw(spec: dict[str, Any], name: str = "default", **meta: Any) -> bytes:
    """A SchedulingShard as the API server stores it."""
    body = {
        "apiVersion": "kai.scheduler/v1",
        "kind": "SchedulingShard",
        "metadata": {"name": name, "uid": "u-1", "resourceVersion": "7", "generation": 2, **meta},
        "spec": spec,
    }
    return json.dumps(body).encode()


def record(spec: dict[str, Any]) -> ShardRecord:
    verdict = read_shard("default", raw(spec))
    assert isinstance(verdict, ShardRecord)
    return verdict


def test_a_valid_shard_becomes_its_record_with_what_is_not_applied() -> None:
    got = record({"placementStrategy": {"gpu": "spread"}, "args": {"detailed-fit-errors": "true"}})
    assert (got.shard, got.resource_version, got.generation) == ("default", "7", 2)
    assert got.config.gpu_placement == "spread"
    assert [n.field for n in got.config.not_applied] == ["spec.args.detailed-fit-errors"]
    assert SHARD_RECORDS.decode(s.shard_key("default"), encode(got)) == got


def test_an_invalid_shard_is_a_problem_naming_the_field() -> None:
    for spec, field in (
        ({"placementStrategy": {"gpu": "scatter"}}, "spec.placementStrategy.gpu"),
        ({"kValue": -1}, "spec.kValue"),
        ({"placementStrategy": {"gpuu": "spread"}}, "gpuu"),
    ):
        got = read_shard("default", raw(spec))
        assert isinstance(got, Problem), spec
        assert (got.kind, got.name, got.reason) == ("SchedulingShard", "default", INVALID_SCHEDULING_SHARD)
        assert field in got.message
        assert "SchedulingShard 'default'" in got.message


def test_a_shard_is_seen_even_when_it_does_not_decode() -> None:
    data = raw({"kValue": "many"})
    assert isinstance(read_shard("default", data), Problem)
    assert seen(data).metadata.uid == "u-1"
    assert seen(b"not json").metadata.name == ""


def test_the_shard_key_is_apart_from_the_objects_keys() -> None:
    assert s.shard_key("default") == "shard.default"
    assert s.shard_key("a.b") == "shard.a_b"
    assert s.shard_key("x").startswith(s.SHARD_KEY_PREFIX)


BASE = Policy(actions=ALL_ACTIONS, gpu_usage_scoring=True)


def test_without_a_record_the_policy_is_the_base() -> None:
    assert shard_policy(BASE, None) is BASE


def test_the_record_sets_the_policy_over_the_base() -> None:
    got = shard_policy(BASE, record({"placementStrategy": {"gpu": "spread"}, "kValue": 2}))
    assert got.gpu_placement == "spread"
    assert got.gpu_usage_scoring is True  # the queue's own option is kept
    assert got.actions == tuple(a for a in BASE.actions if a != "consolidation")  # none with spread


def test_a_work_item_runs_only_the_actions_the_shard_enables() -> None:
    spec = {"actions": {"reclaim": {"enabled": False}}}
    assert shard_policy(BASE, record(spec)).actions == (
        "allocate",
        "consolidation",
        "preempt",
        "stalegangeviction",
    )
    only = Policy(actions=("stalegangeviction",))
    assert shard_policy(only, record(spec)).actions == ("stalegangeviction",)
    assert shard_policy(Policy(actions=("reclaim",)), record(spec)).actions == ()


def test_a_shard_record_names_its_node_pool() -> None:
    got = read_shard(
        "pool-a", raw({"partitionLabelValue": "a"}, name="pool-a"), node_pool_label_key="example/pool"
    )
    assert isinstance(got, ShardRecord)
    assert not got.config.not_applied
    assert (got.pool.label_key, got.pool.value, got.pool.name) == ("example/pool", "a", "a")
    assert record({}).pool.name == "default"


def test_two_shards_with_one_node_pool_the_older_keeps_it() -> None:
    raws = {
        "late": raw({"partitionLabelValue": "a"}, name="late", creationTimestamp="2026-12-03T10:00:00Z"),
        "early": raw({"partitionLabelValue": "a"}, name="early", creationTimestamp="2026-12-03T09:00:00Z"),
        "other": raw({"partitionLabelValue": "b"}, name="other", creationTimestamp="2026-12-03T11:00:00Z"),
    }
    verdicts = read_shards(raws)
    assert isinstance(verdicts["early"], ShardRecord)
    assert isinstance(verdicts["other"], ShardRecord)
    late = verdicts["late"]
    assert isinstance(late, Problem)
    assert "SchedulingShard 'late'" in late.message
    assert "spec.partitionLabelValue" in late.message
    assert "'early'" in late.message


def test_two_shards_without_a_partition_both_claim_the_unlabelled_pool() -> None:
    verdicts = read_shards({"default": raw({}, name="default"), "second": raw({}, name="second")})
    assert isinstance(verdicts["default"], ShardRecord)
    second = verdicts["second"]
    assert isinstance(second, Problem)
    assert "unlabelled node pool" in second.message


def test_an_invalid_shard_claims_no_pool() -> None:
    verdicts = read_shards(
        {
            "a": raw({"partitionLabelValue": "a", "kValue": -1}, name="a"),
            "b": raw({"partitionLabelValue": "a"}, name="b"),
        }
    )
    assert isinstance(verdicts["a"], Problem)
    assert isinstance(verdicts["b"], ShardRecord)
