"""KAI's SPOTRequest plugin (``spotrequest``): the default grouping with the ``inference`` priority class.

Claims (`KINDS`, merged by `registry`) ``egx.nvidia.io/v1`` SPOTRequests; called by `decision.group_pod`.
A ``priorityClassName`` label on the request or the pod (or the pod's ``spec.priorityClassName``, or the
defaults ConfigMap's entry for SPOTRequests) still names another existing class.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import INFERENCE, default_metadata, priority_class_of
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire


def spot_request_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """The default plugin's PodGroup, priority class ``inference`` by default (KAI ``SpotRequestGrouper``)."""
    md = default_metadata(ctx, top, [top])
    md.priority_class = priority_class_of(ctx, [top], INFERENCE)
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("egx.nvidia.io", "v1", "SPOTRequest"): ("spot-request", spot_request_plugin),
}
