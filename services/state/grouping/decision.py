"""The decision for one pod: `group_pod`, the PodGroup it belongs to and the pod's patch.

Called by the pod-grouper loop (`services.state.podgrouper`) with the owner chain it fetched: checks the
chain (`chain`), skips a skipped top owner (`skip`), picks the plugin (`registry`), and builds the
manifest and the patch (`manifest`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from services.state.grouping.chain import check_chain
from services.state.grouping.fields import group_version, pod_as_owner
from services.state.grouping.manifest import pod_patch_for, podgroup_manifest
from services.state.grouping.model import Ctx, GrouperConfig, Grouping, Read
from services.state.grouping.registry import plugin_for
from services.state.grouping.skip import is_skipped, skip_top_owner
from shared.kube import keys, wire


def group_pod(
    pod: wire.Pod,
    owners: Sequence[wire.Owner],
    *,
    priority_classes: Collection[str],
    config: GrouperConfig | None = None,
    reads: Mapping[Read, Any] | None = None,
) -> Grouping | None:
    """The PodGroup `pod` belongs to, or None when the pod is not the pod-grouper's to group.

    `owners` is the pod's owner chain from its own owner up to the top owner (fetched with
    `owner_refs_to_follow`; a shorter chain, when an owner cannot be read, is grouped by its last owner);
    `priority_classes` the names of the PriorityClasses that exist; `reads` what the caller read of the
    cluster for the plugins so far (`model.Reads`): a plugin that needs more raises `ReadsNeeded` naming
    the reads, and the caller decides again with them. Left alone (None): a pod
    of another scheduler, one that already names its podgroup, one that asks to be skipped
    (``kai.scheduler/skip-podgrouper: "true"``). Raises InvalidObject when an owner's spec or a label
    the plugin needs is malformed.
    """
    config = config or GrouperConfig()
    meta = pod.metadata
    if config.scheduler_name is not None and pod.spec.scheduler_name != config.scheduler_name:
        return None
    if meta.annotations.get(keys.PODGROUP_ANNOTATION):
        return None
    if meta.annotations.get(keys.SKIP_PODGROUPER_ANNOTATION, "").lower() == "true":
        return None
    check_chain(pod, owners)
    chain = list(owners)
    top = chain[-1] if chain else pod_as_owner(pod)
    group, version = group_version(top.api_version)
    if is_skipped((group, version, top.kind)):
        top, chain = skip_top_owner(pod, top, chain)
    ctx = Ctx(pod, chain, priority_classes, config, reads or {})
    grouper, plugin = plugin_for(top)
    md = plugin(ctx, top)
    key = config.node_pool_label_key
    if key and key not in md.labels and key in meta.labels:
        md.labels[key] = meta.labels[key]
    return Grouping(
        name=md.name,
        namespace=md.namespace,
        podgroup=podgroup_manifest(md),
        pod_patch=pod_patch_for(md, meta.name),
        grouper=grouper,
    )
