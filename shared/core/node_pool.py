"""Node pools: the part of a cluster snapshot one Kairos shard schedules.

A SchedulingShard's ``partitionLabelValue`` names its node pool; the node-pool label key (KAI's
``nodePoolLabelKey``, ``kai.scheduler/node-pool`` by default) says which label carries it. A `NodePool` selects
objects by that label as KAI's label selector does: an empty key selects everything, an empty value selects
the objects *without* the label (the default shard), any other value the objects whose label equals it.

`in_pool(snapshot, pool)` keeps

* the nodes the pool selects;
* the podgroups the pool selects, and the queues it selects together with their ancestors (a parent queue
  that carries no pool label still shapes its children's fair share);
* the pods bound to a kept node (whatever their podgroup: a pod of another scheduler or shard still takes
  room there), and the unbound pods of a kept podgroup.

So two shards never see the same node, never place the same podgroup, and a shard's fair shares divide its
own pool's resources. Called by the state replica's `shard_snapshot` (the queue leader's plan and the
placement workers' sessions) through a `KeptPool` per shard, which hands back what it chose before for
each kind whose tuple did not change; pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import compress

import msgspec

from shared.model import Node, Pod, PodGroup, Queue, Snapshot

__all__ = ["EVERYTHING", "KeptPool", "NodePool", "in_pool"]


class NodePool(msgspec.Struct, frozen=True, kw_only=True):
    """Which objects a shard schedules: those whose `label_key` label equals `value` (`value` empty: those
    without the label; `label_key` empty: all)."""

    label_key: str = ""
    value: str = ""

    def selects(self, labels: Mapping[str, str]) -> bool:
        if not self.label_key:
            return True
        if not self.value:
            return self.label_key not in labels
        return labels.get(self.label_key) == self.value

    @property
    def everything(self) -> bool:
        return not self.label_key

    @property
    def name(self) -> str:
        """The pool's name as KAI writes it in scheduling conditions (``default`` for the unlabelled pool)."""
        return self.value or "default"


EVERYTHING = NodePool()


def in_pool(snapshot: Snapshot, pool: NodePool) -> Snapshot:
    """The part of `snapshot` the pool's shard schedules (see the module docstring); order is kept."""
    if pool.everything:
        return snapshot
    nodes = _POOL_NODES.of(snapshot.nodes, pool)
    podgroups = tuple(pg for pg in snapshot.podgroups if pool.selects(pg.labels))
    node_names = {node.name for node in nodes}
    kept_groups = {pg.key for pg in podgroups}
    pods = tuple(
        pod
        for pod in snapshot.pods
        if ((pod.node in node_names) if pod.node else (pod.podgroup in kept_groups))
    )
    queues = _queues_in(snapshot.queues, pool)
    return msgspec.structs.replace(snapshot, nodes=nodes, pods=pods, podgroups=podgroups, queues=queues)


