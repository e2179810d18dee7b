"""KAI's Deployment plugin (``deployment``): one PodGroup per pod, owned by the pod, ``inference`` by default.

Claims (`KINDS`, merged by `registry`) ``apps/v1`` Deployments; called by `decision.group_pod`.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import INFERENCE, default_metadata, priority_class_of
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire


def deployment_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """One PodGroup per pod, owned by the pod, priority class ``inference`` by default."""
    md = default_metadata(ctx, top, [top])
    pod = ctx.pod.metadata
    md.owner = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
    md.priority_class = priority_class_of(ctx, [top], INFERENCE)
    md.name = f"pg-{pod.name}-{pod.uid}"
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("apps", "v1", "Deployment"): ("deployment", deployment_plugin),
}
