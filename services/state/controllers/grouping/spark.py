"""KAI's Spark plugin (``spark``): the pods of one Spark application share the PodGroup its app id names.

Not a kind's plugin (Spark pods have no custom owner: ``spark-submit`` creates the driver pod, and the
driver creates its executors, owned by the driver pod): `podjob`, the plugin for pods as top owners,
calls `spark_metadata` for a pod `is_spark_pod` says is Spark's, as KAI's podjob plugin calls its spark
plugin. The PodGroup is the default plugin's (owned by the top owner: the driver pod, for the driver and
its executors alike; priority class ``train``) named by the pod's ``spark-app-selector`` label, the
application id Spark puts on the driver and every executor.

Where Kairos differs: KAI takes the label as the PodGroup's name whatever it holds, and the API server
then refuses the PodGroup; here a label that cannot name one (upper case, ``_``) is refused, naming the pod
and the label, and the pod is held with the reason.
"""

from __future__ import annotations

import re

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import owner_error, pod_as_owner
from services.state.controllers.grouping.model import Ctx, Metadata
from shared.kube import values, wire

SPARK_APP_NAME_LABEL = "spark-app-name"


SPARK_APP_SELECTOR_LABEL = "spark-app-selector"
"""Spark's application id (``spark-<32 hex digits>``), on the driver and its executors."""


_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A DNS subdomain, what the API server takes as a PodGroup's name (a label value is at most 63 long)."""


def is_spark_pod(pod: wire.Pod) -> bool:
    """KAI's ``IsSparkPod``: the pod carries both ``spark-app-name`` and ``spark-app-selector``."""
    labels = pod.metadata.labels
    return SPARK_APP_NAME_LABEL in labels and SPARK_APP_SELECTOR_LABEL in labels


def spark_metadata(ctx: Ctx, top: wire.Owner) -> Metadata:
    """The default plugin's metadata for the top owner, named by the pod's ``spark-app-selector``."""
    md = default_metadata(ctx, top, [top])
    name = ctx.pod.metadata.labels[SPARK_APP_SELECTOR_LABEL]
    if _OBJECT_NAME.fullmatch(name) is None:
        raise owner_error(
            pod_as_owner(ctx.pod),
            f"metadata.labels[{SPARK_APP_SELECTOR_LABEL}]",
            "must name a PodGroup (lower-case letters, digits, '-' and '.'), got " + values.shown(name),
        )
    md.name = name
    return md