class KeptPool:
    """`in_pool` for one shard's successive snapshots: each kind's part is chosen again only when the
    snapshot's tuple of it (or, for the pods, the kept nodes or podgroups) is not the one of the call
    before, or the pool changed; otherwise the very tuple chosen before comes back (a replica shares a
    kind's tuple between snapshots until one of its objects changes, and sessions memoize by identity).
    Told which podgroups changed (`podgroup_changed`) and given the podgroups by key, it asks the pool
    only about those; the others keep the answer they had."""

    def __init__(self) -> None:
        self._forget(EVERYTHING)

    def _forget(self, pool: NodePool) -> None:
        self._pool = pool
        self._nodes = _PoolNodes()
        self._node_names: tuple[tuple[Node, ...], set[str]] = ((), set())
        self._groups: tuple[tuple[PodGroup, ...], tuple[PodGroup, ...]] = ((), ())
        self._chosen: dict[str, PodGroup] | None = None
        """Podgroup key -> the podgroup the pool selects (None: not followed, the tuple is walked)."""
        self._chosen_ids: set[int] = set()
        """`id`s of the podgroups of `_chosen` (which keeps them, so an `id` is not reused meanwhile)."""
        self._kept: set[str] = set()
        """The kept podgroups' keys."""
        self._kept_version = 0
        self._stale: set[str] = set()
        """Podgroup keys changed since the last call."""
        self._queues: tuple[tuple[Queue, ...], tuple[Queue, ...]] = ((), ())
        self._pods: tuple[tuple[Pod, ...], tuple[Node, ...], int, tuple[Pod, ...]] = ((), (), 0, ())

    def podgroup_changed(self, key: str) -> None:
        """The podgroup `key` (`PodGroup.key`) was written or removed."""
        self._stale.add(key)

    def of(
        self, snapshot: Snapshot, pool: NodePool, podgroups: Mapping[str, PodGroup] | None = None
    ) -> Snapshot:
        """`in_pool(snapshot, pool)`; `podgroups`, when given, are the snapshot's podgroups by key, every
        change of which since the last call was told."""
        if pool.everything:
            return snapshot
        if pool != self._pool:
            self._forget(pool)
        nodes = self._nodes.of(snapshot.nodes, pool)
        chosen = self._podgroups(snapshot.podgroups, pool, podgroups)
        seen_pods, seen_nodes, version, pods = self._pods
        if seen_pods is not snapshot.pods or seen_nodes is not nodes or version != self._kept_version:
            seen_nodes, node_names = self._node_names
            if seen_nodes is not nodes:
                node_names = {node.name for node in nodes}
                self._node_names = (nodes, node_names)
            kept_groups = self._kept
            pods = tuple(
                pod
                for pod in snapshot.pods
                if ((pod.node in node_names) if pod.node else (pod.podgroup in kept_groups))
            )
            self._pods = (snapshot.pods, nodes, self._kept_version, pods)
        seen_queues, queues = self._queues
        if seen_queues is not snapshot.queues:
            queues = _queues_in(snapshot.queues, pool)
            self._queues = (snapshot.queues, queues)
        return msgspec.structs.replace(snapshot, nodes=nodes, pods=pods, podgroups=chosen, queues=queues)

    def _podgroups(
        self, groups: tuple[PodGroup, ...], pool: NodePool, by_key: Mapping[str, PodGroup] | None
    ) -> tuple[PodGroup, ...]:
        seen, out = self._groups
        chosen, stale = self._chosen, self._stale
        if by_key is None or chosen is None:
            if seen is groups and not stale:
                return out
            picked = [pg for pg in groups if pool.selects(pg.labels)]
            keyed = {pg.key: pg for pg in picked}
            self._chosen = keyed if by_key is not None and len(keyed) == len(picked) else None
            self._chosen_ids = {id(pg) for pg in picked}
            self._kept = set(keyed)
            self._kept_version += 1
            out = tuple(picked)
        else:
            ids, kept, changed = self._chosen_ids, self._kept, False
            for key in stale:
                was = chosen.pop(key, None)
                if was is not None:
                    ids.discard(id(was))
                    kept.discard(key)
                    changed = True
                podgroup = by_key.get(key)
                if podgroup is not None and pool.selects(podgroup.labels):
                    chosen[key] = podgroup
                    ids.add(id(podgroup))
                    kept.add(key)
                    changed = True
            if changed:
                self._kept_version += 1
            if changed or seen is not groups:
                out = tuple(compress(groups, map(ids.__contains__, map(id, groups))))
        stale.clear()
        self._groups = (groups, out)
        return out


def _queues_in(queues: tuple[Queue, ...], pool: NodePool) -> tuple[Queue, ...]:
    """The queues the pool selects, with their ancestors, in their order."""
    parents = {queue.name: queue.parent for queue in queues}
    kept: set[str] = set()
    for queue in queues:
        if not pool.selects(queue.labels):
            continue
        name: str | None = queue.name
        while name is not None and name not in kept:
            kept.add(name)
            name = parents.get(name)
    return tuple(queue for queue in queues if queue.name in kept)


class _PoolNodes:
    """The nodes of the last snapshot's tuple that a pool selects, kept while the next snapshot's nodes are
    the same tuple (a replica shares it between snapshots until a node changes) and the pool the same: the
    same tuple comes back, which lets a session find again what it kept of the same node records."""

    def __init__(self) -> None:
        self._last: tuple[tuple[Node, ...], NodePool, tuple[Node, ...]] | None = None

    def of(self, nodes: tuple[Node, ...], pool: NodePool) -> tuple[Node, ...]:
        last = self._last
        if last is not None and last[0] is nodes and last[1] == pool:
            return last[2]
        kept = tuple(node for node in nodes if pool.selects(node.labels))
        self._last = (nodes, pool, kept)
        return kept


_POOL_NODES = _PoolNodes()
