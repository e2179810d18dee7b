"""KAI's AmlJob plugin (``aml``): an Azure ML job's pods are one gang of its node count.

Claims (`KINDS`, merged by `registry`) ``amlarc.azureml.com/v1alpha1`` AmlJobs; called by
`decision.group_pod`. The PodGroup is the default plugin's, its min member the job's
``spec.job.options.envs.AZUREML_NODE_COUNT``, which KAI reads as an integer (a count written as text, or
missing, fails the grouping in KAI: here it refuses the pod naming the job and the field).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import int_at, owner_error
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire

NODE_COUNT = ("job", "options", "envs", "AZUREML_NODE_COUNT")


def aml_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """Min member ``AZUREML_NODE_COUNT`` (KAI ``AmlGrouper``)."""
    md = default_metadata(ctx, top, [top])
    count = int_at(top, NODE_COUNT)
    if count is None:
        raise owner_error(top, "spec." + ".".join(NODE_COUNT), "missing: the AzureML node count")
    md.min_available = count
    return md


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("amlarc.azureml.com", "v1alpha1", "AmlJob"): ("aml", aml_plugin),
}
