"""The state mirror's indexes of its raw pods: the members of each podgroup, the pods still without a
podgroup, and the pods carrying the `kairos.io/after` scheduling gate.

Owned by the mirror (`services.state.mirror.cache.Mirror.pod_index`), which tells it of every pod that
came, changed or went (`track`) and forgets it all when the pods are listed afresh (`clear`). Read by the
flush (the pods of a changed podgroup are recomputed with it), the stage verdicts and the min-member
count (`members`), the pod-grouper (`ungrouped`) and the gate keeper (`gated`). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from services.state.mirror.raw_objects import group_of
from services.state.webhook.gate_patches import is_gated
from shared.kube import translate, wire

__all__ = ["PodIndex"]


@dataclass
class PodIndex:
    """Pods by podgroup, and the ungrouped and gated pods of one scheduler."""

    members: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """PodGroup "ns/name" -> the "ns/name" of the pods that name it."""
    ungrouped: dict[str, None] = field(default_factory=dict)
    """Pods of this scheduler, alive and without a podgroup (an ordered set)."""
    gated: dict[str, None] = field(default_factory=dict)
    """Pods of this scheduler, alive, carrying the `kairos.io/after` scheduling gate (an ordered set)."""

    def track(
        self, name: str, before: wire.Pod | None, after: wire.Pod | None, scheduler_name: str
    ) -> set[str]:
        """Pod `name` changed from `before` to `after` (None: absent); the podgroups whose members changed."""
        ours = after is not None and _ours_and_alive(after, scheduler_name)
        if ours and after is not None and translate.podgroup_name_of(after) is None:
            self.ungrouped[name] = None
        else:
            self.ungrouped.pop(name, None)
        if ours and after is not None and is_gated(after):
            self.gated[name] = None
        else:
            self.gated.pop(name, None)
        old = group_of(before)
        new = group_of(after)
        if old == new:
            return set()
        if old is not None:
            self.members[old].discard(name)
            if not self.members[old]:
                del self.members[old]
        if new is not None:
            self.members[new].add(name)
        return {g for g in (old, new) if g is not None}

    def clear(self) -> set[str]:
        """Forget every pod (they are being listed afresh; each is `track`ed again); the podgroups that had
        members."""
        had = set(self.members)
        self.members.clear()
        self.ungrouped.clear()
        self.gated.clear()
        return had


def _ours_and_alive(pod: wire.Pod, scheduler_name: str) -> bool:
    """A pod of this scheduler that has not finished and is not being deleted."""
    return (
        pod.spec.scheduler_name == scheduler_name
        and pod.status.phase not in wire.FINISHED_PHASES
        and pod.metadata.deletion_timestamp is None
    )
