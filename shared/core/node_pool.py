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
placement workers' sessions); pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import compress, repeat
from operator import and_, attrgetter, contains, eq, methodcaller, not_, or_, truth

import msgspec

from shared.model import Node, PodGroup, Snapshot

__all__ = ["EVERYTHING", "NodePool", "in_pool"]


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
    nodes, node_names = _POOL_NODES.of(snapshot.nodes, pool)
    # Each question asked of every record at once, in C (`map` over operator functions): a replica's
    # snapshot holds some 10,000 pods and podgroups, and a walk in Python costs each shard's reader several
    # milliseconds per cycle.
    chosen = _selected(snapshot.podgroups, pool)
    podgroups = tuple(compress(snapshot.podgroups, chosen))
    where = list(map(_NODE, snapshot.pods))
    bound = list(map(truth, where))
    keep: Iterable[bool] = map(node_names.__contains__, where)  # a bound pod: on a node of the pool
    if not all(bound):  # an unbound pod: of a podgroup of the pool
        kept_groups = set(map(_KEY, podgroups))
        of_kept = map(kept_groups.__contains__, map(_PODGROUP, snapshot.pods))
        keep = map(or_, map(and_, bound, keep), map(and_, map(not_, bound), of_kept))
    pods = tuple(compress(snapshot.pods, keep))
    parents = {queue.name: queue.parent for queue in snapshot.queues}
    kept_queues: set[str] = set()
    for queue in snapshot.queues:
        if not pool.selects(queue.labels):
            continue
        name: str | None = queue.name
        while name is not None and name not in kept_queues:
            kept_queues.add(name)
            name = parents.get(name)
    queues = tuple(queue for queue in snapshot.queues if queue.name in kept_queues)
    return msgspec.structs.replace(snapshot, nodes=nodes, pods=pods, podgroups=podgroups, queues=queues)


class _PoolNodes:
    """The nodes of the last snapshot's tuple that a pool selects, kept while the next snapshot's nodes are
    the same tuple (a replica shares it between snapshots until a node changes) and the pool the same: the
    same tuple comes back, which lets a session find again what it kept of the same node records."""

    def __init__(self) -> None:
        self._last: tuple[tuple[Node, ...], NodePool, tuple[Node, ...], frozenset[str]] | None = None

    def of(self, nodes: tuple[Node, ...], pool: NodePool) -> tuple[tuple[Node, ...], frozenset[str]]:
        """The kept nodes and their names."""
        last = self._last
        if last is not None and last[0] is nodes and last[1] == pool:
            return last[2], last[3]
        kept = tuple(node for node in nodes if pool.selects(node.labels))
        names = frozenset(node.name for node in kept)
        self._last = (nodes, pool, kept, names)
        return kept, names


_NODE = attrgetter("node")
_PODGROUP = attrgetter("podgroup")
_KEY = attrgetter("key")
_LABELS = attrgetter("labels")


def _selected(podgroups: tuple[PodGroup, ...], pool: NodePool) -> list[bool]:
    """`pool.selects` of each podgroup's labels (a pool with a label key)."""
    labels = map(_LABELS, podgroups)
    if pool.value:
        return list(map(eq, map(methodcaller("get", pool.label_key), labels), repeat(pool.value)))
    return list(map(not_, map(contains, labels, repeat(pool.label_key))))


_POOL_NODES = _PoolNodes()
