"""KAI's Kubeflow Notebook plugin (``kubeflow/notebook``): one pod, priority ``build``.

Claims (`KINDS`, merged by `registry`) ``kubeflow.org/v1beta1`` Notebooks, the version Kubeflow's
notebook-controller writes in the owner reference of the StatefulSet it makes (KAI's hub claims no other);
called by `decision.group_pod`. A Notebook is interactive: its PodGroup is KAI's default one
(``pg-<notebook>-<uid>``, owned by the Notebook, min member 1) with the ``build`` priority class instead of
``train``, unless the Notebook or its pod names an existing PriorityClass (KAI ``CalcPodGroupPriorityClass``
on the Notebook alone: the StatefulSet between them is not consulted).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.default import BUILD, default_metadata
from services.state.controllers.grouping.model import GVK, Ctx, Metadata, Plugin
from shared.kube import wire


def notebook_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``NotebookGrouper``: the default PodGroup with the ``build`` priority class by default."""
    return default_metadata(ctx, top, [top], BUILD)


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("kubeflow.org", "v1beta1", "Notebook"): ("notebook", notebook_plugin),
}
