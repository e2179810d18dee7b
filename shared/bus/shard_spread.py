"""Which shards a replica serves, and which live queue replica should lead each shard; pure.

Every queue, placement and binder replica can serve every Kairos shard: the shards are the SchedulingShards
the state service keeps in KV (`ShardRecord`s) plus `default`, and a replica's `--shard` / `KAIROS_SHARD`
(`parse_restriction`: comma-separated names, empty for all) only restricts it to some (`serves`).

Queue leadership is per shard, and spread over the live queue replicas by rendezvous (highest random
weight) hashing: each (shard, replica) pair has a fixed pseudo-random `weight`, and a shard's `preferred`
replica is the live replica serving it with the highest weight. Every replica computes the same answer
from the same membership, with no coordination, and a replica joining or leaving moves only the shards it
wins or held (about 1/N of them), never shards between two other replicas. The preferred replica contends
for the shard's lease at once; the others only once the lease has stayed free for a while
(`services.queue.shards`), so N shards use N replicas' cores and a dead preferred replica is still
replaced.

Called by `services.queue.shards` (leadership), `services.placement.service` and
`services.binder.service` (which shards' consumers to run), `shared.bus.members` (restrictions on the
wire); tested in tests/unit/test_shard_spread.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from shared.contracts.subjects import DEFAULT_SHARD

__all__ = ["ALL", "assignment", "parse_restriction", "preferred", "served", "serves", "weight"]

ALL: frozenset[str] = frozenset()
"""The restriction of a replica that serves every shard."""


def parse_restriction(text: str) -> frozenset[str]:
    """`--shard` / `KAIROS_SHARD`: shard names separated by commas (spaces ignored); empty: every shard."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def serves(restriction: frozenset[str], shard: str) -> bool:
    """Whether a replica restricted to `restriction` (empty: none) may serve `shard`."""
    return not restriction or shard in restriction


def served(known: Iterable[str], restriction: frozenset[str]) -> frozenset[str]:
    """The shards a replica serves: `default` and every shard with a record (`known`), within its
    restriction."""
    return frozenset(shard for shard in {DEFAULT_SHARD, *known} if serves(restriction, shard))


def weight(shard: str, replica: str) -> int:
    """The fixed pseudo-random weight of `replica` for `shard` (the same in every process and version)."""
    digest = hashlib.blake2b(f"{shard}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preferred(shard: str, members: Mapping[str, frozenset[str]]) -> str | None:
    """The live replica that should lead `shard`: of `members` (replica -> its restriction) that serve it,
    the one of highest `weight` (ties, which a 64-bit hash all but rules out, by name); None when none
    serves it."""
    best: tuple[int, str] | None = None
    for replica, restriction in members.items():
        if not serves(restriction, shard):
            continue
        candidate = (weight(shard, replica), replica)
        if best is None or candidate > best:
            best = candidate
    return None if best is None else best[1]


def assignment(shards: Iterable[str], members: Mapping[str, frozenset[str]]) -> dict[str, str | None]:
    """Each of `shards` with its preferred replica (`preferred`)."""
    return {shard: preferred(shard, members) for shard in shards}
