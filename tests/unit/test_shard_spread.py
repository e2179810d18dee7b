"""Shards spread over queue replicas (`shared.bus.shard_spread`), as specifications."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bus.shard_spread import (
    ALL,
    assignment,
    parse_restriction,
    preferred,
    served,
    serves,
    weight,
)

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
shard_sets = st.sets(names, min_size=1, max_size=30)
replica_sets = st.sets(names, min_size=1, max_size=8)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", ALL, id="empty: every shard"),
        pytest.param("pool-a", frozenset({"pool-a"}), id="one shard"),
        pytest.param(" pool-a, pool-b ,", frozenset({"pool-a", "pool-b"}), id="a list, spaces ignored"),
        pytest.param(",,", ALL, id="only commas: every shard"),
    ],
)
def test_a_restriction_is_a_comma_separated_list_of_shard_names(text: str, expected: frozenset[str]) -> None:
    assert parse_restriction(text) == expected


def test_an_empty_restriction_serves_every_shard_and_a_list_only_its_own() -> None:
    assert serves(ALL, "anything")
    assert serves(frozenset({"pool-a"}), "pool-a")
    assert not serves(frozenset({"pool-a"}), "default")


def test_the_default_shard_is_served_without_a_record_and_other_shards_only_with_one() -> None:
    assert served([], ALL) == {"default"}
    assert served(["pool-a"], ALL) == {"default", "pool-a"}
    assert served(["pool-a", "pool-b"], frozenset({"pool-b", "pool-c"})) == {"pool-b"}


def test_the_weight_is_fixed_for_a_pair_and_differs_between_pairs() -> None:
    assert weight("pool-a", "queue-0") == weight("pool-a", "queue-0")
    assert weight("pool-a", "queue-0") != weight("pool-a", "queue-1")
    assert weight("pool-a", "queue-0") != weight("pool-b", "queue-0")


@given(shards=shard_sets, replicas=replica_sets)
def test_every_shard_has_exactly_one_preferred_live_replica(shards: set[str], replicas: set[str]) -> None:
    members = dict.fromkeys(replicas, ALL)
    chosen = assignment(shards, members)
    assert set(chosen) == shards
    assert all(replica in replicas for replica in chosen.values())
    # Every replica computes the same answer, whatever order it learnt the members in.
    reordered = dict(reversed(list(members.items())))
    assert assignment(shards, reordered) == chosen


@given(shards=shard_sets, replicas=replica_sets, newcomer=names)
def test_a_replica_that_joins_takes_only_shards_and_moves_none_between_the_others(
    shards: set[str], replicas: set[str], newcomer: str
) -> None:
    before = assignment(shards, dict.fromkeys(replicas, ALL))
    after = assignment(shards, dict.fromkeys(replicas | {newcomer}, ALL))
    for shard in shards:
        assert after[shard] in (before[shard], newcomer)


@given(shards=shard_sets, replicas=replica_sets.filter(lambda r: len(r) > 1), data=st.data())
def test_a_replica_that_leaves_moves_only_the_shards_it_was_preferred_for(
    shards: set[str], replicas: set[str], data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(sorted(replicas)))
    before = assignment(shards, dict.fromkeys(replicas, ALL))
    after = assignment(shards, dict.fromkeys(replicas - {gone}, ALL))
    for shard in shards:
        if before[shard] != gone:
            assert after[shard] == before[shard]
        else:
            assert after[shard] != gone


@given(shards=shard_sets, restricted=shard_sets, replicas=replica_sets)
def test_a_restricted_replica_is_never_preferred_for_a_shard_outside_its_restriction(
    shards: set[str], restricted: set[str], replicas: set[str]
) -> None:
    members = {replica: frozenset(restricted) for replica in replicas}
    for shard, replica in assignment(shards, members).items():
        assert (replica is not None) == (shard in restricted)


def test_no_replica_serving_a_shard_means_no_preferred_replica() -> None:
    assert preferred("pool-a", {}) is None
    assert preferred("pool-a", {"queue-0": frozenset({"default"})}) is None


def test_many_shards_spread_over_every_replica() -> None:
    replicas = {f"queue-{i}": ALL for i in range(4)}
    chosen = assignment([f"pool-{i}" for i in range(200)], replicas)
    counts = {replica: list(chosen.values()).count(replica) for replica in replicas}
    # Rendezvous hashing spreads evenly on average: each of 4 replicas gets about 50 of 200.
    assert all(25 <= count <= 75 for count in counts.values()), counts
