"""KAI's skip-top-owner plugin (``skiptopowner``): the owner below a skipped top owner becomes the top owner.

Called by `decision.group_pod` when the top owner is in `registry.SKIPPED_TOP_OWNERS` (Argo Workflows,
Kubeflow TrainJobs); the plugin for the new top owner then decides.
"""

from __future__ import annotations

import msgspec

from services.state.grouping.fields import pod_as_owner
from shared.kube import wire


def skip_top_owner(
    pod: wire.Pod, skipped: wire.Owner, chain: list[wire.Owner]
) -> tuple[wire.Owner, list[wire.Owner]]:
    """KAI's skip-top-owner plugin: the owner below (or the pod) becomes the top owner and inherits the
    skipped owner's labels and annotations where it has none of its own."""
    below = chain[-2] if len(chain) > 1 else pod_as_owner(pod)
    meta = below.metadata
    merged = msgspec.structs.replace(
        meta,
        labels={**skipped.metadata.labels, **meta.labels},
        annotations={**skipped.metadata.annotations, **meta.annotations},
    )
    return msgspec.structs.replace(below, metadata=merged), chain[:-1]
