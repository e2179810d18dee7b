"""KAI's StatefulSet plugin (``statefulset``): the default grouping, gang-scheduled on request.

Claims (`KINDS`, merged by `registry`) ``apps/v1`` StatefulSets; called by `decision.group_pod`. A
StatefulSet is one PodGroup ``pg-<statefulset>-<uid>`` of min member 1 (KAI's default plugin, priority
``train``, the priority class looked up along the whole owner chain), unless it carries the
``kai.scheduler/min-member`` annotation (its own key, not the batch one): then the annotation is its min
member (KAI's ``minmember`` rule: a whole number, at least 1), and only with ``podManagementPolicy:
Parallel``: OrderedReady (the default) creates one pod after the previous is ready, so a gang of more than
one pod would wait for itself. Refused otherwise, naming the StatefulSet and the field.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import owner_error
from services.state.controllers.grouping.minmember import min_member_override
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import values, wire

MIN_MEMBER_ANNOTATION = "kai.scheduler/min-member"
"""KAI's StatefulSet gang size annotation (the plugin's own key)."""

PARALLEL = "Parallel"


def statefulset_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``StatefulSetGrouper``: the default grouping; ``kai.scheduler/min-member`` sets the min member
    of a ``podManagementPolicy: Parallel`` StatefulSet."""
    md = default_metadata(ctx, top, ctx.owners)
    if MIN_MEMBER_ANNOTATION not in top.metadata.annotations:
        return md
    policy = top.spec.get("podManagementPolicy")
    if policy != PARALLEL:
        shown = "OrderedReady (the default)" if policy is None else values.shown(policy)
        raise owner_error(
            top,
            "spec.podManagementPolicy",
            f"must be {PARALLEL} for the {MIN_MEMBER_ANNOTATION} annotation, got {shown}: an ordered "
            "StatefulSet creates its pods one by one, and a gang of them would wait for itself",
        )
    md.min_available = min_member_override(top, MIN_MEMBER_ANNOTATION) or 1
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("apps", "v1", "StatefulSet"): ("statefulset", statefulset_plugin),
}
