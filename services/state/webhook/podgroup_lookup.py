"""What the admission webhook knows of a pod's PodGroup without asking the API: the Kubernetes source's mirror.

The webhook (`services.state.webhook.webhook`) reads the annotations of the PodGroup a pod names in `pod-group-name`,
for `kairos.io/after`. A pod is usually created before its PodGroup (the benchmark, the pod-grouper, most
operators), so that read was a GET answered 404 for nearly every pod. The replica leading the Kubernetes
source mirrors every PodGroup (`services.state.mirror.cache.Mirror.raw`) once its PodGroup informer has listed
them, so it knows: the PodGroup is there (its annotations, no call), or it is not (no call either). A replica
that does not lead the source (a standby; with state partitions every replica mirrors), or whose informer has not listed yet, says `UNKNOWN` and the
webhook reads the API as before.

The mirror trails the API by a watch event: a PodGroup created a moment before its pod may not be mirrored yet,
and the pod is then admitted without the `kairos.io/after` gate. That is the webhook's existing way to fail
(an owner it cannot read): the state service still holds the podgroup until its dependencies succeed
(`services.state.mirror.dependencies`), so only the gate, the autoscaler's signal, is missed, never a wrong start.

Called by `services.state.service` (which hands `from_election` to `AdmissionServer`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from services.state.mirror.raw_objects import PODGROUPS
from services.state.sources.kube_source import KubeElection, KubeSource
from services.state.sources.partitioned_source import PartitionedKube

__all__ = ["ABSENT", "UNKNOWN", "Known", "PodGroupLookup", "from_election", "from_source"]

ABSENT: Final = "absent"
"""The source's mirror, fully listed, holds no such PodGroup: it does not exist (as of the last watch event)."""
UNKNOWN: Final = "unknown"
"""This replica cannot tell (it does not lead the source, or the source has not listed PodGroups yet)."""

Known = Mapping[str, str] | str
"""A PodGroup's annotations, `ABSENT` or `UNKNOWN`."""
PodGroupLookup = Callable[[str, str], Known]
"""(namespace, name) -> what the mirror knows of that PodGroup."""


def from_election(election: KubeElection | PartitionedKube) -> PodGroupLookup:
    """A lookup in the mirror of the source `election` runs while this replica leads it; with state
    partitions, in this replica's own mirror (every replica runs the informers)."""
    if isinstance(election, PartitionedKube):
        partitioned = election
        return from_source(lambda: partitioned.source)
    leading = election
    return from_source(lambda: leading.owner.source if leading.owner is not None else None)


def from_source(running: Callable[[], KubeSource | None]) -> PodGroupLookup:
    """A lookup in the mirror of the source `running()` returns (None: this replica mirrors nothing now)."""

    def lookup(namespace: str, name: str) -> Known:
        source = running()
        if source is None:
            return UNKNOWN
        if not any(i.what == PODGROUPS and i.synced.is_set() for i in source.informers):
            return UNKNOWN
        found = source.mirror.raw.podgroups.get(f"{namespace}/{name}")
        return ABSENT if found is None else found.metadata.annotations

    return lookup
