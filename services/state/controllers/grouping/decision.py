"""The decision for one pod: `group_pod`, the PodGroup it belongs to and the pod's patch.

Called by the pod-grouper loop (`services.state.controllers.podgrouper`) with the owner chain it fetched: checks the
chain (`chain`), leaves alone a pod that opted out, skips a skipped top owner (`skip`, with the defaults
ConfigMap's for its kind, `kind_defaults`), picks the plugin (`registry`; for a kind no module claims, a
Karta that describes it, `karta`), layers the upstream Workload a pod names over the plugin's decision
(`workload`), and builds the manifest and the patch (`manifest`).

Externally created PodGroups (KAI v0.15): ``kai.scheduler/skip-podgrouper: "true"`` (exactly that value) on
the pod or on any owner of its chain leaves the pod to whoever made its PodGroup; a pod that already names
its PodGroup (``pod-group-name``) is left alone too. KAI leaves only an ownerless such pod alone and groups
an owned one again (overwriting the name unless the skip annotation is set); Kairos's loop never sees a
pod that names a PodGroup, so the name a user or controller wrote is kept either way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from services.state.controllers.grouping import kind_defaults, workload
from services.state.controllers.grouping.chain import check_chain
from services.state.controllers.grouping.fields import group_version, pod_as_owner
from services.state.controllers.grouping.karta import karta_for, karta_plugin
from services.state.controllers.grouping.manifest import pod_patch_for, podgroup_manifest
from services.state.controllers.grouping.model import Ctx, GrouperConfig, Grouping, Plugin, Read
from services.state.controllers.grouping.registry import ANY_VERSION, PLUGINS, plugin_for
from services.state.controllers.grouping.skip import is_skipped, skip_top_owner
from shared.kube import keys, wire

SKIP = "true"
"""KAI skips the pod-grouper for exactly this value of ``kai.scheduler/skip-podgrouper`` ("True", "1" and
any other value group the pod as usual)."""


def skips_grouper(obj: wire.Pod | wire.Owner) -> bool:
    return obj.metadata.annotations.get(keys.SKIP_PODGROUPER_ANNOTATION) == SKIP


def _plugin(top: wire.Owner, kartas: Sequence[Mapping[str, Any]] | None) -> tuple[str, Plugin]:
    """The kind's plugin; for a kind no module claims, the Karta describing it, else the default plugin."""
    group, version = group_version(top.api_version)
    claimed = (group, version, top.kind) in PLUGINS or (group, ANY_VERSION, top.kind) in PLUGINS
    if not claimed and kartas:
        karta = karta_for(kartas, (group, version, top.kind))
        if karta is not None:
            return f"karta {karta.name}", karta_plugin(karta)
    return plugin_for(top)


def group_pod(
    pod: wire.Pod,
    owners: Sequence[wire.Owner],
    *,
    priority_classes: Collection[str],
    config: GrouperConfig | None = None,
    reads: Mapping[Read, Any] | None = None,
    kartas: Sequence[Mapping[str, Any]] | None = None,
) -> Grouping | None:
    """The PodGroup `pod` belongs to, or None when the pod is not the pod-grouper's to group.

    `owners` is the pod's owner chain from its own owner up to the top owner (fetched with
    `owner_refs_to_follow`; a shorter chain, when an owner cannot be read, is grouped by its last owner);
    `priority_classes` the names of the PriorityClasses that exist; `reads` what the caller read of the
    cluster for the plugins so far (`model.Reads`): a plugin that needs more raises `ReadsNeeded` naming
    the reads, and the caller decides again with them. `kartas` are the cluster's ``run.ai/v1alpha1``
    Karta objects (None or empty: no Karta fallback, as on a cluster without the Karta CRD). Left alone
    (None): a pod of another scheduler, one that already names its podgroup, one that (or an owner of
    which) asks to be skipped (``kai.scheduler/skip-podgrouper: "true"``). Raises InvalidObject when an
    owner's spec or a label or annotation the plugin reads is malformed.
    """
    config = config or GrouperConfig()
    meta = pod.metadata
    if config.scheduler_name is not None and pod.spec.scheduler_name != config.scheduler_name:
        return None
    if meta.annotations.get(keys.PODGROUP_ANNOTATION):
        return None
    if skips_grouper(pod):
        return None
    check_chain(pod, owners)
    if any(skips_grouper(owner) for owner in owners):
        return None
    chain = list(owners)
    top = chain[-1] if chain else pod_as_owner(pod)
    ctx = Ctx(pod, chain, priority_classes, config, reads or {})
    group, version = group_version(top.api_version)
    if is_skipped((group, version, top.kind)):
        top, chain = skip_top_owner(pod, top, chain, kind_defaults.resolve_for_kind(ctx, top))
        ctx.owners = chain
    grouper, plugin = _plugin(top, kartas)
    md = plugin(ctx, top)
    md = workload.apply_workload(ctx, md, top, workload.workload_ref_of(pod, pod.spec.workload_ref))
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
