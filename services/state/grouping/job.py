"""KAI's batch Job plugin (``job``): min member 1, or the top owner's ``kai.scheduler/batch-min-member``.

Claims (`KINDS`, merged by `registry`) ``batch/v1`` Jobs; called by `decision.group_pod`.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.grouping.default import default_metadata
from services.state.grouping.fields import parsed
from services.state.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import keys, values, wire


def batch_job_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """Min member 1, or the top owner's ``kai.scheduler/batch-min-member`` annotation."""
    md = default_metadata(ctx, top, [top])
    raw = top.metadata.annotations.get(keys.BATCH_MIN_MEMBER_ANNOTATION)
    if raw is not None:
        field_path = f"metadata.annotations[{keys.BATCH_MIN_MEMBER_ANNOTATION}]"
        md.min_available = parsed(
            top,
            field_path,
            lambda: values.whole(raw, low=0, high=values.INT32_MAX, what="a whole number of pods"),
        )
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("batch", "v1", "Job"): ("batch-job", batch_job_plugin),
}
