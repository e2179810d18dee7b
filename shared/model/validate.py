"""Whole-snapshot validation: references between objects that single objects cannot check.

Shells call `validate_snapshot` before handing a snapshot to the core; the first problem raises
`InvalidObject` naming the object and field (an unknown queue or parent, a cycle of parents, duplicate
names, a podgroup whose sub-group tree needs more pods than it has).
"""

from __future__ import annotations

from collections import Counter

from shared.errors import InvalidObject
from shared.model.objects import Snapshot


def validate_snapshot(snapshot: Snapshot) -> None:
    for kind, names in (
        ("node", [n.name for n in snapshot.nodes]),
        ("queue", [q.name for q in snapshot.queues]),
        ("podgroup", [pg.key for pg in snapshot.podgroups]),
        ("pod", [p.key for p in snapshot.pods]),
    ):
        dup = [n for n, c in Counter(names).items() if c > 1]
        if dup:
            raise InvalidObject(kind, dup[0], "name", "duplicate name")
    queues = {q.name: q for q in snapshot.queues}
    for q in snapshot.queues:
        if q.parent is not None and q.parent not in queues:
            raise InvalidObject("queue", q.name, "parent", f"unknown parent queue {q.parent!r}")
    for q in snapshot.queues:
        seen = [q.name]
        cur = q
        while cur.parent is not None:
            if cur.parent in seen:
                cycle = " -> ".join([*seen[seen.index(cur.parent) :], cur.parent])
                raise InvalidObject("queue", q.name, "parent", f"cycle of parent queues {cycle}")
            seen.append(cur.parent)
            cur = queues[cur.parent]
    pods_per_group = Counter(p.podgroup for p in snapshot.pods)
    for pg in snapshot.podgroups:
        if pg.queue not in queues:
            raise InvalidObject("podgroup", pg.key, "queue", f"unknown queue {pg.queue!r}")
        # The fewest pods that satisfy the sub-group tree (a minSubGroup needs only some members).
        min_member = pg.root.min_pods()
        if min_member > pods_per_group.get(pg.key, 0) and pods_per_group.get(pg.key, 0) > 0:
            raise InvalidObject(
                "podgroup",
                pg.key,
                "min_member",
                f"min member {min_member} is larger than its {pods_per_group[pg.key]} pods: the gang would "
                "wait for min member (it is placed whole or not at all); add the missing pods with it",
            )
    groups = {pg.key for pg in snapshot.podgroups}
    for p in snapshot.pods:
        if p.podgroup not in groups:
            raise InvalidObject("pod", p.key, "podgroup", f"unknown podgroup {p.podgroup!r}")
